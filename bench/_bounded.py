"""Run one command niced, with its output in a log file and a wall-clock bound (shared by the
upstream-measurement scripts in this folder)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from pathlib import Path


def run_bounded(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    log: Path,
    timeout: float,
    nice: int,
    mem_gb: float | None = None,
) -> int | None:
    """The command's exit status, or None when it ran past ``timeout`` seconds and was killed
    (with every process it started: it runs in its own session). ``mem_gb`` caps each process's
    data segment (RLIMIT_DATA: heap and private mappings), so a program sized for a TPU host
    fails with a MemoryError instead of exhausting a shared machine."""

    def lower_priority() -> None:
        os.nice(nice)
        if mem_gb is not None:
            limit = int(mem_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lower_priority,
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
