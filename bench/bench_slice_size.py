"""A sharded train step on a 256-chip slice in one process vs a 4-chip slice vs eager CPU.

The simulator computes the global value once whatever the slice size; only shard bookkeeping
grows with the chip count.  This prints the median step time of a small MLP whose weights and
batch are sharded over a (devices/2, 2) ('data', 'model') mesh, on v6e 2x2
(4 chips, one host), v5p 4x8x8 and v6e 16x16 (256 chips, 64 hosts), next to the same step in
eager CPU torch, and the ratios (target: 256-chip / eager <= 10x).

One process stands for every host of the multi-host slices (``simulate(single_process=True)``):
the absent hosts enter the same data as host 0, as when every host loads identical data.

    python bench/bench_slice_size.py [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
from _models import train_step

SLICES = (("2x2", "v6e"), ("4x8x8", "v5p"), ("16x16", "v6e"))
WIDTH, BATCH = 256, 256


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)
    )


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)


def _median_step(step, steps: int) -> float:
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return statistics.median(times)


def eager_step_seconds(steps: int) -> float:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = _data()
    return _median_step(lambda: train_step(model, opt, x, y).item(), steps)


def sim_step_seconds(topology: str, accelerator: str, steps: int) -> tuple[float, float]:
    """(seconds to build the mesh, place and annotate everything and run the first step,
    median seconds of a later step); the per-simulation import of the simulated modules is
    left out of both."""
    import xlasim

    with xlasim.simulate(topology, accelerator, single_process=True) as rt:
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        start = time.process_time()

        xr.use_spmd()
        n = rt.spec.num_devices
        names = ("data", "model")
        mesh = xs.Mesh(np.arange(n), (n // 2, 2), names)
        dev = torch_xla.device()
        model = _model().to(dev)
        for layer in (model[0], model[2]):
            xs.mark_sharding(layer.weight, mesh, (names[1], None))
        x, y = (t.to(dev) for t in _data())
        xs.mark_sharding(x, mesh, (names[0], None))
        xs.mark_sharding(y, mesh, (names[0], None))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step() -> None:
            loss = train_step(model, opt, x, y)
            torch_xla.sync()
            loss.item()

        step()
        setup = time.process_time() - start
        return setup, _median_step(step, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import xlasim

    xlasim.register_xla_device()
    sim_step_seconds("2x2", "v6e", 1)  # the simulated modules' first import stays out
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeats):  # interleaved, best of: noise hits every row alike
        rows = {"eager": (float("nan"), eager_step_seconds(args.steps))}
        for topology, accelerator in SLICES:
            rows[f"{accelerator} {topology}"] = sim_step_seconds(topology, accelerator, args.steps)
        for name, (setup, step) in rows.items():
            old = best.get(name, (setup, step))
            best[name] = (min(old[0], setup), min(old[1], step))
    eager = best["eager"][1]
    four_setup, four = best["v6e 2x2"]
    print(f"sharded MLP ({WIDTH} wide, batch {BATCH}); step: median of {args.steps}")
    print("  slice        setup+1st step    step       step/eager  step/4-chip  setup/4-chip")
    for name, (setup, step) in best.items():
        print(
            f"  {name:<12} {setup * 1e3:10.1f} ms {step * 1e3:8.2f} ms  {step / eager:8.2f}x"
            f"  {step / four:9.2f}x  {setup / four_setup:10.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
