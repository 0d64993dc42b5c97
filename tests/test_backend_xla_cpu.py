"""The backend on real torch_xla 2.9 (PJRT CPU, 4 devices), one Ray Train worker.

Runs only where real torch_xla is installed (the ``xla-cpu`` env).  The training loop is
the same :func:`xlasim.cli.demo.train_loop` the simulated-slice tests run, so the mesh, the
loss curve shape and the compile counts seen here are what the simulator must reproduce.
"""

from __future__ import annotations

import sys

import pytest

from tpu_backend.machine import real_torch_xla_unavailable

pytest.importorskip("ray.train")


pytestmark = [
    pytest.mark.xla_cpu,
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("ray"),  # one Ray cluster at a time on this machine
    pytest.mark.skipif(
        real_torch_xla_unavailable() is not None, reason=str(real_torch_xla_unavailable())
    ),
]

CPU_DEVICES = 4


@pytest.fixture(scope="module")
def local_ray(tpu_clusters):
    import ray

    tpu_clusters.release()  # a cluster kept for other tests goes first
    if ray.is_initialized():
        pytest.skip("ray is already initialized in this process")
    # address="local": a new cluster of its own, never one another process started here.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        runtime_env={
            "env_vars": {
                "PJRT_DEVICE": "CPU",
                "CPU_NUM_DEVICES": str(CPU_DEVICES),
                # the simulator must stay out of the way: this is the real runtime
                "XLASIM_TOPOLOGY": "",
            }
        },
    )
    try:
        yield
    finally:
        ray.shutdown()


def test_spmd_on_real_torch_xla_cpu(local_ray, tmp_path):
    from ray.train import RunConfig, ScalingConfig

    import tpu_backend
    from xlasim.cli import demo
    from xlasim.ray.cluster import fit_with_deadline

    out = tmp_path / "records"
    out.mkdir()
    trainer = tpu_backend.TorchTrainer(
        demo.train_loop,
        train_loop_config={"steps": 4, "batch": 32, "out_dir": str(out)},
        torch_config=tpu_backend.TPUTorchConfig(),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results")),
    )
    fit_with_deadline(trainer, 600)
    (rec,) = demo.read_records(out)
    assert rec["device_type"] == "CPU"
    assert rec["spmd"] is True
    assert rec["process_group"] == "gloo"
    assert rec["global_devices"] == CPU_DEVICES
    assert rec["mesh_shape"] == [CPU_DEVICES] and rec["axis_names"] == ["data"]
    assert (rec["process_index"], rec["process_count"]) == (0, 1)
    losses = rec["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    # one graph execution per step; torch_xla 2.9 compiles step 0 and step 1 (the
    # parameters come back from step 0 as SPMD outputs), then reuses the graph
    assert rec["uncached_compile"] + rec["cached_compile"] == len(losses)
    assert 1 <= rec["uncached_compile"] <= 2


def _non_spmd_loop(config):
    import os

    import torch
    import torch.distributed as dist
    import torch_xla
    import torch_xla.runtime as xr

    import tpu_backend

    t = torch.ones(3, device=torch_xla.device())
    dist.all_reduce(t)
    torch_xla.sync()
    with open(os.path.join(config["out_dir"], "non_spmd.txt"), "w") as f:
        f.write(
            repr(
                (
                    tpu_backend.get_xla_mesh(),
                    tpu_backend.is_xla_backend(),
                    xr.is_spmd(),
                    dist.get_backend(),
                    t.cpu().tolist(),
                )
            )
        )


def _non_spmd_helpers_loop(config):
    # Ray's helpers without SPMD: Ray's prepare_model; batches through MpDeviceLoader, so a
    # loop with no sync of its own compiles no new graph after its first steps.
    import json
    import os

    import ray.train.torch
    import torch
    import torch_xla.debug.metrics as met

    _non_spmd_loop(config)
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(96.0).reshape(24, 4) / 96
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = ray.train.torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=4))
    compiled = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        compiled.append(met.counter_value("UncachedCompile"))
    with open(os.path.join(config["out_dir"], "helpers.json"), "w") as f:
        json.dump({"param": str(next(model.parameters()).device), "compiled": compiled}, f)


def test_xla_process_group_without_spmd(local_ray, tmp_path):
    import json

    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig

    import tpu_backend
    from xlasim.ray.cluster import fit_with_deadline

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    trainer = tpu_backend.TorchTrainer(
        _non_spmd_helpers_loop,
        train_loop_config={"out_dir": str(tmp_path)},
        torch_config=tpu_backend.TPUTorchConfig(spmd=False),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results")),
    )
    fit_with_deadline(trainer, 600)
    mesh, is_xla, spmd, backend, values = eval((tmp_path / "non_spmd.txt").read_text())
    assert (mesh, is_xla, spmd, backend) == (None, True, False, "xla")
    assert values == [1.0, 1.0, 1.0]
    helpers = json.loads((tmp_path / "helpers.json").read_text())
    assert helpers["param"] == "xla:0"
    assert len(helpers["compiled"]) == 6
    assert helpers["compiled"][-1] == helpers["compiled"][2], helpers["compiled"]


def _ray_helpers_loop(config):
    # Ray Train's own helpers, no torch_xla call: on this backend, under SPMD, they give the
    # XLA device, no DDP, and batches split over the mesh; once with each auto_transfer.
    import json
    import os

    import ray.train.torch
    import torch
    import torch_xla

    record = {}
    for auto_transfer in (True, False):
        torch.manual_seed(0)
        model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.arange(64.0).reshape(16, 4) / 64
        data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
        loader = ray.train.torch.prepare_data_loader(
            torch.utils.data.DataLoader(data, batch_size=8), auto_transfer=auto_transfer
        )
        losses, specs = [], []
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            specs.append(torch_xla._XLAC._get_xla_sharding_spec(xb))
        record[str(auto_transfer)] = {
            "model": type(model).__name__,
            "param": str(next(model.parameters()).device),
            "param_spec": torch_xla._XLAC._get_xla_sharding_spec(model.weight),
            "batch_specs": specs,
            "losses": losses,
        }
    with open(os.path.join(config["out_dir"], "helpers.json"), "w") as f:
        json.dump(record, f)


def test_ray_helpers_under_spmd_on_real_torch_xla_cpu(local_ray, tmp_path):
    import json

    import ray.cloudpickle
    import torch
    from ray.train import RunConfig, ScalingConfig

    import tpu_backend
    from xlasim.ray.cluster import fit_with_deadline

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    trainer = tpu_backend.TorchTrainer(
        _ray_helpers_loop,
        train_loop_config={"out_dir": str(tmp_path)},
        torch_config=tpu_backend.TPUTorchConfig(),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results")),
    )
    fit_with_deadline(trainer, 600)
    record = json.loads((tmp_path / "helpers.json").read_text())

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(64.0).reshape(16, 4) / 64
    y = x.sum(dim=1, keepdim=True)
    eager = []
    for i in (0, 8):
        loss = torch.nn.functional.mse_loss(model(x[i : i + 8]), y[i : i + 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        eager.append(loss.item())
    for run in record.values():
        assert (run["model"], run["param"]) == ("Linear", "xla:0")
        assert "replicated" in run["param_spec"]
        assert run["batch_specs"] == ["{devices=[4,1]0,1,2,3}"] * 2
        assert run["losses"] == pytest.approx(eager, rel=1e-6)
