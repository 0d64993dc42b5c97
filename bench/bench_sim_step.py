"""Simulated train step vs eager CPU (and real torch_xla CPU when installed), side by side.

Prints ratios measured in one run: sim step / eager step for a 1024-wide MLP (target <= 1.2x)
and the per-op overhead of the simulator on tiny ops (target <= 30 us).

    python bench/bench_sim_step.py            # sim vs eager in this interpreter
    python bench/bench_sim_step.py --real PY  # also real torch_xla CPU, run by interpreter PY
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

WIDTH = 1024
BATCH = 256
STEPS = 30
WARMUP = 5
TINY_OPS = 2000


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 1),
    )


def train_step_seconds(device: torch.device, sync) -> list[float]:
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDTH).to(device)
    y = torch.randn(BATCH, 1).to(device)
    times = []
    for i in range(WARMUP + STEPS):
        start = time.perf_counter()
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        sync()
        loss.item()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def tiny_op_seconds(device: torch.device, sync) -> float:
    a = torch.ones(4).to(device)
    b = torch.ones(4).to(device)
    for _ in range(200):
        a + b
    sync()
    start = time.perf_counter()
    for _ in range(TINY_OPS):
        a + b
    elapsed = time.perf_counter() - start
    sync()
    return elapsed / TINY_OPS


def measure_current(kind: str) -> dict[str, float]:
    if kind == "eager":
        dev, sync = torch.device("cpu"), (lambda: None)
    else:
        import torch_xla

        dev, sync = torch_xla.device(), torch_xla.sync
    steps = train_step_seconds(dev, sync)
    return {"step": statistics.median(steps), "op": tiny_op_seconds(dev, sync)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", help="a Python interpreter with real torch_xla installed")
    parser.add_argument("--child", choices=["eager", "xla"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_current(args.child)))
        return
    torch.set_num_threads(1)
    import xlasim

    xlasim.register_xla_device()  # before the eager runs' backward passes

    # Interleave the two measurements so machine noise hits both alike.
    eager, sim = [], []
    for _ in range(3):
        eager.append(measure_current("eager"))
        with xlasim.simulate("2x2"):
            sim.append(measure_current("xla"))
    e_step = min(r["step"] for r in eager)
    s_step = min(r["step"] for r in sim)
    e_op = min(r["op"] for r in eager)
    s_op = min(r["op"] for r in sim)
    print(
        f"MLP {WIDTH}-wide train step: eager {e_step * 1e3:.2f} ms, sim {s_step * 1e3:.2f} ms, "
        f"ratio sim/eager {s_step / e_step:.2f}x (target <= 1.2x)"
    )
    print(
        f"tiny op: eager {e_op * 1e6:.1f} us, sim {s_op * 1e6:.1f} us, "
        f"sim overhead {(s_op - e_op) * 1e6:.1f} us/op (target <= 30 us)"
    )
    if args.real:
        env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4", OMP_NUM_THREADS="1")
        env.pop("XLASIM_TOPOLOGY", None)
        out = subprocess.run(
            [args.real, __file__, "--child", "xla"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        ).stdout
        real = json.loads(out.strip().splitlines()[-1])
        print(
            f"real torch_xla CPU: step {real['step'] * 1e3:.2f} ms "
            f"(ratio real/eager {real['step'] / e_step:.2f}x), tiny op {real['op'] * 1e6:.1f} us"
        )


if __name__ == "__main__":
    sys.exit(main())
