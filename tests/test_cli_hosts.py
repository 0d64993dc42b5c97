"""`xlasim run` on a multi-host slice: one process per simulated host, wired together.

The hosts' program is an ordinary SPMD training script; each host feeds its own part of the
global batch (``minibatch`` input sharding), so the run trains on the global batch only if the
hosts really exchange what they hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest
from global_batch import eager_sgd
from launcher import kill_launcher_group, start_xlasim_run

from xlasim.cli import launcher as host_launcher
from xlasim.runtime import hosts, ports

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "xlasim.pth")),
    reason="xlasim is not installed in this environment (no xlasim.pth in site-packages)",
)

WAIT_S = 300
STOP_BOUND_S = 120

TRAIN = textwrap.dedent(
    """
    import numpy as np, torch, torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    n, count, me = xr.global_runtime_device_count(), xr.process_count(), xr.process_index()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4 * n, 8, generator=g), torch.randn(4 * n, 1, generator=g)
    part = slice(me * x.shape[0] // count, (me + 1) * x.shape[0] // count)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(torch_xla.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spec = xs.ShardingSpec(mesh, ("data", None), minibatch=True)
    for step in range(2):
        xb, yb = xm.send_cpu_data_to_device([x[part], y[part]], torch_xla.device(), spec)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        torch_xla.sync()
        print(f"host {me} of {count} step {step} loss {loss.item()!r}", flush=True)
    """
)


# Kept from the test's environment: the mat-mul precision its mark sets, so that the hosts'
# losses compare with eager CPU's.
_KEPT = ("XLASIM_MAT_MUL_PRECISION",)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_") or k in _KEPT}


def _xlasim_run(
    *args: str, timeout: float = WAIT_S, **env: str
) -> subprocess.CompletedProcess[str]:
    """``xlasim run ARGS`` with the simulator's variables cleared (but the precision), then
    ``env`` added."""
    return subprocess.run(
        [sys.executable, "-m", "xlasim", "run", *args],
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _losses(lines: list[str], prefix: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix)]


def test_the_launcher_sets_the_address_the_runtime_reads():
    assert host_launcher.HOSTS_ADDR_ENV == hosts.ADDR_ENV


@pytest.mark.mat_mul_precision("highest")
def test_run_starts_every_host_and_trains_on_the_global_batch():
    out = _xlasim_run("--topology", "4x4", "--", sys.executable, "-c", TRAIN)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # only host 0 speaks by default, and it knows it is one of four
    assert [line.split(" step")[0] for line in lines] == ["host 0 of 4"] * 2
    assert _losses(lines, "host 0 of 4") == pytest.approx(eager_sgd(16)[0], rel=1e-5)


@pytest.mark.mat_mul_precision("highest")
def test_all_output_shows_every_host_prefixed():
    out = _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4", "--all-output",
        "--", sys.executable, "-c", TRAIN,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert all(line.startswith(("[host 0] ", "[host 1] ")) for line in lines), lines
    host0 = _losses([line.removeprefix("[host 0] ") for line in lines], "host 0 of 2")
    host1 = _losses([line.removeprefix("[host 1] ") for line in lines], "host 1 of 2")
    assert host0 == pytest.approx(eager_sgd(8)[0], rel=1e-5)
    # the hosts run one global program: host 1 computes the same losses, bit for bit
    assert host1 == host0


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    import torch_xla.runtime as xr
    me = xr.process_index()
    pid_file = os.path.join(sys.argv[1], f"pid{me}")
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)  # whole or absent: the test reads it when it appears
    if me == int(sys.argv[2]):
        # fail only once every host is up, so the others are there to be stopped
        deadline = time.monotonic() + 240
        while not all(os.path.exists(os.path.join(sys.argv[1], f"pid{h}"))
                      for h in range(xr.process_count())):
            assert time.monotonic() < deadline, "the other hosts did not start within 240 s"
            time.sleep(0.1)
        print(f"host {me} gives up", flush=True)
        raise SystemExit(7)
    time.sleep(600)
    """
)


def test_the_first_failing_host_sets_the_exit_code_and_ends_the_others(tmp_path):
    out = _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4",
        "--", sys.executable, "-c", SLEEPER, str(tmp_path), "1",
    )  # fmt: skip
    assert out.returncode == 7
    assert "on host 1 of 2 exited with code 7; stopping the other hosts" in out.stderr
    # host 1's output was not shown live, so its last lines come with the failure
    assert "[host 1] host 1 gives up" in out.stderr
    assert _pid_gone(int((tmp_path / "pid0").read_text()))


def test_with_all_output_a_failing_host_is_not_repeated(tmp_path):
    out = _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4", "--all-output",
        "--", sys.executable, "-c", SLEEPER, str(tmp_path), "1",
    )  # fmt: skip
    assert out.returncode == 7
    assert out.stdout.splitlines().count("[host 1] host 1 gives up") == 1
    assert "host 1 gives up" not in out.stderr


def test_ctrl_c_ends_every_host(tmp_path):
    launcher = start_xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4",
        "--", sys.executable, "-c", SLEEPER, str(tmp_path), "-1",
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        while not all((tmp_path / f"pid{h}").exists() for h in range(2)):
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, f"hosts did not start within {WAIT_S} s"
            time.sleep(0.2)
        pids = [int((tmp_path / f"pid{h}").read_text()) for h in range(2)]
        launcher.send_signal(signal.SIGINT)
        try:
            # the launcher's own stop takes at most twice STOP_GRACE_S; the rest is slack
            # for a loaded machine
            _, err = launcher.communicate(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            # say what the launcher was doing: an inherited ignored SIGINT, or where it waits
            status = Path(f"/proc/{launcher.pid}/status").read_text()
            masks = [line for line in status.splitlines() if line.startswith(("SigIgn", "SigCgt"))]
            wchan = Path(f"/proc/{launcher.pid}/wchan").read_text()
            pytest.fail(f"launcher still running {STOP_BOUND_S} s after SIGINT: {masks}, {wchan=}")
    finally:
        if launcher.poll() is None:
            kill_launcher_group(launcher)
            launcher.wait(timeout=30)
    assert launcher.returncode == 130
    assert "interrupted; stopping 2 hosts" in err
    assert all(_pid_gone(pid) for pid in pids)


def test_one_host_of_a_slice_runs_alone_with_host_index():
    code = "import torch_xla.runtime as xr; print(xr.process_index(), xr.process_count())"
    out = _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4", "--host-index", "1",
        "--", sys.executable, "-c", code,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["1", "2"]


def test_a_missing_command_is_one_line():
    out = _xlasim_run("--topology", "2x2x2", "--accelerator", "v4", "--", "no-such-program-x")
    assert out.returncode != 0
    assert out.stderr.strip() == "xlasim run: command not found: 'no-such-program-x'"


def test_a_script_that_is_not_executable_is_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    out = _xlasim_run("--topology", "2x2", "--", str(script))
    assert out.returncode != 0
    assert out.stderr.strip() == (
        f"xlasim run: {str(script)!r} is not executable (a Python script runs as "
        "`-- python SCRIPT`)"
    )


def test_a_host_index_outside_the_slice_is_refused_before_any_host_starts():
    out = _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4", "--host-index", "2", "--", "true"
    )
    assert out.returncode == 2
    assert "2" in out.stderr and len(out.stderr.strip().splitlines()) == 1


LONE = textwrap.dedent(
    """
    import numpy as np, torch, torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    if xr.process_index() == 0:
        t = torch.zeros(8, 2).to(torch_xla.device())
        xs.mark_sharding(t, xs.Mesh(np.arange(8), (8,), ("d",)), ("d", None))
    """
)


def _run_lone(timeout_s: str) -> subprocess.CompletedProcess[str]:
    return _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4", "--", sys.executable, "-c", LONE,
        XLASIM_HOSTS_TIMEOUT_S=timeout_s,
    )  # fmt: skip


def test_a_host_left_alone_stops_within_the_named_bound():
    out = _run_lone("3")
    assert out.returncode == 1
    assert "could not meet the other hosts" in out.stderr
    assert "within XLASIM_HOSTS_TIMEOUT_S=3 s" in out.stderr


def test_a_host_waiting_for_host_0_says_whom_where_and_its_bound():
    """Host 1 started by hand (``--host-index 1``) at an address where no host 0 ever comes:
    within 10 s it says what it waits for, then gives up at the bound."""
    address = ports.loopback_address()
    code = LONE.replace("xr.process_index() == 0", "xr.process_index() == 1")
    out = _xlasim_run(
        "--topology", "2x2x2", "--accelerator", "v4", "--host-index", "1",
        "--", sys.executable, "-c", code,
        XLASIM_HOSTS_ADDR=address, XLASIM_HOSTS_TIMEOUT_S="13",
    )  # fmt: skip
    assert out.returncode == 1
    notices = [line for line in out.stderr.splitlines() if "has waited" in line]
    assert notices == [
        f"xlasim: host 1 of a 2-host v4-16 slice has waited 10 s for host 0 at "
        f"XLASIM_HOSTS_ADDR={address!r}; it gives up after XLASIM_HOSTS_TIMEOUT_S=13 s"
    ], out.stderr[-3000:]
    assert "within XLASIM_HOSTS_TIMEOUT_S=13 s" in out.stderr


def test_hosts_on_one_machine_meet_within_a_minute_unless_told_otherwise():
    code = "import os; print(os.environ['XLASIM_HOSTS_TIMEOUT_S'])"
    argv = ("--topology", "2x2x2", "--accelerator", "v4", "--all-output", "--", sys.executable)
    out = _xlasim_run(*argv, "-c", code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(out.stdout.splitlines()) == ["[host 0] 60", "[host 1] 60"]
    out = _xlasim_run(*argv, "-c", code, XLASIM_HOSTS_TIMEOUT_S="900")
    assert sorted(out.stdout.splitlines()) == ["[host 0] 900", "[host 1] 900"]


def test_a_bad_hosts_timeout_is_named():
    out = _run_lone("soon")
    # Refused by the launcher itself, before any host process starts: one line, status 2.
    assert out.returncode == 2
    assert out.stderr == (
        "xlasim run: XLASIM_HOSTS_TIMEOUT_S='soon' is not valid: expected a finite number > 0\n"
    )


@pytest.mark.mat_mul_precision("highest")
def test_single_process_stands_for_every_host():
    out = _xlasim_run("--topology", "4x4", "--single-process", "--", sys.executable, "-c", TRAIN)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split(" step")[0] for line in lines] == ["host 0 of 4"] * 2
    # host 0's quarter of the global batch, entered by all four hosts: the global batch is that
    # quarter four times over, whose mean loss is the quarter's own
    expected, _ = eager_sgd(16, rows=slice(0, 16))
    assert _losses(lines, "host 0 of 4") == pytest.approx(expected, rel=1e-5)


def test_single_process_and_host_index_exclude_each_other():
    out = _xlasim_run("--topology", "4x4", "--single-process", "--host-index", "1", "--", "true")
    assert out.returncode != 0
    assert out.stderr.strip() == (
        "xlasim run: --single-process and --host-index exclude each other"
    )


def test_many_hosts_are_announced_with_the_single_process_alternative():
    out = _xlasim_run("--topology", "8x8", "--accelerator", "v6e", "--", "true")
    assert out.returncode == 0, out.stderr
    assert out.stderr == (
        "xlasim run: starting 16 host processes, one per host of v6e-64 (each loads torch); "
        "--single-process runs one for them all\n"
    )


def test_pjrt_device_cpu_gives_each_host_torch_xlas_cpu_client():
    """``PJRT_DEVICE=CPU`` on a TPU VM makes torch_xla create its CPU client (upstream
    ``torch_xla/runtime.py`` picks the TPU only where the variable is unset; pytorch/xla's CPU CI
    sets it per file): ``CPU_NUM_DEVICES`` devices computing float32 matmuls exactly, as XLA:CPU
    does (measured on real torch_xla 2.9 CPU), not at the TPU's one-pass precision."""
    code = textwrap.dedent(
        """
        import torch, torch_xla, torch_xla.runtime as xr
        a = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
        exact = torch.equal((a.to("xla") @ a.to("xla")).cpu(), a @ a)
        print(xr.device_type(), xr.global_runtime_device_count(), exact)
        """
    )
    argv = ("--topology", "2x2", "--", sys.executable, "-c", code)
    out = _xlasim_run(*argv, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["CPU", "4", "True"]
    assert "xlasim run: PJRT_DEVICE=CPU: torch_xla in each host process uses that" in out.stderr
    # Unset, the host is the simulated TPU VM's, computing at the TPU's default precision.
    env = {k: v for k, v in _env().items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES")}
    tpu = subprocess.run(
        [sys.executable, "-m", "xlasim", "run", *argv],
        env=env, capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert tpu.returncode == 0, tpu.stderr[-3000:]
    assert tpu.stdout.split() == ["TPU", "4", "False"]
    assert "PJRT_DEVICE" not in tpu.stderr
