"""The fake-TPU Ray cluster: nodes shaped like the slice's hosts, as Ray's TPU code
expects them, workers running the simulator as their host, bounded start and teardown."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("ray")

import ray  # noqa: E402

from tpu_backend.topology import parse_slice  # noqa: E402
from xlasim.ray.cluster import (  # noqa: E402
    SIMULATION_RUNTIME_ENV,
    host_node_args,
    simulated_tpu_cluster,
)

_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"

# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker. Each test
# here starts its own cluster (or none): a cluster kept by an earlier test goes first.
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("ray"),
    pytest.mark.usefixtures("no_shared_cluster"),
]


@pytest.fixture
def tpu_ray_cluster(request):
    # The same thin wrapper the pytest plugin registers (imports ray only when used).
    from xlasim.ray.cluster import tpu_ray_cluster_fixture

    yield from tpu_ray_cluster_fixture(request)


# -- node arguments, no cluster ------------------------------------------------------------------


def test_multi_host_node_args_follow_rays_fake_tpu_hosts():
    spec = parse_slice("4x4", "v6e")
    args = [host_node_args(spec, h, "s-a", hosts_addr="127.0.0.1:1") for h in range(4)]
    for h, a in enumerate(args):
        assert a["resources"]["TPU"] == 4
        assert a["resources"]["accelerator_type:TPU-V6E"] == 1
        assert a["labels"] == {
            "ray.io/tpu-slice-name": "s-a",
            "ray.io/tpu-worker-id": str(h),
            "ray.io/tpu-pod-type": "v6e-16",
            "ray.io/tpu-topology": "4x4",
        }
        env = a["env_vars"]
        assert (env["TPU_NAME"], env["TPU_WORKER_ID"]) == ("s-a", str(h))
        assert (env["TPU_ACCELERATOR_TYPE"], env["TPU_TOPOLOGY"]) == ("v6e-16", "4x4")
        assert (env["XLASIM_NODE_TOPOLOGY"], env["XLASIM_NODE_HOST_INDEX"]) == ("4x4", str(h))
        assert env["XLASIM_NODE_HOSTS_ADDR"] == "127.0.0.1:1"
        # activation variables never sit on the node (its agents would import torch)
        assert not any(k in env for k in ("XLASIM_TOPOLOGY", "XLASIM_HOST_INDEX"))
    heads = [h for h, a in enumerate(args) if "TPU-v6e-16-head" in a["resources"]]
    assert heads == [0]


def test_not_simulated_hosts_carry_no_simulator_variables():
    env = host_node_args(parse_slice("2x2x2", "v4"), 1, "s", simulate=False)["env_vars"]
    assert not any(k.startswith("XLASIM") for k in env)


def test_runtime_env_expands_node_values():
    assert SIMULATION_RUNTIME_ENV["env_vars"] == {
        "XLASIM_TOPOLOGY": "${XLASIM_NODE_TOPOLOGY}",
        "XLASIM_ACCELERATOR": "${XLASIM_NODE_ACCELERATOR}",
        "XLASIM_HOST_INDEX": "${XLASIM_NODE_HOST_INDEX}",
        "XLASIM_HOSTS_ADDR": "${XLASIM_NODE_HOSTS_ADDR}",
    }


def test_bad_slice_fails_before_anything_starts():
    with (
        pytest.raises(ValueError, match="topology '2x2' has 2 dimensions but v4"),
        simulated_tpu_cluster("2x2", "v4"),
    ):
        pass
    assert not ray.is_initialized()


# -- a live v4-16 cluster --------------------------------------------------------------------------


@ray.remote(num_cpus=1, resources={"TPU": 4})
def _host_view():
    import logging
    import os

    import torch_xla
    import torch_xla.runtime as xr

    return {
        "worker_id": os.environ.get("TPU_WORKER_ID"),
        "visible": os.environ.get("TPU_VISIBLE_CHIPS"),
        "labels": ray.get_runtime_context().get_node_labels(),
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "devices": xr.global_runtime_device_count(),
        "device_type": xr.device_type(),
        "simulated": "xlasim" in (torch_xla.__file__ or ""),
        "ray_address": os.environ.get("RAY_ADDRESS"),
        "cleaner_log_level": logging.getLogger(_CLEANER_LOGGER).level,
    }


@pytest.mark.parametrize("tpu_ray_cluster", [("2x2x2", "v4")], indirect=True)
def test_rays_tpu_placement_runs_unchanged(tpu_ray_cluster):
    from ray._private.accelerators.tpu import reserve_tpu_slice
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from ray.util.tpu import SlicePlacementGroup

    spec = tpu_ray_cluster.spec
    assert (spec.pod_type, spec.num_hosts) == ("v4-16", 2)
    total = ray.cluster_resources()
    assert total["TPU"] == 8 and total["TPU-v4-16-head"] == 1

    # Ray's own head reservation finds the slice by its worker 0
    reservation = reserve_tpu_slice("2x2x2", "TPU-V4", timeout_s=60)
    assert reservation is not None
    slice_name, head_pg = reservation
    assert slice_name == tpu_ray_cluster.slice_names[0]
    remove_placement_group(head_pg)

    # ...and SlicePlacementGroup gang-schedules one bundle per host
    spg = SlicePlacementGroup(
        topology="2x2x2", accelerator_version="v4", head_reservation_timeout_s=60
    )
    try:
        assert spg.num_hosts == 2
        ready, _ = ray.wait([spg.placement_group.ready()], timeout=120)
        assert ready, "slice placement group never became ready"
        views = ray.get(
            [
                _host_view.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=spg.placement_group, placement_group_bundle_index=i
                    )
                ).remote()
                for i in range(spg.num_hosts)
            ],
            timeout=240,
        )
    finally:
        spg.shutdown()
    assert sorted(v["worker_id"] for v in views) == ["0", "1"]
    for v in views:
        assert v["simulated"] and v["device_type"] == "TPU"
        assert v["labels"]["ray.io/tpu-worker-id"] == v["worker_id"]
        assert v["labels"]["ray.io/tpu-slice-name"] == slice_name
        assert v["visible"] == "0,1,2,3"  # what Ray sets for a fake TPU node's chips
        # the simulator runs as the host Ray placed the task on
        assert (v["process_index"], v["process_count"]) == (int(v["worker_id"]), 2)
        assert v["devices"] == 8
        # the job's setup hook ran: Ray Train's placement-group cleaner asks this cluster
        # (not the newest one on the machine) and does not warn every second
        assert v["ray_address"] == ray.get_runtime_context().gcs_address
        assert v["cleaner_log_level"] == logging.ERROR


def test_cluster_is_torn_down_when_the_body_fails():
    class Boom(Exception):
        pass

    nodes = []
    with pytest.raises(Boom), simulated_tpu_cluster("2x2", "v6e", startup_timeout_s=120) as c:
        nodes = c.cluster.list_all_nodes()
        assert ray.is_initialized()
        raise Boom
    assert not ray.is_initialized()
    assert nodes and not any(n.any_processes_alive() for n in nodes)
