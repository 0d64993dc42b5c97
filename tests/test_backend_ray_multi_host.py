"""tpu_backend.TorchTrainer on simulated multi-host slices: v4-16 (2x2x2, 2 hosts x 4
chips) and v6e-16 (4x4, 4 hosts x 4 chips).

Each test trains on a fake-TPU Ray cluster of its slice (one Ray node per host, as Ray's own
TPU tests fake them; kept up for the next test on that slice, see tests/shared_clusters.py),
lets Ray's ``SlicePlacementGroup`` place one worker per host, runs an SPMD training loop and
checks what every host saw.  Every fit is bounded in time and the cluster is torn down even
when the test fails.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray.train")

from shared_clusters import CPUS_PER_HOST  # noqa: E402

from xlasim.cli import demo  # noqa: E402

# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]


@pytest.mark.parametrize(
    "topology, accelerator, hosts, devices, mesh",
    [
        ("2x2x2", "v4", 2, 8, [2, 4]),
        ("4x4", "v6e", 4, 16, [4, 4]),
    ],
    ids=["v4-16", "v6e-16"],
)
def test_spmd_training_on_every_host(
    tpu_clusters, topology, accelerator, hosts, devices, mesh, tmp_path
):
    # The cluster's start arguments as the other modules on this slice give them (one kept
    # cluster serves them all): the v4-16's are the fault drills', the v6e-16's Ray's own
    # TorchTrainer's.
    shared = {"num_cpus_per_host": CPUS_PER_HOST[topology]} if accelerator == "v6e" else {}
    cluster = tpu_clusters.get(topology, accelerator, startup_timeout_s=180, **shared)
    assert cluster.spec.num_hosts == hosts
    _, records = demo.run(
        topology,
        accelerator,
        steps=4,
        batch=32,
        out_dir=str(tmp_path / "records"),
        storage_path=str(tmp_path / "ray_results"),
        fit_timeout_s=600,
    )

    # one worker per host, each with its own host index = its TPU worker id
    assert [r["host_index"] for r in records] == list(range(hosts))
    for r in records:
        assert r["tpu_worker_id"] == str(r["host_index"])
        assert (r["process_index"], r["process_count"]) == (r["host_index"], hosts)
        assert r["global_devices"] == devices
        assert r["addressable_devices"] == devices // hosts
        assert r["mesh_shape"] == mesh and r["axis_names"] == ["data", "model"]
        assert r["spmd"] is True and r["device_type"] == "TPU"
        assert r["process_group"] == "gloo"
    # Ray's world rank covers the workers but is not what decides the host index
    assert sorted(r["ray_world_rank"] for r in records) == list(range(hosts))

    # the same program on every host: the same, decreasing loss
    first = records[0]["losses"]
    assert len(first) == 4
    assert all(r["losses"] == first for r in records), [r["losses"] for r in records]
    assert all(b < a for a, b in zip(first, first[1:], strict=False)), first
    # one graph execution per step on every host, compiled at most twice (as on real
    # torch_xla, see test_backend_xla_cpu.py) and reused afterwards
    for r in records:
        assert r["uncached_compile"] + r["cached_compile"] == 4
        assert 1 <= r["uncached_compile"] <= 2
