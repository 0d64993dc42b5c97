"""The upstream-measurement scripts read pytest's junit files and verbose lines, and program logs,
into the outcomes their tables count; these tests feed them hand-written reports."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
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
    reports = sys.modules["_pytest_reports"]  # where upstream_pass_rate's parsers live
    assert reports.case_id("test.spmd.test_a.ShardTest", "test_ok") == "ShardTest::test_ok"


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


# A CI script of the shape pytorch/xla's run_tests.sh has (written for this test): functions
# that prefix variables and end in python3, a wrapper that takes the runner as its first
# argument, a bare python3 with its own prefix, a clean-up rm and a `python -c` query.
CI_SCRIPT = """#!/bin/bash
set -exo pipefail
_TEST_DIR="$(cd "$(dirname "$0")"; pwd -P)"
export CPU_NUM_DEVICES=4
export XLA_DUMP_FATAL_STACK=1
LIB=$(cd ~; dirname "$(python -c 'import torch_xla; print(torch_xla.__file__)')")
function one_device { PJRT_DEVICE=CPU CPU_NUM_DEVICES=1 python3 "$@"; }
function with_debug { local runner="$1"; shift; XLA_SOME_DEBUG=1 "$runner" "$@"; }
function all_runs {
  one_device "$_TEST_DIR/sub/test_alpha.py" --verbosity=2
  with_debug one_device "$_TEST_DIR/test_beta.py"
  rm -f "$_TEST_DIR/keep.txt"
  DUMP_TO=/tmp/dump.txt one_device "$_TEST_DIR/test_beta.py"
  PJRT_DEVICE=CPU python3 "$_TEST_DIR/test_gamma.py"
}
all_runs
"""
PYTEST_FILE = "import unittest\n\nclass AlphaTest(unittest.TestCase):\n  def test_a(self): pass\n"
PROGRAM_FILE = (
    "import unittest\n\nclass GammaTest(unittest.TestCase):\n  def test_g(self): pass\n\n"
    "def _mp_fn(index):\n  unittest.main(exit=False)\n\n"
    "if __name__ == '__main__':\n  torch_xla.launch(_mp_fn, args=())\n"
)


@pytest.fixture(scope="module")
def ci():
    _load("upstream_pass_rate")  # puts the helper modules in sys.modules
    return sys.modules["_ci_script"], sys.modules["_cpu_ci"]


def test_ci_script_trace_gives_each_run_its_environment(ci, tmp_path) -> None:
    ci_script, cpu_ci = ci
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_alpha.py").write_text(PYTEST_FILE)
    (tmp_path / "test_beta.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "test_gamma.py").write_text(PROGRAM_FILE)
    (tmp_path / "keep.txt").write_text("the trace must not delete this")
    (tmp_path / "run_tests.sh").write_text(CI_SCRIPT)
    entries = ci_script.trace(tmp_path / "run_tests.sh")
    common = {"XLA_DUMP_FATAL_STACK": "1", "PJRT_DEVICE": "CPU"}
    got = [(e.file, e.env, e.args, e.kind) for e in entries]
    assert got == [
        ("sub/test_alpha.py", {**common, "CPU_NUM_DEVICES": "1"}, ["--verbosity=2"], "pytest"),
        ("test_beta.py", {**common, "CPU_NUM_DEVICES": "1", "XLA_SOME_DEBUG": "1"}, [], "pytest"),
        (
            "test_beta.py",
            {**common, "CPU_NUM_DEVICES": "1", "DUMP_TO": "/tmp/dump.txt"},
            [],
            "pytest",
        ),
        # the exported CPU_NUM_DEVICES reaches a run no function overrides
        ("test_gamma.py", {**common, "CPU_NUM_DEVICES": "4"}, [], "program"),
    ]
    assert (tmp_path / "keep.txt").exists()
    # runs of one file are told apart by the variables their variant adds
    assert [e.key for e in entries] == [
        "sub/test_alpha.py",
        "test_beta.py [XLA_SOME_DEBUG=1]",
        "test_beta.py [DUMP_TO=/tmp/dump.txt]",
        "test_gamma.py",
    ]
    assert [cpu_ci.group_of(e) for e in entries] == ["ops", "ops", "ops", "mp scripts"]
    private = cpu_ci.private_paths(entries[2].env, tmp_path / "own")
    assert private["DUMP_TO"] == str(tmp_path / "own" / "dump.txt")
    assert (tmp_path / "own").is_dir() and private["PJRT_DEVICE"] == "CPU"


def test_classify_pytest_files_and_programs(ci) -> None:
    ci_script, _ = ci
    assert ci_script.classify(PYTEST_FILE) == "pytest"
    assert ci_script.classify(PROGRAM_FILE) == "program"  # its tests run in spawned workers
    script = "import torch_xla\n\nif __name__ == '__main__':\n  print('no tests here')\n"
    assert ci_script.classify(script) == "program"


def test_ci_summary_groups_kinds_crashes_and_time(ci) -> None:
    _, cpu_ci = ci

    def side(outcomes, lines=None, note="", wall=10.0, rc=0):
        run = {"outcomes": outcomes, "first_lines": lines or {}, "note": note, "wall_s": wall}
        return {**run, "rc": rc}

    records = {
        "spmd/test_s.py": {
            "group": "spmd",
            "real": side({"S::a": "passed", "S::b": "passed", "S::c": "failed"}),
            "sim": side(
                {"S::a": "passed", "S::b": "failed"},
                {"S::b": "AssertionError: 3 != 4"},
                wall=30.0,
            ),
        },
        "test_o.py [XLA_X=1]": {
            "group": "ops",
            "real": side({"O::a": "passed", "O::b": "passed", "O::c": "passed"}),
            "sim": side({}, note="crashed: killed by SIGSEGV", wall=5.0),
        },
        "test_m.py": {
            "group": "mp scripts",
            "real": side({"<program>": "passed"}),
            # xlasim run reports a host process's signal N as exit status 128 + N
            "sim": side({"<program>": "failed"}, {"<program>": "AssertionError: 7 != 8"}, rc=134),
        },
        "test_half.py": {"group": "ops", "real": side({"H::a": "passed"})},  # sim not run yet
    }
    summary = cpu_ci.summarize(records)
    assert summary["total"] == {"runs": 3, "real_passed": 6, "sim_passed": 1}
    assert summary["groups"]["spmd"] == {"runs": 1, "real_passed": 2, "sim_passed": 1}
    assert summary["groups"]["ops"] == {"runs": 1, "real_passed": 3, "sim_passed": 0}
    # largest kinds first; both assertion failures are one kind (numbers blanked)
    assert summary["failure_kinds"][0] == {
        "count": 3,
        "kind": "[not run] crashed: killed by SIGSEGV",
        "example": "test_o.py [XLA_X=1]::O::a",
    }
    assert summary["failure_kinds"][1]["kind"] == "AssertionError: N != N"
    assert summary["failure_kinds"][1]["count"] == 2
    assert summary["crashes_and_hangs"] == [
        "sim test_m.py: crashed: killed by SIGABRT",
        "sim test_o.py [XLA_X=1]: crashed: killed by SIGSEGV",
    ]
    assert summary["time"] == {"real_s": 30.0, "sim_s": 45.0, "ratio": 1.5}


# A TPU CI script as pytorch/xla's test/tpu/*.sh write them: it lives in test/tpu/, takes no
# flags, runs single test cases with ``python -m unittest`` from the test dir, passes flags the
# file reads itself, checks a save-tensors run left its file (under ``set -e``) and picks runs
# by the TPU generation ``torch_xla._internal.tpu.version()`` reports.
TPU_CI_SCRIPT = """\
#!/bin/bash
set -xue
_TEST_DIR="$(dirname "$(cd "$(dirname "$0")"; pwd -P)")"
(cd $_TEST_DIR && python3 -m unittest test_alpha.AlphaTest.test_a)
python3 "$_TEST_DIR/test_alpha.py" -v
python3 "$_TEST_DIR/test_alpha.py" --test_flag
XLA_SAVE_TENSORS_FILE=$_TEST_DIR/saved.txt python3 "$_TEST_DIR/test_alpha.py"
actual=$(ls "$_TEST_DIR/saved.txt"* | head -n1)
rm "$actual"
V=$(python -c "import torch_xla; print(torch_xla._internal.tpu.version())")
if [[ "$V" == "4" ]]; then
  python3 "$_TEST_DIR/test_gamma.py"
fi
"""


def test_ci_script_trace_refuses_a_cut_list(ci, tmp_path, monkeypatch) -> None:
    ci_script, _ = ci
    (tmp_path / "test_beta.py").write_text("def test_b():\n    pass\n")
    script = tmp_path / "run_tests.sh"
    script.write_text('set -e\npython3 "$(dirname "$0")/test_beta.py"\nfalse\npython3 x.py\n')
    monkeypatch.setattr(ci_script, "GRAPH_DUMP", str(tmp_path / "dump.txt"))
    with pytest.raises(RuntimeError, match=r"stopped early \(exit 1\)"):
        ci_script.trace(script)
    # a graph dump left from an earlier run: the scripts would skip or stop at their dump runs
    (tmp_path / "dump.txt.0").write_text("")
    with pytest.raises(RuntimeError, match=r"dump\.txt\.0 exists: .* remove it first"):
        ci_script.trace(script)


def test_tpu_ci_script_trace(ci, tmp_path) -> None:
    ci_script, _ = ci
    (tmp_path / "tpu").mkdir()
    (tmp_path / "tpu" / "run_tests.sh").write_text(TPU_CI_SCRIPT)
    (tmp_path / "test_alpha.py").write_text(PYTEST_FILE)
    (tmp_path / "test_gamma.py").write_text(PROGRAM_FILE)

    def keys(version: str) -> list[tuple[str, str, str]]:
        entries = ci_script.trace(
            tmp_path / "tpu" / "run_tests.sh",
            test_dir=tmp_path,
            script_args=(),
            tpu_version=version,
        )
        return [(e.key, e.kind, e.case) for e in entries]

    saved = f"test_alpha.py [XLA_SAVE_TENSORS_FILE={tmp_path}/saved.txt]"
    on_v6e = [
        ("test_alpha.py::AlphaTest::test_a", "pytest", "AlphaTest::test_a"),
        ("test_alpha.py", "pytest", ""),  # -v is unittest's verbosity: no variant
        ("test_alpha.py [--test_flag]", "pytest", ""),
        (saved, "pytest", ""),
    ]
    assert keys("6") == on_v6e
    assert keys("4") == [*on_v6e, ("test_gamma.py", "program", "")]
    # the recorder made the file the script checks for, and the script's rm removed it
    assert not (tmp_path / "saved.txt").exists()


def test_file_flags_and_tpu_versions(ci) -> None:
    _, cpu_ci = ci
    tpu_ci = sys.modules["_tpu_ci"]
    assert cpu_ci.file_flags(["-v", "--verbosity=2", "--test_autocast"]) == ["--test_autocast"]
    assert [tpu_ci.tpu_version(a) for a in ("v4", "v5litepod", "v5p", "v6e")] == [
        "4",
        "5",
        "5",
        "6",
    ]
    with pytest.raises(ValueError, match="TPU generation"):
        tpu_ci.tpu_version("tpu7x")
    entry = sys.modules["_ci_script"].Entry("test_a.py", {"XLA_X": "1"})
    # a port of its own even one run at a time: other runs on this machine may hold 12355
    port = tpu_ci.own_port(entry).env["MASTER_PORT"]
    assert int(port) > 0 and entry.env == {"XLA_X": "1"}
    assert tpu_ci.names_unsimulated("NotImplementedError: xlasim does not simulate x")
    assert tpu_ci.names_unsimulated("xlasim.runtime.unsimulated.UnsimulatedAttribute: y")
    assert tpu_ci.names_unsimulated("RuntimeError: xlasim does not simulate z")
    assert not tpu_ci.names_unsimulated("AssertionError: 3 != 4")
    pinned = sys.modules["_ci_script"].Entry("t.py", {"MASTER_PORT": "12355"})
    assert tpu_ci.own_port(pinned) is pinned


def test_tpu_ci_summary_counts_collected_tests_and_unsimulated_failures(ci, tmp_path) -> None:
    tpu_ci = sys.modules["_tpu_ci"]
    (tmp_path / "test_b.py").write_text(
        "class B:\n  def test_1(self): ...\n  def test_2(self): ...\n\ndef test_3(): ...\n"
    )

    def sim(outcomes, lines=None, note="", rc=0):
        return {"outcomes": outcomes, "first_lines": lines or {}, "note": note, "rc": rc,
                "wall_s": 3.0}  # fmt: skip

    records = {
        "test_a.py": {
            "group": "ops",
            "sim": sim(
                {"A::ok": "passed", "A::skip": "skipped", "A::ni": "failed", "A::bad": "error"},
                {"A::ni": "NotImplementedError: xlasim does not simulate x", "A::bad": "E 3"},
            ),
        },
        "test_b.py": {
            "group": "ops",
            "file": "test_b.py",
            "kind": "pytest",
            "sim": sim({}, note="collection error: ImportError: y"),
        },
        "test_m.py": {
            "group": "mp scripts",
            "sim": sim(
                {"<program>": "failed"},
                {"<program>": "exit status 1"},
                rc=None,
                note="time bound 300s tripped (--timeout)",
            ),  # fmt: skip
        },
        "test_c.py": {"group": "ops"},  # not run yet
    }
    summary = tpu_ci.summarize(records)
    weighed = tpu_ci.summarize(records, tmp_path)
    assert weighed["total"]["collected"] == 8  # test_b.py defines 3 tests
    assert weighed["failure_kinds"][0] == {
        "count": 3,
        "kind": "[not run] collection error: ImportError: y",
        "example": "test_b.py::<run>",
    }
    assert summary["total"] == {
        "runs": 3,
        "collected": 6,  # a run that collected nothing counts as one test
        "passed": 1,
        "skipped": 1,
        "failed": 4,
        "not_simulated": 1,
    }
    row = {r["run"]: r for r in summary["runs"]}["test_b.py"]
    assert row["failures"] == {"<run>": "[not run] collection error: ImportError: y"}
    assert summary["crashes_and_hangs"] == ["test_m.py: time bound 300s tripped (--timeout)"]
    # one failure of each kind, numbers blanked
    assert {k["kind"]: k["count"] for k in summary["failure_kinds"]} == {
        "NotImplementedError: xlasim does not simulate x": 1,
        "E N": 1,
        "exit status N": 1,
        "[not run] collection error: ImportError: y": 1,
    }


def test_absl_flags_plugin_parses_flags_as_absltest_main_would(ci) -> None:
    # absltest.main() parses absl's flags before any test runs; pytest does not, and the
    # --tpu-ci runs load this plugin so a test reading --test_tmpdir works as under the CI
    flags = pytest.importorskip("absl.flags")
    sys.path.insert(0, str(BENCH))
    try:
        plugin = importlib.import_module("_absl_flags")
    finally:
        sys.path.remove(str(BENCH))
    plugin.pytest_configure(None)
    assert flags.FLAGS.is_parsed()


UNITTEST_FILE = """\
import sys
import unittest

SETUP = []


class AlphaTest(unittest.TestCase):
    def test_ok(self):
        self.assertEqual(SETUP, ["main"])  # what the __main__ block set up

    def test_bad(self):
        raise NotImplementedError("xlasim does not simulate x\\nmore")

    def test_fail(self):
        self.assertEqual(1, 2)

    @unittest.skip("needs more")
    def test_skip(self):
        pass

    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)


if __name__ == "__main__":
    SETUP.append("main")
    assert sys.argv[1:] == ["--flag"]
    unittest.main(argv=sys.argv[:1])
"""


def test_unittest_record_runs_the_main_block_and_records_each_test(ci, tmp_path) -> None:
    _, cpu_ci = ci
    (tmp_path / "test_u.py").write_text(UNITTEST_FILE)
    (tmp_path / "test_broken.py").write_text("raise ImportError('no such thing')\n")
    runner = str(BENCH / "_unittest_record.py")
    runs = {}
    for name, argv in (("u", ["test_u.py", "--flag"]), ("broken", ["test_broken.py"])):
        record = tmp_path / f"{name}.jsonl"
        env = {**os.environ, "UNITTEST_RECORD": str(record)}
        subprocess.run([sys.executable, runner, *argv], cwd=tmp_path, env=env, check=False,
                       capture_output=True, timeout=120)  # fmt: skip
        runs[name] = cpu_ci.parse_record(record.read_text())
    assert runs["u"].outcomes == {
        "AlphaTest::test_ok": "passed",
        "AlphaTest::test_bad": "error",
        "AlphaTest::test_fail": "failed",
        "AlphaTest::test_skip": "skipped",
        "AlphaTest::test_sub": "failed",
    }
    assert runs["u"].first_lines["AlphaTest::test_bad"] == (
        "NotImplementedError: xlasim does not simulate x"
    )
    assert runs["u"].first_lines["AlphaTest::test_fail"] == "AssertionError: 1 != 2"
    assert runs["broken"].outcomes == {}
    assert runs["broken"].note == "collection error: ImportError: no such thing"
    # a line cut short by a kill is left out
    assert cpu_ci.parse_record(
        '{"test": "A::b", "outcome": "passed", "line": ""}\n{"te'
    ).outcomes == {"A::b": "passed"}
