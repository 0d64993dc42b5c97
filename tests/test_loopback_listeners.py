"""A multi-host slice simulated on one machine listens on loopback only.

``xlasim run --topology 4x4`` starts four host processes the way users start them; once the
hosts have met (they exchanged a sharded batch and rendezvoused through ``xla://``), every
socket any of them listens on -- host 0's store for the hosts' data exchange, the ``xla://``
rendezvous store, gloo's listeners -- is bound to a loopback address (docs/network.md).
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
from launcher import kill_launcher_group, start_xlasim_run
from sockets import free_port, is_loopback, listening

pytestmark = [
    pytest.mark.skipif(
        not Path("/proc/self/net/tcp").exists(), reason="reads listening sockets from Linux's /proc"
    ),
    pytest.mark.skipif(
        not os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "xlasim.pth")),
        reason="xlasim is not installed in this environment (no xlasim.pth in site-packages)",
    ),
]

MEET_S = 300
"""Bound on the four hosts starting and meeting (a loaded 2-core machine imports torch 4x)."""

HOSTS = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np, torch, torch_xla
    import torch.distributed as dist
    import torch_xla.distributed.spmd as xs
    import torch_xla.distributed.xla_backend  # noqa: F401 - registers xla://
    import torch_xla.runtime as xr

    xr.use_spmd()
    n, me, count = xr.global_runtime_device_count(), xr.process_index(), xr.process_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    x = torch.randn(4 * n, 8).to(torch_xla.device())
    xs.mark_sharding(x, mesh, ("data", None))  # the hosts exchange their copies
    store, rank, world = next(dist.rendezvous("xla://"))
    store.set(f"host{rank}", "up")
    store.wait([f"host{h}" for h in range(world)])
    out = sys.argv[1]
    with open(os.path.join(out, f"pid{me}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, f"pid{me}.tmp"), os.path.join(out, f"pid{me}"))
    time.sleep(600)
    """
)


def test_hosts_of_a_simulated_slice_listen_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "MASTER_"))}
    # A port of this run's own for the xla:// store (torch_xla's default 12355 may be taken).
    env["MASTER_PORT"] = str(free_port())
    launcher = start_xlasim_run(
        "--topology", "4x4", "--", sys.executable, "-c", HOSTS, str(tmp_path),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + MEET_S
        while not all((tmp_path / f"pid{h}").exists() for h in range(4)):
            assert launcher.poll() is None, launcher.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"the 4 hosts did not meet within {MEET_S} s"
            time.sleep(0.2)
        pids = [int((tmp_path / f"pid{h}").read_text()) for h in range(4)]
        found = {pid: listening(pid) for pid in [launcher.pid, *pids]}
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_launcher_group(launcher)  # the hosts too: they hold its output pipe open
            launcher.communicate(timeout=30)
    # host 0 runs both stores: the data exchange's and the xla:// rendezvous (MASTER_PORT)
    host0_ports = {port for _, port in found[pids[0]]}
    assert int(env["MASTER_PORT"]) in host0_ports, found
    assert len(found[pids[0]]) >= 3, found  # two stores and gloo's listener
    assert all(found[pid] for pid in pids[1:]), found  # gloo listens on every host
    assert not found[launcher.pid], found  # the launcher itself opens nothing
    outside = {pid: [a for a in addrs if not is_loopback(a[0])] for pid, addrs in found.items()}
    assert not any(outside.values()), f"listening outside loopback: {outside}"
