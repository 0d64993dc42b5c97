"""``TPUXLABackend``: Ray Train backend hooks for torch_xla on TPU slices.

``on_start`` (driver side) probes every worker's host, decides host indices and the
coordinator (TPU worker 0), then bootstraps all workers concurrently (the TPU runtime and
the gloo store need every host to join) with a bounded wait that fails fast on the first
worker error.  ``on_shutdown`` cleans up with a bounded wait.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import ray
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig

from tpu_backend.bootstrap import (
    BootstrapError,
    WorkerBootstrap,
    assign_hosts,
    bootstrap_worker,
    probe_host,
    shutdown_worker,
    spec_from_probes,
)
from tpu_backend.config import BACKEND_NAME, TPUTorchConfig

__all__ = ["TPUXLABackend"]

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0


def _scaling_config_of(worker_group: Any) -> Any:
    # Ray's own _TorchBackend reads the run's ScalingConfig the same way.
    return getattr(getattr(worker_group, "_train_run_context", None), "scaling_config", None)


def _gather(refs: list[Any], timeout_s: float, labels: list[str], what: str) -> list[Any]:
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


class TPUXLABackend(Backend):
    """Sets up torch_xla (SPMD by default) on every worker of a TPU slice."""

    share_cuda_visible_devices: bool = False

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        if not isinstance(backend_config, TPUTorchConfig):
            raise TypeError(
                f"TPUXLABackend needs a TPUTorchConfig, got {type(backend_config).__name__}"
            )
        cfg = backend_config
        n = len(worker_group)
        scaling_config = _scaling_config_of(worker_group)
        resolved = cfg.resolve(scaling_config)
        spec = resolved.spec

        multi_host = spec.is_multi_host if spec is not None else n > 1
        probes = _gather(
            [
                worker_group.execute_single_async(i, probe_host, query_metadata=multi_host)
                for i in range(n)
            ],
            min(PROBE_TIMEOUT_S, cfg.bootstrap_timeout_s),
            [f"worker rank {i}" for i in range(n)],
            "host probe",
        )
        if spec is None:
            # Plain TorchTrainer without a topology: the hosts may still say what they are.
            spec = spec_from_probes(probes)
            if spec is not None:
                resolved = cfg.resolve(
                    _Layout(
                        topology=spec.topology,
                        accelerator_type=spec.accelerator,
                        num_workers=n,
                        use_tpu=any(p.tpu_ids for p in probes),
                        resources_per_worker={"TPU": len(probes[0].tpu_ids)},
                    )
                )
        assignments = assign_hosts(probes, spec, cfg.spmd)
        labels = [
            f"host {a.host_index} (worker rank {i}, {probes[i].node_ip})"
            for i, a in enumerate(assignments)
        ]
        # Host 0 coordinates: torch_xla's process 0, the gloo store, libtpu's worker 0.
        coordinator = next(i for i, a in enumerate(assignments) if a.process_index == 0)
        master_addr, master_port = worker_group.execute_single(coordinator, get_address_and_port)
        by_host = {a.host_index: probes[i].node_ip for i, a in enumerate(assignments)}
        hostnames = tuple(by_host[h] for h in sorted(by_host))
        slice_name = next((p.slice_name for p in probes if p.slice_name), None)

        visible = None
        if cfg.compilation_cache_dir is not None and cfg.compilation_cache_readonly == "auto":
            visible = self._cache_visibility(worker_group, cfg, assignments, labels)
        plans = []
        for i, a in enumerate(assignments):
            plans.append(
                WorkerBootstrap(
                    spmd=cfg.spmd,
                    assignment=a,
                    num_hosts=spec.num_hosts if spec is not None else len(by_host),
                    master_addr=master_addr,
                    master_port=int(master_port),
                    init_method=str(cfg.init_method),
                    backend=str(cfg.backend),
                    timeout_s=float(cfg.timeout_s),
                    spec=spec,
                    hostnames=hostnames,
                    slice_name=slice_name,
                    mesh_plan=resolved.mesh,
                    mesh_shape=tuple(cfg.mesh_shape) if cfg.mesh_shape is not None else None,
                    axis_names=tuple(cfg.axis_names) if cfg.axis_names is not None else None,
                    spmd_config=dict(cfg._spmd_config),
                    partitioning_mode=cfg.partitioning_mode,
                    pjrt_device=cfg.pjrt_device,
                    holds_tpu=bool(probes[i].tpu_ids),
                    cache_dir=cfg.compilation_cache_dir,
                    cache_readonly=cfg.compilation_cache_readonly,
                    cache_visible=visible,
                )
            )
        summaries = _gather(
            [worker_group.execute_single_async(i, bootstrap_worker, plans[i]) for i in range(n)],
            cfg.bootstrap_timeout_s,
            labels,
            "worker bootstrap",
        )
        _check_summaries(summaries, labels)
        first = summaries[0]
        logger.info(
            "%s backend ready: %d worker(s), %s, %d global devices, mesh %s %s",
            BACKEND_NAME,
            n,
            f"{spec.pod_type} ({spec.topology})" if spec is not None else first["device_type"],
            first["global_device_count"],
            first["mesh_shape"],
            first["axis_names"],
        )

    @staticmethod
    def _cache_visibility(
        worker_group: Any, cfg: TPUTorchConfig, assignments: list[Any], labels: list[str]
    ) -> dict[int, list[int]]:
        """For the 'auto' cache policy: every host leaves a marker in the cache directory,
        then reports whose markers it sees (hosts sharing the directory see each other)."""
        from tpu_backend import compile_cache

        base = str(cfg.compilation_cache_dir)
        token = uuid.uuid4().hex
        n = len(assignments)
        _gather(
            [
                worker_group.execute_single_async(
                    i, compile_cache.mark_host, base, token, assignments[i].host_index
                )
                for i in range(n)
            ],
            cfg.bootstrap_timeout_s,
            labels,
            "compilation cache marker",
        )
        seen = _gather(
            [
                worker_group.execute_single_async(i, compile_cache.visible_hosts, base, token)
                for i in range(n)
            ],
            cfg.bootstrap_timeout_s,
            labels,
            "compilation cache visibility",
        )
        return {assignments[i].host_index: list(seen[i]) for i in range(n)}

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        n = len(worker_group)
        timeout_s = float(getattr(backend_config, "shutdown_timeout_s", 60.0))
        try:
            _gather(
                [worker_group.execute_single_async(i, shutdown_worker) for i in range(n)],
                timeout_s,
                [f"worker rank {i}" for i in range(n)],
                "worker shutdown",
            )
        except (TimeoutError, BootstrapError) as e:
            logger.warning("%s", e)


class _Layout:
    """A ScalingConfig look-alike built from what the hosts report."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _check_summaries(summaries: list[dict[str, Any]], labels: list[str]) -> None:
    keys = ("process_count", "global_device_count", "mesh_shape", "axis_names")
    first = {k: summaries[0][k] for k in keys}
    for s, label in zip(summaries[1:], labels[1:], strict=True):
        other = {k: s[k] for k in keys}
        if other != first:
            raise BootstrapError(
                f"{BACKEND_NAME} backend: {label} sees {other} but {labels[0]} sees {first}; "
                f"the hosts do not form one slice"
            )
