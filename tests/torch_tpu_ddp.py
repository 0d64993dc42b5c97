"""A DDP training function as Ray's docs write one for TorchTPU workers, what each worker
records, and its reference: the same global batch trained in one eager CPU process. Shared by
the Ray tests that run Ray's own ``TorchTrainer(use_tpu=True)`` on a local simulated cluster
and on ``xlasim ray-node`` machines (workers get this module by value, see
``ray.cloudpickle.register_pickle_by_value``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

GLOBAL_BATCH = 16  # one sample per worker on the 16 chips of a 4x4
STEPS = 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(GLOBAL_BATCH * STEPS, 8, generator=g),
        torch.randn(GLOBAL_BATCH * STEPS, 1, generator=g),
    )


def train_loop(config: dict[str, Any]) -> None:
    """Writes ``{rank}.json`` under ``config["out"]``: what the worker saw and its losses."""
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


def eager_cpu_losses() -> list[float]:
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


def check_records(out: Path, hosts: int, chips: int) -> None:
    """One DDP worker over ``tpu_dist`` on every chip of every host, with eager CPU's losses."""
    records = [json.loads((out / f"{r}.json").read_text()) for r in range(hosts * chips)]
    for r in records:
        assert (r["device"], r["param_device"], r["batch_device"]) == ("tpu", "tpu:0", "tpu:0")
        assert (r["backend"], r["model"], r["device_count"]) == (
            "tpu_dist",
            "DistributedDataParallel",
            1,
        )
        # Ray hands each worker one chip; the simulated TorchTPU's device is that chip.
        assert r["bound_chip"] == int(r["visible_chips"])
    assert sorted((r["host"], r["bound_chip"]) for r in records) == [
        (h, c) for h in range(hosts) for c in range(chips)
    ]
    mean = torch.tensor([r["losses"] for r in records]).mean(0)
    torch.testing.assert_close(mean, torch.tensor(eager_cpu_losses()))
