"""The xlasim command line: run, describe, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

from xlasim.cli import main

installed = pytest.mark.skipif(
    not os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "xlasim.pth")),
    reason="xlasim is not installed in this environment (no xlasim.pth in site-packages)",
)


def _xlasim(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    return subprocess.run(
        [sys.executable, "-m", "xlasim", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@installed
def test_run_reports_the_slice_device_count():
    code = "import torch_xla.runtime as xr; print(xr.global_runtime_device_count())"
    out = _xlasim(
        "run", "--topology", "2x2x1", "--accelerator", "v4", "--", sys.executable, "-c", code
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"


@installed
def test_run_passes_the_exit_code_through():
    out = _xlasim("run", "--topology", "2x2", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert out.returncode == 3


@installed
def test_run_reports_a_child_killed_by_a_signal_as_a_shell_does():
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"
    out = _xlasim("run", "--topology", "2x2", "--", sys.executable, "-c", kill)
    assert out.returncode == 128 + 6
    assert "killed by SIGABRT" in out.stderr


def test_run_rejects_a_bad_topology_before_starting_anything(capsys):
    assert main(["run", "--topology", "0x4", "--", "false"]) == 2
    assert "'0x4'" in capsys.readouterr().err


def test_describe_prints_hosts_devices_and_env(capsys):
    assert main(["describe", "2x2x2", "--accelerator", "v4"]) == 0
    out = capsys.readouterr().out
    assert "v4-16" in out
    assert "TPU_WORKER_ID=1" in out
    assert "TPU_HOST_BOUNDS=1,1,2" in out
    assert "('data', 'model')" in out


def test_describe_rejects_an_unknown_accelerator(capsys):
    assert main(["describe", "2x2", "--accelerator", "v9"]) == 2
    assert "'v9'" in capsys.readouterr().err
