"""Run at interpreter start (from ``xlasim.pth``) when an ``XLASIM_*`` activation variable is set.

A bad activation environment stops the program with one line: carrying on would run it
without the simulator (or, where it is installed, against the real torch_xla).  It exits with
``os._exit``: site.py turns any exception raised here, ``SystemExit`` included, into a fatal
start-up error with a traceback, and nothing has run yet that would need cleaning up.
"""

import os
import sys

from xlasim._activation import activate_from_env
from xlasim.runtime.settings import EnvError

try:
    activate_from_env()
except EnvError as exc:
    sys.stderr.write(f"xlasim: {exc}\n")
    sys.stderr.flush()
    os._exit(2)
