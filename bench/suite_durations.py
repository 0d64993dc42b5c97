"""Where the test suite's time goes: the slowest tests and each file's total.

Reads a JUnit XML report (pytest's ``--junitxml``; each test's time there is its setup, call
and teardown together, module fixtures included in the test that set them up) or runs pytest to
write one, then prints

* the slowest tests (20 by default),
* every file's total, its number of tests and its slowest test,
* the xdist groups (``@pytest.mark.xdist_group``: their tests run one after another on one
  worker) against the rest: with ``-n N`` the run cannot end before its largest group does, nor
  before the total divided by N.

    python bench/suite_durations.py report.xml               # a report from an earlier run
    python bench/suite_durations.py --run -- -n 2 --dist loadgroup tests conformance
    python bench/suite_durations.py --run --cpu -- -n 2 --dist loadgroup tests conformance

``--cpu`` adds each file's CPU seconds, the processes its tests start included (simulated
hosts, child runs, Ray clusters), and the run's total: on a machine others load, wall times
measure their load, CPU times do not, and ``-n N`` on C cores cannot end before the total CPU
divided by C. It needs a writable cgroup v1 ``cpuacct`` hierarchy (:data:`CPUACCT`, root in a
container); see ``bench/_cpu_accounting.py``.

Run from the repository root.  Timings vary with the machine's load (its load average is
printed with a run); compare runs taken back to back on the same machine.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


@dataclass(frozen=True)
class Case:
    file: str
    name: str
    seconds: float
    outcome: str


def read_report(path: Path) -> list[Case]:
    """Every test case of a JUnit XML report, with the file it is in."""
    cases = []
    for tc in ET.parse(path).iter("testcase"):
        # pytest writes classname "tests.test_x" (or "tests.test_x.TestClass") and the file only
        # when junit_family includes it; rebuild the path from the module part.
        classname = tc.get("classname", "")
        file = tc.get("file") or _file_of(classname)
        outcome = "passed"
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                break
        cases.append(Case(file, tc.get("name", ""), float(tc.get("time", 0.0)), outcome))
    return cases


def _file_of(classname: str) -> str:
    parts = [p for p in classname.split(".") if p]
    # The longest dotted prefix that is a file of the repository (a class name follows it).
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / path).exists():
            return str(path)
    return classname


def xdist_groups(files: set[str]) -> dict[str, str]:
    """Test id prefix (a file, or file::test) -> its xdist group, read from the sources.

    A module-level ``pytestmark`` with ``xdist_group("g")`` puts the whole file in ``g``; a
    decorator on one test puts that test in it.
    """
    groups: dict[str, str] = {}
    for file in files:
        path = ROOT / file
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
            ):
                group = _group_in(node.value)
                if group:
                    groups[file] = group
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for deco in node.decorator_list:
                    group = _group_in(deco)
                    if group:
                        groups[f"{file}::{node.name}"] = group
    return groups


def _group_in(node: ast.AST) -> str | None:
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "xdist_group"
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
        ):
            return str(sub.args[0].value)
    return None


def _group_of(case: Case, groups: dict[str, str]) -> str | None:
    base = case.name.split("[", 1)[0]
    return groups.get(f"{case.file}::{base}") or groups.get(case.file)


def report(cases: list[Case], top: int, workers: int) -> None:
    total = sum(c.seconds for c in cases)
    print(f"{len(cases)} tests, {total:.1f} s of test time in all")

    print(f"\nslowest {top} tests (setup + call + teardown):")
    for c in sorted(cases, key=lambda c: -c.seconds)[:top]:
        flag = "" if c.outcome == "passed" else f"  [{c.outcome}]"
        print(f"  {c.seconds:8.1f} s  {c.file}::{c.name}{flag}")

    per_file: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        per_file[c.file].append(c)
    print("\nper file (total, tests, slowest test):")
    for file, group in sorted(per_file.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        seconds = sum(c.seconds for c in group)
        if seconds < 0.5:
            continue
        slowest = max(group, key=lambda c: c.seconds)
        print(f"  {seconds:8.1f} s  {len(group):4d}  {file}  (slowest {slowest.seconds:.1f} s)")

    groups = xdist_groups(set(per_file))
    per_group: dict[str, float] = defaultdict(float)
    ungrouped = 0.0
    for c in cases:
        g = _group_of(c, groups)
        if g is None:
            ungrouped += c.seconds
        else:
            per_group[g] += c.seconds
    print("\nxdist groups (each runs on one worker, its tests one after another):")
    for g, seconds in sorted(per_group.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds:8.1f} s  {g}")
    print(f"  {ungrouped:8.1f} s  (no group: spread over the workers)")
    largest = max(per_group.values(), default=0.0)
    print(
        f"\nwith -n {workers}: no run ends before {max(largest, total / workers):.0f} s "
        f"(largest group {largest:.0f} s, total / {workers} = {total / workers:.0f} s)"
    )


def cpu_report(records: list[dict[str, Any]], total_s: float, top: int) -> None:
    """Per file: CPU seconds of its tests (with everything they started), tests; the run's
    total, which also counts what ran outside any test (collection, worker start-up)."""
    per_file: dict[str, list[float]] = defaultdict(list)
    for r in records:
        per_file[r["nodeid"].split("::", 1)[0]].append(r["cpu_s"])
    in_tests = sum(sum(v) for v in per_file.values())
    print(f"\nCPU: {total_s:.0f} s in all, {in_tests:.0f} s in tests")
    print(f"slowest {top} tests by CPU:")
    for r in sorted(records, key=lambda r: -r["cpu_s"])[:top]:
        print(f"  {r['cpu_s']:8.1f} s  {r['nodeid']}")
    print("per file (CPU, tests):")
    for file, secs in sorted(per_file.items(), key=lambda kv: -sum(kv[1])):
        if sum(secs) >= 0.5:
            print(f"  {sum(secs):8.1f} s  {len(secs):4d}  {file}")
    cores = os.cpu_count() or 1
    print(f"on {cores} CPUs no run ends before {total_s / cores:.0f} s (CPU in all / {cores})")


def _cpu_cgroup() -> Path:
    cgroup = CPUACCT / f"suite-durations-{os.getpid()}"
    try:
        cgroup.mkdir()
    except OSError as exc:
        raise SystemExit(f"--cpu needs a writable cgroup v1 cpuacct hierarchy: {exc}") from None
    return cgroup


def _cgroup_usage_s(cgroup: Path) -> float:
    return sum(int((d / "cpuacct.usage").read_text()) / 1e9 for d in cgroup.iterdir() if d.is_dir())


def run_pytest(args: list[str], cpu: bool = False) -> tuple[Path, int, list[dict[str, Any]], float]:
    tmp = Path(tempfile.mkdtemp(prefix="suite-durations-"))
    out = tmp / "report.xml"
    cmd = [sys.executable, "-m", "pytest", f"--junitxml={out}", *args]
    env = dict(os.environ)
    cgroup = None
    if cpu:
        cgroup = _cpu_cgroup()
        cmd[3:3] = ["-p", "_cpu_accounting"]
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "bench"), env.get("PYTHONPATH")])
        )
        env["XLASIM_BENCH_CPU_CGROUP"] = str(cgroup)
        env["XLASIM_BENCH_CPU_OUT"] = str(tmp / "cpu")
    print("$", " ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"\npytest exited {proc.returncode} after {time.monotonic() - start:.0f} s wall "
        f"(load average {load:.1f} on {os.cpu_count()} CPUs)"
    )
    if not out.exists():
        raise SystemExit("pytest wrote no report")
    records: list[dict[str, Any]] = []
    total_s = 0.0
    if cgroup is not None:
        for path in sorted(tmp.glob("cpu.*")):
            records += [json.loads(line) for line in path.read_text().splitlines()]
        total_s = _cgroup_usage_s(cgroup)
        for d in [*(d for d in cgroup.iterdir() if d.is_dir()), cgroup]:
            try:
                d.rmdir()
            except OSError:  # a process of the run outlived it: the cgroup stays with it
                print(f"(left {d}: a process of the run is still in it)")
    return out, proc.returncode, records, total_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path, help="a JUnit XML report")
    parser.add_argument("--run", action="store_true", help="run pytest (arguments after --)")
    parser.add_argument(
        "--cpu", action="store_true", help="with --run: CPU seconds per file (cgroup v1, root)"
    )
    parser.add_argument("--top", type=int, default=20, help="how many slowest tests to list")
    parser.add_argument("-n", "--workers", type=int, default=2, help="xdist workers to assume")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after the first "--" is pytest's, untouched: its -n must not reach this parser.
    split = argv.index("--") if "--" in argv else len(argv)
    ns = parser.parse_args(argv[:split])
    pytest_args = argv[split + 1 :]
    rc = 0
    records: list[dict[str, Any]] = []
    total_cpu_s = 0.0
    if ns.cpu and not ns.run:
        parser.error("--cpu measures a run: give --run too")
    if ns.run:
        path, rc, records, total_cpu_s = run_pytest(pytest_args, cpu=ns.cpu)
    elif ns.report is not None:
        path = ns.report
    else:
        parser.error("give a report, or --run -- PYTEST_ARGS")
    report(read_report(path), ns.top, ns.workers)
    if ns.cpu:
        cpu_report(records, total_cpu_s, ns.top)
    # A run that collected nothing or failed is reported, and its exit status kept.
    return rc


if __name__ == "__main__":
    sys.exit(main())
