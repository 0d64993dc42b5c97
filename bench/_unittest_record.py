"""Runs a test file as its CI script does - ``python FILE ARGS``, its ``__main__`` block included
(upstream files set up the runtime there: ``xr.use_spmd()``, a global mesh, the mat-mul
precision) - and writes each test's outcome as it is reported, one JSON line per event, to the
file named by ``UNITTEST_RECORD``.

    python _unittest_record.py FILE [ARGS...]
    python _unittest_record.py -m unittest module.Class.test

Every ``unittest`` runner reports through ``unittest.TestResult``'s ``add*`` methods (absltest's
and ``unittest.main``'s text results call them through ``super()``), so wrapping those records
every test whichever runner the file's ``__main__`` starts. Lines are written at once, so a run
killed by its time bound still tells which tests finished. A test id is ``Class::test`` (what
pytest's junit report gives, so the outcomes compare with the pytest runs')."""

from __future__ import annotations

import json
import os
import runpy
import sys
import unittest

_OUT = os.environ.get("UNITTEST_RECORD", "")


def _write(record: dict) -> None:
    with open(_OUT, "a") as out:
        out.write(json.dumps(record) + "\n")


def _test_id(test: unittest.TestCase) -> str:
    parts = test.id().split(".")
    return "::".join(parts[-2:]) if len(parts) >= 2 else parts[0]


def first_line(err: object) -> str:
    """``Type: message`` (its first line) of an ``exc_info`` tuple, or the text given."""
    if isinstance(err, tuple) and len(err) == 3 and err[0] is not None:
        kind, value = err[0], err[1]
        lines = str(value).strip().splitlines()
        return f"{kind.__name__}: {lines[0]}" if lines else kind.__name__
    return str(err).strip().splitlines()[0] if str(err).strip() else ""


def _wrap(name: str, outcome: str) -> None:
    original = getattr(unittest.TestResult, name)

    def record(self: unittest.TestResult, test: unittest.TestCase, *rest: object) -> None:
        if not isinstance(test, unittest.TestCase):  # a class or module fixture's error
            line = first_line(rest[0]) if rest else ""
            _write({"test": str(test), "outcome": outcome, "line": line})
        else:
            _write({"test": _test_id(test), "outcome": outcome, "line": first_line(rest[0])
                    if rest else ""})  # fmt: skip
        original(self, test, *rest)

    setattr(unittest.TestResult, name, record)


def _wrap_subtests() -> None:
    original = unittest.TestResult.addSubTest

    def record(self: unittest.TestResult, test: unittest.TestCase, sub: object, err: object):
        if err is not None:  # a failed subtest fails its test
            outcome = "failed" if issubclass(err[0], test.failureException) else "error"  # type: ignore[index]
            _write({"test": _test_id(test), "outcome": outcome, "line": first_line(err)})
        return original(self, test, sub, err)  # type: ignore[arg-type]

    unittest.TestResult.addSubTest = record  # type: ignore[method-assign]


def main() -> None:
    for name, outcome in (
        ("addSuccess", "passed"),
        ("addFailure", "failed"),
        ("addError", "error"),
        ("addSkip", "skipped"),
        ("addExpectedFailure", "xfailed"),
        ("addUnexpectedSuccess", "failed"),
    ):
        _wrap(name, outcome)
    _wrap_subtests()
    try:
        if sys.argv[1:3] == ["-m", "unittest"]:  # ``python -m unittest module.Class.test``
            sys.argv = ["python -m unittest", *sys.argv[3:]]
            sys.path[0] = os.getcwd()
            runpy.run_module("unittest", run_name="__main__", alter_sys=True)
            return
        path = os.path.abspath(sys.argv[1])
        sys.argv = [path, *sys.argv[2:]]
        sys.path[0] = os.path.dirname(path)  # as ``python FILE`` puts the file's folder first
        runpy.run_path(path, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:  # the file failed before or outside its tests
        _write({"test": "<run>", "outcome": "error", "line": first_line(sys.exc_info())})
        raise exc


if __name__ == "__main__":
    main()
