"""Worker-side bootstrap: the functions the backend runs on every Ray Train worker.

Order on each worker (one process per TPU host under SPMD):

1. :func:`probe_host` reports who this host is.  The host index is the TPU worker id,
   read deliberately from ``TPU_WORKER_ID`` (GKE, and Ray's fake TPU nodes) or the node
   label ``ray.io/tpu-worker-id``, falling back to Ray's metadata-server lookup on GCE.
   Ray's world rank is *not* used: Ray sorts TPU workers by pod name (``TPU_NAME``),
   which is the same for every host of a slice.
2. The driver picks host 0 as coordinator (``MASTER_ADDR``/``MASTER_PORT``, the gloo
   store, and torch_xla's process 0) and sends each worker a :class:`WorkerBootstrap`.
3. :func:`bootstrap_worker` sets the environment torch_xla 2.9 and libtpu read
   (``PJRT_DEVICE``; on multi-host slices without ``TPU_WORKER_HOSTNAMES`` the
   ``TPU_SKIP_MDS_QUERY`` set from :func:`tpu_backend.topology.tpu_host_env`, with Ray's node
   IPs in TPU-worker-id order; per-chip process bounds without SPMD), imports torch_xla,
   opens the persistent compilation cache, calls ``xr.use_spmd()``, creates the process
   group (gloo, rank = process index, under SPMD; ``xla`` over ``xla://`` without),
   checks the runtime agrees with the slice, and builds the mesh.
4. :func:`shutdown_worker` waits for device work, destroys the process group and clears
   the state.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from tpu_backend import compile_cache, context, ray_devices
from tpu_backend.mesh import (
    MeshPlan,
    build_hybrid_mesh,
    build_mesh,
    host_major_device_ids,
    local_device_ids,
    plan_mesh,
)
from tpu_backend.topology import (
    DEFAULT_MEGASCALE_PORT,
    SliceSpec,
    check_same_generation,
    megascale_env,
    parse_slice,
    tpu_host_env,
)

__all__ = [
    "HostProbe",
    "WorkerBootstrap",
    "BootstrapError",
    "probe_host",
    "assign_hosts",
    "bootstrap_worker",
    "shutdown_worker",
    "spec_from_probes",
    "TPU_PROCESS_BASE_PORT",
]

logger = logging.getLogger(__name__)

TPU_WORKER_ID_LABEL = "ray.io/tpu-worker-id"
TPU_SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
TPU_PROCESS_BASE_PORT = 8476
"""torch_xla's ``configure_topology`` default base port for per-chip TPU clients."""


class BootstrapError(RuntimeError):
    """A worker could not be set up for torch_xla; the message names host and cause."""


@dataclass(frozen=True)
class HostProbe:
    """What one worker reports about its host before any torch_xla import."""

    worker_id_env: str | None
    worker_id_label: str | None
    worker_id_metadata: str | None
    slice_name: str | None
    node_ip: str
    hostname: str
    tpu_ids: tuple[str, ...]
    env_accelerator_type: str | None
    env_topology: str | None
    pid: int

    def worker_id(self) -> int | None:
        """The TPU worker id, or None when the host does not say; conflicting sources raise."""
        values = {
            src: v
            for src, v in (
                ("TPU_WORKER_ID", self.worker_id_env),
                (TPU_WORKER_ID_LABEL, self.worker_id_label),
                ("GCE metadata", self.worker_id_metadata),
            )
            if v not in (None, "")
        }
        if not values:
            return None
        parsed = {}
        for src, v in values.items():
            try:
                parsed[src] = int(str(v))
            except ValueError:
                raise BootstrapError(
                    f"host {self.hostname} ({self.node_ip}): {src}={v!r} is not an integer "
                    f"TPU worker id"
                ) from None
        if len(set(parsed.values())) > 1:
            raise BootstrapError(
                f"host {self.hostname} ({self.node_ip}) reports conflicting TPU worker ids: "
                + ", ".join(f"{k}={v}" for k, v in parsed.items())
            )
        return next(iter(parsed.values()))


def probe_host(query_metadata: bool = False) -> HostProbe:
    """Runs on a worker: read the TPU identity of its host (no torch_xla import)."""
    import ray  # deferred: Ray is optional, and this runs on Ray workers only

    rc = ray.get_runtime_context()
    labels: dict[str, Any] = dict(rc.get_node_labels() or {})
    tpu_ids = tuple(str(i) for i in rc.get_accelerator_ids().get("TPU", []))
    worker_id_env = os.environ.get("TPU_WORKER_ID")
    label = labels.get(TPU_WORKER_ID_LABEL)
    worker_id_label = None if label is None else str(label)
    metadata_id = None
    if query_metadata and worker_id_env is None and worker_id_label is None:
        # GCE TPU VMs carry the worker id only in the metadata server; Ray knows how to ask.
        try:
            # Ray's private helper, needed only on GCE (imported only there).
            from ray._private.accelerators.tpu import TPUAcceleratorManager

            wid = TPUAcceleratorManager.get_current_node_tpu_worker_id()
            metadata_id = None if wid is None else str(wid)
        except Exception:  # noqa: BLE001 - no metadata server: the id stays unknown
            metadata_id = None
    return HostProbe(
        worker_id_env=worker_id_env,
        worker_id_label=worker_id_label,
        worker_id_metadata=metadata_id,
        slice_name=str(labels.get(TPU_SLICE_NAME_LABEL) or os.environ.get("TPU_NAME") or "")
        or None,
        node_ip=ray.util.get_node_ip_address(),
        hostname=socket.gethostname(),
        tpu_ids=tpu_ids,
        env_accelerator_type=os.environ.get("TPU_ACCELERATOR_TYPE") or None,
        env_topology=os.environ.get("TPU_TOPOLOGY") or None,
        pid=os.getpid(),
    )


def spec_from_probes(probes: list[HostProbe]) -> SliceSpec | None:
    """The slice the hosts themselves describe (``TPU_ACCELERATOR_TYPE`` + ``TPU_TOPOLOGY``)."""
    pairs = {(p.env_accelerator_type, p.env_topology) for p in probes}
    if len(pairs) != 1:
        return None
    accel_type, topology = next(iter(pairs))
    if not accel_type or not topology:
        return None
    return parse_slice(topology, accel_type.split("-")[0])


@dataclass(frozen=True)
class HostAssignment:
    host_index: int
    process_index: int
    process_count: int
    local_rank: int
    local_world_size: int
    slice_index: int = 0
    """Which slice of a multislice run the host belongs to (``host_index`` is per slice)."""

    @property
    def job_host(self) -> int:
        """The host's number in the whole run, unique across slices (where host indices
        repeat): under SPMD its process index (slice by slice; ``host_index`` on one slice),
        with one process per chip its host index."""
        return self.host_index if self.local_world_size > 1 else self.process_index


def assign_slices(
    probes: list[HostProbe], spec: SliceSpec, num_slices: int
) -> list[HostAssignment]:
    """Under SPMD across ``num_slices`` slices: slices by name (Ray's TPU slice-name label),
    in sorted order, and each slice's hosts by TPU worker id.  Process ``s * hosts + h`` is
    host ``h`` of slice ``s``, as PJRT numbers a multislice job's processes."""
    names: dict[str, list[int]] = {}
    for rank, probe in enumerate(probes):
        if not probe.slice_name:
            raise BootstrapError(
                f"worker rank {rank} on {probe.hostname} ({probe.node_ip}) has no TPU slice "
                f"name (node label {TPU_SLICE_NAME_LABEL} or TPU_NAME), so its slice among "
                f"the {num_slices} is unknown"
            )
        names.setdefault(probe.slice_name, []).append(rank)
    if len(names) != num_slices:
        raise BootstrapError(
            f"the workers run on {len(names)} TPU slice(s) ({', '.join(sorted(names))}) but the "
            f"backend was configured for num_slices={num_slices}; one SPMD worker per host of "
            f"each slice"
        )
    described = [
        parse_slice(p.env_topology, p.env_accelerator_type.split("-")[0])
        for p in probes
        if p.env_topology and p.env_accelerator_type
    ]
    check_same_generation([spec, *described])
    out: dict[int, HostAssignment] = {}
    for slice_index, name in enumerate(sorted(names)):
        ranks = names[name]
        # Within a slice, exactly the single-slice rule: worker ids 0..hosts-1 once each.
        for rank, a in zip(
            ranks, assign_hosts([probes[r] for r in ranks], spec, True), strict=True
        ):
            process = slice_index * spec.num_hosts + a.host_index
            out[rank] = HostAssignment(
                a.host_index, process, spec.num_hosts * num_slices, 0, 1, slice_index
            )
    return [out[rank] for rank in range(len(probes))]


def assign_hosts(
    probes: list[HostProbe], spec: SliceSpec | None, spmd: bool
) -> list[HostAssignment]:
    """Host index and process index of each worker (list index = Ray world rank).

    Under SPMD the process index is the host index.  Without SPMD a host runs one process
    per chip; the local rank is the position of the chip Ray assigned on that host, and
    the process index ``host * chips_per_host + local_rank`` (torch_xla's
    ``CLOUD_TPU_TASK_ID``).
    """
    n = len(probes)
    num_hosts = spec.num_hosts if spec is not None else (n if spmd else 1)
    ids: list[int] = []
    for rank, probe in enumerate(probes):
        wid = probe.worker_id()
        if wid is None:
            if num_hosts == 1:
                wid = 0
            else:
                raise BootstrapError(
                    f"worker rank {rank} on {probe.hostname} ({probe.node_ip}) has no TPU worker "
                    f"id (neither TPU_WORKER_ID nor the node label {TPU_WORKER_ID_LABEL} nor "
                    f"GCE metadata), so its host index in the {num_hosts}-host slice is unknown"
                )
        if not 0 <= wid < num_hosts:
            raise BootstrapError(
                f"worker rank {rank} on {probe.hostname} ({probe.node_ip}) reports TPU worker id "
                f"{wid}, outside 0..{num_hosts - 1} for a {num_hosts}-host slice; the topology "
                f"given to the backend does not match the cluster"
            )
        ids.append(wid)

    if spmd:
        if sorted(ids) != list(range(num_hosts)):
            raise BootstrapError(
                f"workers report TPU worker ids {ids} (by Ray rank), expected each of "
                f"0..{num_hosts - 1} exactly once: one SPMD worker per host of one slice"
            )
        return [HostAssignment(h, h, num_hosts, 0, 1) for h in ids]

    chips_per_host = spec.chips_per_host if spec is not None else n
    out = []
    seen: set[int] = set()
    for rank, (probe, host) in enumerate(zip(probes, ids, strict=True)):
        if len(probe.tpu_ids) == 1:
            local = int(probe.tpu_ids[0])
        elif not probe.tpu_ids and n == 1:
            local = 0
        else:
            raise BootstrapError(
                f"worker rank {rank} on {probe.hostname} holds TPU chips {list(probe.tpu_ids)}; "
                f"with spmd=False each worker must hold exactly one chip (resources_per_worker "
                f"{{'TPU': 1}})"
            )
        process = host * chips_per_host + local
        if process in seen:
            raise BootstrapError(f"two workers claim chip {local} of host {host}")
        seen.add(process)
        out.append(HostAssignment(host, process, n, local, chips_per_host))
    return out


@dataclass(frozen=True)
class WorkerBootstrap:
    """Everything one worker needs to set itself up, decided on the driver."""

    spmd: bool
    assignment: HostAssignment
    num_hosts: int
    master_addr: str
    master_port: int
    init_method: str
    backend: str
    timeout_s: float
    spec: SliceSpec | None
    hostnames: tuple[str, ...]
    slice_name: str | None
    mesh_plan: MeshPlan | None
    mesh_shape: tuple[int, ...] | None = None
    axis_names: tuple[str, ...] | None = None
    spmd_config: dict[str, Any] = field(default_factory=dict)
    partitioning_mode: str = "manual"
    pjrt_device: str | None = None
    holds_tpu: bool = False
    cache_dir: str | None = None
    cache_readonly: bool | str = "followers"
    """A :data:`tpu_backend.compile_cache.READONLY_POLICIES` value."""
    cache_visible: dict[int, list[int]] | None = None
    """For the 'auto' policy: which hosts' markers each host saw."""
    num_slices: int = 1
    """Slices joined over DCN; ``hostnames`` are this worker's slice's hosts."""


def _set_env(env: dict[str, str], *, override: bool) -> None:
    for key, value in env.items():
        if override:
            os.environ[key] = value
        else:
            os.environ.setdefault(key, value)


def _check_host_matches_slice(spec: SliceSpec, where: str) -> None:
    accel = os.environ.get("TPU_ACCELERATOR_TYPE")
    topo = os.environ.get("TPU_TOPOLOGY")
    if accel and accel != spec.pod_type:
        raise BootstrapError(
            f"{where}: this host is a {accel} (TPU_ACCELERATOR_TYPE) but the backend was "
            f"configured for {spec.pod_type} ({spec.topology}); fix topology/accelerator_type"
        )
    if topo and parse_slice(topo, spec.accelerator).topology != spec.topology:
        raise BootstrapError(
            f"{where}: this host's slice has topology {topo} (TPU_TOPOLOGY) but the backend "
            f"was configured for {spec.topology}; fix topology"
        )


def _tpu_env(b: WorkerBootstrap) -> dict[str, str]:
    """TPU environment for this worker, beyond what the platform already set."""
    spec = b.spec
    a = b.assignment
    env: dict[str, str] = {}
    if spec is None:
        return env
    if spec.is_multi_host and "TPU_WORKER_HOSTNAMES" not in os.environ:
        # GKE sets these; on GCE they live in the metadata server.  Ray knows every host's
        # address, so write them down and let torch_xla/libtpu skip the metadata query.
        env.update(tpu_host_env(spec, a.host_index, list(b.hostnames), slice_name=b.slice_name))
        env.pop("TPU_NAME", None)  # Ray's pod name for the host; never ours to rename
    if not b.spmd:
        # One process per chip, as torch_xla's _internal/tpu.py configure_topology sets up
        # for torchrun/xmp.spawn.  Ray marks a one-chip worker as a one-chip *slice*
        # (TPU_HOST_BOUNDS=1,1,1); these values put it back into the whole slice.
        process_bounds = [
            h * c for h, c in zip(spec.host_bounds, spec.chips_per_host_bounds, strict=True)
        ]
        bounds = ",".join(map(str, process_bounds)) + (",2" if spec.generation == 7 else "")
        ports = [TPU_PROCESS_BASE_PORT + i for i in range(a.local_world_size)]
        hosts = list(b.hostnames) if spec.is_multi_host else ["localhost"]
        env.update(
            {
                "TPU_PROCESS_BOUNDS": bounds,
                "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
                "TPU_HOST_BOUNDS": ",".join(map(str, spec.host_bounds)),
                "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, spec.chips_per_host_bounds)),
                "TPU_VISIBLE_CHIPS": str(a.local_rank),
                "TPU_PROCESS_PORT": str(ports[a.local_rank]),
                "TPU_PROCESS_ADDRESSES": ",".join(
                    ",".join(f"{h}:{p}" for p in ports) for h in hosts
                ),
                "CLOUD_TPU_TASK_ID": str(a.process_index),
            }
        )
    return env


def bootstrap_worker(b: WorkerBootstrap) -> dict[str, Any]:
    """Runs on a worker: set up torch_xla, the process group and the mesh.

    Returns a summary (host index, runtime's process index/count, device count, mesh) the
    driver checks across hosts.
    """
    a = b.assignment
    where = f"host {a.host_index} ({socket.gethostname()})"
    if b.spec is not None and b.holds_tpu:
        _check_host_matches_slice(b.spec, where)

    # -- environment torch_xla reads at import / client creation -----------------------
    os.environ["MASTER_ADDR"] = b.master_addr
    os.environ["MASTER_PORT"] = str(b.master_port)
    os.environ["RANK"] = str(a.process_index)
    os.environ["WORLD_SIZE"] = str(a.process_count)
    os.environ["LOCAL_RANK"] = str(a.local_rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(a.local_world_size)
    if b.pjrt_device is not None:
        os.environ["PJRT_DEVICE"] = b.pjrt_device
    elif b.holds_tpu:
        os.environ.setdefault("PJRT_DEVICE", "TPU")
    if os.environ.get("PJRT_DEVICE", "TPU") == "TPU" and b.holds_tpu:
        _set_env(_tpu_env(b), override=not b.spmd)
    if b.num_slices > 1:
        # As Ray Train sets them for its own multislice TPU runs (_setup_tpu_multislice): the
        # coordinator is the run's master address, the port MEGASCALE_PORT's or Ray's default.
        port = os.environ.get("MEGASCALE_PORT", DEFAULT_MEGASCALE_PORT)
        coordinator = megascale_env(b.num_slices, a.slice_index, b.master_addr, port)
        _set_env(coordinator, override=True)
    if not b.spmd:
        # torch_xla's xla:// handler runs pjrt.initialize_multiprocess (replication groups,
        # per-chip topology) only for "torchelastic-launched" processes.
        os.environ.setdefault("TORCHELASTIC_RUN_ID", f"ray-{b.master_addr}-{b.master_port}")

    try:
        # Imported on the worker, now that the environment torch_xla reads at import is set.
        import torch_xla  # noqa: F401 - the runtime must import before anything else here
        import torch_xla.runtime as xr
    except ImportError as e:
        raise BootstrapError(
            f"{where}: torch_xla is not importable on this worker ({e}); install it on every "
            f"host (pip install 'torch_xla[tpu]==2.9.0' on TPU VMs)"
        ) from e

    cache_path = None
    if b.cache_dir is not None:
        cache_path, _ = compile_cache.initialize_cache(
            b.cache_dir,
            spec=b.spec,
            host_index=a.job_host,
            readonly=b.cache_readonly,  # type: ignore[arg-type]
            visible=b.cache_visible,
        )

    timeout = timedelta(seconds=b.timeout_s)
    mesh = None
    plan = b.mesh_plan
    if b.spmd:
        if b.partitioning_mode == "auto":
            xr.use_spmd(auto=True)
        else:
            xr.use_spmd()
        url = "env://" if b.init_method == "env" else f"tcp://{b.master_addr}:{b.master_port}"
        if not dist.is_initialized():
            dist.init_process_group(
                backend=b.backend,
                init_method=url,
                rank=a.process_index,
                world_size=a.process_count,
                timeout=timeout,
            )
        _check_runtime(xr, b, where)
        n_global = xr.global_runtime_device_count()
        if plan is None:
            plan = plan_mesh(
                n_global,
                xr.process_count(),
                mesh_shape=b.mesh_shape,
                axis_names=b.axis_names,
                spmd_config=b.spmd_config,
            )
        ids = local_device_ids()
        if a.process_count > 1:
            gathered: list[Any] = [None] * a.process_count
            dist.all_gather_object(gathered, ids)
            device_ids = host_major_device_ids(gathered, n_global)
        else:
            device_ids = host_major_device_ids([ids], n_global)
        if b.num_slices > 1 and plan.source == "default" and b.spec is not None:
            mesh = build_hybrid_mesh(plan, b.spec, b.num_slices)
        else:
            mesh = build_mesh(plan, device_ids)
    else:
        # Deferred like torch_xla above; importing it registers 'xla' and xla://.
        import torch_xla.distributed.xla_backend  # noqa: F401

        if not dist.is_initialized():
            dist.init_process_group(backend="xla", init_method="xla://", timeout=timeout)
        _check_runtime(xr, b, where)

    state = context.XlaWorkerState(
        spmd=b.spmd,
        host_index=a.host_index,
        num_hosts=b.num_hosts,
        process_index=xr.process_index(),
        process_count=xr.process_count(),
        global_device_count=xr.global_runtime_device_count(),
        mesh=mesh,
        mesh_shape=plan.shape if (b.spmd and plan is not None) else None,
        axis_names=plan.axis_names if (b.spmd and plan is not None) else None,
        slice_topology=b.spec.topology if b.spec else None,
        slice_accelerator=b.spec.accelerator if b.spec else None,
        pod_type=b.spec.pod_type if b.spec else None,
        process_group_backend=dist.get_backend(),
        device_type=xr.device_type(),
        num_slices=b.num_slices,
        slice_index=a.slice_index,
    )
    context._set_state(state)
    ray_devices.install()
    return {
        "host_index": state.host_index,
        "slice_index": state.slice_index,
        "process_index": state.process_index,
        "process_count": state.process_count,
        "global_device_count": state.global_device_count,
        "mesh_shape": state.mesh_shape,
        "axis_names": state.axis_names,
        "device_type": state.device_type,
        "process_group_backend": state.process_group_backend,
        "compilation_cache": cache_path,
    }


def _check_runtime(xr: Any, b: WorkerBootstrap, where: str) -> None:
    """The runtime's view of the slice must match the driver's plan."""
    a = b.assignment
    got = (xr.process_index(), xr.process_count())
    want = (a.process_index, a.process_count)
    if b.spmd and got != want:
        raise BootstrapError(
            f"{where}: torch_xla reports process_index/process_count {got} but the backend "
            f"assigned {want} from the TPU worker id; the host's TPU environment and Ray's "
            f"node labels disagree"
        )
    if b.spec is not None and b.holds_tpu:
        n = xr.global_runtime_device_count()
        devices = b.spec.num_devices * b.num_slices
        if n != devices:
            of = f"{b.num_slices} x " if b.num_slices > 1 else ""
            raise BootstrapError(
                f"{where}: torch_xla sees {n} global devices but {of}{b.spec.pod_type} "
                f"({b.spec.topology}) has {devices}; the topology given to the "
                f"backend does not match the slice"
            )


def shutdown_worker() -> None:
    """Runs on a worker at the end of the run: flush device work, drop the process group."""
    state = context._state
    context._set_state(None)
    if state is not None:
        try:
            import torch_xla.core.xla_model as xm  # deferred: only where torch_xla is set up

            xm.wait_device_ops()
        except Exception:  # noqa: BLE001 - best effort; the group still has to go
            logger.debug("wait_device_ops failed during shutdown", exc_info=True)
        if state.spmd:
            try:
                import torch_xla.distributed.spmd as xs  # deferred: as above

                xs.set_global_mesh(None)
            except Exception:  # noqa: BLE001
                logger.debug("clearing the global mesh failed", exc_info=True)
    if dist.is_initialized():
        dist.destroy_process_group()
