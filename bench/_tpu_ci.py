"""upstream_pass_rate's ``--tpu-ci SCRIPT`` mode: every run one of pytorch/xla's TPU CI scripts
(``test/tpu/run_tests.sh``, ``run_training_tests.sh``, ``run_pallas_test.sh``) makes, made on the
simulated TPU VM only - there is no real TPU to compare with, so a test counts as passing when
it passes on the simulator, and the denominator is every test the simulator's run collected.

The runs come from ``_ci_script.trace`` as for ``--cpu-ci``; the script's ``python -c '...
torch_xla._internal.tpu.version()'`` is told the simulated generation (``--accelerator v4``:
4), so a script that picks runs by generation picks what it would on that TPU VM. Each run is

  SIM_PY -m xlasim run --accelerator ACC --topology TOPO -- SIM_PY _unittest_record.py FILE ARGS

with the script's environment around it and no ``PJRT_DEVICE`` (TPU mode, as on the VM): the
file runs as ``python3 FILE ARGS`` would, its ``__main__`` block included (upstream files turn
on SPMD, set a global mesh or the mat-mul precision there), and each test's outcome is recorded
as the file's unittest runner reports it (``--via-pytest``: pytest runs the file instead, as
``--cpu-ci`` does). A program (a file with no test cases, or one whose tests run in spawned
workers) is one test, ``<program>``, that passes when it exits 0.

Results go to ``--json`` as each run finishes; a later call with the same file skips the runs
it holds. The report: a per-run table (collected, passed, skipped, failed; how many failures
name what the simulator does not simulate), totals, failures grouped by their first error line,
and every run that crashed or hung.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import sys
from collections import Counter
from pathlib import Path

# this folder's helper modules (the script's own dir is on sys.path)
from _ci_script import trace
from _cpu_ci import (
    Results,
    _how_it_ended,
    failure_kind,
    group_of,
    own_port,
    print_failures,
    run_side,
    select,
)
from _pytest_reports import PASSED

SIDE = "sim"
_SKIPS = ("skipped", "xfailed")


def names_unsimulated(line: str) -> bool:
    """Whether a failure's first line is the simulator saying what it does not simulate: a
    NotImplementedError (or one of its subclasses, named by their module path), or any error
    whose message says so (an upstream test may re-raise it as another kind)."""
    kind = line.split(":", 1)[0]
    return "NotImplementedError" in kind or "Unsimulated" in kind or "does not simulate" in line


def tpu_version(accelerator: str) -> str:
    """What ``torch_xla._internal.tpu.version()`` answers on a VM of ``accelerator`` (v4 -> 4,
    v5litepod/v5e -> 5, v6e -> 6)."""
    match = re.match(r"v(\d+)", accelerator)
    if match is None:
        raise ValueError(f"--accelerator {accelerator!r}: expected a TPU generation like v4")
    return match.group(1)


def _ended(run: dict) -> str:
    note = run["note"]
    if not note.startswith(("crashed", "time bound")) and run.get("rc") is not None:
        note = _how_it_ended(run["rc"], 0) or note  # wrote its report, then died
    return note


_TEST_DEF = re.compile(r"^\s*def test\w*\(", re.MULTILINE)


def tests_defined(path: Path) -> int:
    """How many test functions a file defines (at least 1): the stand-in count for a run that
    collected nothing (its import failed), so that a large file that cannot even be imported
    weighs what its tests do. Parameterized tests count once."""
    try:
        return max(len(_TEST_DEF.findall(path.read_text(errors="replace"))), 1)
    except OSError:
        return 1


def summarize(records: dict[str, dict], test_dir: Path | None = None) -> dict:
    """Per run and in total: tests collected, passed, skipped and failed on the simulator, and
    how many of the failures name what is not simulated; failures by kind; crashes and hangs.
    A pytest run that collected nothing counts as the tests its file defines (``test_dir``
    given) or as one test, all failed with the run's note."""
    runs, kinds, examples, crashes = [], Counter(), {}, []
    totals = Counter()
    for key, rec in sorted(records.items()):
        sim = rec.get(SIDE)
        if sim is None:
            continue
        outcomes = sim["outcomes"]
        passed = [t for t, o in outcomes.items() if o == PASSED]
        skipped = [t for t, o in outcomes.items() if o in _SKIPS]
        failures = {
            t: sim["first_lines"].get(t, "") or f"[{o}]"
            for t, o in sorted(outcomes.items())
            if o != PASSED and o not in _SKIPS
        }
        ended = _ended(sim)
        weight = 1
        if not outcomes:  # nothing collected: the run itself fails, as all its tests
            failures = {"<run>": f"[not run] {ended or sim['note'] or 'nothing collected'}"}
            if test_dir is not None and rec.get("kind") != "program":
                weight = tests_defined(test_dir / rec["file"])
        for test, line in failures.items():
            kind = failure_kind(line)
            kinds[kind] += weight
            examples.setdefault(kind, f"{key}::{test}")
        if ended.startswith(("crashed", "time bound")):
            crashes.append(f"{key}: {ended}")
        unsimulated = weight * sum(names_unsimulated(line) for line in failures.values())
        row = {
            "run": key,
            "group": rec["group"],
            "collected": max(len(outcomes), weight),
            "passed": len(passed),
            "skipped": len(skipped),
            "failed": weight * len(failures),
            "not_simulated": unsimulated,
            "wall_s": sim["wall_s"],
            "note": sim["note"],
            "failures": failures,
        }
        for field in ("collected", "passed", "skipped", "failed", "not_simulated"):
            totals[field] += row[field]
        runs.append(row)
    return {
        "runs": runs,
        "total": {"runs": len(runs), **totals},
        "failure_kinds": [
            {"count": n, "kind": k, "example": examples[k]} for k, n in kinds.most_common()
        ],
        "crashes_and_hangs": crashes,
    }


def print_report(summary: dict, top: int) -> None:
    print(f"{'run':70} {'coll':>5} {'pass':>5} {'skip':>5} {'fail':>5} {'unsim':>5} {'s':>6}")
    for r in summary["runs"]:
        print(
            f"{r['run'][:70]:70} {r['collected']:>5} {r['passed']:>5} {r['skipped']:>5} "
            f"{r['failed']:>5} {r['not_simulated']:>5} {r['wall_s'] or '-':>6}"
        )
    t = summary["total"]
    share = 100.0 * t["passed"] / t["collected"] if t["collected"] else 0.0
    print(
        f"TOTAL {t['runs']} runs: {t['passed']} of {t['collected']} collected tests pass "
        f"({share:.1f}%), {t['skipped']} skipped, {t['failed']} fail "
        f"({t['not_simulated']} naming what is not simulated)"
    )
    print_failures(summary, top)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tpu-ci",
        type=Path,
        metavar="SCRIPT",
        help="run every file one of pytorch/xla's TPU CI scripts runs, on the simulator only",
    )
    parser.add_argument(
        "--via-pytest",
        action="store_true",
        help="--tpu-ci: run test files with pytest instead of as the script does (python FILE)",
    )


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    script = args.tpu_ci.resolve()
    args.test_dir = script.parent.parent  # the scripts live in test/tpu/
    # As the script runs them: ``python3 FILE ARGS``, the file's ``__main__`` block included,
    # each test's outcome recorded (_unittest_record.py). With --via-pytest, pytest runs the
    # file, with absl's flags parsed as the absltest.main() it skips would (see the plugin).
    args.as_script = not args.via_pytest
    args.pytest_plugins = ("_absl_flags",)
    version = tpu_version(args.accelerator)
    entries = select(
        trace(script, test_dir=args.test_dir, script_args=(), tpu_version=version), args
    )
    if args.list:
        for entry in entries:
            print(f"{group_of(entry):18} {entry.kind:8} {entry.key} {' '.join(entry.args)}")
        return 0
    results = Results(args.json, script)
    results.data.setdefault("accelerator", args.accelerator)
    results.data.setdefault("topology", args.topology)
    if (results.data["accelerator"], results.data["topology"]) != (args.accelerator, args.topology):
        parser.error(
            f"{args.json} holds runs on {results.data['accelerator']} "
            f"{results.data['topology']}: use another --json for {args.accelerator}"
        )
    if not args.report_only:
        jobs = [e for e in entries if not results.has(e.key, SIDE)]
        (args.out_dir / SIDE).mkdir(parents=True, exist_ok=True)
        print(f"{len(jobs)} runs to make; logs in {args.out_dir}", file=sys.stderr)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(run_side, own_port(e), SIDE, args): e for e in jobs}
            for fut in concurrent.futures.as_completed(futures):
                entry, run = futures[fut], fut.result()
                results.record(entry, SIDE, run)
                passed = sum(o == PASSED for o in run["outcomes"].values())
                print(
                    f"  {entry.key}: {passed}/{len(run['outcomes'])} passed "
                    f"in {run['wall_s']}s {run['note']}",
                    file=sys.stderr,
                    flush=True,
                )
    summary = summarize(results.data["entries"], args.test_dir)
    print_report(summary, args.top)
    summary_path = args.json.with_name(args.json.stem + "-summary.json")
    summary_path.write_text(json.dumps(summary, indent=1))
    return 0
