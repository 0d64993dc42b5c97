"""The backend on a simulated single-host v6e 2x4 slice, and the errors that need workers.

One fake-TPU Ray cluster (one node = the host, 8 chips) is shared by the tests of this
module (tests/shared_clusters.py); every fit is bounded in time and the cluster is torn down
at the end.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray.train")

from docs_examples import cluster_driver_command, env_for, python_examples, run  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from shared_clusters import CPUS_PER_HOST  # noqa: E402

import tpu_backend  # noqa: E402
from xlasim.cli import demo  # noqa: E402
from xlasim.pytest_plugin import real_torch_xla_unavailable  # noqa: E402
from xlasim.ray.cluster import (  # noqa: E402
    error_chain_text,
    fit_with_deadline,
    release_placement_groups,
)

FIT_TIMEOUT_S = 300
# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]


@pytest.fixture
def v6e_8_cluster(tpu_clusters):
    return tpu_clusters.get(
        "2x4", "v6e", num_cpus_per_host=CPUS_PER_HOST["2x4"], startup_timeout_s=120
    )


def _trainer(tmp_path, *, torch_config=None, scaling=None, run_env=None, steps=3):
    out = tmp_path / "records"
    out.mkdir(exist_ok=True)
    return tpu_backend.TorchTrainer(
        demo.train_loop,
        train_loop_config={"steps": steps, "batch": 32, "out_dir": str(out)},
        torch_config=torch_config,
        scaling_config=scaling
        or ScalingConfig(use_tpu=True, topology="2x4", accelerator_type="TPU-V6E", num_workers=1),
        run_config=RunConfig(
            storage_path=str(tmp_path / "ray_results"),
            worker_runtime_env={"env_vars": run_env} if run_env else None,
        ),
    ), out


def test_fake_host_looks_like_a_tpu_vm(v6e_8_cluster):
    nodes = v6e_8_cluster.node_summary()
    tpu = [n for n in nodes if n["resources"].get("TPU")]
    assert len(tpu) == 1
    assert tpu[0]["resources"]["TPU"] == 8
    assert tpu[0]["resources"]["accelerator_type:TPU-V6E"] == 1
    assert tpu[0]["labels"]["ray.io/tpu-pod-type"] == "v6e-8"
    # single-host slices have no head resource: Ray does not gang-schedule them
    assert not any(k.endswith("-head") for k in tpu[0]["resources"])


def test_single_host_mesh_is_1d_over_all_devices(v6e_8_cluster, tmp_path):
    trainer, out = _trainer(tmp_path)
    fit_with_deadline(trainer, FIT_TIMEOUT_S)
    (rec,) = demo.read_records(out)
    assert rec["mesh_shape"] == [8] and rec["axis_names"] == ["data"]
    assert rec["global_devices"] == 8 and rec["addressable_devices"] == 8
    assert (rec["process_index"], rec["process_count"]) == (0, 1)
    assert rec["device_type"] == "TPU" and rec["spmd"] is True
    assert rec["process_group"] == "gloo"
    assert rec["is_xla_backend"] is True
    losses = rec["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    # one graph execution per step, compiled at most twice, reused afterwards
    assert rec["uncached_compile"] + rec["cached_compile"] == len(losses)
    assert 1 <= rec["uncached_compile"] <= 2


@pytest.fixture(scope="module")
def mesh_and_cache_run(tpu_clusters, tmp_path_factory):
    """One fit for two settings a worker applies independently at bootstrap: a mesh override
    and a compilation cache (each fit costs a Ray Train run's workers and actors). Returns the
    host's record and the cache directory."""
    tpu_clusters.get("2x4", "v6e", num_cpus_per_host=CPUS_PER_HOST["2x4"], startup_timeout_s=120)
    tmp_path = tmp_path_factory.mktemp("mesh_and_cache")
    cache = tmp_path / "xla-cache"
    cfg = tpu_backend.TPUTorchConfig(
        mesh_shape=(2, 4),
        axis_names=("data", "model"),
        compilation_cache_dir=str(cache),
        compilation_cache_readonly="auto",
    )
    trainer, out = _trainer(tmp_path, torch_config=cfg, steps=2)
    fit_with_deadline(trainer, FIT_TIMEOUT_S)
    (rec,) = demo.read_records(out)
    return rec, cache


def test_mesh_override_reaches_the_worker(mesh_and_cache_run):
    rec, _ = mesh_and_cache_run
    assert rec["mesh_shape"] == [2, 4] and rec["axis_names"] == ["data", "model"]


def test_compilation_cache_is_opened_at_bootstrap(mesh_and_cache_run):
    _, cache = mesh_and_cache_run  # the fixture found the host's record of the run
    # keyed by slice and torch_xla version; the only host writes the compiled programs
    (version_dir,) = (cache / "v6e-8-2x4").iterdir()
    assert version_dir.name.startswith("torch_xla-")
    assert any(version_dir.iterdir()), "no compiled program was written to the cache"


def test_config_for_a_different_host_fails_fast(v6e_8_cluster, tmp_path):
    # The config says v6e 2x2 (4 chips) but the worker lands on this v6e-8 host.
    cfg = tpu_backend.TPUTorchConfig(topology="2x2", accelerator="v6e")
    scaling = ScalingConfig(
        use_tpu=True, num_workers=1, resources_per_worker={"TPU": 4}, accelerator_type="TPU-V6E"
    )
    trainer, _ = _trainer(tmp_path, torch_config=cfg, scaling=scaling)
    with pytest.raises(Exception) as info:  # noqa: B017 - Ray's wrapper type varies
        fit_with_deadline(trainer, FIT_TIMEOUT_S)
    text = error_chain_text(info.value)
    assert "this host is a v6e-8 (TPU_ACCELERATOR_TYPE)" in text, text
    assert "configured for v6e-4" in text, text


@pytest.mark.skipif(
    real_torch_xla_unavailable() is None,
    reason="real torch_xla is installed here, so the workers' TPU hosts have it",
)
def test_missing_torch_xla_on_a_tpu_host_is_a_clear_error(v6e_8_cluster, tmp_path):
    # Workers started without the simulator are TPU hosts without torch_xla.
    trainer, _ = _trainer(tmp_path, run_env={"XLASIM_TOPOLOGY": ""})
    with pytest.raises(Exception) as info:  # noqa: B017
        fit_with_deadline(trainer, FIT_TIMEOUT_S)
    text = error_chain_text(info.value)
    assert "torch_xla is not importable on this worker" in text, text
    assert "pip install 'torch_xla[tpu]==2.9.0'" in text, text


def test_plain_ray_trainer_with_our_config(v6e_8_cluster, tmp_path):
    from ray.train.torch import TorchTrainer as RayTorchTrainer

    out = tmp_path / "records"
    out.mkdir()
    cfg = tpu_backend.TPUTorchConfig()
    trainer = RayTorchTrainer(
        demo.train_loop,
        train_loop_config={"steps": 2, "batch": 32, "out_dir": str(out)},
        torch_config=cfg,
        scaling_config=ScalingConfig(
            use_tpu=True, topology="2x4", accelerator_type="TPU-V6E", num_workers=1
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results")),
    )
    assert cfg.backend == "gloo"  # Ray did not rewrite it to 'tpu_dist'
    fit_with_deadline(trainer, FIT_TIMEOUT_S)
    (rec,) = demo.read_records(out)
    assert rec["mesh_shape"] == [8] and rec["process_group"] == "gloo"


@pytest.mark.parametrize(
    "example",
    [e for e in python_examples() if e.mode == ("ray-cluster", "2x4", "v6e")],
    ids=lambda e: e.name,
)
def test_docs_example_trains_on_the_cluster(v6e_8_cluster, tmp_path, example):
    """The documentation's Ray examples, as written, driving this module's cluster (the
    other examples run in tests/test_docs.py)."""
    try:
        result = run(
            cluster_driver_command(example, v6e_8_cluster.address), tmp_path, env_for(tmp_path)
        )
    finally:
        release_placement_groups()  # a failed run must not hold the host's TPUs
    assert result.returncode == 0, f"{example.name} failed:\n{result.stdout}"


def _ray_style_loop(config):
    # A Ray Train loop written the usual way: Ray's own device helpers, no torch_xla calls.
    import json

    import ray.train.torch
    import torch

    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(32.0).reshape(8, 4) / 32
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = ray.train.torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=4))
    losses = []
    for _ in range(2):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    record = {
        "device": str(ray.train.torch.get_device()),
        "param_device": str(next(model.parameters()).device),
        "batch_device": str(xb.device),
        "losses": losses,
    }
    with open(config["out"], "w") as f:
        json.dump(record, f)


def _cpu_losses():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(32.0).reshape(8, 4) / 32
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(2):
        for i in range(0, 8, 4):
            loss = torch.nn.functional.mse_loss(model(x[i : i + 4]), y[i : i + 4])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_ray_train_device_helpers_give_the_xla_device(v6e_8_cluster, tmp_path):
    """get_device/prepare_model/prepare_data_loader: on TPU workers Ray 2.60 asks for torch_tpu;
    on ours they give torch_xla's device, and the loop trains as on CPU."""
    import sys

    import ray.cloudpickle

    # Workers cannot import this test module: ship the loop by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    out = tmp_path / "record.json"
    trainer = tpu_backend.TorchTrainer(
        _ray_style_loop,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(
            use_tpu=True, topology="2x4", accelerator_type="TPU-V6E", num_workers=1
        ),
        run_config=RunConfig(
            storage_path=str(tmp_path / "ray_results"),
            # Compared with eager CPU below: the worker's chips compute at 'highest'.
            worker_runtime_env={"env_vars": {"XLASIM_MAT_MUL_PRECISION": "highest"}},
        ),
    )
    fit_with_deadline(trainer, FIT_TIMEOUT_S)
    m = json.loads(out.read_text())
    assert (m["device"], m["param_device"], m["batch_device"]) == ("xla:0", "xla:0", "xla:0")
    assert m["losses"] == pytest.approx(_cpu_losses(), rel=1e-6)
