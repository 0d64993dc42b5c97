"""Ray 2.60's own ``ray.train.torch.TorchTrainer`` with TPU workers, on simulated v6e slices:
one host of 8 chips (2x4) and four hosts of 4 (4x4).

Nothing of the project stands between Ray and the simulated TorchTPU: a ScalingConfig with
``use_tpu=True`` and ``{"TPU": 1}`` per worker makes Ray pick its ``tpu_dist`` backend
(``ray/train/torch/config.py``), load TorchTPU through ``torch_tpu._loader.load()`` and ask its
TPU device manager for ``torch.device("tpu")`` (``ray/air/_internal/device_manager/tpu.py``);
Ray gives each worker one chip through ``TPU_VISIBLE_CHIPS``. The workers' DDP losses are
compared with an eager CPU run of the same global batch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("ray.train")

from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402
from shared_clusters import CPUS_PER_HOST  # noqa: E402

from xlasim.ray.cluster import fit_with_deadline  # noqa: E402

FIT_TIMEOUT_S = 300
GLOBAL_BATCH = 16  # one sample per worker on the 16 chips of a 4x4
STEPS = 2
# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker.
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("ray"),
    pytest.mark.skipif(
        torch.__version__ < "2.11",
        reason=f"TorchTPU 0.2.0 needs torch >= 2.11, this is {torch.__version__}",
    ),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(GLOBAL_BATCH * STEPS, 8, generator=g),
        torch.randn(GLOBAL_BATCH * STEPS, 1, generator=g),
    )


def _train_loop(config: dict[str, Any]) -> None:
    """A training function as Ray's docs write one; it records what the worker saw."""
    import ray.train
    import ray.train.torch
    import torch_tpu._internal.utils.hardware as hardware

    device = ray.train.torch.get_device()
    torch.set_float32_matmul_precision("highest")  # TorchTPU: HIGHEST, compared with CPU below
    context = ray.train.get_context()
    model = ray.train.torch.prepare_model(_model())
    loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(_data(), batch_size=GLOBAL_BATCH // context.get_world_size())
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ray.train.report({"loss": losses[-1]})
    record = {
        "device": str(device),
        "param_device": str(next(model.parameters()).device),
        "batch_device": str(x.device),
        "backend": torch.distributed.get_backend(),
        "model": type(model).__name__,
        "visible_chips": os.environ.get("TPU_VISIBLE_CHIPS"),
        "host": int(os.environ["TPU_WORKER_ID"]),
        "bound_chip": hardware.bound_chip(),
        # torch.accelerator, not torch.tpu: a driver that has loaded TorchTPU (an earlier test
        # in this process) would have cloudpickle copy torch.tpu's modules by value.
        "device_count": torch.accelerator.device_count(),
        "losses": losses,
    }
    rank = context.get_world_rank()
    (Path(config["out"]) / f"{rank}.json").write_text(json.dumps(record))


def _eager_cpu_losses() -> list[float]:
    """The global batch of each step trained in one eager CPU process. Ray's
    DistributedSampler (no shuffle) deals sample i to rank i % world: each step the ranks'
    batches together are the next GLOBAL_BATCH samples."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data().tensors
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        part = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        loss = torch.nn.functional.mse_loss(model(x[part]), y[part])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# (topology, hosts, chips per host) of the v6e slices Ray runs a worker per chip on.
# The v6e-16 first: tests/test_backend_ray_multi_host.py ends on it, and
# tests/test_backend_ray_single_host.py (next) starts on the v6e-8 (see conftest.RAY_MODULES).
SLICES = [
    pytest.param("4x4", 4, 4, id="v6e-16"),
    pytest.param("2x4", 1, 8, id="v6e-8"),
]


@pytest.mark.parametrize(("topology", "hosts", "chips"), SLICES)
def test_torch_trainer_trains_ddp_over_tpu_dist(
    tpu_clusters: Any, tmp_path: Path, topology: str, hosts: int, chips: int
) -> None:
    import ray.cloudpickle

    # Ray Train gives every worker a CPU beside its chip: each host has one per chip.
    assert CPUS_PER_HOST[topology] == chips
    tpu_clusters.get(topology, "v6e", num_cpus_per_host=chips, startup_timeout_s=120)
    # Workers cannot import this test module: ship the loop by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    workers = hosts * chips
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(
            use_tpu=True,
            topology=topology,
            accelerator_type="TPU-V6E",
            num_workers=workers,
            resources_per_worker={"TPU": 1},
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results")),
    )
    fit_with_deadline(trainer, FIT_TIMEOUT_S)
    records = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(workers)]
    for r in records:
        assert (r["device"], r["param_device"], r["batch_device"]) == ("tpu", "tpu:0", "tpu:0")
        assert (r["backend"], r["model"], r["device_count"]) == (
            "tpu_dist",
            "DistributedDataParallel",
            1,
        )
        # Ray hands each worker one chip; the simulated TorchTPU's device is that chip.
        assert r["bound_chip"] == int(r["visible_chips"])
    # One worker on every chip of every host.
    assert sorted((r["host"], r["bound_chip"]) for r in records) == [
        (h, c) for h in range(hosts) for c in range(chips)
    ]
    mean = torch.tensor([r["losses"] for r in records]).mean(0)
    torch.testing.assert_close(mean, torch.tensor(_eager_cpu_losses()))


def test_multi_slice_worker_counts_are_refused_as_ray_does() -> None:
    # Ray 2.60 (ray/train/v2/api/config.py): TPU workers come in whole slices, 8 on a v6e 2x4.
    with pytest.raises(ValueError, match=r"must be a multiple of 8 for the specified topology"):
        ScalingConfig(
            use_tpu=True,
            topology="2x4",
            accelerator_type="TPU-V6E",
            num_workers=12,
            resources_per_worker={"TPU": 1},
        )
