"""Ray Train's ``prepare_model()`` / ``prepare_data_loader()`` on an SPMD worker of the backend,
in this process on a simulated single-host slice (no Ray cluster).

The worker state the bootstrap leaves is set by hand; Ray's helpers are reached by their public
names after ``tpu_backend.ray_prepare.install()``, as a training function reaches them.  The
multi-host run (per-host batches assembled into one global batch, against eager CPU) is in
``tests/test_seamless.py::test_same_loop_on_a_multi_host_simulated_slice``.
"""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
import torch

pytest.importorskip("ray.train")

import ray.train.torch  # noqa: E402

import xlasim  # noqa: E402
from tpu_backend import context, ray_prepare  # noqa: E402


@pytest.fixture
def spmd_worker(monkeypatch):
    """A simulated v6e-8 host under SPMD with the backend's state and Ray's helpers installed;
    yields (torch_xla, mesh).  Ray's own helpers come back afterwards."""
    for name in ray_prepare._RAY_MODULES:
        module = importlib.import_module(name)
        for helper in ray_prepare._HELPERS:
            monkeypatch.setattr(module, helper, getattr(module, helper))
    ray_prepare.install()
    with xlasim.simulate("2x4", "v6e"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
        context._set_state(
            context.XlaWorkerState(
                spmd=True,
                host_index=0,
                num_hosts=1,
                process_index=0,
                process_count=1,
                global_device_count=8,
                mesh=mesh,
                mesh_shape=(2, 4),
                axis_names=("data", "model"),
                slice_topology="2x4",
                slice_accelerator="v6e",
                pod_type="v6e-8",
                process_group_backend="gloo",
                device_type="TPU",
            )
        )
        try:
            yield torch_xla, mesh
        finally:
            context._set_state(None)


def _spec(torch_xla, t):
    return torch_xla._XLAC._get_xla_sharding_spec(t)


def test_model_is_moved_and_replicated_never_wrapped(spmd_worker):
    torch_xla, _ = spmd_worker
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 2))
    assert type(model) is torch.nn.Linear  # no DistributedDataParallel
    for p in model.parameters():
        assert p.device == torch_xla.device()
        assert "replicated" in _spec(torch_xla, p)
    kept = ray.train.torch.prepare_model(torch.nn.Linear(4, 2), parallel_strategy=None)
    assert type(kept) is torch.nn.Linear and kept.weight.device.type == "xla"


def test_move_to_device_false_leaves_the_model_where_it_is(spmd_worker):
    model = torch.nn.Linear(4, 2)
    assert ray.train.torch.prepare_model(model, move_to_device=False) is model
    assert model.weight.device == torch.device("cpu")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"parallel_strategy": "fsdp"}, r"parallel_strategy='fsdp'.*'ddp' \(the default\) or None"),
        ({"parallel_strategy": "zero"}, r"parallel_strategy='zero'.*SpmdFullyShardedDataParallel"),
        (
            {"parallel_strategy_kwargs": {"find_unused_parameters": True}},
            r"find_unused_parameters.*DistributedDataParallel arguments",
        ),
        ({"move_to_device": torch.device("cpu")}, r"device\(type='cpu'\).*an XLA device"),
    ],
)
def test_what_cannot_apply_under_spmd_is_refused(spmd_worker, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ray.train.torch.prepare_model(torch.nn.Linear(4, 2), **kwargs)


def test_batches_are_split_over_the_data_axis_with_or_without_prefetch(spmd_worker):
    torch_xla, _ = spmd_worker
    x = torch.arange(64.0).reshape(16, 4)
    y = torch.arange(16.0)
    base = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    seen = {}
    for auto_transfer in (True, False):
        loader = ray.train.torch.prepare_data_loader(base, auto_transfer=auto_transfer)
        assert len(loader) == 2 and loader.batch_size == 8 and loader.sampler is base.sampler
        assert copy.copy(loader).sampler is base.sampler
        batches = list(loader)
        assert len(batches) == 2
        for (xb, yb), i in zip(batches, (0, 8), strict=True):
            assert xb.device == torch_xla.device() and yb.device == torch_xla.device()
            assert torch.equal(xb.cpu(), x[i : i + 8]) and torch.equal(yb.cpu(), y[i : i + 8])
        seen[auto_transfer] = [(_spec(torch_xla, xb), _spec(torch_xla, yb)) for xb, yb in batches]
    # rows over the 'data' axis (2), replicated over 'model' (4); rank-1 labels over all 8
    assert seen[True][0] == (
        "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
        "{devices=[8]0,1,2,3,4,5,6,7}",
    )
    assert seen[False] == seen[True]


def test_move_to_device_false_returns_the_cpu_loader(spmd_worker):
    base = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2)))
    assert ray.train.torch.prepare_data_loader(base, move_to_device=False) is base


def test_ray_train_v1_amp_is_refused(spmd_worker, monkeypatch):
    from types import SimpleNamespace

    from ray.train._internal import session

    amp_session = SimpleNamespace(accelerator=SimpleNamespace(amp_is_enabled=True))
    monkeypatch.setattr(session, "_session", amp_session)
    with pytest.raises(ValueError, match=r"accelerate\(amp=True\) cannot apply"):
        ray.train.torch.prepare_model(torch.nn.Linear(4, 2))


def _steps_compiled(loader, torch_xla, steps):
    """Train a Linear on the loader the usual Ray way (no sync); UncachedCompile after each step."""
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(torch_xla.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        compiled.append(met.counter_value("UncachedCompile") or 0)
    assert len(compiled) == steps
    return compiled


def test_without_spmd_batches_are_whole_and_each_step_is_its_own_graph(monkeypatch):
    """One process per chip: Ray's model helper (DDP), but batches through MpDeviceLoader, so
    a loop with no sync of its own does not trace one growing graph (Ray's own loader only
    moves batches: on real torch_xla 2.9 that compiles anew at every step)."""
    for name in ray_prepare._RAY_MODULES:
        module = importlib.import_module(name)
        for helper in ray_prepare._HELPERS:
            monkeypatch.setattr(module, helper, getattr(module, helper))
    ray_prepare.install()
    with xlasim.simulate("2x2"):
        import torch_xla

        context._set_state(
            context.XlaWorkerState(
                spmd=False,
                host_index=0,
                num_hosts=1,
                process_index=0,
                process_count=1,
                global_device_count=1,
                mesh=None,
                mesh_shape=None,
                axis_names=None,
                slice_topology=None,
                slice_accelerator=None,
                pod_type=None,
                process_group_backend="xla",
                device_type="TPU",
            )
        )
        try:
            x = torch.arange(96.0).reshape(24, 4) / 96
            data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
            base = torch.utils.data.DataLoader(data, batch_size=4)
            loader = ray.train.torch.prepare_data_loader(base)
            xb, _ = next(iter(loader))
            assert xb.device == torch_xla.device() and torch.equal(xb.cpu(), x[:4])
            compiled = _steps_compiled(loader, torch_xla, steps=6)
        finally:
            context._set_state(None)
    assert compiled[-1] == compiled[2], compiled  # no new graph after the first steps
