"""Simulated TPU Ray clusters shared by the tests of one pytest process.

Starting a simulated slice costs seconds per host (a raylet, its agents, the driver connecting)
and several test modules train on the same slices (a v4-16 for the fault drills, the multi-host
backend and the seamless trainer).  :class:`ClusterPool` keeps the last cluster up for the next
test that asks for the same slice and the same start arguments; a test that asks for another
one, or that needs this process's Ray connection for itself (:meth:`ClusterPool.release`),
shuts it down first.  So there is never more than one cluster per pytest process.

Handing a kept cluster on, the pool checks that the test before left it as a new one is: every
node alive, no placement group held, no actor of a run alive.  A cluster that is not is shut
down and started again, so what one test breaks cannot fail the next.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

RAY_TRAIN_POLL_S = "0.25"
"""Ray Train's controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s by
default) and only then takes in their reports, sees a training function return or a worker die:
each run waits for it at start, at every checkpoint a test waits on, at a failure and at the
end.  Here every cluster is on this machine, where a poll costs little."""

RAY_TEST_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": RAY_TRAIN_POLL_S,
    # Ray Train starts one more actor per run that polls Ray Core for nodes being drained
    # (cloud preemption notices); no node of a cluster on this machine ever is.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Ray lowers its worker processes to nice 15 so that a node's own daemons stay responsive
    # beside heavy tasks. Here those workers are the simulated hosts a test waits on, and the
    # other xdist worker's processes (nice 0) would take all but a few percent of the CPU from
    # them while both run.
    "RAY_worker_niceness": "0",
    # Ray 2.60 turns token authentication on for the whole process (its os.environ, so every
    # cluster and driver started from it afterwards) when a test starts a local cluster with
    # ray.init(address="local") and no mode is set; the drivers later tests start with a home
    # of their own then find no token. These clusters are this machine's, as before: say so.
    "RAY_AUTH_MODE": "disabled",
}
"""Set for this process and inherited by the clusters it starts and the Ray drivers it runs
(tests that start Ray processes with an environment of their own add it)."""

PER_RUN_ENV = ("XLASIM_MAT_MUL_PRECISION", "XLASIM_NUMERICS")
"""How the simulated chips compute is a test's own (its mat_mul_precision mark): kept clusters
start without these, so that every run of a test gets them through :func:`run_env`."""


def run_env() -> dict[str, Any] | None:
    """The ``worker_runtime_env`` that gives a run's workers this test's numerics settings."""
    env = {k: os.environ[k] for k in PER_RUN_ENV if os.environ.get(k)}
    return {"env_vars": env} if env else None


CPUS_PER_HOST = {"2x4": 8, "4x4": 4}
"""CPUs of each host of the v6e slices that several modules train on: one per chip, which Ray's
own TorchTrainer needs (a CPU beside each worker's chip, tests/test_torch_tpu_ray_train.py) and
which costs the other runs nothing.  Every module asks for them, so that one kept cluster of the
slice serves them all (starting a v6e-16's five Ray nodes costs tens of seconds)."""


CLUSTER_ACTORS = ("_AutoscalingCoordinatorActor",)
"""Ray's own actors that live as long as the cluster (started by the first run, shared by the
next ones): not something a run leaves behind."""

_START_ONLY = ("startup_timeout_s", "startup_attempts", "progress")

SETTLE_S = 60.0
"""Bound on Ray's asynchronous cleanup of a finished run (actors exiting, placement groups
going), waited for before a kept cluster is handed on."""


class ClusterPool:
    """At most one running :func:`xlasim.ray.cluster.simulated_tpu_cluster`, reused by key."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._stack: contextlib.ExitStack | None = None
        self._handle: Any = None
        self.starts = 0

    def get(self, topology: str, accelerator: str | None, **kwargs: Any) -> Any:
        """The running cluster of this slice and these start arguments, started if needed;
        this process's Ray is connected to it."""
        import ray  # deferred: only Ray tests need it

        # What the cluster is, not how its start is bounded or reported.
        shape = {k: v for k, v in kwargs.items() if k not in _START_ONLY}
        key = (topology, accelerator, tuple(sorted(shape.items())))
        if self._key == key and ray.is_initialized():
            problems = self._left_over()
            if not problems:
                return self._handle
            # Not as a new cluster would be: start a new one rather than let it fail the next.
            print(f"shared cluster {key}: restarting it ({'; '.join(problems)})")
        self.release()
        from xlasim.ray.cluster import simulated_tpu_cluster

        stack = contextlib.ExitStack()
        saved = {k: os.environ.pop(k) for k in PER_RUN_ENV if k in os.environ}
        try:  # the nodes' processes inherit this environment, and so would every later run
            self._handle = stack.enter_context(
                simulated_tpu_cluster(topology, accelerator, **kwargs)
            )
        finally:
            os.environ.update(saved)
        self._stack, self._key = stack, key
        self.starts += 1
        return self._handle

    def release(self) -> None:
        """Shut the kept cluster down (if any) and disconnect this process from it."""
        stack, self._stack, self._key, self._handle = self._stack, None, None, None
        if stack is not None:
            import ray

            stack.close()
            # simulated_tpu_cluster's exit leaves this process without a Ray connection
            assert not ray.is_initialized()

    def _left_over(self) -> list[str]:
        """What the kept cluster holds that a new one would not, after waiting up to
        :data:`SETTLE_S` for Ray to finish cleaning up."""
        import ray
        import ray._private.state

        from xlasim.ray.cluster import release_placement_groups

        # A run that failed in worker setup leaves its placement group for the caller to free
        # (see fit_with_deadline); freeing it here is what a new cluster's user would see.
        release_placement_groups()
        expected = self._handle.num_hosts + (1 if self._separate_head() else 0)
        deadline = time.monotonic() + SETTLE_S
        while True:
            found = []
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) != expected:
                found.append(f"{len(alive)} of {expected} nodes alive")
            found += [
                f"placement group {pg_id} is {info['state']}"
                for pg_id, info in (ray.util.placement_group_table() or {}).items()
                if info.get("state") != "REMOVED"
            ]
            found += [
                f"actor {info.get('ActorClassName', actor_id)} is ALIVE"
                for actor_id, info in ray._private.state.actors().items()
                if info.get("State") == "ALIVE" and info.get("ActorClassName") not in CLUSTER_ACTORS
            ]
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def _separate_head(self) -> bool:
        return bool(self._key and dict(self._key[2]).get("separate_head"))
