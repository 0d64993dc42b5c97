"""Cost and error of the simulated TPU's matmul precisions, side by side in one run.

For each shape, an ``xla`` tensor matmul (or convolution) on a simulated v4 slice at each
mat-mul precision, against the same op with ``XLASIM_NUMERICS=exact`` (the CPU kernel as it is):
the time ratios (targets: default <= 1.3x, high <= 4x, highest <= 7x) and the maximum error
against a float64 product, next to exact float32's. Times are the calling thread's CPU time,
medians over interleaved rounds, so other processes' load stays out of the figures.

    python bench/bench_matmul_precision.py
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

import xlasim

ROUNDS = 9
TARGETS = {"default": 1.3, "high": 4.0, "highest": 7.0}
CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[tuple[int, ...], ...]]] = {
    "mm [256,1024]@[1024,1024]": (torch.mm, ((256, 1024), (1024, 1024))),
    "mm [64,256]@[256,64]": (torch.mm, ((64, 256), (256, 64))),
    "bmm [16,128,64]@[16,64,128]": (torch.bmm, ((16, 128, 64), (16, 64, 128))),
    "conv2d [8,64,32,32]*[64,64,3,3]": (
        lambda x, w: torch.nn.functional.conv2d(x, w, padding=1),
        ((8, 64, 32, 32), (64, 64, 3, 3)),
    ),
}


def _cpu_seconds(fn: Callable[[], object], repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - start) / repeat


def _measure(numerics: str, level: str, op, inputs, repeat: int) -> tuple[float, torch.Tensor]:
    os.environ["XLASIM_NUMERICS"] = numerics
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        torch_xla._XLAC._xla_set_mat_mul_precision(level)
        dev = torch_xla.device()
        on_device = [t.to(dev) for t in inputs]
        result = op(*on_device).cpu()
        seconds = _cpu_seconds(lambda: op(*on_device), repeat)
        torch_xla.sync()
    return seconds, result


def main() -> None:
    torch.set_num_threads(1)
    saved = os.environ.get("XLASIM_NUMERICS")
    try:
        for name, (op, shapes) in CASES.items():
            g = torch.Generator().manual_seed(0)
            inputs = [torch.randn(*s, generator=g) for s in shapes]
            exact64 = op(*(t.double() for t in inputs))
            flops = 1.0
            for d in shapes[0]:
                flops *= d
            repeat = max(1, int(2e8 / (flops * shapes[1][-1])))
            times: dict[str, list[float]] = {k: [] for k in ("exact", *TARGETS)}
            errors: dict[str, float] = {}
            for _ in range(ROUNDS):
                for level in times:
                    numerics = "exact" if level == "exact" else "tpu"
                    seconds, result = _measure(
                        numerics, "default" if level == "exact" else level, op, inputs, repeat
                    )
                    times[level].append(seconds)
                    errors[level] = (result.double() - exact64).abs().max().item()
            base = statistics.median(times["exact"])
            print(f"{name}: exact f32 {base * 1e3:.2f} ms, max error {errors['exact']:.2e}")
            for level, target in TARGETS.items():
                ratio = statistics.median(times[level]) / base
                verdict = "ok" if ratio <= target else "OVER"
                print(
                    f"  {level:8s} {ratio:5.2f}x exact (target <= {target}x, {verdict}), "
                    f"max error {errors[level]:.2e}"
                )
    finally:
        if saved is None:
            os.environ.pop("XLASIM_NUMERICS", None)
        else:
            os.environ["XLASIM_NUMERICS"] = saved


if __name__ == "__main__":
    main()
