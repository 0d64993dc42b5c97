"""The seamless trainer: one loop for TPU (simulated here), GPU and CPU.

The loop in :func:`same_loop` is the user's program.  It is run unchanged

* on CPU in this process (no XLA configured),
* on a simulated TPU slice (``xlasim.simulate``), plain and SPMD,
* in Ray Train on 2 CPU workers with gloo, and through ``tpu_backend.TorchTrainer`` on a
  simulated single-host TPU slice (``test_same_loop_in_ray_train_...``),

and the loss curves are compared (tolerance: 1e-5 relative, for float summation order).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from shared_clusters import run_env

import xlasim
from tpu_backend.precision import SeamlessConfig
from tpu_backend.seamless import SeamlessTPUTrainer, detect_device, to_device

GLOBAL_BATCH = 16
RTOL = 1e-5

# PyTorch's autograd engine sizes its per-device queues at the first backward of the
# process; register the simulated XLA device before any test here runs a CPU backward.
with xlasim.simulate("2x2"):
    pass


def same_loop(config: dict | None = None) -> dict:
    """The user's training function: no torch_xla, no device checks."""
    import torch

    from tpu_backend.seamless import SeamlessTPUTrainer

    config = config or {}
    trainer = SeamlessTPUTrainer(**config.get("settings", {}))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=gen)
    y = torch.tanh(x @ torch.randn(8, 1, generator=gen)).squeeze(1)  # rank-1 labels
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y),
        batch_size=config.get("global_batch", GLOBAL_BATCH) // trainer.num_data_loaders,
    )
    model, optimizer, loader = trainer.prepare(model, optimizer, loader)
    losses, stats = [], []
    for _ in range(config.get("epochs", 2)):
        for xb, yb in loader:
            optimizer.zero_grad()
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
            losses.append(trainer.reduce_mean(loss))
            s = trainer.compile_stats()
            stats.append(None if s is None else [s.compiles, s.executions])
    result = {
        "kind": trainer.info.kind,
        "spmd": trainer.spmd,
        "num_processes": trainer.num_processes,
        "losses": losses,
        "stats": stats,
        "cache": None if not trainer.is_xla else trainer.compile_stats().as_dict(),
    }
    out = config.get("out_dir")
    if out:
        Path(out, f"result{trainer.process_index}.json").write_text(json.dumps(result))
    return result


def _assert_one_graph_per_step(stats):
    """On XLA: one compile at step 1, then exactly one execution per step, no recompile."""
    assert stats[0] == [1, 1], stats
    for i, (compiles, executions) in enumerate(stats, 1):
        assert compiles == 1, f"recompiled by step {i}: {stats}"
        assert executions == i, f"step {i} ran {executions} graphs in all: {stats}"


# -- device detection and helpers ------------------------------------------------------------


def test_cpu_when_no_xla_is_configured(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    info = detect_device()
    if torch.cuda.is_available():
        assert info.kind == "cuda"
    else:
        assert (info.kind, info.device) == ("cpu", torch.device("cpu"))
    assert not info.spmd and info.mesh is None


def test_xla_on_a_simulated_slice():
    with xlasim.simulate("2x2"):
        info = detect_device()
        assert info.kind == "xla" and info.device.type == "xla"
        assert not info.spmd and info.mesh is None


def test_spmd_gets_a_data_mesh_over_all_devices():
    with xlasim.simulate("2x4", "v6e"):
        import torch_xla.runtime as xr

        xr.use_spmd()
        info = detect_device()
        assert info.spmd
        assert tuple(info.mesh.mesh_shape) == (8,) and tuple(info.mesh.axis_names) == ("data",)
        assert info.num_data_loaders == 1


def test_to_device_moves_nested_structures():
    with xlasim.simulate("2x2"):
        a, b = torch.ones(2), {"x": [torch.zeros(3), 5], "y": (torch.ones(1),)}
        ma, mb = to_device(a, b)
        assert ma.device.type == "xla"
        assert mb["x"][0].device.type == "xla" and mb["x"][1] == 5
        assert mb["y"][0].device.type == "xla"
        single = to_device(torch.ones(1))
        assert single.device.type == "xla"
    with pytest.raises(TypeError, match="at least one"):
        to_device()


def test_importing_tpu_backend_needs_no_torch_xla():
    """With torch_xla unimportable, the package imports and the loop runs on CPU."""
    program = textwrap.dedent(
        f"""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch_xla" or name.startswith("torch_xla."):
                    raise ImportError("torch_xla blocked for this test")
        sys.meta_path.insert(0, Block())
        import tpu_backend, tpu_backend.seamless, tpu_backend.compile_cache, tpu_backend.precision
        assert "torch_xla" not in sys.modules
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_seamless import same_loop
        r = same_loop({{"epochs": 1}})
        assert r["kind"] == "cpu" and r["stats"] == [None] * 4, r
        assert "torch_xla" not in sys.modules
        print("OK", r["losses"][-1] < r["losses"][0])
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "PJRT_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


# -- settings (seed 004 knobs) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"compilation_timeout": 60}, "compilation_timeout=60 is not supported"),
        ({"precision": "fp16"}, "precision 'fp16' is not valid"),
        ({"mixed_precision": "fp16"}, "bfloat16-only"),
        ({"precision": "bf16", "mixed_precision": "bf16"}, "set one of them"),
        ({"compile_cache": True}, "needs compile_cache_dir"),
        ({"compile_cache_dir": "/tmp/x"}, "compile_cache=False"),
        ({"compile_cache_size": 0}, "compile_cache_size 0 is not valid"),
        ({"memory_fraction": 1.5}, r"memory_fraction 1.5 is not valid"),
        ({"compile_cache_readonly": "sometimes"}, "compile_cache_readonly 'sometimes'"),
    ],
)
def test_bad_or_unsupported_settings_are_rejected(settings, match):
    with pytest.raises(ValueError, match=match):
        SeamlessConfig(**settings)


def test_unknown_setting_names_the_valid_ones():
    with pytest.raises(TypeError, match="valid settings: precision, mixed_precision"):
        SeamlessTPUTrainer(torch.nn.Linear(1, 1), learning_rate=3)


def test_memory_fraction_is_rejected_on_xla():
    with (
        xlasim.simulate("2x2"),
        pytest.raises(ValueError, match="memory_fraction=0.5 is not supported on XLA"),
    ):
        SeamlessTPUTrainer(torch.nn.Linear(1, 1), memory_fraction=0.5)


def test_bf16_precision_casts_the_model():
    with xlasim.simulate("2x2"):
        trainer = SeamlessTPUTrainer(torch.nn.Linear(4, 2), precision="bf16")
        assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
        assert {p.device.type for p in trainer.model.parameters()} == {"xla"}
    plain = SeamlessTPUTrainer(torch.nn.Linear(4, 2))
    assert {p.dtype for p in plain.model.parameters()} == {torch.float32}


def test_mixed_precision_is_explicit_and_can_be_off():
    model = torch.nn.Linear(4, 2)
    on = SeamlessTPUTrainer(model, mixed_precision="bf16", device="cpu")
    with on.autocast():
        assert on.model(torch.ones(3, 4)).dtype == torch.bfloat16
    off = SeamlessTPUTrainer(torch.nn.Linear(4, 2), device="cpu")
    with off.autocast():
        assert off.model(torch.ones(3, 4)).dtype == torch.float32


def test_compile_cache_setting_opens_the_persistent_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_PERSISTENT_CACHE_PATH", raising=False)
    monkeypatch.delenv("XLA_COMPILATION_CACHE_SIZE", raising=False)
    with xlasim.simulate("2x2"):
        trainer = SeamlessTPUTrainer(
            torch.nn.Linear(4, 1),
            compile_cache=True,
            compile_cache_dir=str(tmp_path),
            compile_cache_size=64,
        )
        assert os.environ["XLA_PERSISTENT_CACHE_PATH"].startswith(str(tmp_path))
        assert os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] == "0"  # process 0 writes
        assert os.environ["XLA_COMPILATION_CACHE_SIZE"] == "64"
        x = trainer.to_device(torch.ones(2, 4))
        trainer.model(x).sum().backward()
        import torch_xla

        torch_xla.sync()
        stats = trainer.compile_stats()
        assert stats.persistent_misses == 1 and stats.compiles == 1
        assert len(os.listdir(os.environ["XLA_PERSISTENT_CACHE_PATH"])) == 1


# -- the optimizer wrapper -------------------------------------------------------------------


def test_an_optimizer_built_before_prepare_steps_the_moved_parameters():
    with xlasim.simulate("2x2"):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # built on CPU parameters
        trainer = SeamlessTPUTrainer()
        model, optimizer = trainer.prepare(model, optimizer)
        before = model.weight.detach().cpu().clone()
        model(trainer.to_device(torch.ones(2, 4))).sum().backward()
        optimizer.step()
        after = model.weight.detach().cpu()
        assert not torch.equal(before, after)
        assert all(p.device.type == "xla" for g in optimizer.param_groups for p in g["params"])
        assert trainer.steps == 1


def test_optimizer_wrapper_delegates_everything_else():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    trainer = SeamlessTPUTrainer(model, opt, device="cpu")
    wrapped = trainer.optimizer
    assert wrapped.param_groups is opt.param_groups
    wrapped.defaults["lr"] = 0.25
    assert opt.defaults["lr"] == 0.25
    assert isinstance(wrapped, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.StepLR(wrapped, step_size=1, gamma=0.5)
    model(torch.ones(1, 2)).sum().backward()
    wrapped.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.25
    assert "SGD" in repr(wrapped)
    assert wrapped.state_dict()["param_groups"][0]["lr"] == 0.25
    assert trainer.prepare_optimizer(wrapped) is wrapped


def test_prepare_rejects_what_it_cannot_prepare():
    trainer = SeamlessTPUTrainer(device="cpu")
    with pytest.raises(TypeError, match="cannot prepare a int"):
        trainer.prepare(3)


# -- the same loop ---------------------------------------------------------------------------


@pytest.mark.mat_mul_precision("highest")
def test_same_loop_on_cpu_and_on_a_simulated_tpu():
    cpu = same_loop()
    assert cpu["kind"] in ("cpu", "cuda") and cpu["stats"] == [None] * 8
    with xlasim.simulate("2x2"):
        xla = same_loop()
    assert xla["kind"] == "xla" and not xla["spmd"]
    assert xla["losses"] == pytest.approx(cpu["losses"], rel=RTOL)
    _assert_one_graph_per_step(xla["stats"])
    assert xla["losses"][-1] < xla["losses"][0]


@pytest.mark.skipif(torch.__version__ < "2.11", reason="TorchTPU 0.2.0 needs torch >= 2.11")
def test_same_loop_on_torch_tpus_tpu_device():
    cpu = same_loop()
    with xlasim.simulate("2x2"):
        import torch_tpu  # noqa: F401  (loaded: its tpu device is the loop's)

        torch.set_float32_matmul_precision("highest")  # TorchTPU's HIGHEST, to compare with CPU
        tpu = same_loop()
        info = detect_device()
        with pytest.raises(ValueError, match="torch.tpu has no per-process memory fraction"):
            SeamlessTPUTrainer(memory_fraction=0.5)
    assert (info.kind, info.device, tpu["kind"]) == ("tpu", torch.device("tpu", 0), "tpu")
    # Eager: no graphs to count, nothing to synchronize; the losses are the CPU's.
    assert tpu["stats"] == [None] * 8 and tpu["cache"] is None
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=RTOL)
    # Outside the simulation TorchTPU finds no chip: the loop is back on the CPU.
    assert detect_device().kind in ("cpu", "cuda")


@pytest.mark.mat_mul_precision("highest")
def test_same_loop_under_spmd_on_a_simulated_slice():
    cpu = same_loop()
    with xlasim.simulate("2x4", "v6e"):
        import torch_xla.runtime as xr

        from xlasim.reports.recompilation import assert_no_recompilation

        xr.use_spmd()
        with assert_no_recompilation():
            spmd = same_loop()
    assert spmd["spmd"] and spmd["kind"] == "xla"
    assert spmd["losses"] == pytest.approx(cpu["losses"], rel=RTOL)
    _assert_one_graph_per_step(spmd["stats"])


def test_ragged_last_batch_is_reported_as_a_recompilation():
    with xlasim.simulate("2x2"):
        from xlasim.reports.recompilation import recompilations

        same_loop({"global_batch": 24, "epochs": 1})  # 64 = 24 + 24 + 16
        reports = recompilations()
        assert len(reports) == 1, [r.describe() for r in reports]
        text = reports[0].describe()
        assert "shape [24, 8] -> [16, 8]" in text
        assert "shape [24] -> [16]" in text
        assert reports[0].filename == __file__


# -- the same loop in Ray Train ----------------------------------------------------------------


def _ray_loop(config):
    same_loop(config)


HOST_BATCH = 8  # per Ray worker, as Ray Train's own loops size their loaders


def _dataset():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=gen)
    y = torch.tanh(x @ torch.randn(8, 1, generator=gen)).squeeze(1)
    return torch.utils.data.TensorDataset(x, y)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _ray_helpers_loop(config):
    """A Ray Train loop written the usual way: Ray's own helpers, no torch_xla call."""
    import ray.train
    import ray.train.torch

    import tpu_backend  # only to record which host this is

    model = ray.train.torch.prepare_model(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=HOST_BATCH)
    loader = ray.train.torch.prepare_data_loader(loader)
    losses, rows = [], []
    for epoch in range(2):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            rows.append(xb.shape[0])
    host = tpu_backend.get_xla_worker_state().host_index
    record = {
        "model": type(model).__name__,
        "param_device": str(next(model.parameters()).device),
        "sampler": [
            type(loader.sampler).__name__,
            loader.sampler.rank,
            loader.sampler.num_replicas,
        ],
        "rows": rows,
        "losses": losses,
    }
    Path(config["out_dir"], f"ray{host}.json").write_text(json.dumps(record))


def _eager_global_batches(hosts: int) -> list[float]:
    """The losses of :func:`_ray_helpers_loop` in one CPU process: each step's global batch
    is every host's batch (its DistributedSampler's next rows), hosts in order."""
    data = _dataset()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    per_host = [
        list(torch.utils.data.DistributedSampler(data, hosts, h, shuffle=False))
        for h in range(hosts)
    ]
    losses = []
    for _ in range(2):
        for start in range(0, len(per_host[0]), HOST_BATCH):
            index = [i for rows in per_host for i in rows[start : start + HOST_BATCH]]
            x, y = data[index]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


@pytest.mark.timeout(900)
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on this machine
@pytest.mark.mat_mul_precision("highest")
def test_same_loop_in_ray_train_on_gloo_and_on_a_simulated_slice(tpu_clusters, tmp_path):
    pytest.importorskip("ray.train")
    import ray
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig
    from ray.train.torch import TorchTrainer as RayTorchTrainer

    import tpu_backend
    from xlasim.ray.cluster import fit_with_deadline

    # Workers cannot import this test module: ship the loop by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tpu_clusters.release()  # this process's Ray connection is the plain cluster's first

    # (a) plain Ray Train, 2 CPU workers, gloo
    gloo_out = tmp_path / "gloo"
    gloo_out.mkdir()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = RayTorchTrainer(
            _ray_loop,
            train_loop_config={"out_dir": str(gloo_out)},
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(storage_path=str(tmp_path / "ray_gloo")),
        )
        fit_with_deadline(trainer, 300)
    finally:
        ray.shutdown()
    gloo = json.loads((gloo_out / "result0.json").read_text())
    assert gloo["kind"] == "cpu" and gloo["num_processes"] == 2

    # (b) tpu_backend.TorchTrainer on a simulated single-host v6e 2x2 slice (SPMD, 4 chips)
    tpu_out = tmp_path / "tpu"
    tpu_out.mkdir()
    tpu_clusters.get("2x2", "v6e", startup_timeout_s=120)
    trainer = tpu_backend.TorchTrainer(
        _ray_loop,
        train_loop_config={"out_dir": str(tpu_out)},
        scaling_config=ScalingConfig(
            use_tpu=True, topology="2x2", accelerator_type="TPU-V6E", num_workers=1
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_tpu"), worker_runtime_env=run_env()),
    )
    fit_with_deadline(trainer, 300)
    tpu = json.loads((tpu_out / "result0.json").read_text())
    assert tpu["kind"] == "xla" and tpu["spmd"] is True

    assert len(gloo["losses"]) == len(tpu["losses"]) == 8
    worst = max(abs(a - b) / abs(a) for a, b in zip(gloo["losses"], tpu["losses"], strict=True))
    print(
        f"gloo losses {gloo['losses']}\nsimulated-slice losses {tpu['losses']}\n"
        f"max relative difference {worst:.2e}; xla (compiles, executions) {tpu['stats']}"
    )
    assert tpu["losses"] == pytest.approx(gloo["losses"], rel=RTOL)
    _assert_one_graph_per_step(tpu["stats"])
    assert tpu["losses"][-1] < tpu["losses"][0]


@pytest.mark.timeout(900)
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on this machine
def test_backend_compile_cache_makes_the_second_run_compile_nothing(tpu_clusters, tmp_path):
    """TPUTorchConfig(compilation_cache_dir=...) opens torch_xla's persistent cache on the
    worker before any computation; a second fit() of the same loop loads every graph."""
    pytest.importorskip("ray.train")
    import ray
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig

    import tpu_backend
    from xlasim.ray.cluster import fit_with_deadline

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cache_dir = tmp_path / "xla-cache"
    results = []
    tpu_clusters.get("2x2", "v6e", startup_timeout_s=120)
    for run in range(2):
        out = tmp_path / f"run{run}"
        out.mkdir()
        trainer = tpu_backend.TorchTrainer(
            _ray_loop,
            train_loop_config={"out_dir": str(out), "epochs": 1},
            torch_config=tpu_backend.TPUTorchConfig(compilation_cache_dir=str(cache_dir)),
            scaling_config=ScalingConfig(
                use_tpu=True, topology="2x2", accelerator_type="TPU-V6E", num_workers=1
            ),
            run_config=RunConfig(storage_path=str(tmp_path / f"ray{run}")),
        )
        fit_with_deadline(trainer, 300)
        results.append(json.loads((out / "result0.json").read_text()))
    first, second = (r["cache"] for r in results)
    assert first["persistent_cache_dir"].startswith(str(cache_dir))
    assert "v6e-4-2x2" in first["persistent_cache_dir"]
    assert first["persistent_cache_readonly"] is False  # host 0 writes
    assert first["compiles"] == 1 and first["persistent_misses"] == 1
    assert second["persistent_hits"] == 1 and second["persistent_misses"] == 0
    assert second["compiles"] == 0
    assert results[1]["losses"] == results[0]["losses"]


@pytest.mark.timeout(900)
@pytest.mark.mat_mul_precision("highest")
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on this machine
def test_same_loop_on_a_multi_host_simulated_slice(tpu_clusters, tmp_path):
    """v4-16 (2 hosts x 4 chips, mesh (2, 4) over ('data', 'model')): every host runs the
    loop on the same global batch and sees the loss curve of the CPU run.

    On the same cluster, a loop written with Ray's own prepare_model/prepare_data_loader:
    no DDP, each host loads its DistributedSampler's rows and the hosts' batches form one
    global batch, so every host sees the CPU losses of those global batches."""
    pytest.importorskip("ray.train")
    import ray
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig

    import tpu_backend
    from xlasim.ray.cluster import fit_with_deadline

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cpu = same_loop({"settings": {"device": "cpu"}})
    out = tmp_path / "v4-16"
    out.mkdir()
    tpu_clusters.get("2x2x2", "v4", startup_timeout_s=120)
    trainer = tpu_backend.TorchTrainer(
        _ray_loop,
        train_loop_config={"out_dir": str(out)},
        scaling_config=ScalingConfig(
            use_tpu=True, topology="2x2x2", accelerator_type="TPU-V4", num_workers=2
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "ray"), worker_runtime_env=run_env()),
    )
    fit_with_deadline(trainer, 400)
    trainer = tpu_backend.TorchTrainer(
        _ray_helpers_loop,
        train_loop_config={"out_dir": str(out)},
        scaling_config=ScalingConfig(
            use_tpu=True, topology="2x2x2", accelerator_type="TPU-V4", num_workers=2
        ),
        run_config=RunConfig(
            storage_path=str(tmp_path / "ray-helpers"), worker_runtime_env=run_env()
        ),
    )
    fit_with_deadline(trainer, 400)
    hosts = [json.loads((out / f"result{h}.json").read_text()) for h in (0, 1)]
    for host in hosts:
        assert host["kind"] == "xla" and host["spmd"] and host["num_processes"] == 2
        assert host["losses"] == pytest.approx(cpu["losses"], rel=RTOL)
        _assert_one_graph_per_step(host["stats"])
    assert hosts[0]["losses"] == hosts[1]["losses"]

    eager = _eager_global_batches(hosts=2)
    helpers = [json.loads((out / f"ray{h}.json").read_text()) for h in (0, 1)]
    print(f"eager CPU, global batches {eager}\nRay helpers per host {helpers}")
    for h, run in enumerate(helpers):
        assert run["model"] == "Sequential" and run["param_device"] == "xla:0"
        assert run["sampler"] == ["DistributedSampler", h, 2]
        assert run["rows"] == [2 * HOST_BATCH] * 8  # each step's batch is the global one
        assert run["losses"] == pytest.approx(eager, rel=RTOL)
    assert helpers[0]["losses"] == helpers[1]["losses"]
    assert eager[-1] < eager[0]
