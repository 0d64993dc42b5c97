"""Command-line parsing shared by ``xlasim`` and ``xlasim demo``: every mistake is one line.

argparse prints its usage block and the error on separate lines; a user who mistyped a
flag needs the error and where to look, nothing else.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

from tpu_backend.topology import parse_slice

__all__ = ["OneLineErrorParser", "positive_float", "positive_int", "reject_dash_topologies"]

# '-1x2' is no option, but argparse takes anything starting with '-' (other than a plain
# negative number) for one and then complains about the option, not the topology.
_DASH_TOPOLOGY = re.compile(r"-\d+(?:x-?\d+)+")


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def reject_dash_topologies(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Fails on an argument like '-1x2' with the topology's own error."""
    for arg in argv:
        if arg == "--":
            return
        if _DASH_TOPOLOGY.fullmatch(arg):
            try:
                parse_slice(arg)
            except ValueError as exc:
                parser.error(str(exc))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a whole number >= 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a number of seconds > 0")
    return value


def fail(prog: str, message: str) -> NoReturn:
    """One line on stderr, exit status 2: a run-time error found before anything started."""
    sys.stderr.write(f"{prog}: {message}\n")
    raise SystemExit(2)
