"""How many of pytorch/xla's own tests that pass on real torch_xla (CPU) also pass on xlasim.

Each test file runs twice, unchanged, with pytest from the file's own directory (upstream's
tests import their neighbours, e.g. ``import test_xla_sharding_base``):

  real: PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 REAL_PY -m pytest ... FILE
  sim:  SIM_PY -m xlasim run --topology 2x2x1 --accelerator v4 -- SIM_PY -m pytest ... FILE

and the per-test outcomes (from ``--junitxml``; from pytest's ``-v`` lines when a run is cut
short by the time bound or a crash) are compared. The table says, per file, how many tests pass
on real torch_xla and how many of *those* pass on the simulator; the JSON (``--json``) has every
test's outcome and, for each one that fails on the simulator, the first line of its error.

    python bench/upstream_pass_rate.py /path/to/xla/test \\
        --real-python /venvs/xla/bin/python --sim-python /venvs/sim/bin/python \\
        [FILE ...] [--jobs 2] [--nice 10] [--timeout 1200] [--json out.json] \\
        [--reuse-real previous.json]   # skip the (slow, unchanging) real runs

    python bench/upstream_pass_rate.py --cpu-ci /path/to/xla/test/run_tests.sh \\
        --real-python ... --sim-python ... --json results.json [--only GLOB] [--skip GLOB]
        # every run pytorch/xla's CPU CI script makes, each with the environment the script
        # gives it, on both sides; resumable (see _cpu_ci.py)

    python bench/upstream_pass_rate.py --tpu-ci /path/to/xla/test/tpu/run_tests.sh \\
        --sim-python ... --accelerator v6e --topology 2x4 --json results-v6e.json
        # every run a TPU CI script makes, on the simulated TPU VM only (no real TPU to
        # compare with: the denominator is the tests collected); resumable (see _tpu_ci.py)

FILEs are relative to the test dir; the default is ``spmd/test_*.py test_metrics.py
test_devices.py pjrt/test_runtime.py``. Copy the test dir somewhere writable first: pytest
writes ``__pycache__`` next to the files.

Plugins: both runs pass ``-p no:xlasim -p no:cacheprovider``. Under the real runtime the xlasim
plugin (installed as a pytest11 entry point where the package is) must not be loaded: it is not
part of upstream's setup. Under the simulator it would not change the result either - the
simulator is switched on by ``xlasim run``'s environment through ``xlasim.pth`` at interpreter
start, not by the plugin, and the plugin only acts on tests that use its ``xla_target`` /
``xlasim_sim`` fixtures, which upstream tests do not - but it adds ``--topology`` and
``--accelerator`` options to pytest, so it is kept out of both runs alike. The interpreters'
environments are inherited; ``--real-env``/``--sim-env K=V`` set variables for one side only
(e.g. a ``PYTHONPATH`` adding test-only packages such as ``absl-py`` that a venv lacks, or the
xlasim checkout to measure); ``PJRT_DEVICE``/``CPU_NUM_DEVICES``/``XLASIM_*`` are set or
removed per side.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
from pathlib import Path

# this folder's helper modules (the script's own dir is on sys.path)
import _cpu_ci
import _tpu_ci
from _pytest_reports import PASSED, PYTEST_ARGS, FileRun, parse_junit, parse_verbose
from _upstream_run import add_side_options, check_side_options, run_bounded, side_command

DEFAULT_FILES = ("spmd/test_*.py", "test_metrics.py", "test_devices.py", "pjrt/test_runtime.py")


def _run_pytest(
    cmd: list[str], env: dict[str, str], cwd: Path, junit: Path, log: Path, args
) -> FileRun:
    rc = run_bounded(cmd, env=env, cwd=cwd, log=log, timeout=args.timeout, nice=args.nice)
    if rc is not None and junit.exists():
        return parse_junit(junit.read_text(errors="replace"))
    output = log.read_text(errors="replace")
    run = parse_verbose(output)
    if rc is None:
        run.note = f"time bound {args.timeout:g}s tripped (--timeout)"
    else:
        run.note = f"pytest exited {rc} without a junit report: {_last_line(output)}"
    return run


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def run_file(rel: str, side: str, args) -> FileRun:
    path = (args.test_dir / rel).resolve()
    slug = rel.replace("/", "__")
    junit = args.out_dir / side / f"{slug}.xml"
    log = args.out_dir / side / f"{slug}.log"
    junit.unlink(missing_ok=True)
    cmd, env = side_command(
        side, args, ["-m", "pytest", *PYTEST_ARGS, f"--junitxml={junit}", path.name]
    )
    return _run_pytest(cmd, env, path.parent, junit, log, args)


def expand_files(test_dir: Path, patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        found = sorted(str(p.relative_to(test_dir)) for p in test_dir.glob(pattern))
        if not found:
            raise SystemExit(f"no test file matches {pattern!r} under {test_dir}")
        files += [f for f in found if f not in files and not f.endswith("_base.py")]
    return files


def summarize(files: list[str], real: dict[str, FileRun], sim: dict[str, FileRun]) -> dict:
    rows, total_real, total_sim = [], 0, 0
    for rel in files:
        r, s = real[rel], sim.get(rel, FileRun())
        real_pass = sorted(t for t, o in r.outcomes.items() if o == PASSED)
        sim_pass = [t for t in real_pass if s.outcomes.get(t) == PASSED]
        failures = {
            t: f"[{s.outcomes[t]}] {s.first_lines.get(t, '')}".rstrip()
            if t in s.outcomes
            else f"[not run] {s.note or 'not collected'}"
            for t in real_pass
            if t not in sim_pass
        }
        total_real, total_sim = total_real + len(real_pass), total_sim + len(sim_pass)
        rows.append(
            {
                "file": rel,
                "real_collected": len(r.outcomes),
                "real_passed": len(real_pass),
                "sim_passed": len(sim_pass),
                "real_note": r.note,
                "sim_note": s.note,
                "real": r.outcomes,
                "sim": s.outcomes,
                "sim_failures": failures,
            }
        )
    pct = 100.0 * total_sim / total_real if total_real else 0.0
    return {"files": rows, "real_passed": total_real, "sim_passed": total_sim, "percent": pct}


def print_table(summary: dict) -> None:
    print(f"{'file':45} {'real pass/coll':>14} {'sim pass':>9}  notes")
    for row in summary["files"]:
        notes = "; ".join(
            f"{side}: {row[side + '_note']}" for side in ("real", "sim") if row[side + "_note"]
        )
        real_col = f"{row['real_passed']}/{row['real_collected']}"
        print(f"{row['file']:45} {real_col:>14} {row['sim_passed']:>9}  {notes[:160]}")
    print(
        f"TOTAL: {summary['sim_passed']} of {summary['real_passed']} real-passing tests pass on "
        f"the simulator ({summary['percent']:.1f}%)"
    )


def _load_real(path: Path) -> dict[str, FileRun]:
    rows = json.loads(path.read_text())["files"]
    return {row["file"]: FileRun(row["real"], {}, row["real_note"]) for row in rows}


def _script_run_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, flag: str
) -> None:
    """What a CI-script run needs besides its script: the side options, a results file to add
    to and resume from (unless only listing), and a logs folder beside it."""
    check_side_options(parser, args)
    if args.json is None and not args.list:
        parser.error(f"{flag} needs --json (the results file it adds to and resumes from)")
    logs = args.json.with_suffix(".logs") if args.json else Path(tempfile.mkdtemp())
    args.out_dir = (args.out_dir or logs).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "test_dir", type=Path, nargs="?", help="pytorch/xla's test/ directory (a copy)"
    )
    parser.add_argument("files", nargs="*", help="files or globs relative to test_dir")
    parser.add_argument("--real-python", help="interpreter with real torch_xla 2.9")
    parser.add_argument("--sim-python", required=True, help="interpreter with xlasim installed")
    parser.add_argument(
        "--reuse-real",
        type=Path,
        action="append",
        default=[],
        help="take real outcomes from this --json (--cpu-ci: repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per file and side")
    parser.add_argument("--jobs", type=int, default=2, help="files run at once (default 2)")
    add_side_options(parser)
    parser.add_argument("--out-dir", type=Path, help="junit files and logs (default: a tmp dir)")
    parser.add_argument("--json", type=Path, help="write per-test outcomes here")
    _cpu_ci.add_options(parser)
    _tpu_ci.add_options(parser)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be >= 1")
    if args.tpu_ci:
        if args.cpu_ci or args.test_dir or args.files or args.real_python or args.reuse_real:
            parser.error(
                "--tpu-ci runs its script's files on the simulator only: give no "
                "--cpu-ci, test_dir, FILEs, --real-python or --reuse-real"
            )
        _script_run_options(parser, args, "--tpu-ci")
        return _tpu_ci.main(args, parser)
    if args.cpu_ci:
        if args.test_dir or args.files:
            parser.error("--cpu-ci runs the files its script names: give no test_dir or FILEs")
        _script_run_options(parser, args, "--cpu-ci")
        return _cpu_ci.main(args, parser)
    if args.test_dir is None or not args.test_dir.is_dir():
        parser.error(f"test_dir {str(args.test_dir)!r} is not a directory")
    if bool(args.real_python) == bool(args.reuse_real) or len(args.reuse_real) > 1:
        parser.error("give exactly one of --real-python and --reuse-real")
    check_side_options(parser, args)
    args.test_dir = args.test_dir.resolve()
    files = expand_files(args.test_dir, args.files or list(DEFAULT_FILES))
    args.out_dir = (args.out_dir or Path(tempfile.mkdtemp(prefix="upstream_pass_rate_"))).resolve()
    for side in ("real", "sim"):
        (args.out_dir / side).mkdir(parents=True, exist_ok=True)
    print(f"logs and junit files: {args.out_dir}", file=sys.stderr)

    real = _load_real(args.reuse_real[0]) if args.reuse_real else {}
    missing = [f for f in files if f not in real]
    if args.reuse_real and missing:
        parser.error(f"{args.reuse_real} has no real outcomes for {missing}")
    jobs = [(f, "real") for f in files if f not in real] + [(f, "sim") for f in files]
    sim: dict[str, FileRun] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_file, f, side, args): (f, side) for f, side in jobs}
        for fut in concurrent.futures.as_completed(futures):
            rel, side = futures[fut]
            (real if side == "real" else sim)[rel] = result = fut.result()
            passed = sum(o == PASSED for o in result.outcomes.values())
            print(
                f"  {side:4} {rel}: {passed}/{len(result.outcomes)} passed {result.note}",
                file=sys.stderr,
            )
    summary = summarize(files, real, sim)
    print_table(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
