"""First SPMD step of deep networks: sharded vs unsharded on the simulator, side by side.

The first step traces the whole forward, backward and optimizer graph and, under SPMD, settles
every graph output's sharding; a graph pass that revisits shared values grows exponentially
with the number of skip connections, and per-value bookkeeping shows at small widths, where
the computation itself is cheap.  Printed: first-step seconds of a residual MLP at depths
8..64, widths 32 (bookkeeping-bound) and 1024 (compute-bound), and of a ResNet-50-shaped
network, each without SPMD ("plain"), under SPMD with nothing annotated ("spmd") and with
sharded weights and batch ("sharded"), and the ratio sharded / plain (target <= 1.5x).

    python bench/bench_spmd_graphs.py [--depths 8 16 32 64] [--widths 32 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from _models import ResidualMLP, ResNet50Shaped, timed, train_step

MODES = ("plain", "spmd", "sharded")


def _mlp(depth: int, width: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return ResidualMLP(width, depth), torch.randn(16, width), torch.randn(16, 1)


def _resnet() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return ResNet50Shaped(shrink=8), torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))


def first_step_seconds(make, mode: str) -> float:
    """One fresh simulated 2x2 slice: place the model, then time its first train step."""
    import xlasim

    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        if mode != "plain":
            xr.use_spmd()
        model, x, y = make()
        dev = torch_xla.device()
        model = model.to(dev)
        x, y = x.to(dev), y.to(dev)
        if mode == "sharded":
            mesh = xs.Mesh(np.arange(4), (2, 2), ("data", "model"))
            for p in model.parameters():
                if p.dim() >= 2:  # weights: output features/channels over 'model'
                    xs.mark_sharding(p, mesh, ("model",) + (None,) * (p.dim() - 1))
            xs.mark_sharding(x, mesh, ("data",) + (None,) * (x.dim() - 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        torch_xla.sync()

        def step() -> None:
            loss = train_step(model, opt, x, y)
            torch_xla.sync()
            loss.item()

        return timed(step)


def _row(label: str, make, repeats: int) -> None:
    # Interleaved and the best of ``repeats``: machine noise hits all modes alike.
    best = dict.fromkeys(MODES, float("inf"))
    for _ in range(repeats):
        for mode in MODES:
            best[mode] = min(best[mode], first_step_seconds(make, mode))
    cells = "  ".join(f"{m} {best[m] * 1e3:8.1f} ms" for m in MODES)
    print(
        f"{label:<24}{cells}  sharded/plain {best['sharded'] / best['plain']:.2f}x "
        f"sharded/spmd {best['sharded'] / best['spmd']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-resnet", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import xlasim

    xlasim.register_xla_device()
    for mode in MODES:  # one-time costs (first use of each op) stay out of the rows
        first_step_seconds(lambda: _mlp(2, 32), mode)
    print("first train step (target: sharded/plain <= 1.5x)")
    for width in args.widths:
        for depth in args.depths:
            _row(
                f"residual MLP w{width} d{depth}",
                lambda depth=depth, width=width: _mlp(depth, width),
                args.repeats,
            )
    if not args.no_resnet:
        for mode in MODES:
            first_step_seconds(_resnet, mode)
        _row("ResNet-50-shaped", _resnet, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
