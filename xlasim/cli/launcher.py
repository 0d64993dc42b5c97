"""Start one process per simulated host, as a TPU pod's ``--worker=all`` starts one per VM.

Every host runs the same command with its own host index; they find each other through a
loopback ``XLASIM_HOSTS_ADDR`` (host 0 listens there), so data entering the devices from a host
is exchanged exactly as in a multi-host Ray run.  Host 0's output goes straight to the
terminal; the other hosts' lines are kept (the last few) and shown when that host fails.  Asked
for all output, every host's lines go through the launcher, each whole and prefixed
``[host N]``.  The first host to fail decides the exit code and
ends the others; Ctrl-C ends them all.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Where host 0's store listens; the same name `xlasim.runtime.hosts` reads (kept apart so the
# launcher starts without importing torch).
HOSTS_ADDR_ENV = "XLASIM_HOSTS_ADDR"
# The bound on the hosts meeting when they all run on this machine (XLASIM_HOSTS_TIMEOUT_S,
# unless the user set it; hosts on separate machines keep the runtime's 300 s).
LOCAL_HOSTS_TIMEOUT_S = 60.0
# After the first failure, how long the other hosts get to exit on SIGTERM before SIGKILL.
STOP_GRACE_S = 10.0
# How many of a silent host's last lines are kept to show when it fails.
TAIL_LINES = 40
_POLL_S = 0.05


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: a signal N reads 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


@dataclass
class _Host:
    index: int
    proc: subprocess.Popen[bytes]
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES)
    )
    reader: threading.Thread | None = None


def _pump(host: _Host, echo: bool) -> None:
    """Reads a piped host's merged output line by line: keeps its tail, echoes if asked."""
    assert host.proc.stdout is not None
    for raw in host.proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        host.tail.append(line)
        if echo:
            sys.stdout.write(f"[host {host.index}] {line}\n")
            sys.stdout.flush()


def _start(
    command: Sequence[str], envs: Sequence[Mapping[str, str]], echo_all: bool
) -> list[_Host]:
    hosts: list[_Host] = []
    try:
        for index, env in enumerate(envs):
            if index == 0 and not echo_all:
                # Host 0 keeps the terminal itself: progress bars and colours work as usual.
                proc = subprocess.Popen(list(command), env=dict(env))
            else:
                # Through a pipe and a reader, line by line: hosts' lines never interleave.
                proc = subprocess.Popen(
                    list(command),
                    env=dict(env),
                    stdin=None if index == 0 else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            host = _Host(index, proc)
            if proc.stdout is not None:
                host.reader = threading.Thread(
                    target=_pump, args=(host, echo_all), name=f"xlasim-host-{index}", daemon=True
                )
                host.reader.start()
            hosts.append(host)
    except BaseException:
        _stop(hosts)
        raise
    return hosts


def _stop(hosts: Sequence[_Host]) -> None:
    """SIGTERM every host still running, then SIGKILL what is left after ``STOP_GRACE_S``."""
    running = [h for h in hosts if h.proc.poll() is None]
    for host in running:
        host.proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for host in running:
        try:
            host.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            host.proc.kill()
            host.proc.wait()
    for host in hosts:
        if host.reader is not None:
            # The pipe closes when the host exits; a grandchild holding it open must not block.
            host.reader.join(timeout=STOP_GRACE_S)


def _report_failure(host: _Host, total: int, program: str, echoed: bool) -> None:
    rc = host.proc.returncode
    if total == 1:
        # A one-host run passes an exit code through silently, like the shell; a signal is
        # named because the number alone (128 + N) is easy to misread.
        if rc < 0:
            print(f"xlasim run: {program} {describe_exit(rc)}", file=sys.stderr)
        return
    print(
        f"xlasim run: {program} on host {host.index} of {total} {describe_exit(rc)}; "
        "stopping the other hosts",
        file=sys.stderr,
    )
    if host.reader is not None and host.tail and not echoed:
        # Its output was kept back, so the failure comes with the end of it.
        print(f"xlasim run: the last lines host {host.index} printed:", file=sys.stderr)
        for line in host.tail:
            print(f"[host {host.index}] {line}", file=sys.stderr)


def run_hosts(
    command: Sequence[str], envs: Sequence[Mapping[str, str]], *, echo_all: bool = False
) -> int:
    """Runs ``command`` once per environment in ``envs`` (host ``i`` gets ``envs[i]``).

    Returns 0 when every host exits 0; otherwise the exit code of the first host that failed
    (128 + N for a signal), after ending the others; 130 on Ctrl-C.
    Raises ``FileNotFoundError`` when the command does not exist.
    """
    hosts = _start(command, envs, echo_all)
    try:
        pending = list(hosts)
        while pending:
            for host in list(pending):
                rc = host.proc.poll()
                if rc is None:
                    continue
                pending.remove(host)
                if rc != 0:
                    if host.reader is not None:
                        host.reader.join(timeout=STOP_GRACE_S)
                    _report_failure(host, len(hosts), command[0], echo_all)
                    _stop(hosts)
                    return exit_code(rc)
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        what = f"{len(hosts)} hosts" if len(hosts) > 1 else "the program"
        print(f"xlasim run: interrupted; stopping {what}", file=sys.stderr)
        _stop(hosts)
        return 130
    for host in hosts:
        if host.reader is not None:
            host.reader.join(timeout=STOP_GRACE_S)
    return 0
