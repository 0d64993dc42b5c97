"""The plugin's real-target path: each real-target test runs in a fresh pytest subprocess.

CI runs this file in the xla-cpu env (real torch_xla 2.9 on CPU), where the children really
import torch_xla; elsewhere the same runs must report the xla_cpu target as unavailable.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

from xlasim import pytest_plugin as plugin

pytest_plugins = ["pytester"]

REAL_XLA_REASON = plugin.real_torch_xla_unavailable()


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    installed = any(
        ep.value == "xlasim.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    load = [] if installed else ["-p", "xlasim.pytest_plugin"]
    return pytester.runpytest(*load, "-p", "no:cacheprovider", "-p", "no:randomly", "-rA", *args)


def test_each_real_target_test_gets_a_fresh_torch_xla(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pytester.makepyfile(
        f"""
        import os

        def _note_pid():
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")

        def test_enables_spmd(xla_target):
            import torch_xla.runtime as xr
            _note_pid()
            xr.use_spmd()
            assert xr.is_spmd()
            assert xr.addressable_device_count() == 1

        def test_sees_plain_mode(xla_target):
            # SPMD mode is process-global in torch_xla: only a fresh process starts without it
            import torch_xla.runtime as xr
            _note_pid()
            assert not xr.is_spmd()
            assert xr.addressable_device_count() == xla_target.num_devices == 4
            assert xr.device_type() == "CPU"
        """
    )
    had_torch_xla = sys.modules.get("torch_xla")
    result = _run(pytester, "--xla-targets", "xla_cpu")
    if REAL_XLA_REASON is None:
        result.assert_outcomes(passed=2)
        children = [int(line) for line in pids.read_text().split()]
        assert len(set(children)) == 2 and os.getpid() not in children
    else:
        result.assert_outcomes(skipped=2)
        result.stdout.fnmatch_lines([f"SKIPPED*xla_cpu target unavailable: {REAL_XLA_REASON}"])
        assert not pids.exists()
    # the parent never imports real torch_xla
    assert sys.modules.get("torch_xla") is had_torch_xla
