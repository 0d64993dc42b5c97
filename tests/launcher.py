"""Starting ``xlasim run`` from a test the way a terminal starts a foreground job.

A process started in the background by a non-interactive shell (``cmd &``, as CI scripts and
nohup'd runs do) inherits SIGINT as *ignored*, and Python then never turns SIGINT into
KeyboardInterrupt: a test that presses Ctrl-C on the launcher would wait in vain. The command
below resets SIGINT to its default before Python starts the launcher. The launcher gets its own
process group, so a test can clean up the launcher and every host at once whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def start_xlasim_run(*args: str, **popen_kwargs: object) -> subprocess.Popen:
    """``python -m xlasim run ARGS`` with SIGINT at its default, in a new process group."""
    command = [sys.executable, "-c", _WITH_DEFAULT_SIGINT, "-m", "xlasim", "run", *args]
    return subprocess.Popen(command, start_new_session=True, **popen_kwargs)  # type: ignore[call-overload]


def kill_launcher_group(launcher: subprocess.Popen) -> None:
    """SIGKILL the launcher and every host it started (they share its process group)."""
    with contextlib.suppress(ProcessLookupError):  # already gone, hosts and all
        os.killpg(launcher.pid, signal.SIGKILL)
