"""Driver-side steps of starting and stopping the backend's workers.

``TPUXLABackend.on_start`` (:mod:`tpu_backend.config`) runs them in order: probe every
worker's host, pick the coordinator (TPU worker 0), let the hosts find out which of them
share a compilation cache directory, then bootstrap all workers concurrently (the TPU
runtime and the gloo store need every host to join).  Every wait is bounded and fails fast
on the first worker error.  Nothing here reads the config: the backend passes each step
what it needs.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import ray
from ray.train._internal.utils import get_address_and_port

from tpu_backend import compile_cache
from tpu_backend.bootstrap import (
    BootstrapError,
    HostAssignment,
    HostProbe,
    WorkerBootstrap,
    probe_host,
    shutdown_worker,
)
from tpu_backend.ray_prepare import set_up_worker
from tpu_backend.topology import SliceSpec

__all__ = [
    "BACKEND_NAME",
    "bootstrap_workers",
    "cache_visibility",
    "coordinator_address",
    "gather",
    "layout_from_probes",
    "probe_hosts",
    "scaling_config_of",
    "shutdown_workers",
]

logger = logging.getLogger(__name__)

BACKEND_NAME = "torch_xla"
"""What this backend calls itself in logs and errors (never Ray's 'tpu_dist')."""

PROBE_TIMEOUT_S = 120.0


def scaling_config_of(worker_group: Any) -> Any:
    # Ray's own _TorchBackend reads the run's ScalingConfig the same way.
    return getattr(getattr(worker_group, "_train_run_context", None), "scaling_config", None)


def gather(refs: list[Any], timeout_s: float, labels: list[str], what: str) -> list[Any]:
    """``ray.get`` with a deadline that raises on the first failed worker instead of
    waiting for the others (which may block forever on a peer that died)."""
    deadline = time.monotonic() + timeout_s
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            late = ", ".join(labels[index[r]] for r in pending)
            raise TimeoutError(
                f"{BACKEND_NAME} backend: {what} did not finish within {timeout_s:g}s on "
                f"{late}; raise TPUTorchConfig(bootstrap_timeout_s=...) if the slice is slow "
                f"to start, otherwise check those hosts"
            )
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        for ref in ready:
            i = index[ref]
            try:
                results[i] = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise BootstrapError(
                    f"{BACKEND_NAME} backend: {what} failed on {labels[i]}: {cause}"
                ) from e
    return results


def probe_hosts(worker_group: Any, multi_host: bool, timeout_s: float) -> list[HostProbe]:
    """Every worker's :class:`HostProbe`, by Ray world rank."""
    n = len(worker_group)
    return gather(
        [
            worker_group.execute_single_async(i, probe_host, query_metadata=multi_host)
            for i in range(n)
        ],
        min(PROBE_TIMEOUT_S, timeout_s),
        [f"worker rank {i}" for i in range(n)],
        "host probe",
    )


class _Layout:
    """A ScalingConfig look-alike built from what the hosts report."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def layout_from_probes(spec: SliceSpec, probes: list[HostProbe]) -> Any:
    """The worker layout the hosts describe, for a run that gave no topology."""
    return _Layout(
        topology=spec.topology,
        accelerator_type=spec.accelerator,
        num_workers=len(probes),
        use_tpu=any(p.tpu_ids for p in probes),
        resources_per_worker={"TPU": len(probes[0].tpu_ids)},
    )


def coordinator_address(worker_group: Any, assignments: list[HostAssignment]) -> tuple[str, int]:
    """Host 0 coordinates: torch_xla's process 0, the gloo store, libtpu's worker 0."""
    coordinator = next(i for i, a in enumerate(assignments) if a.process_index == 0)
    addr, port = worker_group.execute_single(coordinator, get_address_and_port)
    return addr, int(port)


def cache_visibility(
    worker_group: Any,
    cache_dir: str,
    assignments: list[HostAssignment],
    labels: list[str],
    timeout_s: float,
) -> dict[int, list[int]]:
    """For the 'auto' cache policy: every host leaves a marker in the cache directory,
    then reports whose markers it sees (hosts sharing the directory see each other)."""
    token = uuid.uuid4().hex
    n = len(assignments)
    gather(
        [
            worker_group.execute_single_async(
                i, compile_cache.mark_host, cache_dir, token, assignments[i].job_host
            )
            for i in range(n)
        ],
        timeout_s,
        labels,
        "compilation cache marker",
    )
    seen = gather(
        [
            worker_group.execute_single_async(i, compile_cache.visible_hosts, cache_dir, token)
            for i in range(n)
        ],
        timeout_s,
        labels,
        "compilation cache visibility",
    )
    return {assignments[i].job_host: list(seen[i]) for i in range(n)}


def bootstrap_workers(
    worker_group: Any, plans: list[WorkerBootstrap], labels: list[str], timeout_s: float
) -> list[dict[str, Any]]:
    """Runs every worker's bootstrap (and points Ray Train's helpers at it) at once; their
    summaries must describe one slice."""
    summaries = gather(
        [worker_group.execute_single_async(i, set_up_worker, plan) for i, plan in enumerate(plans)],
        timeout_s,
        labels,
        "worker bootstrap",
    )
    keys = ("process_count", "global_device_count", "mesh_shape", "axis_names")
    first = {k: summaries[0][k] for k in keys}
    for s, label in zip(summaries[1:], labels[1:], strict=True):
        other = {k: s[k] for k in keys}
        if other != first:
            raise BootstrapError(
                f"{BACKEND_NAME} backend: {label} sees {other} but {labels[0]} sees {first}; "
                f"the hosts do not form one slice"
            )
    return summaries


def shutdown_workers(worker_group: Any, timeout_s: float) -> None:
    """Cleans up every worker, bounded; a failure is logged, not raised (the run is over)."""
    n = len(worker_group)
    try:
        gather(
            [worker_group.execute_single_async(i, shutdown_worker) for i in range(n)],
            timeout_s,
            [f"worker rank {i}" for i in range(n)],
            "worker shutdown",
        )
    except (TimeoutError, BootstrapError) as e:
        logger.warning("%s", e)
