"""Host-index assignment and the per-worker TPU environment, without starting Ray.

The non-SPMD (one process per chip) environment is compared with what real torch_xla
2.9's ``_internal/tpu.py configure_topology`` writes for the same host when torch_xla is
installed (the ``xla-cpu`` env); its published example (test_internal_tpu.py: v4-16,
worker 1, local rank 0) is checked everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tpu_backend.bootstrap import (
    BootstrapError,
    HostAssignment,
    HostProbe,
    WorkerBootstrap,
    _tpu_env,
    assign_hosts,
    spec_from_probes,
)
from tpu_backend.machine import real_torch_xla_unavailable
from tpu_backend.topology import parse_slice


def probe(env=None, label=None, tpu_ids=("0", "1", "2", "3"), ip="10.0.0.1", accel=None, topo=None):
    return HostProbe(
        worker_id_env=env,
        worker_id_label=label,
        worker_id_metadata=None,
        slice_name="slice-a",
        node_ip=ip,
        hostname=f"host-{ip}",
        tpu_ids=tuple(tpu_ids),
        env_accelerator_type=accel,
        env_topology=topo,
        pid=1,
    )


V4_16 = parse_slice("2x2x2", "v4")
V6E_16 = parse_slice("4x4", "v6e")


def test_host_index_comes_from_tpu_worker_id_not_ray_rank():
    # Ray sorts TPU workers by pod name, identical on every host of a slice, so rank 0 can
    # be any host.  Here Ray rank 0 sits on TPU worker 3.
    probes = [probe("3"), probe("0", "0"), probe(None, "2"), probe("1")]
    got = assign_hosts(probes, V6E_16, spmd=True)
    assert [a.host_index for a in got] == [3, 0, 2, 1]
    assert [a.process_index for a in got] == [3, 0, 2, 1]
    assert {a.process_count for a in got} == {4}


def test_conflicting_worker_ids_on_one_host():
    with pytest.raises(
        BootstrapError, match="conflicting TPU worker ids: TPU_WORKER_ID=1, ray.io/tpu-worker-id=0"
    ):
        assign_hosts([probe("1", "0"), probe("0")], V4_16, spmd=True)


def test_duplicate_and_out_of_range_worker_ids():
    with pytest.raises(BootstrapError, match=r"TPU worker ids \[0, 0\].*exactly once"):
        assign_hosts([probe("0"), probe("0")], V4_16, spmd=True)
    with pytest.raises(BootstrapError, match="TPU worker id 2, outside 0..1"):
        assign_hosts([probe("0"), probe("2")], V4_16, spmd=True)
    with pytest.raises(BootstrapError, match="'x' is not an integer"):
        assign_hosts([probe("x"), probe("1")], V4_16, spmd=True)


def test_missing_worker_id_is_fatal_only_on_multi_host():
    with pytest.raises(BootstrapError, match="no TPU worker id"):
        assign_hosts([probe(), probe("1")], V4_16, spmd=True)
    (single,) = assign_hosts(
        [probe(tpu_ids=[str(i) for i in range(8)])], parse_slice("2x4", "v6e"), spmd=True
    )
    assert (single.host_index, single.process_index, single.process_count) == (0, 0, 1)
    (cpu,) = assign_hosts([probe(tpu_ids=())], None, spmd=True)
    assert cpu.host_index == 0


def test_one_process_per_chip_without_spmd():
    probes = [
        probe(str(h), tpu_ids=[str(c)], ip=f"10.0.0.{h}") for h in (1, 0) for c in (2, 0, 3, 1)
    ]
    got = assign_hosts(probes, V4_16, spmd=False)
    assert [(a.host_index, a.local_rank, a.process_index) for a in got[:4]] == [
        (1, 2, 6),
        (1, 0, 4),
        (1, 3, 7),
        (1, 1, 5),
    ]
    assert sorted(a.process_index for a in got) == list(range(8))
    assert {a.local_world_size for a in got} == {4}
    with pytest.raises(BootstrapError, match="exactly one chip"):
        assign_hosts([probe("0"), probe("1")], V4_16, spmd=False)


def test_spec_from_host_env():
    probes = [probe("0", accel="v4-16", topo="2x2x2"), probe("1", accel="v4-16", topo="2x2x2")]
    assert spec_from_probes(probes) == V4_16
    assert spec_from_probes([probe("0")]) is None


def _bootstrap(spec, host, local_rank, *, spmd, hostnames):
    a = HostAssignment(
        host_index=host,
        process_index=host * spec.chips_per_host + local_rank if not spmd else host,
        process_count=spec.num_chips if not spmd else spec.num_hosts,
        local_rank=local_rank,
        local_world_size=spec.chips_per_host if not spmd else 1,
    )
    return WorkerBootstrap(
        spmd=spmd,
        assignment=a,
        num_hosts=spec.num_hosts,
        master_addr=hostnames[0],
        master_port=1234,
        init_method="xla" if not spmd else "env",
        backend="xla" if not spmd else "gloo",
        timeout_s=60,
        spec=spec,
        hostnames=tuple(hostnames),
        slice_name="slice-a",
        mesh_plan=None,
        holds_tpu=True,
    )


def test_per_chip_env_matches_torch_xla_published_example(monkeypatch):
    # torch_xla test/pjrt/test_internal_tpu.py: v4-16, worker 1, local rank 0.
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    env = _tpu_env(_bootstrap(V4_16, 1, 0, spmd=False, hostnames=["10.0.0.1", "10.0.0.2"]))
    assert env["TPU_PROCESS_BOUNDS"] == "2,2,2"
    assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
    assert env["TPU_VISIBLE_CHIPS"] == "0"
    assert env["TPU_PROCESS_PORT"] == "8476"
    assert env["CLOUD_TPU_TASK_ID"] == "4"


def test_spmd_env_fills_missing_gke_vars(monkeypatch):
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    env = _tpu_env(_bootstrap(V4_16, 1, 0, spmd=True, hostnames=["10.0.0.1", "10.0.0.2"]))
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.1,10.0.0.2"
    assert env["TPU_SKIP_MDS_QUERY"] == "1"
    assert "TPU_NAME" not in env
    assert "TPU_PROCESS_BOUNDS" not in env  # libtpu drives all host chips itself under SPMD
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "gke-0,gke-1")
    assert _tpu_env(_bootstrap(V4_16, 1, 0, spmd=True, hostnames=["a", "b"])) == {}


_REAL_CONFIGURE = textwrap.dedent(
    """
    import json, os, sys
    os.environ["PJRT_DEVICE"] = "CPU"
    from torch_xla._internal import tpu
    keys = ["TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS",
            "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID"]
    out = []
    for case in json.loads(sys.stdin.read()):
        for k in keys:
            os.environ.pop(k, None)
        os.environ.update(case["env"])
        tpu.configure_topology(case["local_rank"], case["local_world_size"])
        out.append({k: os.environ.get(k) for k in keys})
    print(json.dumps(out))
    """
)


@pytest.mark.xla_cpu
@pytest.mark.skipif(
    real_torch_xla_unavailable() is not None, reason=str(real_torch_xla_unavailable())
)
def test_per_chip_env_equals_real_torch_xla_configure_topology(monkeypatch):
    from tpu_backend.topology import tpu_host_env

    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    cases, ours = [], []
    for topo, accel in [("2x2x2", "v4"), ("4x4", "v6e"), ("4x4", "v5litepod"), ("2x2x4", "v5p")]:
        spec = parse_slice(topo, accel)
        hosts = [f"10.0.0.{i + 1}" for i in range(spec.num_hosts)]
        for host in range(spec.num_hosts):
            for local in range(spec.chips_per_host):
                b = _bootstrap(spec, host, local, spmd=False, hostnames=hosts)
                mine = _tpu_env(b)
                ours.append(
                    {
                        k: mine[k]
                        for k in (
                            "TPU_PROCESS_BOUNDS",
                            "TPU_CHIPS_PER_PROCESS_BOUNDS",
                            "TPU_VISIBLE_CHIPS",
                            "TPU_PROCESS_PORT",
                            "TPU_PROCESS_ADDRESSES",
                            "CLOUD_TPU_TASK_ID",
                        )
                    }
                )
                cases.append(
                    {
                        "env": tpu_host_env(spec, host, hosts),
                        "local_rank": local,
                        "local_world_size": spec.chips_per_host,
                    }
                )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "XLASIM_"))}
    proc = subprocess.run(
        [sys.executable, "-c", _REAL_CONFIGURE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    mismatches = [(c, o, r) for c, o, r in zip(cases, ours, real, strict=True) if o != r]
    assert not mismatches, mismatches[:3]
