"""Which files pytorch/xla's CPU CI script (``test/run_tests.sh``) runs, and how.

The script is a chain of bash functions (``run_test``, ``run_dynamic``, ``run_xla_hlo_debug
run_test ...``) that each prefix environment variables and end in ``python3 FILE ARGS``. Rather
than re-implement bash, the script is run for real with ``python3``, ``python`` and ``rm``
replaced (first on ``PATH``) by a recorder that writes down its arguments and the
environment it was given and exits 0. What the recorder saw, in order, is the CI's list of runs:
each file with the exact environment the script built for it. ``rm`` is replaced so the trace
deletes nothing on this machine (the script clears files it expects under ``/tmp``). The
environment it runs in is bare (no ``USE_COVERAGE``), so every run goes through ``python3``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Variables bash itself sets or changes in every child; they say nothing about the test's run.
_SHELL_VARS = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PATH"})
# What the script's ``python -c 'import torch_xla; print(torch_xla.__file__)'`` is told.
_FAKE_TORCH_XLA = "/nonexistent/torch_xla/__init__.py"
# Where pytorch/xla's scripts have graph-dump runs write (test/utils/run_tests_utils.sh).
GRAPH_DUMP = "/tmp/xla_test_save_ir.txt"

_RECORDER = """\
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["-c"]:
    asks_version = "tpu.version()" in " ".join(args[1:])
    print(os.environ.get("CI_TPU_VERSION", "") if asks_version else {fake!r})
    raise SystemExit(0)
made = os.environ["CI_TRACE_FILE"] + ".made"
if {tool!r} == "rm":
    # delete only what the recorder made below: the script's clean-up of a run's output file
    mine = open(made).read().split("\\n") if os.path.exists(made) else []
    for arg in args:
        if arg in mine and os.path.exists(arg):
            os.remove(arg)
else:
    # the file a save-tensors run writes: the script checks it is there after the run
    dump = os.environ.get("XLA_SAVE_TENSORS_FILE")
    if dump and not os.path.exists(dump):
        open(dump, "w").close()
        with open(made, "a") as out:
            out.write(dump + "\\n")
with open(os.environ["CI_TRACE_FILE"], "a") as out:
    out.write(json.dumps({{"tool": {tool!r}, "argv": args, "env": dict(os.environ)}}) + "\\n")
"""

_MAIN_BLOCK = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.MULTILINE)
_SPAWNS = re.compile(r"\b(?:xmp\.spawn|torch_xla\.launch|launch)\(")
_HAS_TESTS = re.compile(r"^\s*(?:class\s+\w+\(.*TestCase.*\)|def\s+test_\w*\()", re.MULTILINE)

PYTEST = "pytest"  # collected and run by pytest: one outcome per test
PROGRAM = "program"  # run as ``python FILE ARGS``: passes when it exits 0


@dataclass
class Entry:
    """One run the CI script makes: a file, the environment the script built for it (only what
    it set; the caller's environment is not included), the arguments after the file, and how the
    bench runs it."""

    file: str  # relative to the test dir (``../examples/...`` for files outside it)
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    kind: str = PYTEST
    # ``Class::test`` when the script runs one test case (``python -m unittest mod.Class.test``)
    case: str = ""

    @property
    def key(self) -> str:
        """Names the run among the script's runs of the same file: the file plus the variables
        that differ from the script's plain ``run_test`` (a file runs once per variant)."""
        extra = [f"{k}={v}" for k, v in sorted(self.env.items()) if k not in _COMMON]
        # flags the file itself reads (``--test_autocast``) make a variant too; ``-v`` is
        # unittest's verbosity and changes no test
        extra += [a for a in self.args if a != "-v" and not a.startswith("--verbosity")]
        name = f"{self.file}::{self.case}" if self.case else self.file
        return f"{name} [{' '.join(extra)}]" if extra else name


# Set for every run by the script's exports and its plain ``run_test``; not part of a key.
_COMMON = frozenset(
    {"PJRT_DEVICE", "CPU_NUM_DEVICES", "TORCH_TEST_DEVICES", "PYTORCH_TEST_WITH_SLOW"}
    | {"XLA_DUMP_FATAL_STACK"}
)


def classify(source: str) -> str:
    """Program when the file's ``__main__`` block starts processes (upstream's multi-process
    tests run their test cases inside the spawned workers) or it holds no test cases."""
    main = _MAIN_BLOCK.search(source)
    if main and _SPAWNS.search(source[main.end() :]):
        return PROGRAM
    return PYTEST if _HAS_TESTS.search(source) else PROGRAM


def trace(
    script: Path,
    *,
    timeout: float = 60,
    test_dir: Path | None = None,
    script_args: tuple[str, ...] = ("-L",),
    tpu_version: str = "",
) -> list[Entry]:
    """The runs ``script`` makes, in order, each with the environment it set for that run.

    ``test_dir`` (default: the script's folder) is what the runs' files are named relative to;
    ``script_args`` are the script's own flags (the CPU script's ``-L``: no log file; the TPU
    scripts take none); ``tpu_version`` is what the script's ``python -c '...
    torch_xla._internal.tpu.version()'`` is told (the TPU training script picks its runs by it).
    """
    script = script.resolve()
    test_dir = (test_dir or script.parent).resolve()
    # pytorch/xla's scripts skip (CPU) or stop at (TPU) a graph-dump run while its file exists;
    # the trace runs their checks on this machine's /tmp, so a file left there loses runs.
    stale = sorted(glob.glob(GRAPH_DUMP + "*"))
    if stale:
        raise RuntimeError(
            f"{stale[0]} exists: pytorch/xla's CI scripts refuse to start a graph-dump run "
            "while it does, so the list of runs would be cut short; remove it first"
        )
    with tempfile.TemporaryDirectory(prefix="ci_trace_") as tmp:
        bin_dir = Path(tmp, "bin")
        bin_dir.mkdir()
        for tool in ("python3", "python", "rm"):
            shim = bin_dir / tool
            body = _RECORDER.format(fake=_FAKE_TORCH_XLA, tool=tool)
            shim.write_text(f"#!{sys.executable} -S\n{body}")  # -S: no site, quick start
            shim.chmod(0o755)
        trace_file = Path(tmp, "trace.jsonl")
        base = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": tmp,  # the script cds to ~ to ask python where torch_xla is
            "CI_TRACE_FILE": str(trace_file),
            # keep going past a step that reports failure (the recorder never does, but the
            # script's own checks may)
            "CONTINUE_ON_ERROR": "1",
            # what Python's C-locale coercion would add to the recorder's own environment
            "LC_CTYPE": "C.UTF-8",
        }
        if tpu_version:
            base["CI_TPU_VERSION"] = tpu_version
        done = subprocess.run(
            ["bash", str(script), *script_args],
            env=base,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if not trace_file.exists():
            tail = done.stderr[-500:]
            raise RuntimeError(f"{script} ran nothing (exit {done.returncode}): {tail}")
        if done.returncode != 0:
            # A script that stops early (set -e) lists only the runs before the failed step.
            raise RuntimeError(
                f"{script} stopped early (exit {done.returncode}): its list of runs would be "
                f"cut short; the end of its output: {done.stderr[-500:]}"
            )
        records = [json.loads(ln) for ln in trace_file.read_text().splitlines() if ln]
    entries = []
    for rec in records:
        if rec["tool"] == "rm":
            continue
        argv, case = rec["argv"], ""
        if argv[:2] == ["-m", "unittest"] and len(argv) > 2:
            # ``python -m unittest module.Class.test`` from the folder the script cd'd to
            module, _, case = argv[2].partition(".")
            path = Path(rec["env"].get("PWD", str(test_dir)), f"{module}.py")
            argv, case = [str(path), *argv[3:]], case.replace(".", "::")
        path = Path(os.path.normpath(argv[0]))
        env = {
            k: v
            for k, v in rec["env"].items()
            if k not in _SHELL_VARS and base.get(k) != v and k not in _TRACE_VARS
        }
        env.pop("CONTINUE_ON_ERROR", None)
        rel = os.path.relpath(path, test_dir)
        source = path.read_text(errors="replace") if path.exists() else ""
        kind = PYTEST if case else classify(source)
        entries.append(Entry(rel, env, argv[1:], kind, case))
    return entries


# The recorder's own variables, not the script's.
_TRACE_VARS = frozenset({"CI_TRACE_FILE", "CI_TPU_VERSION"})
