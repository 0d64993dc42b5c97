"""Will it fit: three answers to "how much HBM does one chip need for this training step",
side by side in one run, per model and slice.

* **sim**: the simulator's own per-chip model (``xlasim.chip_memory()``, the running totals of
  live device buffers) after the second step, when parameters, gradients and AdamW state all
  exist;
* **libtpu**: the real TPU compiler's figures for the second step's graph
  (``xlasim.compiled_graphs()``): arguments, outputs, aliased bytes, temporaries and program;
  ``live`` = arguments + outputs - aliased (every buffer alive at the step's end: what the
  simulator counts), ``peak`` adds temporaries and program;
* **hand**: counted here from the parameter shapes and the sharding rule the bench applies:
  (parameters + gradients + 2 AdamW moments) / shards, plus the batch and the model's buffers.

The ratios ``sim/hand`` and ``live/hand`` should be 1.00: a difference is a finding, printed,
never hidden.  Also printed: the compile time of each step's graph against the parameter count
(one run, a shared machine: compare rows, not absolute seconds).  Every case is a dry run, so
no value is computed.  Needs the ``tpu-compiler`` extra::

    python bench/bench_will_it_fit.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _models import ResidualMLP
from torch import nn

import xlasim

MIB = 1 << 20


@dataclass
class Case:
    name: str
    topology: str
    accelerator: str
    # mesh shape over (data, model); a parameter's first dimension is split over "model"
    # (or over both axes for FSDP), the batch over "data".
    mesh: tuple[int, int]
    fsdp: bool
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def _mlp_case(width: int, depth: int, topology: str, mesh: tuple[int, int]) -> Case:
    batch = 64 * mesh[0]
    return Case(
        name=f"residual MLP {width}x{depth}",
        topology=topology,
        accelerator="v5e",
        mesh=mesh,
        fsdp=False,
        build=lambda: ResidualMLP(width, depth),
        batch=lambda: (torch.randn(batch, width), torch.randn(batch, 1)),
        loss=lambda model, x, y: F.mse_loss(model(x), y),
    )


def _llama_case(dim: int, layers: int, topology: str, accelerator: str, devices: int) -> Case:
    seq, vocab = 512, 32000

    def build() -> nn.Module:
        # The 8B program's model, scaled down (it imports torch_xla: inside the simulation).
        from dry_run_8b import Llama

        return Llama(vocab, dim, layers, dim * 7 // 2, dim // 128, max(dim // 512, 1), seq)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, vocab, (devices, seq))
        return tokens, torch.randint(0, vocab, (devices, seq))

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    return Case(
        name=f"Llama-shaped d{dim} x{layers}",
        topology=topology,
        accelerator=accelerator,
        mesh=(devices, 1),
        fsdp=True,
        build=build,
        batch=batch,
        loss=loss,
    )


def cases(quick: bool) -> list[Case]:
    if quick:
        return [_mlp_case(1024, 2, "2x2", (2, 2))]
    return [
        _mlp_case(1024, 4, "4x4", (4, 4)),
        _mlp_case(2048, 4, "4x4", (4, 4)),
        _mlp_case(4096, 4, "4x4", (4, 4)),
        _mlp_case(4096, 4, "2x2", (2, 2)),
        _llama_case(512, 4, "2x4", "v6e", 8),
        _llama_case(1024, 4, "2x2x2", "v5p", 8),
    ]


def _shards(case: Case, shape: torch.Size) -> int:
    """How many pieces the bench's rule cuts a parameter into (1: replicated)."""
    if len(shape) != 2:
        return 1
    ways = case.mesh[0] * case.mesh[1] if case.fsdp else case.mesh[1]
    return ways if shape[0] % ways == 0 else 1


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def hand_count(case: Case, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Per chip: parameters, gradients and AdamW's two moments, each split as its parameter
    is; the batch split over the data axis; the model's buffers (replicated)."""
    state = sum(4 * _nbytes(p) // _shards(case, p.shape) for p in model.parameters())
    data = (_nbytes(x) + _nbytes(y)) // case.mesh[0]
    buffers = sum(_nbytes(b) for b in model.buffers())
    return state + data + buffers


def run_case(case: Case) -> dict[str, Any]:
    with xlasim.simulate(
        topology=case.topology, accelerator=case.accelerator, compiler="libtpu", dry_run=True
    ):
        # torch_xla is the simulator's only inside a simulation.
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        dev = torch_xla.device()
        mesh = xs.Mesh(np.arange(math.prod(case.mesh)), case.mesh, ("data", "model"))
        model = case.build().to(dev)
        split = ("data", "model") if case.fsdp else "model"
        for p in model.parameters():
            if _shards(case, p.shape) > 1:
                xs.mark_sharding(p, mesh, (split, None))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = (t.to(dev) for t in case.batch())
        for t in (x, y):
            xs.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            case.loss(model, x, y).backward()
            optimizer.step()
            torch_xla.sync()
        sim = max(row["bytes"] for row in xlasim.chip_memory())
        graphs = xlasim.compiled_graphs()
        params = sum(p.numel() for p in model.parameters())
        hand = hand_count(case, model, x, y)
    step = graphs[-1]
    return {
        "case": case,
        "params": params,
        "sim": sim,
        "hand": hand,
        "graph": step,
        "compile": [g.compile_seconds for g in graphs],
        "trace": [g.trace_seconds for g in graphs],
    }


def _mib(n: float) -> str:
    return f"{n / MIB:9.1f}"


def report(rows: list[dict[str, Any]]) -> None:
    print(
        "\nPer chip, MiB (differences in bytes), after the second step (AdamW state exists); "
        "hand = counted from shapes"
    )
    head = (
        f"{'model':<24} {'slice':<10} {'params':>11} {'hand':>9} {'sim':>9} {'args':>9} "
        f"{'out':>9} {'alias':>9} {'live':>9} {'temp':>9} {'peak':>9} {'sim/hand':>8} "
        f"{'live/hand':>9} {'sim-hand':>9} {'live-hand':>9}"
    )
    print(head)
    for r in rows:
        g, case = r["graph"], r["case"]
        live = g.argument_bytes + g.output_bytes - g.alias_bytes
        print(
            f"{case.name:<24} {case.accelerator + ' ' + case.topology:<10} {r['params']:>11,} "
            f"{_mib(r['hand'])} {_mib(r['sim'])} {_mib(g.argument_bytes)} {_mib(g.output_bytes)} "
            f"{_mib(g.alias_bytes)} {_mib(live)} {_mib(g.temp_bytes)} {_mib(g.peak_bytes)} "
            f"{r['sim'] / r['hand']:8.3f} {live / r['hand']:9.3f} "
            f"{r['sim'] - r['hand']:>9,} {live - r['hand']:>9,}"
        )
    print("\nCompile time (libtpu) and replay/lowering time per graph, seconds, against model size")
    print(
        f"{'model':<24} {'slice':<10} {'params':>11} {'compile 1':>10} {'compile 2':>10} "
        f"{'trace 1':>8} {'trace 2':>8} {'s per 1M params':>16}"
    )
    for r in rows:
        case = r["case"]
        c, t = r["compile"], r["trace"]
        print(
            f"{case.name:<24} {case.accelerator + ' ' + case.topology:<10} {r['params']:>11,} "
            f"{c[0]:10.1f} {c[-1]:10.1f} {t[0]:8.1f} {t[-1]:8.1f} "
            f"{c[-1] / (r['params'] / 1e6):16.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one small case")
    args = parser.parse_args(argv)
    rows = []
    for case in cases(args.quick):
        start = time.perf_counter()
        rows.append(run_case(case))
        print(
            f"{case.name} on {case.accelerator} {case.topology}: "
            f"{time.perf_counter() - start:.1f}s",
            flush=True,
        )
    report(rows)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process: {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
