"""The xlasim command line: run, describe, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

from xlasim.cli.commands import main

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


def test_describe_draws_the_chips_on_the_torus(capsys):
    assert main(["describe", "2x2x2", "--accelerator", "v4"]) == 0
    out = capsys.readouterr().out
    # v4-16: HOST_BOUNDS 1,1,2, so host 0 is the z=0 plane and host 1 the z=1 plane; ids
    # follow the hosts, x fastest; mesh (data=2, model=4) puts device d at (d // 4, d % 4).
    plane0, plane1 = out.split("z=0:")[1].split("Per-host")[0].split("z=1:")
    assert "host 0" in plane0 and "host 1" not in plane0
    assert "host 1" in plane1 and "host 0" not in plane1
    for d in range(4):
        assert f"TPU:{d} (0,{d})" in plane0
        assert f"TPU:{d + 4} (1,{d})" in plane1
    rows0 = [line for line in plane0.splitlines() if "│" in line and "TPU:" in line]
    assert [r.split("TPU:")[1][0] + r.split("TPU:")[2][0] for r in rows0] == ["01", "23"]


def test_describe_of_a_huge_slice_skips_the_grid(capsys):
    assert main(["describe", "8x16x16", "--accelerator", "v5p"]) == 0
    out = capsys.readouterr().out
    assert "2048 chips" in out and "TPU:0 " not in out


def test_describe_rejects_an_unknown_accelerator(capsys):
    assert main(["describe", "2x2", "--accelerator", "v9"]) == 2
    assert "'v9'" in capsys.readouterr().err


def test_describe_lists_a_generations_standard_slices(capsys):
    assert main(["describe", "--list", "TPU-V4"]) == 0  # Ray's spelling works too
    rows = {
        cells[0]: cells[1:]
        for line in capsys.readouterr().out.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 5
    }
    # Google Cloud's v4 slices: 4 chips per host, the pod type counts TensorCores (2 per chip)
    assert rows["2x2x1"] == ["v4-8", "4", "1", "4"]
    assert rows["2x2x4"] == ["v4-32", "16", "4", "4"]
    assert rows["4x4x8"] == ["v4-256", "128", "32", "4"]
    assert "4x4" not in rows  # a 2-D shape is not a v4 slice


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["describe", "--list", "v9"], "unknown accelerator 'v9'; valid: v2, v3, v4"),
        (["describe"], "give a topology (e.g. 2x2x2 --accelerator v4) or --list GENERATION"),
        (["describe", "2x2", "--list", "v6e"], "--list GENERATION takes no topology"),
    ],
)
def test_describe_list_mistakes_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("xlasim describe: ") and message in err and err.count("\n") == 1
