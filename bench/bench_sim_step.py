"""Simulated train step and per-op cost vs eager CPU and real torch_xla CPU, side by side.

Prints ratios measured in one run: sim step / eager step for a 1024-wide MLP (target <= 1.0x)
in process CPU time (all threads: the autograd engine runs a device's backward on a thread of
its own), and the cost of one tiny op (``a + b`` on 4 elements) in the calling thread's CPU
time, in eager CPU, on the simulator and in real torch_xla's lazy tracing (target: sim <= real
torch_xla, about 4 us).  CPU time keeps other processes' load out of the figures.  The floor
rows show where a Python ``__torch_dispatch__`` subclass stands before any simulator work: an
empty handler returning a preallocated tensor, then one that also runs the CPU op, then one
that also wraps the result.

Real torch_xla runs in a child interpreter (it cannot share a process with the simulator):
this interpreter when it has real torch_xla installed, or the one given with ``--real``.

    python bench/bench_sim_step.py            # add --real PY for another interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

WIDTH = 1024
BATCH = 256
STEPS = 20
WARMUP = 3
TINY_OPS = 2000
ROUNDS = 7


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 1),
    )


def train_step_seconds(device: torch.device, sync) -> float:
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH).to(device)
    y = torch.randn(BATCH, 1).to(device)
    best = float("inf")
    for i in range(WARMUP + STEPS):
        start = time.process_time()
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        sync()
        loss.item()
        if i >= WARMUP:
            best = min(best, time.process_time() - start)
    return best


def tiny_op_seconds(a: torch.Tensor, b: torch.Tensor, sync) -> float:
    """Best of ``ROUNDS`` runs of ``TINY_OPS`` additions, per op (the graph cut after each)."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.thread_time()
        for _ in range(TINY_OPS):
            a + b
        best = min(best, (time.thread_time() - start) / TINY_OPS)
        sync()
    return best


def measure(kind: str) -> dict[str, float]:
    if kind == "eager":
        dev, sync = torch.device("cpu"), (lambda: None)
    else:
        import torch_xla

        dev, sync = torch_xla.device(), torch_xla.sync
    a, b = torch.ones(4).to(dev), torch.ones(4).to(dev)
    return {"step": train_step_seconds(dev, sync), "op": tiny_op_seconds(a, b, sync)}


def floor_op_seconds() -> dict[str, float]:
    """Per-op cost of bare ``__torch_dispatch__`` subclasses on the simulated xla device."""
    make = torch.Tensor._make_wrapper_subclass
    dev = torch.device("xla", 0)
    cpu = torch.ones(4)

    class Bare(torch.Tensor):
        __slots__ = ("elem",)
        __torch_function__ = torch._C._disabled_torch_function_impl

    def wrap(cls: type, elem: torch.Tensor) -> torch.Tensor:
        t = make(cls, elem.size(), dtype=elem.dtype, device=dev)
        t.elem = elem
        return t

    class Empty(Bare):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return prealloc

    class RunOp(Bare):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            func(*(a.elem for a in args))
            return prealloc

    class RunOpAndWrap(Bare):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return wrap(RunOpAndWrap, func(*(a.elem for a in args)))

    prealloc = wrap(Empty, cpu)
    return {
        name: tiny_op_seconds(wrap(cls, cpu), wrap(cls, cpu), lambda: None)
        for name, cls in (
            ("empty handler", Empty),
            ("+ run the CPU op", RunOp),
            ("+ wrap the result", RunOpAndWrap),
        )
    }


def _real_interpreter(given: str | None) -> str | None:
    if given:
        return given
    from xlasim.pytest_plugin import real_torch_xla_unavailable

    return sys.executable if real_torch_xla_unavailable() is None else None


def measure_real(python: str) -> dict[str, float]:
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4", OMP_NUM_THREADS="1")
    env.pop("XLASIM_TOPOLOGY", None)
    out = subprocess.run(
        [python, __file__, "--child", "xla"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", help="a Python interpreter with real torch_xla installed")
    parser.add_argument("--child", choices=["eager", "xla"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    real_python = _real_interpreter(args.real)
    import xlasim

    xlasim.register_xla_device()  # before the eager runs' backward passes

    # Interleaved, best of three: machine noise hits every measurement alike.
    eager, sim, floor = [], [], []
    for _ in range(3):
        eager.append(measure("eager"))
        with xlasim.simulate("2x2"):
            sim.append(measure("xla"))
        floor.append(floor_op_seconds())
    real = [measure_real(real_python) for _ in range(2)] if real_python else []

    def best(runs: list[dict[str, float]], key: str) -> float:
        return min(r[key] for r in runs)

    e_step, s_step = best(eager, "step"), best(sim, "step")
    print(
        f"torch {torch.__version__}; MLP {WIDTH}-wide train step: eager {e_step * 1e3:.2f} ms, "
        f"sim {s_step * 1e3:.2f} ms, sim/eager {s_step / e_step:.2f}x (target <= 1.0x)"
    )
    rows = [("eager CPU", best(eager, "op")), ("xlasim", best(sim, "op"))]
    if real:
        r_step = best(real, "step")
        print(
            f"real torch_xla CPU ({real_python}): step {r_step * 1e3:.2f} ms, "
            f"real/eager {r_step / e_step:.2f}x"
        )
        rows.append(("real torch_xla", best(real, "op")))
    rows += [(f"floor: {name}", best(floor, name)) for name in floor[0]]
    eager_op = rows[0][1]
    print(f"tiny op (a + b, 4 elements), best of {ROUNDS}x{TINY_OPS}:")
    for name, seconds in rows:
        print(f"  {name:<28} {seconds * 1e6:6.2f} us  {seconds / eager_op:5.1f}x eager")


if __name__ == "__main__":
    sys.exit(main())
