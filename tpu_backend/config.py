"""``TPUTorchConfig``, the Ray Train ``TorchConfig`` of torch_xla, and its backend hooks.

Ray 2.60 maps ``ScalingConfig(use_tpu=True)`` to ``backend="tpu_dist"`` (Google's
torch_tpu runtime).  This config brings its own backend class (:class:`TPUXLABackend`,
below; its steps are :mod:`tpu_backend.driver`) and always names its torch.distributed
backend explicitly, so Ray's ``TorchTrainer`` never rewrites it:

* SPMD (the default): one process per TPU host drives all of the host's chips;
  torch_xla refuses its ``xla`` process group under SPMD, so the backend creates a CPU
  ``gloo`` group (rank = TPU worker id = ``xr.process_index()``) for host-side collectives.
* ``spmd=False``: one process per chip with the ``xla`` group over ``xla://``.

Everything that can be checked without workers is checked in ``__post_init__`` (the
config alone) and :meth:`TPUTorchConfig.resolve` (the config against the slice and the
``ScalingConfig``), so inconsistent settings fail before any worker starts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.train.backend import Backend, BackendConfig
from ray.train.torch.config import TorchConfig

from tpu_backend import driver
from tpu_backend.bootstrap import WorkerBootstrap, assign_hosts, assign_slices, spec_from_probes
from tpu_backend.compile_cache import check_cache_base
from tpu_backend.driver import BACKEND_NAME
from tpu_backend.mesh import MeshPlan, as_axis_names, as_shape, normalize_spmd_config, plan_mesh
from tpu_backend.topology import SliceSpec, check_num_slices, normalize_accelerator, parse_slice

__all__ = [
    "BACKEND_NAME",
    "SPMD_PROCESS_GROUP_BACKENDS",
    "ResolvedSlice",
    "TPUTorchConfig",
    "TPUXLABackend",
]

logger = logging.getLogger(__name__)

SPMD_PROCESS_GROUP_BACKENDS = ("gloo",)
SPMD_INIT_METHODS = ("env", "tcp")
MULTIPROCESS_INIT_METHODS = ("xla",)


# What gloo says when one of its collectives waited out the process group's timeout.
_GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (send|recv) operation")


@contextlib.contextmanager
def _collective_timeouts_named(timeout_s: int) -> Iterator[None]:
    """Around the training function: gloo's timeout message gives the bound in ms only; this
    names the setting it comes from (a host that hangs keeps the others waiting that long)."""
    try:
        yield
    except RuntimeError as exc:
        if exc.args and isinstance(exc.args[0], str) and _GLOO_TIMEOUT.search(exc.args[0]):
            # In the message itself (same exception, same type), not in a note: this is
            # gloo's own error, not a text the product mirrors, and code that logs only
            # str(exc) still sees which setting bounds the wait.
            exc.args = (
                f"{exc.args[0]}\ntpu_backend: a collective of the run's process group waited "
                f"TPUTorchConfig(timeout_s={timeout_s}) seconds for a host that did not join "
                f"it (one that hangs or is stuck elsewhere); that is the bound to change",
                *exc.args[1:],
            )
        raise


def _for_mode(name: str, value: str | None, valid: tuple[str, ...], mode: str, hint: str) -> str:
    """``value``, or the mode's default (the first valid one) when None; else ValueError."""
    if value is None:
        return valid[0]
    if value not in valid:
        raise ValueError(f"{name} {value!r} is not valid with {mode}; valid: {hint}")
    return value


@dataclass(frozen=True)
class ResolvedSlice:
    """The slice a run targets and the plan derived from it, decided on the driver."""

    spec: SliceSpec | None
    """None when no topology is known (a single worker; the mesh then follows the runtime)."""
    mesh: MeshPlan | None
    """None in non-SPMD mode, or when ``spec`` is None (planned on the worker)."""
    num_workers: int


@dataclass
class TPUTorchConfig(TorchConfig):
    """Configuration for torch_xla training on TPU slices with Ray Train.

    Args:
        backend: torch.distributed backend of the process group the backend creates.
            Resolved to ``'gloo'`` under SPMD and ``'xla'`` otherwise; any other value
            (``'nccl'``, ``'tpu_dist'``, ``'xla'`` under SPMD) is rejected.
        init_method: ``'env'`` or ``'tcp'`` for the SPMD gloo group; ``'xla'`` (torch_xla's
            ``xla://`` rendezvous) for the non-SPMD ``xla`` group.  Default per mode.
        timeout_s: Process group operation timeout.
        spmd: Run torch_xla SPMD (``xr.use_spmd()``), one worker per host.  Default True.
        topology, accelerator: The slice (``'2x2x2'``, ``'v4'``).  Default: taken from the
            ``ScalingConfig`` (``topology``, ``accelerator_type``).  When both give one
            they must agree.
        num_slices: Slices of that topology joined over DCN (a multislice run, SPMD only):
            one worker per host of every slice (``num_workers`` = hosts x slices), each
            given the ``MEGASCALE_*`` variables Ray gives its own multislice TPU workers.
            The default mesh is then data parallel across slices (a ``HybridMesh``).
        mesh_shape, axis_names: Override the default mesh.
        xla_spmd_config: A dict of ``mesh_shape``, ``data_parallel_size``,
            ``model_parallel_size``, ``partitioning_mode`` (``'manual'`` or ``'auto'``).
        compilation_cache_dir: Initialize torch_xla's persistent compilation cache under
            this directory on every worker (``xr.initialize_cache``, before any
            computation), in a subdirectory keyed by slice and torch_xla version.
        compilation_cache_readonly: Who writes the cache
            (:mod:`tpu_backend.compile_cache`): ``'followers'`` (host 0 writes, the others
            read; right for a shared directory), ``'auto'`` (one writer per directory the
            hosts share, found with marker files), True (nobody writes), False (all write).
        pjrt_device: Force ``PJRT_DEVICE`` on the workers.  Default: leave the worker's
            value; set ``'TPU'`` when the worker holds TPU chips and none is set.
        bootstrap_timeout_s: Bound on worker bootstrap (host discovery, runtime start,
            process group, mesh); exceeding it fails the run instead of hanging.
        shutdown_timeout_s: Bound on worker cleanup.
    """

    backend: str | None = None
    init_method: str | None = None  # type: ignore[assignment]
    timeout_s: int = 1800
    spmd: bool = True
    topology: str | None = None
    accelerator: str | None = None
    num_slices: int = 1
    mesh_shape: Sequence[int] | None = None
    axis_names: Sequence[str] | None = None
    xla_spmd_config: Mapping[str, Any] | None = None
    compilation_cache_dir: str | None = None
    compilation_cache_readonly: bool | str = "followers"
    pjrt_device: str | None = None
    bootstrap_timeout_s: float = 600.0
    shutdown_timeout_s: float = 60.0
    _spmd_config: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.spmd, bool):
            raise ValueError(f"spmd {self.spmd!r} is not valid: expected True or False")
        check_num_slices(self.num_slices)
        if self.num_slices > 1 and not self.spmd:
            raise ValueError(
                f"num_slices={self.num_slices} needs spmd=True: across slices the backend runs "
                f"one SPMD worker per host (spmd=False runs one process per chip of one slice)"
            )
        self._spmd_config = normalize_spmd_config(self.xla_spmd_config)
        mode = self._spmd_config.get("partitioning_mode")
        if self.spmd:
            hint = (
                " (torch_xla raises 'XLA backend is not supported with SPMD. Please use a "
                "CPU process group instead.')"
                if self.backend == "xla"
                else ""
            )
            self.backend = _for_mode(
                "backend",
                self.backend,
                SPMD_PROCESS_GROUP_BACKENDS,
                f"spmd=True{hint}",
                "'gloo' (a CPU process group next to SPMD), or set spmd=False for 'xla'",
            )
            self.init_method = _for_mode(
                "init_method",
                self.init_method,
                SPMD_INIT_METHODS,
                "spmd=True",
                ", ".join(map(repr, SPMD_INIT_METHODS)),
            )
        else:
            self.backend = _for_mode(
                "backend",
                self.backend,
                ("xla",),
                "spmd=False",
                "'xla' (torch_xla's process group, one process per chip)",
            )
            self.init_method = _for_mode(
                "init_method",
                self.init_method,
                MULTIPROCESS_INIT_METHODS,
                "spmd=False",
                "'xla' (torch_xla's xla:// rendezvous)",
            )
            given = [
                name
                for name, value in (
                    ("mesh_shape", self.mesh_shape),
                    ("axis_names", self.axis_names),
                    ("xla_spmd_config", self.xla_spmd_config or None),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} need(s) SPMD but spmd=False; set spmd=True or drop "
                    f"{', '.join(given)}"
                )
        if mode == "auto" and (self.mesh_shape is not None or "mesh_shape" in self._spmd_config):
            raise ValueError(
                "xla_spmd_config partitioning_mode 'auto' lets XLA choose the sharding; a "
                "mesh_shape cannot be combined with it (drop one)"
            )
        if self.mesh_shape is not None:
            self.mesh_shape = as_shape(self.mesh_shape, "mesh_shape")
        if self.axis_names is not None:
            self.axis_names = as_axis_names(self.axis_names)
        for name in ("timeout_s", "bootstrap_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            # inf or nan would be a bound that never trips: a hang instead of an error.
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or (isinstance(value, float) and not math.isfinite(value))
                or value <= 0
            ):
                raise ValueError(
                    f"{name} {value!r} is not valid: expected a finite number of seconds > 0"
                )
        if self.compilation_cache_readonly not in (True, False, "followers", "auto") or (
            self.compilation_cache_readonly in (0, 1)
            and not isinstance(self.compilation_cache_readonly, bool)
        ):
            raise ValueError(
                f"compilation_cache_readonly {self.compilation_cache_readonly!r} is not "
                f"valid; valid: True, False, 'followers', 'auto'"
            )
        if self.compilation_cache_dir is not None:
            check_cache_base(self.compilation_cache_dir, "compilation_cache_dir")
        if self.pjrt_device is not None and self.pjrt_device not in ("TPU", "CPU"):
            raise ValueError(
                f"pjrt_device {self.pjrt_device!r} is not valid; valid: 'TPU', 'CPU' or None "
                f"(keep the worker's PJRT_DEVICE)"
            )
        if self.accelerator is not None:
            self.accelerator = normalize_accelerator(self.accelerator)
        if self.topology is not None:
            # Parse now so a malformed topology fails on the driver.
            parse_slice(self.topology, self.accelerator)
        # Mesh arguments that are wrong whatever the slice (names vs dimensions, override vs
        # xla_spmd_config): check them against a slice of exactly the mesh's size.
        shape = self.mesh_shape or self._spmd_config.get("mesh_shape")
        dp = self._spmd_config.get("data_parallel_size")
        mp = self._spmd_config.get("model_parallel_size")
        if shape is None and dp is not None and mp is not None:
            shape = (dp, mp)
        if self.spmd and shape is not None:
            plan_mesh(
                math.prod(shape),
                1,
                mesh_shape=self.mesh_shape,
                axis_names=self.axis_names,
                spmd_config=self._spmd_config,
            )

    @property
    def backend_cls(self) -> type[TPUXLABackend]:
        return TPUXLABackend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[None]]:
        return functools.partial(_collective_timeouts_named, self.timeout_s)

    @property
    def partitioning_mode(self) -> str:
        return str(self._spmd_config.get("partitioning_mode", "manual"))

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(
            spmd=self.spmd,
            topology=self.topology,
            accelerator=self.accelerator,
            num_slices=self.num_slices,
            mesh_shape=self.mesh_shape,
            axis_names=self.axis_names,
            xla_spmd_config=dict(self._spmd_config) or None,
            compilation_cache_dir=self.compilation_cache_dir,
            compilation_cache_readonly=self.compilation_cache_readonly,
            pjrt_device=self.pjrt_device,
            bootstrap_timeout_s=self.bootstrap_timeout_s,
            shutdown_timeout_s=self.shutdown_timeout_s,
        )
        return out

    # -- checks against the slice and the ScalingConfig ------------------------------------

    def slice_spec(self, scaling_config: Any = None) -> SliceSpec | None:
        """The slice from this config and/or ``scaling_config``; they must agree."""
        topology = self.topology
        accelerator = self.accelerator
        sc_topology = getattr(scaling_config, "topology", None)
        sc_accel = getattr(scaling_config, "accelerator_type", None)
        if (
            sc_topology is not None
            and topology is not None
            and (
                parse_slice(sc_topology, accelerator or sc_accel).topology
                != parse_slice(topology, accelerator or sc_accel).topology
            )
        ):
            raise ValueError(
                f"TPUTorchConfig topology {topology!r} contradicts ScalingConfig topology "
                f"{sc_topology!r}; give the same slice in both or only one"
            )
        topology = topology or sc_topology
        if sc_accel is not None and accelerator is not None:
            try:
                sc_gen = normalize_accelerator(sc_accel)
            except ValueError as e:
                raise ValueError(f"ScalingConfig accelerator_type {sc_accel!r}: {e}") from None
            if sc_gen != accelerator:
                raise ValueError(
                    f"TPUTorchConfig accelerator {accelerator!r} contradicts ScalingConfig "
                    f"accelerator_type {sc_accel!r} ({sc_gen}); give the same generation"
                )
        accelerator = accelerator or sc_accel
        if topology is None:
            return None
        return parse_slice(topology, accelerator)

    def resolve(self, scaling_config: Any = None) -> ResolvedSlice:
        """Check this config against the slice and the worker layout; return the plan.

        Raises ``ValueError`` for every inconsistent combination, before workers start.
        """
        spec = self.slice_spec(scaling_config)
        num_workers = getattr(scaling_config, "num_workers", 1) if scaling_config else 1
        if isinstance(num_workers, tuple):
            lo, hi = num_workers
            if lo != hi:
                raise ValueError(
                    f"num_workers {num_workers} is elastic, but a TPU slice runs a fixed "
                    f"number of workers; give an int"
                )
            num_workers = lo
        use_tpu = bool(getattr(scaling_config, "use_tpu", False))
        tpus_per_worker = None
        if scaling_config is not None:
            resources = getattr(scaling_config, "resources_per_worker", None) or {}
            tpus_per_worker = resources.get("TPU")
            if use_tpu and tpus_per_worker is None:
                tpus_per_worker = 1  # Ray's default for use_tpu without a topology
        if spec is None:
            if num_workers > 1:
                raise ValueError(
                    f"num_workers={num_workers} needs a slice: set ScalingConfig(topology=..., "
                    f"accelerator_type=...) or TPUTorchConfig(topology=..., accelerator=...)"
                )
            return ResolvedSlice(None, None, num_workers)

        slices = self.num_slices
        slice_name = f"{spec.pod_type} ({spec.topology})"
        if slices > 1:
            slice_name = f"{slices} x {slice_name}"
        if self.spmd:
            hosts = spec.num_hosts * slices
            if num_workers != hosts:
                extra = ""
                if num_workers % hosts == 0 and num_workers > hosts:
                    extra = (
                        f" ({num_workers // spec.num_hosts} slices' worth: set "
                        f"TPUTorchConfig(num_slices={num_workers // spec.num_hosts}) for a "
                        f"multislice run)"
                    )
                raise ValueError(
                    f"num_workers={num_workers} does not match {slice_name}, which has "
                    f"{hosts} host(s){extra}; SPMD runs one worker per host: set "
                    f"num_workers={hosts}"
                )
            if use_tpu and tpus_per_worker != spec.chips_per_host:
                raise ValueError(
                    f"resources_per_worker TPU={tpus_per_worker} does not match {slice_name}, "
                    f"whose hosts have {spec.chips_per_host} chips; under SPMD each worker "
                    f"holds all chips of its host: use TPU={spec.chips_per_host} (the default)"
                )
            mesh: MeshPlan | None = plan_mesh(
                spec.num_devices * slices,
                hosts,
                mesh_shape=self.mesh_shape,
                axis_names=self.axis_names,
                spmd_config=self._spmd_config,
                slice_name=slice_name,
            )
        else:
            if num_workers != spec.num_chips:
                raise ValueError(
                    f"num_workers={num_workers} does not match {slice_name}, which has "
                    f"{spec.num_chips} chips; with spmd=False torch_xla runs one process per "
                    f"chip: set num_workers={spec.num_chips} and resources_per_worker "
                    f"{{'TPU': 1}}"
                )
            if use_tpu and tpus_per_worker != 1:
                raise ValueError(
                    f"resources_per_worker TPU={tpus_per_worker} is not valid with spmd=False; "
                    f"torch_xla binds one process per chip: use {{'TPU': 1}}"
                )
            mesh = None
        return ResolvedSlice(spec, mesh, num_workers)


class TPUXLABackend(Backend):
    """Sets up torch_xla (SPMD by default) on every worker of a TPU slice.

    ``on_start`` (driver side) probes every worker's host, decides host indices and the
    coordinator, then bootstraps all workers; ``on_shutdown`` cleans them up.  Both waits
    are bounded (``bootstrap_timeout_s``, ``shutdown_timeout_s``).
    """

    share_cuda_visible_devices: bool = False

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        if not isinstance(backend_config, TPUTorchConfig):
            raise TypeError(
                f"TPUXLABackend needs a TPUTorchConfig, got {type(backend_config).__name__}"
            )
        cfg = backend_config
        n = len(worker_group)
        resolved = cfg.resolve(driver.scaling_config_of(worker_group))
        spec = resolved.spec
        multi_host = (spec.is_multi_host or cfg.num_slices > 1) if spec is not None else n > 1
        probes = driver.probe_hosts(worker_group, multi_host, cfg.bootstrap_timeout_s)
        if spec is None:
            # Plain TorchTrainer without a topology: the hosts may still say what they are.
            spec = spec_from_probes(probes)
            if spec is not None:
                resolved = cfg.resolve(driver.layout_from_probes(spec, probes))
        if cfg.num_slices > 1 and spec is not None:
            assignments = assign_slices(probes, spec, cfg.num_slices)
        else:
            assignments = assign_hosts(probes, spec, cfg.spmd)
        labels = [
            f"{f'slice {a.slice_index} ' if cfg.num_slices > 1 else ''}host {a.host_index} "
            f"(worker rank {i}, {probes[i].node_ip})"
            for i, a in enumerate(assignments)
        ]
        master_addr, master_port = driver.coordinator_address(worker_group, assignments)
        # Each slice's hosts, in worker-id order (TPU_WORKER_HOSTNAMES is per slice).
        by_host = {
            (a.slice_index, a.host_index): probes[i].node_ip for i, a in enumerate(assignments)
        }
        hostnames = {
            s: tuple(by_host[k] for k in sorted(by_host) if k[0] == s)
            for s in {k[0] for k in by_host}
        }
        slice_names = {a.slice_index: probes[i].slice_name for i, a in enumerate(assignments)}
        visible = None
        if cfg.compilation_cache_dir is not None and cfg.compilation_cache_readonly == "auto":
            visible = driver.cache_visibility(
                worker_group,
                cfg.compilation_cache_dir,
                assignments,
                labels,
                cfg.bootstrap_timeout_s,
            )
        plans = [
            WorkerBootstrap(
                spmd=cfg.spmd,
                assignment=a,
                num_hosts=spec.num_hosts if spec is not None else len(by_host),
                num_slices=cfg.num_slices,
                master_addr=master_addr,
                master_port=master_port,
                init_method=str(cfg.init_method),
                backend=str(cfg.backend),
                timeout_s=float(cfg.timeout_s),
                spec=spec,
                hostnames=hostnames[a.slice_index],
                slice_name=slice_names[a.slice_index]
                or next((p.slice_name for p in probes if p.slice_name), None),
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
            for i, a in enumerate(assignments)
        ]
        summaries = driver.bootstrap_workers(worker_group, plans, labels, cfg.bootstrap_timeout_s)
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

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        timeout_s = float(getattr(backend_config, "shutdown_timeout_s", 60.0))
        driver.shutdown_workers(worker_group, timeout_s)
