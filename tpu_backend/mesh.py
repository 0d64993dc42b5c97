"""The SPMD device mesh the backend builds on every worker at bootstrap.

Planning (:func:`plan_mesh`) is pure arithmetic, so the driver can reject a mesh that does
not cover the slice before any worker starts.  Building (:func:`build_mesh`) runs on the
worker after ``xr.use_spmd()`` and imports torch_xla there, never at module import.

Default rule (:func:`tpu_backend.topology.default_mesh_for`): on a multi-host slice
``(hosts, devices_per_host)`` over ``('data', 'model')``; on one host ``(devices,)`` over
``('data',)``.  The device ids are laid out host-major: row ``h`` of a multi-host mesh holds
the devices process ``h`` can address, so the ``model`` axis stays inside a host and each
host's slice of the ``data`` axis is the part of the global batch it loads.  torch_xla
numbers TPU devices by chip coordinates, which on a v6e 4x4 gives host 0 the ids 0, 1, 4, 5,
so ``np.arange`` alone would not keep rows on hosts; the builder gathers each process's
addressable ids instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpu_backend.topology import DEFAULT_AXIS_NAMES, SliceSpec, default_mesh_for

__all__ = [
    "SPMD_CONFIG_KEYS",
    "PARTITIONING_MODES",
    "MeshPlan",
    "plan_mesh",
    "normalize_spmd_config",
    "build_mesh",
    "build_hybrid_mesh",
    "as_shape",
    "as_axis_names",
]

SPMD_CONFIG_KEYS = ("mesh_shape", "data_parallel_size", "model_parallel_size", "partitioning_mode")
# 'manual': the user's mark_sharding annotations decide (xr.use_spmd()).
# 'auto': XLA's auto-sharding pass decides (xr.use_spmd(auto=True), TPU only in torch_xla 2.9).
PARTITIONING_MODES = ("manual", "auto")


@dataclass(frozen=True)
class MeshPlan:
    """Shape and axis names of the mesh, and which setting they came from."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    source: str
    """'default', 'mesh_shape' or 'xla_spmd_config'."""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape, strict=True))
        return f"Mesh({axes})"


def as_shape(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(
            f"{what} {value!r} is not valid: expected a tuple of positive ints, e.g. (2, 4)"
        )
    dims = tuple(value)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(
            f"{what} {value!r} is not valid: expected a non-empty tuple of positive ints, "
            f"e.g. (2, 4)"
        )
    return dims


def as_axis_names(value: Any, what: str = "axis_names") -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(
            f"{what} {value!r} is not valid: expected a tuple of str, e.g. ('data', 'model')"
        )
    names = tuple(value)
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise ValueError(
            f"{what} {value!r} is not valid: expected a non-empty tuple of non-empty str, "
            f"e.g. ('data', 'model')"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{what} {value!r} is not valid: axis names must be unique")
    return names


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} {value!r} is not valid: expected a positive int")
    return value


def normalize_spmd_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check an ``xla_spmd_config`` dict on its own (no slice needed).

    Returns a copy with ``mesh_shape`` as a tuple.  Unknown keys, bad values and a
    ``mesh_shape`` that contradicts ``data_parallel_size``/``model_parallel_size`` raise
    ``ValueError``.
    """
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ValueError(
            f"xla_spmd_config {config!r} is not valid: expected a dict with keys "
            f"{', '.join(SPMD_CONFIG_KEYS)}"
        )
    unknown = sorted(set(config) - set(SPMD_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"xla_spmd_config has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(SPMD_CONFIG_KEYS)}"
        )
    out: dict[str, Any] = {}
    if config.get("mesh_shape") is not None:
        out["mesh_shape"] = as_shape(config["mesh_shape"], "xla_spmd_config['mesh_shape']")
    for key in ("data_parallel_size", "model_parallel_size"):
        if config.get(key) is not None:
            out[key] = _positive_int(config[key], f"xla_spmd_config[{key!r}]")
    mode = config.get("partitioning_mode")
    if mode is not None:
        if mode not in PARTITIONING_MODES:
            raise ValueError(
                f"xla_spmd_config['partitioning_mode'] {mode!r} is not valid; valid: "
                f"{', '.join(map(repr, PARTITIONING_MODES))}"
            )
        out["partitioning_mode"] = mode
    if "mesh_shape" in out and ("data_parallel_size" in out or "model_parallel_size" in out):
        shape = out["mesh_shape"]
        dp = out.get("data_parallel_size")
        mp = out.get("model_parallel_size")
        if (
            len(shape) != 2
            or (dp is not None and shape[0] != dp)
            or (mp is not None and shape[1] != mp)
        ):
            raise ValueError(
                f"xla_spmd_config mesh_shape {shape} contradicts data_parallel_size={dp} / "
                f"model_parallel_size={mp}: with both given the mesh must be "
                f"(data_parallel_size, model_parallel_size)"
            )
    return out


def _describe_slice(slice_name: str | None) -> str:
    return f"the slice {slice_name} has" if slice_name else "there are"


def _factor_examples(n: int) -> str:
    pairs = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    shown = [f"({n},)"] + [f"({a}, {b})" for a, b in pairs[1:-1][:3]]
    return ", ".join(shown)


def plan_mesh(
    num_devices: int,
    num_hosts: int,
    *,
    mesh_shape: Sequence[int] | None = None,
    axis_names: Sequence[str] | None = None,
    spmd_config: Mapping[str, Any] | None = None,
    slice_name: str | None = None,
) -> MeshPlan:
    """Decide the mesh for ``num_devices`` devices over ``num_hosts`` hosts.

    Precedence: ``mesh_shape`` (the backend's override) > ``xla_spmd_config``'s
    ``mesh_shape`` / ``data_parallel_size`` / ``model_parallel_size`` > the default rule.
    Giving both an override and a different ``xla_spmd_config`` mesh is an error, as is
    any mesh whose size is not ``num_devices``.  ``slice_name`` only words the errors.
    """
    spmd = normalize_spmd_config(spmd_config)
    where = _describe_slice(slice_name)
    override = as_shape(mesh_shape, "mesh_shape") if mesh_shape is not None else None

    from_config: tuple[int, ...] | None = None
    if "mesh_shape" in spmd:
        from_config = spmd["mesh_shape"]
    elif "data_parallel_size" in spmd or "model_parallel_size" in spmd:
        dp = spmd.get("data_parallel_size")
        mp = spmd.get("model_parallel_size")
        if dp is None or mp is None:
            given, other = (
                ("data_parallel_size", dp) if dp is not None else ("model_parallel_size", mp)
            )
            assert other is not None
            if num_devices % other:
                raise ValueError(
                    f"xla_spmd_config {given}={other} does not divide the {num_devices} "
                    f"devices ({where} {num_devices}); valid sizes divide {num_devices}"
                )
            dp = dp if dp is not None else num_devices // other
            mp = mp if mp is not None else num_devices // other
        from_config = (dp, mp)

    if override is not None and from_config is not None and override != from_config:
        raise ValueError(
            f"mesh_shape {override} contradicts xla_spmd_config's mesh {from_config}; "
            f"give the mesh in one place"
        )

    if override is not None or from_config is not None:
        shape = override if override is not None else from_config
        assert shape is not None
        source = "mesh_shape" if override is not None else "xla_spmd_config"
        if math.prod(shape) != num_devices:
            raise ValueError(
                f"{source} {shape} covers {math.prod(shape)} devices but {where} "
                f"{num_devices} devices; the mesh must cover every device, e.g. "
                f"{_factor_examples(num_devices)}"
            )
        if axis_names is not None:
            names = as_axis_names(axis_names)
        elif len(shape) <= len(DEFAULT_AXIS_NAMES):
            names = DEFAULT_AXIS_NAMES[: len(shape)]
        else:
            raise ValueError(
                f"mesh_shape {shape} has {len(shape)} dimensions; name them with "
                f"axis_names (a tuple of {len(shape)} unique str)"
            )
        if len(names) != len(shape):
            raise ValueError(
                f"axis_names {names} has {len(names)} names but the mesh {shape} has "
                f"{len(shape)} dimensions; give one name per dimension"
            )
        return MeshPlan(shape, names, source)

    shape, default_names = default_mesh_for(num_devices, num_hosts)
    if axis_names is not None:
        names = as_axis_names(axis_names)
        if len(names) != len(shape):
            raise ValueError(
                f"axis_names {names} has {len(names)} names but the default mesh {shape} "
                f"has {len(shape)} dimensions; give one name per dimension or set mesh_shape"
            )
        return MeshPlan(shape, names, "default")
    return MeshPlan(shape, default_names, "default")


def host_major_device_ids(ids_per_process: Sequence[Sequence[int]], num_devices: int) -> list[int]:
    """Concatenate each process's addressable device ids in process order.

    Falls back to ``range(num_devices)`` when the gathered ids are not a permutation of the
    global ids (a runtime that does not name devices by global id).
    """
    flat = [int(i) for ids in ids_per_process for i in sorted(ids)]
    if sorted(flat) == list(range(num_devices)):
        return flat
    return list(range(num_devices))


def local_device_ids() -> list[int]:
    """Global ids of the devices this process addresses, from the runtime's device names
    ('TPU:4' -> 4); empty when the runtime does not say."""
    import torch_xla  # deferred (here and below): runs on a worker whose torch_xla is set up

    try:
        names = torch_xla._XLAC._xla_get_runtime_devices()
    except (AttributeError, NotImplementedError, RuntimeError):
        return []
    ids = []
    for name in names:
        _, _, idx = str(name).rpartition(":")
        if not idx.isdigit():
            return []
        ids.append(int(idx))
    return ids


def build_mesh(plan: MeshPlan, device_ids: Sequence[int] | None = None) -> Any:
    """Create the ``torch_xla.distributed.spmd.Mesh`` for ``plan`` and make it global."""
    # Deferred: runs on a worker whose torch_xla is set up.
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xr.global_runtime_device_count()
    if n != plan.size:
        raise RuntimeError(
            f"the runtime reports {n} global devices but the planned mesh "
            f"{plan.describe()} covers {plan.size}; the topology given to the backend does "
            f"not match the slice this worker runs on"
        )
    ids = np.array(list(device_ids) if device_ids is not None else range(n))
    mesh = xs.Mesh(ids, plan.shape, plan.axis_names)
    xs.set_global_mesh(mesh)
    return mesh


def build_hybrid_mesh(plan: MeshPlan, spec: SliceSpec, num_slices: int) -> Any:
    """The default mesh of a multislice run as torch_xla's ``HybridMesh``, made global.

    ``plan`` is the default ``(slices x hosts, devices_per_host)``: within a slice the
    ``(hosts, devices_per_host)`` block is laid out on the chips' torus (ICI), and the slices
    are stacked along ``data`` over DCN, so only data parallelism crosses slices.
    """
    import torch_xla.distributed.spmd as xs  # deferred: runs on a worker, as build_mesh

    expected = (spec.num_hosts * num_slices, spec.devices_per_host)
    if plan.shape != expected:
        raise ValueError(
            f"the default multislice mesh is {expected}, not {plan.shape}; give mesh_shape "
            f"to choose another"
        )
    mesh = xs.HybridMesh(
        ici_mesh_shape=(spec.num_hosts, spec.devices_per_host),
        dcn_mesh_shape=(num_slices, 1),
        axis_names=plan.axis_names,
    )
    xs.set_global_mesh(mesh)
    return mesh
