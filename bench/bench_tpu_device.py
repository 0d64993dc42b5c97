"""The simulated TorchTPU ``tpu`` device vs eager CPU, side by side in one process.

Prints the cost of tiny ops (8x8 ``a + b``, ``a.mul_(1.0)``, ``a.sum()``, ``a @ b``) in the
calling thread's CPU time, and a 1024-wide MLP training step (fwd + bwd + SGD, batch 256) in
process CPU time (autograd runs a device's backward on a thread of its own), on ``cpu`` and on
``tpu``, with their ratio. Targets: tiny ops <= 1.5x, the MLP step <= 1.1x with exact numerics
(``XLASIM_NUMERICS=exact``); at the TPU's precision the step also pays for the matmul emulation
(``highest`` is three CPU matmuls per matmul).

    python bench/bench_tpu_device.py            # XLASIM_NUMERICS=exact for the device alone
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import xlasim

WIDTH = 1024
BATCH = 256


def _per_call(fn: Callable[[], object], calls: int, clock: Callable[[], float]) -> float:
    for _ in range(max(3, calls // 10)):
        fn()
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls


def _tiny_ops(device: str) -> dict[str, float]:
    a = torch.randn(8, 8, device=device)
    b = torch.randn(8, 8, device=device)
    ops: dict[str, Callable[[], object]] = {
        "a + b": lambda: a + b,
        "a.mul_(1.0)": lambda: a.mul_(1.0),
        "a.sum()": lambda: a.sum(),
        "a @ b": lambda: a @ b,
    }
    return {name: _per_call(fn, 20000, time.thread_time) for name, fn in ops.items()}


def _mlp_step(device: str) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, WIDTH, device=device)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    return _per_call(step, 20, time.process_time)


def main() -> None:
    # One intra-op thread: process CPU time then counts work, not OpenMP threads spinning.
    torch.set_num_threads(1)
    with xlasim.simulate("2x2") as runtime:
        import torch_tpu  # noqa: F401

        torch.set_float32_matmul_precision("highest")
        print(f"numerics: {runtime.numerics}, precision: highest, torch {torch.__version__}")
        cpu, tpu = _tiny_ops("cpu"), _tiny_ops("tpu")
        for name in cpu:
            print(
                f"{name:12s} cpu {cpu[name] * 1e6:6.2f} us  tpu {tpu[name] * 1e6:6.2f} us  "
                f"ratio {tpu[name] / cpu[name]:.2f}x"
            )
        cpu_step, tpu_step = _mlp_step("cpu"), _mlp_step("tpu")
        print(
            f"MLP step     cpu {cpu_step * 1e3:6.2f} ms  tpu {tpu_step * 1e3:6.2f} ms  "
            f"ratio {tpu_step / cpu_step:.2f}x"
        )


if __name__ == "__main__":
    main()
