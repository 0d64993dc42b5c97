"""The xlasim pytest plugin, driven through pytester.

Most runs are in-process (``pytester.runpytest``) so a test can force a target's availability
probe (``real_torch_xla_unavailable``, ``tpu_backend.machine.PCI_DEVICES_ROOT``) with
monkeypatch.  With the probe forced, the ``xla_cpu`` target really spawns its child pytest;
bodies that never import torch_xla then run there even where real torch_xla is not installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import time
from pathlib import Path

import pytest

from tpu_backend import machine
from xlasim import pytest_plugin as plugin

pytest_plugins = ["pytester"]

# pytester gives each run its own HOME; keep the user's cache root so sim subprocesses find the
# simulator's JIT-built extension in torch's extension cache instead of rebuilding it.
CACHE_ROOT = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")


@pytest.fixture(autouse=True)
def _keep_cache_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", CACHE_ROOT)


def _load_args() -> list[str]:
    """Load the plugin in the inner pytest unless its entry point already does."""
    installed = any(
        ep.value == "xlasim.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "xlasim.pytest_plugin"]


# Inner sessions keep file order even where pytest-randomly is installed (it would shuffle the
# lines the tests match in order).
_INNER_ARGS = ("-p", "no:cacheprovider", "-p", "no:randomly", "-rA")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*_load_args(), *_INNER_ARGS, *args)


def run_sim(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Sim-target runs go to a subprocess: an in-process pytester run drops the modules first
    imported inside it (the simulator's included) from sys.modules when it ends."""
    return pytester.runpytest_subprocess(*_load_args(), *_INNER_ARGS, *args, timeout=300)


@pytest.fixture
def real_xla_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend real torch_xla is importable, so xla_cpu spawns its child."""
    monkeypatch.setattr(plugin, "real_torch_xla_unavailable", lambda: None)


@pytest.fixture
def no_real_xla(monkeypatch: pytest.MonkeyPatch) -> str:
    reason = "real torch_xla is not installed (forced by the test)"
    monkeypatch.setattr(plugin, "real_torch_xla_unavailable", lambda: reason)
    return reason


@pytest.fixture
def no_tpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    root = tmp_path / "no-pci"
    root.mkdir()
    monkeypatch.setattr(machine, "PCI_DEVICES_ROOT", str(root))
    return root


def _fake_pci(root: Path, devices: list[tuple[str, str]]) -> Path:
    for i, (vendor, device) in enumerate(devices):
        d = root / f"0000:00:{i:02x}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
    return root


# ---------------------------------------------------------------------------------------------
# Collection: ids, marks, options


def test_one_test_function_runs_once_per_target(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_a(xla_target):
            pass

        def test_plain():
            pass
        """
    )
    result = run(pytester, "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "test_one_test_function_runs_once_per_target.py::test_a[[]sim[]]",
            "test_one_test_function_runs_once_per_target.py::test_a[[]xla_cpu[]]",
            "test_one_test_function_runs_once_per_target.py::test_a[[]tpu[]]",
            "test_one_test_function_runs_once_per_target.py::test_plain",
            "4 tests collected*",
        ]
    )


@pytest.mark.parametrize(
    ("args", "selected"),
    [
        (["-m", "cpu_sim"], ["test_a[sim]", "test_s"]),
        (["-m", "xla_cpu"], ["test_a[xla_cpu]"]),
        (["-m", "tpu"], ["test_a[tpu]"]),
        (["-m", "not cpu_sim"], ["test_a[xla_cpu]", "test_a[tpu]", "test_plain"]),
        (["--xla-targets", "tpu,sim"], ["test_a[sim]", "test_a[tpu]", "test_s", "test_plain"]),
    ],
)
def test_marks_and_target_option_select_targets(
    pytester: pytest.Pytester, args: list[str], selected: list[str]
) -> None:
    pytester.makepyfile(
        test_sel="""
        def test_a(xla_target):
            pass

        def test_s(xlasim_sim):
            pass

        def test_plain():
            pass
        """
    )
    result = run(pytester, "--collect-only", "-q", *args)
    collected = sorted(
        line.split("::", 1)[1] for line in result.stdout.lines if line.startswith("test_sel.py::")
    )
    assert collected == sorted(selected)


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.cpu_sim:*",
            "@pytest.mark.xla_cpu:*",
            "@pytest.mark.tpu:*",
            "@pytest.mark.topology(topology, accelerator=None):*",
            "@pytest.mark.xlasim_shared:*",
        ]
    )


def test_options_are_documented(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--help")
    result.stdout.fnmatch_lines(
        ["*--topology=*", "*--accelerator=*", "*--xla-targets=*", "*--xla-timeout=*"]
    )
    assert "--xlasim-child" not in result.stdout.str()  # internal


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--xla-targets", "sim,gpu"],
            "*--xla-targets 'sim,gpu': unknown target(s) [[]'gpu'[]]; valid targets are sim, "
            "xla_cpu, tpu*",
        ),
        (["--topology", "4x"], "*--topology/--accelerator: topology '4x'*"),
        (["--topology", "2x2", "--accelerator", "v99"], "*--topology/--accelerator:*v99*"),
    ],
    ids=["target", "topology", "accelerator"],
)
def test_bad_options_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile("def test_a(xla_target): pass")
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


# ---------------------------------------------------------------------------------------------
# Unavailable targets are skipped with their reason


def test_xla_cpu_is_skipped_with_reason_without_real_torch_xla(
    pytester: pytest.Pytester, no_real_xla: str
) -> None:
    pytester.makepyfile("def test_a(xla_target): raise AssertionError('must not run')")
    result = run(pytester, "--xla-targets", "xla_cpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED*xla_cpu target unavailable: {no_real_xla}"])


def test_xla_cpu_is_skipped_for_multi_host_topologies(
    pytester: pytest.Pytester, real_xla_forced: None
) -> None:
    pytester.makepyfile("def test_a(xla_target): raise AssertionError('must not run')")
    result = run(pytester, "--xla-targets", "xla_cpu", "--topology", "4x4")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED*xla_cpu target unavailable: it runs one process on one host, but "
            "topology 4x4 (v6e, v6e-16) has 4 hosts"
        ]
    )


def test_tpu_is_skipped_with_reason_without_chips(pytester: pytest.Pytester, no_tpu: Path) -> None:
    pytester.makepyfile("def test_a(xla_target): raise AssertionError('must not run')")
    result = run(pytester, "--xla-targets", "tpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [f"SKIPPED*tpu target unavailable: no TPU chips on this host*under {no_tpu})"]
    )


def test_tpu_with_other_chip_count_is_skipped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = _fake_pci(tmp_path / "pci", [("0x1ae0", "0x006f")] * 8)
    monkeypatch.setattr(machine, "PCI_DEVICES_ROOT", str(root))
    pytester.makepyfile("def test_a(xla_target): raise AssertionError('must not run')")
    result = run(pytester, "--xla-targets", "tpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED*tpu target unavailable: this host has 8 TPU chips but v6e-4 (topology "
            "2x2) has 4; pass --topology/--accelerator matching this TPU VM"
        ]
    )


def test_tpu_with_matching_chips_still_needs_real_torch_xla(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_real_xla: str
) -> None:
    root = _fake_pci(tmp_path / "pci", [("0x1ae0", "0x005e")] * 4)
    monkeypatch.setattr(machine, "PCI_DEVICES_ROOT", str(root))
    pytester.makepyfile("def test_a(xla_target): raise AssertionError('must not run')")
    result = run(pytester, "--xla-targets", "tpu", "--topology", "2x2x1", "--accelerator", "v4")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED*tpu target unavailable: {no_real_xla}"])


def test_count_tpu_chips_reads_pci_like_torch_xla(tmp_path: Path) -> None:
    root = _fake_pci(
        tmp_path,
        [
            ("0x1ae0", "0x005e"),  # v4
            ("0x1ae0", "0x0063"),  # v5e
            ("0x1ae0", "0x1234"),  # a Google device that is not a TPU
            ("0x8086", "0x005e"),  # another vendor
        ],
    )
    assert machine.count_tpu_chips(root) == 2
    assert machine.count_tpu_chips(tmp_path / "missing") == 0


# ---------------------------------------------------------------------------------------------
# A failing body fails on every target


FAILING_BODY = """
def test_f(xla_target):
    assert xla_target.name == "never", "boom-" + xla_target.name
"""


def test_a_failing_body_fails_on_the_sim_target(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FAILING_BODY)
    result = run_sim(pytester, "--xla-targets", "sim")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E * AssertionError: boom-sim"])


def test_a_failing_body_fails_on_the_real_targets(
    pytester: pytest.Pytester, real_xla_forced: None, no_tpu: Path
) -> None:
    pytester.makepyfile(FAILING_BODY)
    result = run(pytester, "--xla-targets", "xla_cpu,tpu")
    result.assert_outcomes(failed=1, skipped=1)
    # the child's own traceback comes back in the parent's failure
    result.stdout.fnmatch_lines(
        [
            "*target xla_cpu (v6e-4, topology 2x2): the test subprocess failed in call*",
            "*subprocess output*",
            "E * AssertionError: boom-xla_cpu",
        ]
    )


def test_child_outcomes_come_back(pytester: pytest.Pytester, real_xla_forced: None) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_pass(xla_target):
            pass

        def test_skip(xla_target):
            pytest.skip("skipped in the child")

        def test_xfail(xla_target):
            pytest.xfail("known in the child")

        @pytest.mark.xfail(reason="expected", strict=True)
        def test_xpass_strict(xla_target):
            pass

        @pytest.mark.xfail(reason="expected", raises=ZeroDivisionError)
        def test_xfail_raises(xla_target):
            1 / 0
        """
    )
    result = run(pytester, "--xla-targets", "xla_cpu")
    result.assert_outcomes(passed=1, skipped=1, xfailed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED*test_child_outcomes_come_back.py:*: skipped in the child",
            "XFAIL*test_xfail[[]xla_cpu[]] - known in the child",
            "FAILED*test_xpass_strict[[]xla_cpu[]]*",
        ]
    )


def test_real_target_child_is_a_fresh_clean_process(
    pytester: pytest.Pytester,
    real_xla_forced: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv("PROBE_DIR", str(probe))
    monkeypatch.setenv("XLASIM_TOPOLOGY", "4x4")  # must not reach the child
    monkeypatch.setenv("XLA_USE_SPMD", "1")
    monkeypatch.setenv("CPU_NUM_DEVICES", "99")
    pytester.makepyfile(
        """
        import json, os, sys
        import pytest

        def _record(xla_target, name):
            env = {k: os.environ.get(k) for k in
                   ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLASIM_TOPOLOGY", "XLA_USE_SPMD")}
            data = {"pid": os.getpid(), "env": env, "xlasim": "xlasim" in sys.modules,
                    "num_devices": xla_target.num_devices, "name": xla_target.name}
            with open(os.path.join(os.environ["PROBE_DIR"], name), "w") as f:
                json.dump(data, f)

        def test_default(xla_target):
            _record(xla_target, "default")

        @pytest.mark.topology("2x4")
        def test_eight(xla_target):
            _record(xla_target, "eight")
        """
    )
    result = run(pytester, "--xla-targets", "xla_cpu")
    result.assert_outcomes(passed=2)
    default = json.loads((probe / "default").read_text())
    eight = json.loads((probe / "eight").read_text())
    assert len({default["pid"], eight["pid"], os.getpid()}) == 3
    assert default["env"] == {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "4",
        "XLASIM_TOPOLOGY": None,
        "XLA_USE_SPMD": None,
    }
    assert eight["env"]["CPU_NUM_DEVICES"] == "8"
    assert (default["num_devices"], eight["num_devices"]) == (4, 8)
    assert default["name"] == "xla_cpu"
    # the child loads the plugin by file path and never imports the xlasim package
    assert default["xlasim"] is False


def test_real_target_subprocess_is_bounded_by_the_timeout(
    pytester: pytest.Pytester,
    real_xla_forced: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))
    pytester.makepyfile(
        """
        import os, time

        def test_hangs(xla_target):
            with open(os.environ["PID_FILE"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        """
    )
    started = time.monotonic()
    result = run(pytester, "--xla-targets", "xla_cpu", "--xla-timeout", "15")
    assert time.monotonic() - started < 90
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the test subprocess timed out after 15 s (--xla-timeout)*"])
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ---------------------------------------------------------------------------------------------
# The simulator target


def test_topology_mark_sets_the_slice(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.topology("2x4")

        def test_module_mark(xla_target):
            assert (xla_target.spec.topology, xla_target.num_devices) == ("2x4", 8)
            import torch_xla.runtime as xr
            assert xr.global_runtime_device_count() == 8

        @pytest.mark.topology("2x2x2", accelerator="v4")
        def test_own_mark(xla_target):
            assert xla_target.spec.pod_type == "v4-16"
            assert (xla_target.num_devices, xla_target.num_hosts) == (8, 2)
            assert xla_target.device_type == "TPU" and not xla_target.is_real
            import torch_xla.runtime as xr
            assert xr.global_runtime_device_count() == 8
            assert xr.addressable_runtime_device_count() == 4

        @pytest.mark.topology(topology="2x2x1", accelerator="v4")
        def test_sim_only(xlasim_sim):
            assert xlasim_sim.name == "sim" and xlasim_sim.num_devices == 4
            import torch_xla.runtime as xr
            assert xr.global_runtime_device_count() == 4
        """
    )
    result = run_sim(pytester, "--xla-targets", "sim")
    result.assert_outcomes(passed=3)


def test_bad_topology_mark_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.topology("2x2", "v4", "extra")
        def test_too_many(xlasim_sim):
            pass

        @pytest.mark.topology("3x")
        def test_bad_value(xlasim_sim):
            pass
        """
    )
    result = run_sim(pytester)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*TypeError: @pytest.mark.topology('2x2', 'v4', 'extra') {}: expected "
            "topology(topology: str, accelerator: str | None = None)*",
            "*ValueError: *'3x'*",
        ]
    )


def test_sim_state_is_fresh_per_test_unless_shared(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_zz_after="""
        import xlasim

        def test_after_the_module():
            assert not xlasim.is_active()
        """,
        test_shared="""
        import pytest
        import xlasim

        RUNTIMES = []

        def test_fresh_1(xla_target):
            import torch_xla.runtime as xr
            assert not xr.is_spmd()
            xr.use_spmd()
            RUNTIMES.append(xlasim.current_runtime())

        def test_fresh_2(xla_target):
            import torch_xla.runtime as xr
            assert not xr.is_spmd()
            assert xlasim.current_runtime() is not RUNTIMES[-1]

        @pytest.mark.xlasim_shared
        def test_shared_1(xlasim_sim):
            import torch_xla.runtime as xr
            assert not xr.is_spmd()
            xr.use_spmd()
            RUNTIMES.append(xlasim.current_runtime())

        def test_between(xlasim_sim):
            import torch_xla.runtime as xr
            assert not xr.is_spmd()
            assert xlasim.current_runtime() is not RUNTIMES[-1]

        @pytest.mark.xlasim_shared
        def test_shared_2(xlasim_sim):
            import torch_xla.runtime as xr
            assert xlasim.current_runtime() is RUNTIMES[-1]
            assert xr.is_spmd()

        def test_plain():
            # the module's shared runtime stays active until the module ends
            assert xlasim.is_active()
        """,
    )
    result = run_sim(pytester, "--xla-targets", "sim", "-p", "no:randomly")
    result.assert_outcomes(passed=7)


def test_sim_target_fails_if_torch_xla_is_not_the_simulator(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # A test that smuggles another torch_xla into sys.modules is caught at teardown.
    fake = tmp_path / "elsewhere" / "torch_xla"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    pytester.makepyfile(
        f"""
        import importlib.util, sys

        def test_smuggle(xlasim_sim):
            path = {str(fake / "__init__.py")!r}
            spec = importlib.util.spec_from_file_location("torch_xla", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules["torch_xla"] = module
        """
    )
    result = run_sim(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the torch_xla imported by this test is*not the simulator*"])


def test_a_multi_host_topology_runs_spmd_tests_in_one_process(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import numpy as np
        import torch

        def test_minibatch_and_sharding(xla_target):
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.distributed.spmd as xs
            import torch_xla.runtime as xr

            xr.use_spmd()
            assert (xr.process_count(), xr.process_index()) == (4, 0)
            assert xr.addressable_runtime_device_count() == 4
            mesh = xs.Mesh(np.arange(16), (16,), ("data",))
            spec = xs.ShardingSpec(mesh, ("data", None), minibatch=True)
            (xb,) = xm.send_cpu_data_to_device([torch.ones(8, 2)], torch_xla.device(), spec)
            assert tuple(xb.shape) == (32, 2)
            t = torch.arange(16.0).reshape(16, 1).to(torch_xla.device())
            xs.mark_sharding(t, mesh, ("data", None))
            assert (t * 2).sum().item() == 240.0
        """
    )
    result = run_sim(pytester, "--topology", "4x4", "--xla-targets", "sim")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["xlasim: v6e-16 has 4 hosts; each sim-target test is one process*"]
    )


def test_compiler_option_rejects_a_bad_name(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, "--xlasim-compiler", "gcc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--xlasim-compiler: unknown compiler 'gcc'; valid: libtpu, none"])


def test_an_eager_backward_before_the_first_simulator_test_does_not_break_it(
    pytester: pytest.Pytester,
) -> None:
    # Autograd fixes its devices at a process's first backward pass; the plugin registers the
    # simulated device once collection shows a simulator test, so test order does not matter.
    pytester.makepyfile(
        test_order="""
        import torch

        def test_cpu_training_first():
            w = torch.ones(3, requires_grad=True)
            (w * 2).sum().backward()
            assert w.grad.tolist() == [2.0, 2.0, 2.0]

        def test_sim_after(xlasim_sim):
            import torch_xla
            w = torch.ones(3, device=torch_xla.device(), requires_grad=True)
            (w * 3).sum().backward()
            assert w.grad.cpu().tolist() == [3.0, 3.0, 3.0]
        """
    )
    result = run_sim(pytester, "-p", "no:randomly")
    result.assert_outcomes(passed=2)


# -- TorchTPU's tpu device: the torch_tpu_target fixture ---------------------------------------

# The sim instance runs in docs/torch-tpu.md's pytest example (tests/test_docs.py).


def test_torch_tpu_target_is_skipped_with_reason_without_chips(
    pytester: pytest.Pytester, no_tpu: Path
) -> None:
    pytester.makepyfile(
        """
        def test_t(torch_tpu_target):
            raise AssertionError('must not run')

        def test_x(xla_target):
            pass
        """
    )
    # Its real target is TorchTPU's alone: xla_target tests have no [torch_tpu] instance.
    result = run(pytester, "--xla-targets", "torch_tpu,tpu", "-m", "torch_tpu")
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED*torch_tpu target unavailable: no TPU chips on this host*"]
    )


def test_torch_tpu_target_needs_the_real_package_on_a_tpu_vm(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = _fake_pci(tmp_path / "pci", [("0x1ae0", "0x006f")] * 4)  # a v6e-4 host's chips
    monkeypatch.setattr(machine, "PCI_DEVICES_ROOT", str(root))
    pytester.makepyfile("def test_t(torch_tpu_target): raise AssertionError('must not run')")
    result = run(pytester, "--xla-targets", "torch_tpu", "-m", "torch_tpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED*torch_tpu target unavailable: real torch_tpu is not installed for *"]
    )
