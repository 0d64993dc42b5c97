"""Python examples of README.md and docs/*.md, and running one as a reader would.

Used by tests/test_docs.py, and by tests/test_backend_ray_single_host.py for the examples
that need a TPU Ray cluster (it has one up already).  An HTML comment right above a fenced
``python`` block says how to run it: ``<!-- docs-test: pytest -->`` (the block is a test
module), ``<!-- docs-test: xlasim-run OPTIONS -->`` (the block is a file run with ``xlasim run
OPTIONS -- python FILE``) or ``<!-- docs-test: ray-cluster TOPOLOGY ACCELERATOR -->`` (it needs
a Ray cluster of that slice); without one the block is a script.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 240.0

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int
    code: str
    mode: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_examples() -> list[Example]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            if m.group(1) != "python":
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            mode = tuple(mark.group(1).split()) if mark else ("script",)
            found.append(Example(path, line, m.group(2), mode))
    return found


# Runs a ray-cluster example as a driver of an existing (simulated TPU) cluster.
_CLUSTER_DRIVER = """\
import sys
import ray
from xlasim.ray.cluster import SIMULATION_RUNTIME_ENV

address, name, code = sys.argv[1:4]
ray.init(address=address, runtime_env=SIMULATION_RUNTIME_ENV)
try:
    exec(compile(code, name, "exec"), {"__name__": "__main__"})
finally:
    ray.shutdown()
"""


def cluster_driver_command(example: Example, address: str) -> list[str]:
    return [sys.executable, "-c", _CLUSTER_DRIVER, address, example.name, example.code]


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "PYTEST_"))}
    if os.environ.get("XLASIM_MAT_MUL_PRECISION"):  # a test's mat_mul_precision mark
        env["XLASIM_MAT_MUL_PRECISION"] = os.environ["XLASIM_MAT_MUL_PRECISION"]
    env.pop("PJRT_DEVICE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # A private home (Ray Train writes results under it) that keeps torch's extension cache.
    env["XDG_CACHE_HOME"] = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env["HOME"] = str(home)
    return env


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a timeout kills the example's own children (Ray) too
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n[killed: the example did not finish within {TIMEOUT_S:g}s]"
        return subprocess.CompletedProcess(command, -9, output)
    return subprocess.CompletedProcess(command, proc.returncode, output)
