"""A newcomer's first hour, timed: the README's steps from a fresh clone in a fresh venv.

Steps, each a separate command with its own time limit (a step that runs past it fails and
names the limit; the later steps are skipped):

1. ``git clone`` the repository (a local path or URL; default: this checkout's committed HEAD);
2. a fresh venv; ``pip install torch==2.13.0`` then ``pip install -e '.[ray]'``, as the README says;
3. ``xlasim demo --topology 2x2x2 --accelerator v4`` (the README's first command);
4. the tests: ``--tests`` (default: the README's ``pip install tox && tox -e sim``);
5. the user's own torch_xla program under ``xlasim run --topology 2x2x1 --accelerator v4``;
6. a downstream package's own tests using the installed pytest plugin (``xla_target``), after
   ``pip install pytest`` (the README says so: pytest is not a dependency).

Prints one line per step and a table of seconds at the end; ``--json FILE`` also writes them.
pip's download cache is used as it is; the C++ extension cache starts empty.
Everything lives under ``--workdir`` (a new temporary directory by default, removed unless
``--keep``).  Timings vary with machine load; compare them only with runs on the same machine.

    python bench/first_hour.py [--repo URL_OR_PATH] [--tests "pytest -q tests/test_cli.py"]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OWN_MODEL = """\
# A user's own torch_xla 2.9 SPMD program: nothing in it knows about the simulator.
import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()
n = xr.global_runtime_device_count()
mesh = xs.Mesh(np.arange(n), (n, 1), ("data", "model"))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
model = model.to(torch_xla.device())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randn(64, 1)
for step in range(5):
    xb = x.to(torch_xla.device())
    xs.mark_sharding(xb, mesh, ("data", None))
    loss = torch.nn.functional.mse_loss(model(xb), y.to(torch_xla.device()))
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
print(f"devices={n} loss={loss.item():.4f}")
"""

DOWNSTREAM_TEST = """\
import torch


def test_matmul_on_every_target(xla_target):
    import torch_xla
    import torch_xla.runtime as xr

    a = torch.ones(4, 4, device=torch_xla.device())
    assert (a @ a).sum().item() == 64.0
    assert xr.global_runtime_device_count() == xla_target.num_devices
"""


@dataclass
class Step:
    name: str
    argv: list[str]
    limit_s: int
    cwd: Path
    seconds: float | None = None
    outcome: str = "skipped"


def _run(step: Step, env: dict[str, str], log_dir: Path) -> bool:
    log = log_dir / f"{step.name}.log"
    print(f"--> {step.name}: {shlex.join(step.argv)}  (limit {step.limit_s} s, log {log})")
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                step.argv,
                cwd=step.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=step.limit_s,
                check=False,
            )
            step.outcome = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            step.outcome = f"ran past its {step.limit_s} s limit"
    step.seconds = time.perf_counter() - start
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    print(f"    {step.outcome} in {step.seconds:.1f} s" + "".join(f"\n    | {t}" for t in tail))
    return step.outcome == "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repo", default=str(ROOT), help="what to git clone (default: %(default)s)"
    )
    parser.add_argument("--python", default=sys.executable, help="makes the venv")
    parser.add_argument("--workdir", type=Path, help="default: a new temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the workdir afterwards")
    parser.add_argument(
        "--tests",
        default="pip install tox && tox -e sim",
        help="the test step, a shell command in the clone (default: %(default)r)",
    )
    parser.add_argument("--json", type=Path, help="also write the timings here")
    args = parser.parse_args(argv)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="first-hour-"))
    work.mkdir(parents=True, exist_ok=True)
    clone, venv, logs = work / "repo", work / "venv", work / "logs"
    logs.mkdir(exist_ok=True)
    bin_dir = venv / "bin"
    # A newcomer's shell: the fresh venv first on PATH, nothing of this process's setup.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    # An empty extension cache, as on a newcomer's machine: the first use builds it.
    env["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
    (work / "own_model.py").write_text(OWN_MODEL)
    downstream = work / "downstream"
    (downstream / "tests").mkdir(parents=True, exist_ok=True)
    (downstream / "tests" / "test_on_tpu.py").write_text(DOWNSTREAM_TEST)

    py = str(bin_dir / "python")
    steps = [
        Step("clone", ["git", "clone", "--quiet", args.repo, str(clone)], 300, work),
        Step("venv", [args.python, "-m", "venv", str(venv)], 120, work),
        Step(
            "install",
            ["sh", "-c", "pip install torch==2.13.0 && pip install -e '.[ray]'"],
            1800,
            clone,
        ),
        Step("demo", ["xlasim", "demo", "--topology", "2x2x2", "--accelerator", "v4"], 900, clone),
        Step("tests", ["sh", "-c", args.tests], 3600, clone),
        Step(
            "own_model",
            [
                "xlasim",
                "run",
                "--topology",
                "2x2x1",
                "--accelerator",
                "v4",
                "--",
                py,
                "own_model.py",
            ],
            600,
            work,
        ),
        Step(
            "downstream_tests",
            ["sh", "-c", f"{py} -m pip install pytest && {py} -m pytest -q -rs tests"],
            600,
            downstream,
        ),
    ]
    failed = False
    try:
        for step in steps:
            if not _run(step, env, logs):
                failed = True
                break
    finally:
        print("\nstep              seconds  outcome")
        for step in steps:
            secs = f"{step.seconds:8.1f}" if step.seconds is not None else "       -"
            print(f"{step.name:<16} {secs}  {step.outcome}")
        total = sum(s.seconds or 0.0 for s in steps)
        print(f"{'total':<16} {total:8.1f}")
        if args.json:
            rows = [{"step": s.name, "seconds": s.seconds, "outcome": s.outcome} for s in steps]
            args.json.write_text(json.dumps({"steps": rows, "total_s": total}, indent=2))
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
