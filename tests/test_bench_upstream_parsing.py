"""The upstream-measurement scripts read pytest's junit files and verbose lines, and program logs,
into the outcomes their tables count; these tests feed them hand-written reports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str):
    sys.path.insert(0, str(BENCH))  # the scripts import their folder's helper module
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def pass_rate():
    return _load("upstream_pass_rate")


@pytest.fixture(scope="module")
def examples():
    return _load("upstream_examples")


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test.spmd.test_a.ShardTest" name="test_ok" time="0.1"/>
<testcase classname="test.spmd.test_a.ShardTest" name="test_bad" time="0.1">
  <failure message="AssertionError: 3 != 4&#10;more detail">trace</failure></testcase>
<testcase classname="test.spmd.test_a.ShardTest" name="test_setup" time="0.1">
  <error message="failed on setup with &quot;NotImplementedError: x&quot;">
E   NotImplementedError: xlasim does not simulate x
  </error></testcase>
<testcase classname="test.spmd.test_a.ShardTest" name="test_skip" time="0">
  <skipped type="pytest.skip" message="needs TPU v4">skip</skipped></testcase>
<testcase classname="test.spmd.test_a.ShardTest" name="test_xfail" time="0">
  <skipped type="pytest.xfail" message="known"/></testcase>
<testcase classname="test.spmd.test_a.ShardTest" name="test_teardown" time="0.1">
  <error message="failed on teardown with &quot;E&quot;">
E   RuntimeError: teardown broke
  </error></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes_and_first_error_lines(pass_rate) -> None:
    run = pass_rate.parse_junit(JUNIT)
    assert run.outcomes == {
        "ShardTest::test_ok": "passed",
        "ShardTest::test_bad": "failed",
        "ShardTest::test_setup": "error",
        "ShardTest::test_skip": "skipped",
        "ShardTest::test_xfail": "xfailed",
        "ShardTest::test_teardown": "error",
    }
    assert run.first_lines["ShardTest::test_bad"] == "AssertionError: 3 != 4"
    # pytest's "failed on setup" summary loses to the E line that names the error
    assert run.first_lines["ShardTest::test_setup"] == (
        "NotImplementedError: xlasim does not simulate x"
    )
    assert run.first_lines["ShardTest::test_teardown"] == "RuntimeError: teardown broke"
    assert run.note == ""


def test_collection_error_becomes_the_files_note(pass_rate) -> None:
    xml = """<testsuites><testsuite><testcase classname="" name="test_b">
      <error message="collection failure">
E   ModuleNotFoundError: No module named 'torch_xla.amp'
      </error></testcase></testsuite></testsuites>"""
    run = pass_rate.parse_junit(xml)
    assert run.outcomes == {}
    assert run.note == "collection error: ModuleNotFoundError: No module named 'torch_xla.amp'"


def test_verbose_lines_give_the_ids_junit_gives(pass_rate) -> None:
    output = "\n".join(
        [
            "test_a.py::ShardTest::test_ok PASSED                       [ 10%]",
            "test_a.py::ShardTest::test_bad FAILED                      [ 20%]",
            "some printed line mentioning test_a.py::X::y PASSED in the middle",
            "test_a.py::ShardTest::test_param_0 SKIPPED (needs TPU)     [ 30%]",
        ]
    )
    run = pass_rate.parse_verbose(output)
    assert run.outcomes == {
        "ShardTest::test_ok": "passed",
        "ShardTest::test_bad": "failed",
        "ShardTest::test_param_0": "skipped",
    }
    assert pass_rate.case_id("test.spmd.test_a.ShardTest", "test_ok") == "ShardTest::test_ok"


def test_summary_counts_only_tests_that_pass_on_real(pass_rate) -> None:
    real = pass_rate.FileRun({"A::t1": "passed", "A::t2": "passed", "A::t3": "failed"})
    sim = pass_rate.FileRun({"A::t1": "passed", "A::t2": "error", "A::t3": "passed"})
    sim.first_lines["A::t2"] = "AttributeError: no x"
    summary = pass_rate.summarize(["f.py"], {"f.py": real}, {"f.py": sim})
    assert (summary["real_passed"], summary["sim_passed"]) == (2, 1)
    assert summary["percent"] == 50.0
    assert summary["files"][0]["sim_failures"] == {"A::t2": "[error] AttributeError: no x"}
    sim_cut = pass_rate.FileRun({"A::t1": "skipped"}, note="time bound 9s tripped (--timeout)")
    summary = pass_rate.summarize(["f.py"], {"f.py": real}, {"f.py": sim_cut})
    assert summary["files"][0]["sim_failures"] == {
        "A::t1": "[skipped]",
        "A::t2": "[not run] time bound 9s tripped (--timeout)",
    }


def test_example_log_parsing(examples) -> None:
    log = "\n".join(
        [
            "epoch: 1, step: 0, loss: tensor(6.9, device='xla:0'), rate: 1.0",
            "epoch: 1, step: 10, loss: 5.25, rate: 2.0",
            "Traceback (most recent call last):",
            '  File "x.py", line 3, in <module>',
            "NotImplementedError: torch_xla.compile(full_graph=True) is not simulated",
        ]
    )
    out = examples.parse_output(log, 1, 600)
    assert (out.status, out.steps_logged, out.losses) == (
        "failed rc=1 after 2 logged steps",
        2,
        ["6.9", "5.25"],
    )
    assert out.error == "NotImplementedError: torch_xla.compile(full_graph=True) is not simulated"
    assert examples.parse_output("Step: 0, Tracing time: 1s", None, 60).status == (
        "time bound 60s after 1 logged steps"
    )
    assert examples.parse_output("done", 0, 60).status == "finished"
    pool = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "x.py", line 3, in <module>',
            "concurrent.futures.process.BrokenProcessPool: A process in the pool was terminated",
        ]
    )
    assert examples.parse_output(pool, 1, 60).error.startswith("concurrent.futures.process.Broken")
    crash = "step 1\nterminate called after throwing an instance of 'std::bad_alloc'\n  what()"
    assert examples.parse_output(crash, -6, 60).error == (
        "terminate called after throwing an instance of 'std::bad_alloc'"
    )
    raised_then_abort = pool.replace("concurrent.futures.process.BrokenProcessPool", "ValueError")
    raised_then_abort += "\nterminate called without an active exception"
    assert examples.parse_output(raised_then_abort, -6, 60).error.startswith("ValueError: ")


def test_a_run_stopped_after_its_first_logged_steps(examples, tmp_path) -> None:
    """--stop-after-steps ends a TPU-sized program once it has shown its first steps: the run is
    killed as soon as the log holds them (not at the time bound) and reported as stopped."""
    program = (
        "import time\n"
        "for step in range(3):\n"
        "    print(f'epoch: 1, step: {step}, loss: {7 - step}.5', flush=True)\n"
        "time.sleep(120)\n"
    )
    log = tmp_path / "run.log"
    rc = examples.run_bounded(
        [sys.executable, "-c", program],
        env={},
        cwd=tmp_path,
        log=log,
        timeout=60,
        nice=0,
        stop_when=lambda out: len(examples.logged_steps(out)) >= 2,
    )
    assert rc == examples.STOPPED
    out = examples.parse_output(log.read_text(), rc, 60)
    assert (out.status, out.losses) == ("stopped after 3 logged steps", ["7.5", "6.5", "5.5"])
    # without the predicate the same program runs into its bound, reported as such
    rc = examples.run_bounded(
        [sys.executable, "-c", program], env={}, cwd=tmp_path, log=log, timeout=2, nice=0
    )
    assert rc is None
