"""TorchTPU's launch environment (``torch.tpu.distributed.set_tpu_launch_env``) on simulated
hosts, and the launchers it feeds: ``torch.multiprocessing.spawn`` and ``torchrun``, one
process per chip over ``tpu_dist``, and a multi-host job under ``xlasim run``.

What is expected comes from TorchTPU 0.2.0's ``_internal/distributed/distributed.py``: the
variables it sets, its topology per process count, its rank of a host from its chip's
coordinates (hosts as 2x2x1 blocks, z first, x last), its error texts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import xlasim

pytestmark = pytest.mark.skipif(
    torch.__version__ < "2.11",
    reason=f"TorchTPU 0.2.0 needs torch >= 2.11, this is {torch.__version__}",
)

_LAUNCH_VARS = (
    "TORCH_TPU_TOPOLOGY",
    "TORCH_TPU_SLICEBUILDER_ADDRESSES",
    "TORCH_TPU_XPROF_SESSION_ID",
    "TPU_WORKER_HOSTNAMES",
    "JOB_COMPLETION_INDEX",
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "TPU_VISIBLE_CHIPS",
)

# A job as TorchTPU's docs write one: the parent sets the launch environment, a launcher
# starts a process per chip, each joins the tpu_dist group and all-reduces its rank.
JOB = """
import os, subprocess, sys
import torch
import torch.distributed as dist

NPROC = int(sys.argv[2])


def work(local_rank):
    if "RANK" not in os.environ:  # torch.multiprocessing.spawn: the job's ranks are ours to set
        nodes = int(os.environ.get("NNODES", "1"))
        rank = int(os.environ.get("NODE_RANK", "0")) * NPROC + local_rank
        os.environ.update(LOCAL_RANK=str(local_rank), RANK=str(rank),
                          WORLD_SIZE=str(nodes * NPROC))
        os.environ.setdefault("MASTER_ADDR", "localhost")
    import torch_tpu
    from torch_tpu._internal.utils import hardware
    dist.init_process_group("tpu_dist")
    rank = dist.get_rank()
    total = torch.tensor([float(rank)], device="tpu")
    dist.all_reduce(total)
    line = (f"rank={rank} host={os.environ.get('XLASIM_HOST_INDEX')}"
            f" chip={hardware.bound_chip()} world={dist.get_world_size()} sum={total.item():g}"
            f" backend={dist.get_backend()} device={total.device}\\n")
    os.write(1, line.encode())  # one write: the processes' lines never interleave
    dist.destroy_process_group()


if __name__ == "__main__":
    launcher = sys.argv[1]
    if launcher == "worker":  # started by torchrun
        work(int(os.environ["LOCAL_RANK"]))
        raise SystemExit
    import torch_tpu
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=NPROC)
    if launcher == "spawn":
        os.environ.setdefault("MASTER_PORT", sys.argv[3])
        torch.multiprocessing.spawn(work, nprocs=NPROC)
    else:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                        str(NPROC), "--master-port", sys.argv[3], __file__, "worker",
                        str(NPROC)], check=True)
"""


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launch variable of this process leaks into the test, nor the test's out of it."""
    for name in _LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


def _set(**kwargs: Any) -> dict[str, str]:
    torch.tpu.distributed.set_tpu_launch_env(**kwargs)
    return {k: os.environ[k] for k in _LAUNCH_VARS if k in os.environ}


def test_one_host_gets_a_topology_and_an_address_per_process(launch_env: None) -> None:
    with xlasim.simulate("2x4"):  # a v6e host with 8 chips
        import torch_tpu  # noqa: F401

        env = _set()
        assert env["TORCH_TPU_TOPOLOGY"] == "2,4,1"
        addresses = env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
        assert len(set(addresses)) == 8
        assert all(re.fullmatch(r"localhost:\d+", a) for a in addresses)
        assert env["TORCH_TPU_XPROF_SESSION_ID"].isdigit()
        assert "NODE_RANK" not in env and "MASTER_ADDR" not in env
        # Never overwrites: a second call, with another count, changes nothing.
        assert _set(nproc_per_node=4) == env
        for name in ("TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICEBUILDER_ADDRESSES"):
            del os.environ[name]
        assert _set(nproc_per_node=4)["TORCH_TPU_TOPOLOGY"] == "2,2,1"
        del os.environ["TORCH_TPU_TOPOLOGY"]
        with pytest.raises(RuntimeError, match="No TPU topology found for count: 3"):
            _set(nproc_per_node=3)
    for name in _LAUNCH_VARS:
        os.environ.pop(name, None)
    with xlasim.simulate("2x2x1", "v7x"):  # 4 chips of 2 devices each: TorchTPU counts 8
        assert _set()["TORCH_TPU_TOPOLOGY"] == "2,2,1,2"


@pytest.mark.parametrize("host", range(4))
def test_hosts_of_a_slice_rank_by_their_chips_coordinates(launch_env: None, host: int) -> None:
    with xlasim.simulate("4x4", host_index=host):  # v6e: 4 hosts of 2x2 chips
        import torch_tpu  # noqa: F401

        os.environ["TORCH_TPU_TOPOLOGY"] = "4x4"  # the whole slice, given from outside
        env = _set()
        assert env["NODE_RANK"] == str(host)
        assert (env["NNODES"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
            "4",
            "localhost",
            "29500",
        )
        # One address per chip of every host, from TorchTPU's base port.
        expected = [f"localhost:{8070 + i}" for _ in range(4) for i in range(4)]
        assert env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",") == expected
        assert env["TORCH_TPU_TOPOLOGY"] == "4x4"


def test_a_host_without_slice_topology_or_index_has_no_rank(launch_env: None) -> None:
    with xlasim.simulate("4x4", host_index=1):
        import torch_tpu  # noqa: F401

        with pytest.raises(ValueError, match="or environment variable JOB_COMPLETION_INDEX"):
            _set()
        os.environ["JOB_COMPLETION_INDEX"] = "3"
        env = _set()
        # Its own 4 chips' topology fills TORCH_TPU_TOPOLOGY in, after the rank is decided.
        assert (env["NODE_RANK"], env["TORCH_TPU_TOPOLOGY"]) == ("3", "2,2,1")
        with pytest.raises(ValueError, match=r"expected nnodes to match .* \(4: "):
            _set(nnodes=2)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_job(
    tmp_path: Path, topology: str, accelerator: str, launcher: str, nproc: int, **pinned: str
) -> Any:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS} | pinned
    command = [sys.executable, "-m", "xlasim", "run", "--topology", topology]
    command += ["--accelerator", accelerator, "--all-output", "--", sys.executable, str(script)]
    command += [launcher, str(nproc), str(_free_port())]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = re.findall(r"rank=.*", out.stdout)
    return [dict(kv.split("=", 1) for kv in line.split()) for line in lines]


def test_torchrun_runs_a_process_per_chip_over_tpu_dist(tmp_path: Path) -> None:
    # A v4 host of 4 chips, 2 processes on 2 of them (TorchTPU lets one host run fewer).
    ranks = _run_job(tmp_path, "2x2x1", "v4", "torchrun", 2)
    assert sorted(r["rank"] for r in ranks) == ["0", "1"]
    for r in ranks:
        # Each process is the chip of its local rank; the all-reduce sums every rank.
        assert r["chip"] == r["rank"]
        assert (r["world"], r["sum"], r["backend"], r["device"]) == ("2", "1", "tpu_dist", "tpu:0")


def test_spawn_on_every_host_of_a_multi_host_job_under_xlasim_run(tmp_path: Path) -> None:
    # torch.multiprocessing.spawn, as TorchTPU's docs launch a job: xlasim run starts the 2
    # hosts of a v4 2x2x2 (4 chips each); each sets the launch environment and spawns 2
    # processes. The slice's topology and the rendezvous port are given from outside, as an
    # operator pins them; each host's NODE_RANK comes from its chips' coordinates (host 1
    # holds z = 1).
    ranks = _run_job(
        tmp_path,
        "2x2x2",
        "v4",
        "spawn",
        2,
        TORCH_TPU_TOPOLOGY="2x2x2",
        MASTER_PORT=str(_free_port()),
    )
    assert sorted(int(r["rank"]) for r in ranks) == list(range(4))
    for r in ranks:
        rank = int(r["rank"])
        assert (int(r["host"]), int(r["chip"])) == divmod(rank, 2)
        assert (r["world"], r["sum"], r["backend"], r["device"]) == ("4", "6", "tpu_dist", "tpu:0")
