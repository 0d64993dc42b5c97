"""upstream_pass_rate's ``--cpu-ci RUN_TESTS_SH`` mode: every run pytorch/xla's CPU CI script
makes, made on both sides with the environment the script gives it, and the outcomes compared.

The runs come from ``_ci_script.trace`` (file, environment, arguments, pytest file or program).
A pytest file runs as ``python -m pytest FILE`` (per-test outcomes; the arguments the script
passes after the file are for its ``unittest`` entry point and are not given to pytest); a
program runs as ``python FILE ARGS`` and counts as one test, ``<program>``, that passes when it
exits 0. Each side's command starts from the same run environment (files it names under
``/tmp`` moved to a folder of the run's own, see ``private_paths``); the simulator side is
``xlasim run ... -- python ...`` with that environment around it, so ``PJRT_DEVICE=CPU`` and the
``XLA_*`` variables reach the simulated host as they would a TPU VM's shell.

Results go to ``--json`` as they finish and a later call with the same file skips every run
and side it already holds (``--timeout`` bounds each). Then: a per-group table (of the tests
that pass on real torch_xla, how many pass on the simulator), wall times per side and their
ratio, every run that crashed or hung, and the simulator's failures grouped by their first
error line, largest kinds first.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

# this folder's helper modules (the script's own dir is on sys.path)
from _ci_script import PROGRAM, PYTEST, Entry, trace
from _pytest_reports import PASSED, PYTEST_ARGS, FileRun, merge, parse_junit, parse_verbose
from _upstream_run import run_bounded, side_command
from upstream_examples import parse_output

PROGRAM_TEST = "<program>"
GROUPS = ("spmd", "dynamo", "eager", "pjrt", "torch_distributed", "scan")
PROGRAMS_GROUP = "mp scripts"
OTHER_GROUP = "ops"


def group_of(entry: Entry) -> str:
    """Programs form their own group; pytest files group by their folder under test/."""
    if entry.kind == PROGRAM:
        return PROGRAMS_GROUP
    top = entry.file.split("/", 1)[0]
    return top if top in GROUPS else OTHER_GROUP


def _slug(key: str) -> str:
    return re.sub(r"[^\w.-]+", "_", key).strip("_")


def _how_it_ended(rc: int | None, timeout: float) -> str:
    if rc is None:
        return f"time bound {timeout:g}s tripped (--timeout)"
    signum = -rc if rc < 0 else rc - 128 if rc > 128 else 0  # xlasim run says 128 + N
    if signum:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"crashed: killed by {name}"
    return ""


def private_paths(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` with the files the script names under ``/tmp`` (graph dumps, debug and metrics
    files) moved into ``folder``, emptied first: the script expects them absent when a run
    starts, and the two sides (and other users of the machine) must not share them."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return {k: str(folder / v[5:]) if v.startswith("/tmp/") else v for k, v in env.items()}


def own_port(entry: Entry) -> Entry:
    """``entry`` with ``MASTER_PORT`` set to a free port when the script sets none. CI runs the
    files one at a time, so each ``xla://`` group there has torch_xla's default port (12355)
    to itself; here two files run at once, or another measurement on the same machine (even
    with ``jobs`` 1), would meet on it and fail to listen or wait for each other's processes."""
    if "MASTER_PORT" in entry.env:
        return entry
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return dataclasses.replace(entry, env={**entry.env, "MASTER_PORT": str(port)})


def run_side(entry: Entry, side: str, args: argparse.Namespace) -> dict:
    """One run on one side: per-test outcomes, first error lines, exit status, wall time."""
    path = (args.test_dir / entry.file).resolve()
    slug = _slug(entry.key)
    folder = args.out_dir / side
    junit, log = folder / f"{slug}.xml", folder / f"{slug}.log"
    junit.unlink(missing_ok=True)
    if not path.exists():
        note = f"missing: {path} is not in the test dir's copy"
        return {"outcomes": {}, "first_lines": {}, "note": note, "rc": None, "wall_s": 0.0}
    record = folder / f"{slug}.jsonl"
    as_script = getattr(args, "as_script", False) and entry.kind == PYTEST
    if as_script:
        # as the CI script runs it; each test's outcome is recorded as it is reported
        record.unlink(missing_ok=True)
        runner = str(Path(__file__).with_name("_unittest_record.py"))
        if entry.case:
            module = Path(entry.file).stem
            argv = [runner, "-m", "unittest", f"{module}.{entry.case.replace('::', '.')}"]
        else:
            argv = [runner, path.name, *entry.args]
    elif entry.kind == PYTEST:
        target = f"{path.name}::{entry.case}" if entry.case else path.name
        plugins = [a for name in getattr(args, "pytest_plugins", ()) for a in ("-p", name)]
        pytest_args = [*PYTEST_ARGS, *plugins, f"--junitxml={junit}", target]
        argv = ["-m", "pytest", *pytest_args]
        flags = file_flags(entry.args)
        if flags:
            # the file reads its own flags from sys.argv at import (``--test_autocast``):
            # pytest gets its arguments directly and the file sees the ones the script gave it
            code = f"import sys, pytest; sys.argv = {[path.name, *flags]!r}; "
            argv = ["-c", code + f"raise SystemExit(pytest.main({pytest_args!r}))"]
    else:
        argv = [path.name, *entry.args]
    run_env = private_paths(entry.env, folder / f"{slug}.tmp")
    if as_script:
        run_env["UNITTEST_RECORD"] = str(record)
    # the script's files import the test dir's helpers (args_parse, distributed_util) from
    # sub-folders; the side's own PYTHONPATH (e.g. the xlasim checkout) comes first
    side_env = args.real_env if side == "real" else args.sim_env
    own = side_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    helpers = str(Path(__file__).parent) if getattr(args, "pytest_plugins", ()) else ""
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (own, str(args.test_dir), helpers) if p)
    cmd, env = side_command(side, args, argv, run_env)
    start = time.monotonic()
    rc = run_bounded(cmd, env=env, cwd=path.parent, log=log, timeout=args.timeout, nice=args.nice)
    wall = round(time.monotonic() - start, 1)
    output = log.read_text(errors="replace")
    ended = _how_it_ended(rc, args.timeout)
    if as_script:
        parsed = parse_record(record.read_text() if record.exists() else "")
        if not parsed.outcomes and not parsed.note:
            error = parse_output(output, rc, args.timeout).error
            parsed.note = ended or f"no test reported (exit {rc}): {error or _last(output)}"
        elif ended:
            parsed.note = ended
        run = {"outcomes": parsed.outcomes, "first_lines": parsed.first_lines, "note": parsed.note}
    elif entry.kind == PROGRAM:
        error = parse_output(output, rc, args.timeout).error
        outcome = PASSED if rc == 0 else "failed"
        lines = {} if rc == 0 else {PROGRAM_TEST: error or ended or f"exit status {rc}"}
        run = {"outcomes": {PROGRAM_TEST: outcome}, "first_lines": lines, "note": ended}
    else:
        if rc is not None and junit.exists():
            parsed = parse_junit(junit.read_text(errors="replace"))
        else:
            parsed = parse_verbose(output)
            parsed.note = ended or f"pytest exited {rc} without a junit report"
        if ended and not parsed.note:
            parsed.note = ended
        run = {"outcomes": parsed.outcomes, "first_lines": parsed.first_lines, "note": parsed.note}
    run.update(rc=rc, wall_s=wall)
    return run


def parse_record(text: str) -> FileRun:
    """Outcomes from ``_unittest_record``'s lines (the worst one of a test wins); a failure
    outside any test (``<run>``: the file did not import) becomes the run's note."""
    run = FileRun()
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # a line cut short by a kill
            continue
        if event["test"] == "<run>":
            run.note = f"collection error: {event['line']}"
            continue
        merge(run, event["test"], event["outcome"], event["line"])
    return run


def _last(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def file_flags(args: list[str]) -> list[str]:
    """The arguments a script gives a pytest-run file that the file itself reads; unittest's
    verbosity flags change no test."""
    return [a for a in args if a != "-v" and not a.startswith("--verbosity")]


def select(entries: list[Entry], args: argparse.Namespace) -> list[Entry]:
    """The runs asked for (``--only``/``--skip`` globs on the file), smallest files first: the
    size of a test file is a rough guide to how long it runs, and quick answers come first."""
    chosen = []
    for entry in entries:
        if args.only and not any(fnmatch.fnmatch(entry.file, g) for g in args.only):
            continue
        if any(fnmatch.fnmatch(entry.file, g) for g in args.skip):
            continue
        chosen.append(entry)
    size = {e.file: _size(args.test_dir / e.file) for e in chosen}
    return sorted(chosen, key=lambda e: size[e.file])


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def reusable_real(paths: list[Path], entries: list[Entry]) -> dict[str, dict]:
    """Real outcomes from earlier per-file measurements (upstream_pass_rate's ``--json``), for
    the runs whose environment those measured: ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=4`` and no
    variant variables. Runs the CI makes with one CPU device are measured afresh."""
    rows: dict[str, dict] = {}
    for path in paths:  # a later measurement of a file replaces an earlier one
        rows.update((row["file"], row) for row in json.loads(path.read_text())["files"])
    found = {}
    for entry in entries:
        row = rows.get(entry.file)
        if row is None or entry.kind != PYTEST or entry.key != entry.file:
            continue
        if entry.env.get("CPU_NUM_DEVICES") != "4":
            continue
        note = f"{row['real_note']} (reused from an earlier run)".strip()
        found[entry.key] = {
            "outcomes": row["real"],
            "first_lines": {},
            "note": note,
            "rc": None,
            "wall_s": None,
        }
    return found


class Results:
    """The results file: one record per run, each side written as soon as it finishes."""

    def __init__(self, path: Path, script: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.data = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("script", str(script))
        self.data.setdefault("entries", {})

    def record(self, entry: Entry, side: str | None = None, run: dict | None = None) -> None:
        with self.lock:
            rec = self.data["entries"].setdefault(entry.key, {})
            rec.update(file=entry.file, env=entry.env, args=entry.args, kind=entry.kind)
            rec["group"] = group_of(entry)
            if side is not None:
                rec[side] = run
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
            tmp.replace(self.path)

    def has(self, key: str, side: str) -> bool:
        return side in self.data["entries"].get(key, {})


def failure_kind(line: str) -> str:
    """A first error line with its numbers and addresses blanked, so that one cause met with
    different shapes or values counts as one kind."""
    kind = re.sub(r"0x[0-9a-fA-F]+", "0x?", line)
    kind = re.sub(r"\d+(\.\d+)?", "N", kind)
    return kind[:160]


def summarize(records: dict[str, dict]) -> dict:
    """Per group and in total: tests passing on real torch_xla and how many of them pass on the
    simulator; per run: wall times; the simulator's failures by kind; crashes and hangs."""
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # runs, real, sim
    runs, kinds, examples, crashes = [], Counter(), {}, []
    real_time = sim_time = 0.0
    for key, rec in sorted(records.items()):
        real, sim = rec.get("real"), rec.get("sim")
        if real is None or sim is None:
            continue
        real_pass = sorted(t for t, o in real["outcomes"].items() if o == PASSED)
        sim_pass = [t for t in real_pass if sim["outcomes"].get(t) == PASSED]
        failures = {}
        for test in real_pass:
            if test in sim_pass:
                continue
            outcome = sim["outcomes"].get(test)
            line = sim["first_lines"].get(test, "") if outcome else ""
            line = line or (f"[{outcome}]" if outcome else f"[not run] {sim['note'] or 'absent'}")
            failures[test] = line
            kind = failure_kind(line)
            kinds[kind] += 1
            examples.setdefault(kind, f"{key}::{test}")
        counts = groups[rec["group"]]
        counts[0] += 1
        counts[1] += len(real_pass)
        counts[2] += len(sim_pass)
        for side, run in (("real", real), ("sim", sim)):
            ended = run["note"]
            if not ended.startswith(("crashed", "time bound")) and run.get("rc") is not None:
                ended = _how_it_ended(run["rc"], 0)  # a run that wrote its report, then died
            if ended.startswith(("crashed", "time bound")):
                crashes.append(f"{side} {key}: {ended}")
        ratio = None
        if real["wall_s"] and sim["wall_s"]:
            ratio = round(sim["wall_s"] / real["wall_s"], 2)
            real_time += real["wall_s"]
            sim_time += sim["wall_s"]
        runs.append(
            {
                "run": key,
                "group": rec["group"],
                "real_passed": len(real_pass),
                "real_collected": len(real["outcomes"]),
                "sim_passed": len(sim_pass),
                "real_wall_s": real["wall_s"],
                "sim_wall_s": sim["wall_s"],
                "time_ratio": ratio,
                "real_note": real["note"],
                "sim_note": sim["note"],
                "sim_failures": failures,
            }
        )
    total = [sum(c[i] for c in groups.values()) for i in range(3)]
    return {
        "runs": runs,
        "groups": {
            g: dict(zip(("runs", "real_passed", "sim_passed"), c, strict=True))
            for g, c in groups.items()
        },
        "total": dict(zip(("runs", "real_passed", "sim_passed"), total, strict=True)),
        "time": {
            "real_s": round(real_time, 1),
            "sim_s": round(sim_time, 1),
            "ratio": round(sim_time / real_time, 2) if real_time else None,
        },
        "failure_kinds": [
            {"count": n, "kind": k, "example": examples[k]} for k, n in kinds.most_common()
        ],
        "crashes_and_hangs": crashes,
    }


def _pct(sim: int, real: int) -> str:
    return f"{100.0 * sim / real:5.1f}%" if real else "    -"


def print_report(summary: dict, top: int) -> None:
    print(f"{'run':70} {'real pass/coll':>14} {'sim':>5} {'real s':>7} {'sim s':>7} {'x':>5}")
    for row in summary["runs"]:
        real_col = f"{row['real_passed']}/{row['real_collected']}"
        ratio = f"{row['time_ratio']:.1f}" if row["time_ratio"] else "-"
        print(
            f"{row['run'][:70]:70} {real_col:>14} {row['sim_passed']:>5} "
            f"{row['real_wall_s'] or '-':>7} {row['sim_wall_s'] or '-':>7} {ratio:>5}"
        )
    print(f"\n{'group':20} {'runs':>5} {'real pass':>10} {'sim pass':>9} {'share':>7}")
    for name, c in sorted(summary["groups"].items()):
        share = _pct(c["sim_passed"], c["real_passed"])
        print(f"{name:20} {c['runs']:>5} {c['real_passed']:>10} {c['sim_passed']:>9} {share:>7}")
    t = summary["total"]
    share = _pct(t["sim_passed"], t["real_passed"])
    print(f"{'TOTAL':20} {t['runs']:>5} {t['real_passed']:>10} {t['sim_passed']:>9} {share:>7}")
    tm = summary["time"]
    print(
        f"\nwall time (runs timed on both sides): real {tm['real_s']}s, sim {tm['sim_s']}s, "
        f"sim/real {tm['ratio']}"
    )
    print_failures(summary, top)


def print_failures(summary: dict, top: int) -> None:
    """The simulator's failures grouped by first error line, then crashes and hangs (the
    closing part of both CI reports)."""
    print(
        f"\nsimulator failures by first error line (top {top} of {len(summary['failure_kinds'])}):"
    )
    for kind in summary["failure_kinds"][:top]:
        print(f"  {kind['count']:5}  {kind['kind']}\n         e.g. {kind['example']}")
    print("\ncrashes and hangs:")
    for line in summary["crashes_and_hangs"] or ["(none)"]:
        print(f"  {line}")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpu-ci",
        type=Path,
        metavar="RUN_TESTS_SH",
        help="run every file pytorch/xla's CPU CI script runs, as it runs it",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="--cpu-ci: only files matching (repeatable)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="GLOB",
        help="--cpu-ci: leave out files matching (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="--cpu-ci: list the runs and stop")
    parser.add_argument(
        "--report-only", action="store_true", help="--cpu-ci: report what --json holds, run nothing"
    )
    parser.add_argument("--top", type=int, default=10, help="--cpu-ci: failure kinds shown")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    script = args.cpu_ci.resolve()
    args.test_dir = script.parent
    entries = select(trace(script), args)
    if args.list:
        for entry in entries:
            print(f"{group_of(entry):18} {entry.kind:8} {entry.key} {' '.join(entry.args)}")
        return 0
    results = Results(args.json, script)
    if not args.report_only:
        if not args.real_python and not args.reuse_real:
            parser.error("--cpu-ci needs --real-python (and may take --reuse-real)")
        for key, run in reusable_real(args.reuse_real, entries).items():
            if not results.has(key, "real"):
                results.record(next(e for e in entries if e.key == key), "real", run)
        jobs = [
            (entry, side)
            for entry in entries
            for side in ("real", "sim")
            if not results.has(entry.key, side) and (side == "sim" or args.real_python)
        ]
        for side in ("real", "sim"):
            (args.out_dir / side).mkdir(parents=True, exist_ok=True)
        print(f"{len(jobs)} runs to make; logs in {args.out_dir}", file=sys.stderr)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {
                pool.submit(run_side, own_port(e), side, args): (e, side) for e, side in jobs
            }
            for fut in concurrent.futures.as_completed(futures):
                entry, side = futures[fut]
                run = fut.result()
                results.record(entry, side, run)
                passed = sum(o == PASSED for o in run["outcomes"].values())
                print(
                    f"  {side:4} {entry.key}: {passed}/{len(run['outcomes'])} passed "
                    f"in {run['wall_s']}s {run['note']}",
                    file=sys.stderr,
                    flush=True,
                )
    summary = summarize(results.data["entries"])
    print_report(summary, args.top)
    summary_path = args.json.with_name(args.json.stem + "-summary.json")
    summary_path.write_text(json.dumps(summary, indent=1))
    return 0
