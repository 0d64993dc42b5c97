"""Faults of a simulated v4-16 slice (2 hosts) under Ray Train: each ends in a clear error that
names its bound, or in a retry that resumes from the last complete checkpoint with no step lost,
and leaves no placement group, actor or worker process behind.

The drills themselves (the training loop and how each fault is injected) are in
``fault_drills.py``; ``bench/bench_faults.py`` measures how long each takes to be noticed.
One fake-TPU Ray cluster serves the whole module (and the other tests on a v4-16).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray.train")

import ray  # noqa: E402
import ray._private.state  # noqa: E402
from fault_drills import expected_losses, leftovers, read_log, run_drill  # noqa: E402
from sockets import is_loopback  # noqa: E402

# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]

STEPS, CKPT_EVERY, FAULT_STEP = 6, 2, 3
"""Checkpoints after steps 1, 3 and 5; the fault comes at step 3, so the last complete
checkpoint before it is step 1's."""
HANG_BOUND_S = 20
"""The bound under test for a hanging host: far below the defaults (300 s, 1800 s), far above
what one step takes on a loaded machine."""


@pytest.fixture
def v4_16_cluster(tpu_clusters):
    return tpu_clusters.get("2x2x2", "v4", startup_timeout_s=180)


def _drill(tmp_path, fault, **kwargs):
    result, error = run_drill(
        fault, tmp_path, steps=STEPS, ckpt_every=CKPT_EVERY, step=FAULT_STEP, **kwargs
    )
    assert result.fault_record, f"the {fault} fault never fired: {result.attempts}"
    assert leftovers(tmp_path / "out") == []
    return result, error


def _assert_resumed_without_loss(result, resumed_from):
    first, retry = result.attempts
    assert first["resumed_from"] is None
    assert retry["resumed_from"] == resumed_from
    # the retry runs every step after the checkpoint, the rest of the run, once each
    assert retry["steps"] == list(range(resumed_from + 1, STEPS))
    assert first["steps"][: resumed_from + 1] == list(range(resumed_from + 1))
    # ...from the checkpoint's weights: the losses are those of an uninterrupted run
    got = [result.losses[s] for s in range(STEPS)]
    assert got == pytest.approx(expected_losses(STEPS), rel=1e-5)


def _assert_simulator_listens_on_loopback(out):
    """What the hosts listened on once they had met (recorded by drill_loop)."""
    seen = [r for h in range(2) for r in read_log(out, h) if r["event"] == "listeners"]
    assert len(seen) == 2, seen
    hosts_addr = seen[0]["hosts_addr"]
    host, port = hosts_addr.rsplit(":", 1)
    assert host == "127.0.0.1"
    # host 0 runs the simulator's exchange store, on that address only
    on_port = [(a, p) for r in seen for a, p in r["listening"] if p == int(port)]
    assert on_port == [("127.0.0.1", int(port))], seen
    # anything else outside loopback is Ray's (each worker's gRPC server) or the backend's
    # process group (MASTER_ADDR:MASTER_PORT, torch's store on every interface; gloo on the
    # node's address), see docs/network.md
    ray_ports = {
        info["Address"]["Port"]
        for info in ray._private.state.actors().values()
        if info.get("ActorClassName") == "RayTrainWorker"
    }
    master_addr, master_port = seen[0]["master"]
    outside = [
        (a, p)
        for r in seen
        for a, p in r["listening"]
        if not is_loopback(a) and p not in ray_ports and p != int(master_port) and a != master_addr
    ]
    assert outside == [], (seen, ray_ports)


@pytest.mark.mat_mul_precision("highest")
def test_killed_host_is_replaced_and_the_run_resumes(v4_16_cluster, tmp_path):
    result, error = _drill(tmp_path, "kill", max_failures=1)
    assert error is None and result.outcome == "recovered", result.error
    assert result.attempts[0]["steps"] == [0, 1, 2]  # killed before step 3
    _assert_resumed_without_loss(result, resumed_from=1)


@pytest.mark.mat_mul_precision("highest")
def test_killed_coordinator_is_replaced_and_the_run_resumes(v4_16_cluster, tmp_path):
    # Host 0 runs the stores every host meets at (the exchange's, the process group's); the
    # retry's host 0 listens at the same XLASIM_HOSTS_ADDR again.
    result, error = _drill(tmp_path, "kill_coordinator", max_failures=1)
    assert error is None and result.outcome == "recovered", result.error
    assert result.fault_record["host"] == 0
    _assert_resumed_without_loss(result, resumed_from=1)


def test_host_raising_ends_the_run_with_its_error(v4_16_cluster, tmp_path):
    result, error = _drill(tmp_path, "raise")
    assert result.outcome == "error"
    assert "RuntimeError: drill: host 1 raised at step 3" in result.error, result.error
    assert len(result.attempts) == 1
    # the simulated cluster's own listeners, read in the same run
    _assert_simulator_listens_on_loopback(tmp_path / "out")


def test_host_hanging_before_the_exchange_is_ended_by_the_hosts_bound(v4_16_cluster, tmp_path):
    # The process group's own bound stays at its 1800 s default: the exchange's bound ends it.
    result, error = _drill(tmp_path, "hang_exchange", hosts_timeout_s=HANG_BOUND_S)
    assert result.outcome == "error"
    assert f"each exchange waits at most XLASIM_HOSTS_TIMEOUT_S={HANG_BOUND_S} s" in result.error, (
        result.error
    )
    assert "TimeoutError: xlasim: exchanging host-entered data" in result.peer_error


def test_host_hanging_before_an_all_reduce_is_ended_by_timeout_s(v4_16_cluster, tmp_path):
    result, error = _drill(tmp_path, "hang_all_reduce", timeout_s=HANG_BOUND_S)
    assert result.outcome == "error"
    # gloo's message gives the bound in ms; the note names the knob that sets it
    assert f"Timed out waiting {HANG_BOUND_S * 1000}ms" in result.peer_error, result.peer_error
    assert f"TPUTorchConfig(timeout_s={HANG_BOUND_S})" in result.error, result.error


@pytest.mark.mat_mul_precision("highest")
def test_preemption_during_checkpoint_save_resumes_from_the_last_complete_one(
    v4_16_cluster, tmp_path
):
    result, error = _drill(tmp_path, "kill_in_save", max_failures=1)
    assert error is None and result.outcome == "recovered", result.error
    # killed while step 3's checkpoint was being copied, with part of it in storage
    assert result.attempts[0]["steps"] == [0, 1, 2, 3]
    assert result.fault_record["copied"] > 0
    # the half-written step-3 checkpoint is never resumed from (a retry reading it would
    # have failed: drill_loop checks that every file of every host is there)
    _assert_resumed_without_loss(result, resumed_from=1)
