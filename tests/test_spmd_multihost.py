"""Multi-host SPMD on the simulator: one process per simulated host, exchanging over gloo.

Each test starts the slice's host processes (``xlasim.simulate(..., host_index=h)`` with a
shared ``XLASIM_HOSTS_ADDR``), waits for them with a bound and kills them on failure.  The
hosts of a real slice run one global program, so every host must report the same global
results -- equal to eager CPU torch on the global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from global_batch import eager_sgd
from sockets import free_port

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 240.0

TRAIN_STEP = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import xlasim

    topology, accelerator, host = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
    with xlasim.simulate(topology, accelerator=accelerator, host_index=host):
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        n, hosts = xr.global_runtime_device_count(), xr.process_count()
        assert xr.process_index() == host
        mesh = xs.Mesh(np.arange(n), (n,), ("data",))
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(4 * n, 8, generator=g), torch.randn(4 * n, 1, generator=g)
        per_host = x.shape[0] // hosts
        part = slice(host * per_host, (host + 1) * per_host)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1).to(torch_xla.device())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        spec = xs.ShardingSpec(mesh, ("data", None), minibatch=True)
        losses = []
        for _ in range(2):
            xb, yb = xm.send_cpu_data_to_device([x[part], y[part]], torch_xla.device(), spec)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            torch_xla.sync()
            losses.append(loss.item())
        # a host-local tensor sharded by every host: each device keeps its owner host's rows
        mine = torch.full((n, 2), float(host)).to(torch_xla.device())
        xs.mark_sharding(mine, mesh, ("data", None))
        # each host loads its devices' shards; every host then sees all of them
        st = xs.mark_sharding(torch.zeros(n, 2).to(torch_xla.device()), mesh, ("data", None))
        shards = st.local_shards
        for s in shards:
            s.data.fill_(100 * host + int(s.shard_device.split(":")[1]))
        st.load_local_shards_(shards)
        print(json.dumps({
            "host": host,
            "losses": losses,
            "global_batch_shape": list(xb.shape),
            "owners": mine.cpu()[:, 0].tolist(),
            "loaded": st.global_tensor.cpu()[:, 0].tolist(),
            "weight": model.weight.detach().cpu().flatten().tolist(),
        }))
    """
)


def _run_hosts(topology: str, accelerator: str, num_hosts: int) -> list[dict]:
    env = dict(
        os.environ,
        XLASIM_HOSTS_ADDR=f"127.0.0.1:{free_port()}",
        XLASIM_HOSTS_TIMEOUT_S=str(int(WAIT_S)),
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for key in ("XLASIM_TOPOLOGY", "XLASIM_ACCELERATOR", "XLASIM_HOST_INDEX", "XLA_USE_SPMD"):
        env.pop(key, None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN_STEP, topology, accelerator, str(h)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for h in range(num_hosts)
    ]
    deadline = time.monotonic() + WAIT_S
    results = []
    try:
        for h, proc in enumerate(procs):
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, f"host {h} failed ({proc.returncode}):\n{err[-3000:]}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return results


@pytest.mark.parametrize(
    ("topology", "accelerator", "num_hosts", "num_devices"),
    [("2x2x2", "v4", 2, 8), ("4x4", "v6e", 4, 16)],
    ids=["v4-16-2hosts", "v6e-16-4hosts"],
)
@pytest.mark.mat_mul_precision("highest")
def test_hosts_compute_the_global_step(topology, accelerator, num_hosts, num_devices):
    results = _run_hosts(topology, accelerator, num_hosts)
    losses, weight = eager_sgd(num_devices)
    per_host = num_devices // num_hosts
    for h, r in enumerate(results):
        assert r["host"] == h
        assert r["global_batch_shape"] == [4 * num_devices, 8]
        assert r["losses"] == pytest.approx(losses, rel=1e-6), f"host {h}"
        assert r["weight"] == pytest.approx(weight, rel=1e-6), f"host {h}"
        # device d belongs to host d // per_host, whose copy held the value of its index
        assert r["owners"] == [float(d // per_host) for d in range(num_devices)]
        assert r["loaded"] == [float(100 * (d // per_host) + d) for d in range(num_devices)]
    # and the hosts agree bit for bit
    assert all(r["losses"] == results[0]["losses"] for r in results)


def test_single_host_process_of_a_multi_host_slice_needs_the_address():
    code = textwrap.dedent(
        """
        import numpy as np, torch, xlasim
        with xlasim.simulate("2x2x2", accelerator="v4", host_index=1):
            import torch_xla.distributed.spmd as xs, torch_xla.runtime as xr
            xr.use_spmd()
            t = torch.zeros(8, 2).to("xla")
            try:
                xs.mark_sharding(t, xs.get_1d_mesh("d"), ("d", None))
            except RuntimeError as e:
                print(e)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XLASIM_HOSTS_ADDR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "xlasim: this process is host 1 of a 2-host v4-16 slice" in proc.stdout
    assert "XLASIM_HOSTS_ADDR='host:port'" in proc.stdout
