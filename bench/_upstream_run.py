"""What the upstream-measurement scripts in this folder share: the options that pick the two
sides (real torch_xla on CPU, the simulator), each side's command and environment, and running one
command niced, logged and time-bounded."""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# run_bounded's answer when ``stop_when`` ended the run (an exit status is never negative here
# except for a signal, and those are -1..-64)
STOPPED = -1000


def run_bounded(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    log: Path,
    timeout: float,
    nice: int,
    mem_gb: float | None = None,
    stop_when: Callable[[str], bool] | None = None,
) -> int | None:
    """The command's exit status, or None when it ran past ``timeout`` seconds and was killed
    (with every process it started: it runs in its own session). ``mem_gb`` caps each process's
    data segment (RLIMIT_DATA: heap and private mappings), so a program sized for a TPU host
    fails with a MemoryError instead of exhausting a shared machine. ``stop_when`` is asked
    about the log so far every second; once it says yes the run is killed the same way and the
    answer is ``STOPPED``."""

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
        deadline = time.monotonic() + timeout
        while True:
            try:
                return proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
            stop = stop_when is not None and stop_when(log.read_text(errors="replace"))
            if stop or time.monotonic() >= deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return STOPPED if stop else None


def add_side_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--real-env",
        action="append",
        default=[],
        metavar="K=V",
        help="set in the real runs' environment (repeatable)",
    )
    parser.add_argument(
        "--sim-env",
        action="append",
        default=[],
        metavar="K=V",
        help="set in the simulator runs' environment (repeatable)",
    )
    parser.add_argument("--topology", default="2x2x1", help="simulated slice (default 2x2x1)")
    parser.add_argument("--accelerator", default="v4", help="simulated TPU (default v4)")
    parser.add_argument("--cpu-devices", type=int, default=4, help="CPU_NUM_DEVICES for real")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the runs (default 10)")


def check_side_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Turns the repeated ``K=V`` options into dicts; a malformed one is a usage error."""
    for flag in ("--real-env", "--sim-env"):
        name = flag[2:].replace("-", "_")
        pairs = getattr(args, name)
        bad = [p for p in pairs if "=" not in p]
        if bad:
            parser.error(f"{flag} {bad[0]!r}: expected KEY=VALUE")
        setattr(args, name, dict(p.split("=", 1) for p in pairs))


def side_command(
    side: str,
    args: argparse.Namespace,
    argv: list[str],
    run_env: dict[str, str] | None = None,
) -> tuple[list, dict]:
    """The command line and environment that run ``python ARGV`` on one side.

    The caller's environment is inherited, less anything that would pick the other side
    (``XLASIM_*``, ``PJRT_DEVICE``, ``CPU_NUM_DEVICES``), plus that side's ``--*-env`` values.
    ``run_env`` is one run's own environment (what pytorch/xla's CI script sets for a file),
    given to both sides alike; on the simulator side it reaches the program through ``xlasim
    run``, as on a TPU VM. Without it the real side gets ``PJRT_DEVICE=CPU`` and
    ``--cpu-devices``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    for key in ("PJRT_DEVICE", "CPU_NUM_DEVICES"):
        env.pop(key, None)
    env.update(args.real_env if side == "real" else args.sim_env)
    if run_env is not None:
        env.update(run_env)
    if side == "real":
        if run_env is None:
            env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(args.cpu_devices))
        return [args.real_python, *argv], env
    cmd = [args.sim_python, "-m", "xlasim", "run", "--topology", args.topology]
    return [*cmd, "--accelerator", args.accelerator, "--", args.sim_python, *argv], env
