"""Time from ``fit()`` to the first reported step: simulated v4-16 through the XLA backend
versus a plain 2-worker CPU ``TorchTrainer`` (gloo), measured side by side in one run.

Both trainers run on the same fake-TPU Ray cluster (2 host nodes, started once, its
start-up reported separately), alternating, ``--repeats`` times each; the ratio of the
medians is printed (target <= 1.15x).  The first report reaches the driver's controller
through a ``UserCallback`` that writes a timestamp file.

    python bench/bench_fit.py [--topology 2x2x2 --accelerator v4 --repeats 2 --steps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.train import RunConfig, ScalingConfig, UserCallback
from ray.train.torch import TorchTrainer as RayTorchTrainer

import tpu_backend
from xlasim.cli import demo
from xlasim.ray.cluster import fit_with_deadline, simulated_tpu_cluster


class FirstReport(UserCallback):
    """Writes the wall-clock time of the run's first report (runs in the controller)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_report(self, run_context, metrics, checkpoint) -> None:  # noqa: ANN001
        p = Path(self.path)
        if not p.exists():
            p.write_text(repr(time.time()))


def cpu_train_loop(config: dict) -> None:
    """The demo's model and problem on plain CPU workers with DDP over gloo."""
    import ray.train
    import ray.train.torch
    import torch

    torch.manual_seed(0)
    width = int(config.get("width", 32))
    model = torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    )
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    batch = int(config.get("batch", 64))
    x = torch.randn(batch, 16, generator=gen)
    y = torch.tanh(x @ torch.randn(16, 1, generator=gen))
    ctx = ray.train.get_context()
    shard = slice(ctx.get_world_rank(), None, ctx.get_world_size())
    for step in range(int(config.get("steps", 3))):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
        loss.backward()
        optimizer.step()
        ray.train.report({"step": step, "loss": float(loss.item())})


def _timed_fit(make_trainer, tmp: str, label: str, timeout_s: float) -> tuple[float, float]:
    stamp = os.path.join(tmp, f"{label}-{time.monotonic_ns()}.first")
    trainer = make_trainer(stamp)
    t0 = time.time()
    fit_with_deadline(trainer, timeout_s)
    total = time.time() - t0
    first = float(Path(stamp).read_text()) - t0
    return first, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", default="2x2x2")
    parser.add_argument("--accelerator", default="v4")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)

    spec = tpu_backend.parse_slice(args.topology, args.accelerator)
    results: dict[str, list[tuple[float, float]]] = {"xla": [], "cpu": []}
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        t0 = time.monotonic()
        with simulated_tpu_cluster(spec.topology, spec.accelerator) as cluster:
            print(
                f"fake-TPU cluster ({spec.pod_type}, {spec.num_hosts} host nodes) up in "
                f"{time.monotonic() - t0:.1f}s",
                flush=True,
            )

            def xla_trainer(stamp: str):
                out = os.path.join(tmp, f"rec-{time.monotonic_ns()}")
                os.makedirs(out)
                return tpu_backend.TorchTrainer(
                    demo.train_loop,
                    train_loop_config={"steps": args.steps, "batch": 64, "out_dir": out},
                    scaling_config=ScalingConfig(
                        use_tpu=True,
                        topology=spec.topology,
                        accelerator_type=spec.ray_accelerator_type,
                        num_workers=spec.num_hosts,
                    ),
                    run_config=RunConfig(
                        storage_path=os.path.join(tmp, "rr"), callbacks=[FirstReport(stamp)]
                    ),
                )

            def cpu_trainer(stamp: str):
                return RayTorchTrainer(
                    cpu_train_loop,
                    train_loop_config={"steps": args.steps, "batch": 64},
                    scaling_config=ScalingConfig(num_workers=spec.num_hosts),
                    run_config=RunConfig(
                        storage_path=os.path.join(tmp, "rr"), callbacks=[FirstReport(stamp)]
                    ),
                )

            for rep in range(args.repeats):
                for label, make in (("xla", xla_trainer), ("cpu", cpu_trainer)):
                    first, total = _timed_fit(make, tmp, label, args.timeout)
                    results[label].append((first, total))
                    print(
                        f"run {rep + 1} {label:>3}: first report {first:6.1f}s, fit {total:6.1f}s",
                        flush=True,
                    )
            del cluster
    assert not ray.is_initialized()
    med = {k: statistics.median(f for f, _ in v) for k, v in results.items()}
    ratio = med["xla"] / med["cpu"]
    print()
    print(f"fit() -> first reported step, median of {args.repeats}:")
    print(f"  simulated {spec.pod_type} via tpu_backend.TorchTrainer: {med['xla']:.1f}s")
    print(f"  plain {spec.num_hosts}-worker CPU TorchTrainer (gloo):      {med['cpu']:.1f}s")
    print(f"  ratio: {ratio:.2f}x (target <= 1.15x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
