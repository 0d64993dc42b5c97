"""Load check: many cold ``xlasim run`` children at once all exit 0 with the right answer.

Each batch starts ``--concurrency`` children together against a fresh, empty extension build
directory (``TORCH_EXTENSIONS_DIR``), so every batch builds the simulator's C++ extension while
its children race for it, import torch, run a backward pass on ``xla`` tensors and exit; on a
2-core machine that is the load under which a rare exit-time abort showed up. The check passes
when every one of ``--runs`` children exits 0 and prints the expected line.

    python bench/load_xlasim_run.py [--runs 50 --concurrency 8 --timeout 900]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

PROGRAM = """
import torch, torch_xla, torch_xla.runtime as xr
w = torch.ones(3, device=torch_xla.device(), requires_grad=True)
(w * w).sum().backward()
print(xr.global_runtime_device_count(), w.grad.cpu().tolist())
"""
EXPECTED = "4 [2.0, 2.0, 2.0]"


def _start(ext_dir: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    env["TORCH_EXTENSIONS_DIR"] = ext_dir
    return subprocess.Popen(
        [sys.executable, "-m", "xlasim", "run", "--topology", "2x2x1", "--accelerator", "v4"]
        + ["--", sys.executable, "-c", PROGRAM],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900.0, help="per batch, seconds")
    args = parser.parse_args(argv)

    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    done = 0
    t0 = time.monotonic()
    while done < args.runs:
        n = min(args.concurrency, args.runs - done)
        with tempfile.TemporaryDirectory(prefix="xlasim-load-ext-") as ext_dir:
            start = time.monotonic()
            children = [_start(ext_dir) for _ in range(n)]
            deadline = start + args.timeout
            for child in children:
                try:
                    out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    out, err = child.communicate()
                    outcomes["timed out"] += 1
                    failures.append(f"timed out after the {args.timeout:.0f}s batch bound")
                    continue
                if child.returncode != 0:
                    outcomes[f"exit {child.returncode}"] += 1
                    failures.append(f"exit {child.returncode}: {err.strip()[-500:]}")
                elif out.strip() != EXPECTED:
                    outcomes["wrong output"] += 1
                    failures.append(f"printed {out.strip()!r}, expected {EXPECTED!r}")
                else:
                    outcomes["ok"] += 1
        done += n
        print(
            f"batch of {n}: {time.monotonic() - start:5.1f}s; {done}/{args.runs} runs, "
            f"{sum(v for k, v in outcomes.items() if k != 'ok')} failed",
            flush=True,
        )
    bad = args.runs - outcomes["ok"]
    print()
    for failure in failures:
        print("  " + failure)
    print(
        f"{args.runs} cold `xlasim run` children, {args.concurrency} at a time, "
        f"{time.monotonic() - t0:.0f}s: {outcomes['ok']} ok, {bad} failed "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(outcomes.items()) if k != 'ok') or 'none'})"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
