"""The TPU slice model shared by ``tpu_backend`` and ``xlasim``.

A slice is named by a TPU generation (the *accelerator*) and a *topology*: the chip
grid, ``AxB`` for the 2-D generations (v2, v3, v5litepod/v5e, v6e) and ``AxBxC`` for
the 3-D ones (v4, v5p, v7x).  :func:`parse_slice` turns the pair into a
:class:`SliceSpec` holding everything derived from it: hosts, chips per host, XLA
devices per chip, the pod type (``v4-16``), HBM per chip, the device kind, and the
host / chips-per-host bounds a real TPU VM reports.

Default accelerator
    When only a topology is given the accelerator is :data:`DEFAULT_ACCELERATOR`,
    ``'v6e'``, so ``parse_slice('4x4')`` is a v6e-16: 4 hosts x 4 chips = 16 devices.
    A 3-D topology needs an explicit 3-D accelerator (``'v4'``, ``'v5p'``, ``'v7x'``).

Which topologies are accepted
    Any well-formed topology of the generation's dimensionality whose chips fill whole
    hosts, not only the shapes in Ray's ``VALID_TPU_TOPOLOGY`` table (every one of
    which is accepted, with the same chip, host and pod-type numbers Ray computes).
    Hosts hold 4 chips as a 2x2x1 block (so the first two dimensions must be even),
    except single-host v5litepod/v6e slices, which Ray and Google Cloud write as
    ``1x1``, ``2x2`` or ``2x4`` and which put all their (up to 8) chips on one host.
    Other v5litepod/v6e shapes of 8 chips or fewer (``4x2``, ``1x4``) are rejected:
    Ray's helpers disagree about how many hosts they have.  Sub-host slices of 4-chip
    generations (one v4 chip of a host) are not modelled.

Counting rules, and where they come from
    * chips per host: Ray 2.60 ``ray._private.accelerators.tpu.get_chips_per_host``.
    * pod type: Ray's ``infer_tpu_pod_type_from_topology``: generation + TensorCores,
      counting 2 cores per chip for every generation except v5litepod and v6e
      (so v4 2x2x2 = 8 chips = ``v4-16``; v6e 4x4 = ``v6e-16``).
    * XLA devices per chip: 2 for v2/v3 (torch_xla ``_internal/tpu.py``
      ``num_logical_cores_per_chip``), 1 for the megacore (v4, v5p) and single-core
      (v5e, v6e) chips, and 2 for v7x, whose two TensorCores are separate devices
      (Google Cloud "TPU7x" page, dual-chiplet architecture; Ray's
      ``get_tpu_resource_per_chip`` notes v7x exposes 2 logical devices per chip;
      torch_xla 2.9 appends a 4th process-bound dimension of 2 for v7).
    * host bounds: chips per host form a ``2,2,1`` block on multi-host slices; a real
      v4-256 (4x4x8) reports ``HOST_BOUNDS '2,2,8'`` and ``CHIPS_PER_HOST_BOUNDS
      '2,2,1'``, and torch_xla's ``_ACCELERATOR_TYPE_TO_HOST_BOUNDS`` table for v2/v3
      follows the same rule.

Nothing here imports torch, torch_xla or ray.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ACCELERATORS",
    "DEFAULT_ACCELERATOR",
    "DEFAULT_MEGASCALE_PORT",
    "DEFAULT_AXIS_NAMES",
    "GENERATIONS",
    "Generation",
    "SliceSpec",
    "default_mesh",
    "default_mesh_for",
    "STANDARD_TOPOLOGIES",
    "check_num_slices",
    "check_same_generation",
    "check_slice_index",
    "megascale_env",
    "nearest_topologies",
    "normalize_accelerator",
    "parse_slice",
    "tpu_host_env",
]

DEFAULT_ACCELERATOR = "v6e"

_GIB = 1 << 30


@dataclass(frozen=True)
class Generation:
    """Fixed facts about one TPU generation."""

    name: str
    """Canonical name, as Ray and Google Cloud accelerator types spell it ('v5litepod')."""
    version: int
    """The generation number torch_xla's ``tpu.version()`` parses from the pod type."""
    ndims: int
    """2 for AxB topologies, 3 for AxBxC."""
    cores_per_chip: int
    """TensorCores per chip as Ray counts them for pod types ('v4-16' = 8 chips)."""
    devices_per_chip: int
    """XLA (PJRT) devices per chip."""
    hbm_bytes_per_chip: int
    device_kind: str
    """What PJRT reports as the device kind (jax ``device.device_kind``)."""
    max_single_host_chips: int
    """Chips one host can hold for a single-host slice (v5litepod/v6e: 8)."""
    largest_topology: str
    """The whole pod as one slice: no larger slice of this generation exists."""


# Largest slices: a whole pod (Google Cloud architecture pages: v2 256 chips, v3 1024, v4 4096,
# v5e 256, v5p 8960, v6e 256, TPU7x 9216); every topology in Ray 2.60's VALID_TPU_TOPOLOGY fits.
# Anything bigger does not exist, and refusing it keeps every per-chip structure bounded.
# HBM per chip, from the Google Cloud TPU architecture pages: v2 16 GiB and v3 32 GiB
# (cloud.google.com/tpu/docs/v2, /v3), v4 32 GiB (/v4), v5e 16 GB (/v5e), v5p 95 GiB,
# v6e 32 GiB and TPU7x 192 GiB (/tpu7x, "HBM capacity per chip (GiB)" table).  Counted
# in GiB throughout, which also matches JAX's tpu_info (v5e 17.2e9 B, v4 34.4e9 B).
# Device kinds as JAX's jax/_src/tpu_info.py chip_version_from_device_kind spells the
# current ones ('TPU v5 lite', 'TPU v6 lite', 'TPU7x'); torch_xla 2.9's pallas kernels
# parse the same strings (quantized_matmul_kernel.get_tpu_version).
GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v2", 2, 2, 2, 2, 16 * _GIB, "TPU v2", 4, "16x16"),
        Generation("v3", 3, 2, 2, 2, 32 * _GIB, "TPU v3", 4, "32x32"),
        Generation("v4", 4, 3, 2, 1, 32 * _GIB, "TPU v4", 4, "16x16x16"),
        Generation("v5litepod", 5, 2, 1, 1, 16 * _GIB, "TPU v5 lite", 8, "16x16"),
        Generation("v5p", 5, 3, 2, 1, 95 * _GIB, "TPU v5", 4, "16x20x28"),
        Generation("v6e", 6, 2, 1, 1, 32 * _GIB, "TPU v6 lite", 8, "16x16"),
        Generation("v7x", 7, 3, 2, 2, 192 * _GIB, "TPU7x", 4, "16x24x24"),
    )
}

ACCELERATORS: tuple[str, ...] = tuple(GENERATIONS)

_ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod"}

# Ray's TPU_SINGLE_HOST_TOPOLOGIES: the shapes in which v5litepod/v6e put all chips
# on one host (get_chips_per_host returns the chip count for exactly these).
_SINGLE_HOST_SHAPES = ("1x1", "2x2", "2x4")

_HOST_BLOCK = (2, 2, 1)
_CHIPS_PER_HOST = 4

_MAX_DIM_DIGITS = 4  # the widest pod dimension is 28 chips
_TOPOLOGY_RE = re.compile(r"^\d+(?:x\d+){1,2}$", re.ASCII)
_TOPOLOGY_FORMS = (
    "expected 2 (AxB) or 3 (AxBxC) positive integers joined by 'x', e.g. '2x2' or '2x2x2'"
)


def _valid_accelerators_text() -> str:
    return ", ".join(
        f"{name} (alias v5e)" if name == "v5litepod" else name for name in ACCELERATORS
    )


def normalize_accelerator(accelerator: str) -> str:
    """Return the canonical generation name for ``accelerator``.

    Case-insensitive; accepts the canonical names, Ray's accelerator types
    ('TPU-V4', 'TPU-V5LITEPOD'), a 'tpu' prefix ('tpu7x', 'tpu-v6e') and 'v5e'.
    """
    if not isinstance(accelerator, str):
        raise TypeError(
            f"accelerator must be a str, got {type(accelerator).__name__} {accelerator!r}"
        )
    # Same prefix rewrite as Ray's normalize_tpu_accelerator_type ("TPU-V7X" -> "v7x").
    name = re.sub(r"^tpu-?v?", "v", accelerator.strip().lower())
    name = _ALIASES.get(name, name)
    if name in GENERATIONS:
        return name
    hint = ""
    if re.fullmatch(r"[a-z0-9]+-\d+", name):
        hint = " (that looks like a pod type; pass the generation and a topology instead)"
    raise ValueError(
        f"unknown accelerator {accelerator!r}{hint}; valid: {_valid_accelerators_text()}"
    )


def _format_dims(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def _parse_topology(topology: str) -> tuple[int, ...]:
    if not isinstance(topology, str):
        raise TypeError(f"topology must be a str, got {type(topology).__name__} {topology!r}")
    text = topology.strip().lower()
    if not _TOPOLOGY_RE.fullmatch(text):
        raise ValueError(f"topology {topology!r} is not valid: {_TOPOLOGY_FORMS}")
    parts = text.split("x")
    if any(len(part.lstrip("0")) > _MAX_DIM_DIGITS for part in parts):
        raise ValueError(
            f"topology {topology!r} is not valid: no TPU slice has a dimension of more than "
            f"{_MAX_DIM_DIGITS} digits; {_TOPOLOGY_FORMS}"
        )
    dims = tuple(int(part) for part in parts)
    if any(d == 0 for d in dims):
        raise ValueError(
            f"topology {topology!r} is not valid: every dimension must be positive; "
            f"{_TOPOLOGY_FORMS}"
        )
    return dims


def _example_shapes(gen: Generation) -> str:
    if gen.ndims == 2:
        examples = ("2x2", "4x4") if gen.max_single_host_chips == 4 else ("2x4", "4x4")
    else:
        examples = ("2x2x1", "2x2x2")
    return " or ".join(repr(e) for e in examples)


def _chips_per_host(gen: Generation, dims: tuple[int, ...], topology: str) -> int:
    num_chips = math.prod(dims)
    shape = _format_dims(dims)
    if gen.max_single_host_chips > _CHIPS_PER_HOST and num_chips <= gen.max_single_host_chips:
        if shape not in _SINGLE_HOST_SHAPES:
            raise ValueError(
                f"{gen.name} topology {topology!r} ({num_chips} chips) is not valid: "
                f"{gen.name} slices of up to {gen.max_single_host_chips} chips are "
                f"single-host and are written {', '.join(_SINGLE_HOST_SHAPES)}"
            )
        return num_chips
    if num_chips % _CHIPS_PER_HOST:
        raise ValueError(
            f"{gen.name} topology {topology!r} has {num_chips} chip(s), not a multiple of "
            f"the {_CHIPS_PER_HOST} chips per host; {gen.name} slices span whole hosts"
            f"{_suggestion(gen, num_chips)}"
        )
    if any(d % b for d, b in zip(dims, _HOST_BLOCK, strict=False)):
        raise ValueError(
            f"{gen.name} topology {topology!r} cannot be split into hosts of 2x2 chips: "
            f"its first two dimensions must be even{_suggestion(gen, num_chips)}"
        )
    return _CHIPS_PER_HOST


def _shapes(*dims_sets: Sequence[int]) -> set[tuple[int, ...]]:
    """Every shape whose i-th dimension is taken from ``dims_sets[i]``."""
    return set(itertools.product(*dims_sets))


_SMALL_3D: set[tuple[int, ...]] = {(2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4)}
_V5E_V6E: set[tuple[int, ...]] = {
    (1, 1),
    (2, 2),
    (2, 4),
    (2, 8),
    (4, 4),
    (4, 8),
    (8, 8),
    (8, 16),
    (16, 16),
}
_V2: set[tuple[int, ...]] = {(2, 2), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)}
_STANDARD_SHAPES: dict[str, set[tuple[int, ...]]] = {
    "v2": _V2,
    "v3": _V2 | {(16, 32), (32, 32)},
    "v4": _SMALL_3D | _shapes((4, 8, 12), (4, 8, 12), (4, 8, 12, 16)),
    "v5litepod": _V5E_V6E,
    "v5p": _SMALL_3D | _shapes((4, 8, 12, 16), (4, 8, 12, 16), (4, 8, 12, 16, 20, 24)),
    "v6e": _V5E_V6E,
    "v7x": _SMALL_3D | {(4, 4, 4), (4, 4, 8), (4, 8, 8), (8, 8, 8), (8, 8, 16), (8, 16, 16)},
}

STANDARD_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    gen: tuple(_format_dims(d) for d in sorted(shapes, key=lambda d: (math.prod(d), d)))
    for gen, shapes in _STANDARD_SHAPES.items()
}
"""The slice shapes Google Cloud offers per generation, smallest first: every shape Ray
2.60 validates (``VALID_TPU_TOPOLOGY``) plus the single-host ``2x2`` of v2/v3 (v2-8,
v3-8).  :func:`parse_slice` accepts more (any shape whose chips fill whole hosts); these are
what its error messages suggest."""


def nearest_topologies(accelerator: str, num_chips: int, limit: int = 3) -> list[str]:
    """Standard topologies of ``accelerator`` closest to ``num_chips`` chips: those with
    exactly that many if there are any, else the nearest smaller and larger ones."""
    gen = GENERATIONS[normalize_accelerator(accelerator)]
    by_chips: dict[int, list[str]] = {}
    for topology in STANDARD_TOPOLOGIES[gen.name]:
        by_chips.setdefault(math.prod(_parse_topology(topology)), []).append(topology)
    if num_chips in by_chips:
        return by_chips[num_chips][:limit]
    below = [n for n in by_chips if n < num_chips]
    above = [n for n in by_chips if n > num_chips]
    picks = [by_chips[max(below)][0]] if below else []
    picks += [by_chips[min(above)][0]] if above else []
    return picks[:limit]


def _suggestion(gen: Generation, num_chips: int) -> str:
    """'; nearest valid v4 topologies: '2x2x4' (16 chips, 4 hosts)' for an error message."""
    parts = []
    for topology in nearest_topologies(gen.name, num_chips):
        dims = _parse_topology(topology)
        chips = math.prod(dims)
        hosts = chips // _chips_per_host(gen, dims, topology)
        parts.append(f"{topology!r} ({chips} chips, {hosts} host{'s' if hosts > 1 else ''})")
    return f"; nearest valid {gen.name} topologies: {', '.join(parts)}" if parts else ""


@dataclass(frozen=True)
class SliceSpec:
    """One TPU slice.  Build it with :func:`parse_slice`, which keeps the fields consistent."""

    accelerator: str
    """Canonical generation name: 'v2', 'v3', 'v4', 'v5litepod', 'v5p', 'v6e', 'v7x'."""
    topology: str
    """Normalised chip grid, e.g. '2x2x2'."""
    dims: tuple[int, ...]
    num_chips: int
    num_hosts: int
    chips_per_host: int
    devices_per_chip: int
    devices_per_host: int
    num_devices: int
    pod_type: str
    """Ray's / Google Cloud's accelerator type with size, e.g. 'v4-16' (TensorCores)."""
    ray_accelerator_type: str
    """Ray's accelerator resource type, e.g. 'TPU-V4'."""
    hbm_bytes_per_chip: int
    device_kind: str
    host_bounds: tuple[int, int, int]
    """Hosts along x, y, z (TPU_HOST_BOUNDS)."""
    chips_per_host_bounds: tuple[int, int, int]
    """Chips of one host along x, y, z (TPU_CHIPS_PER_HOST_BOUNDS)."""
    generation: int
    """torch_xla's TPU version number (``torch_xla._internal.tpu.version()``)."""
    cores_per_chip: int
    """TensorCores per chip as counted in :attr:`pod_type`."""

    def __post_init__(self) -> None:
        # Cheap guard against hand-built specs whose numbers disagree.
        checks = {
            "num_chips == prod(dims)": self.num_chips == math.prod(self.dims),
            "num_hosts * chips_per_host == num_chips": (
                self.num_hosts * self.chips_per_host == self.num_chips
            ),
            "devices_per_host == chips_per_host * devices_per_chip": (
                self.devices_per_host == self.chips_per_host * self.devices_per_chip
            ),
            "num_devices == num_hosts * devices_per_host": (
                self.num_devices == self.num_hosts * self.devices_per_host
            ),
            "prod(host_bounds) == num_hosts": math.prod(self.host_bounds) == self.num_hosts,
            "prod(chips_per_host_bounds) == chips_per_host": (
                math.prod(self.chips_per_host_bounds) == self.chips_per_host
            ),
        }
        broken = [name for name, ok in checks.items() if not ok]
        if broken:
            raise ValueError(f"inconsistent SliceSpec {self!r}: {', '.join(broken)} fails")

    @property
    def is_multi_host(self) -> bool:
        return self.num_hosts > 1

    @property
    def hbm_bytes_per_host(self) -> int:
        return self.hbm_bytes_per_chip * self.chips_per_host

    def describe_rows(self) -> list[tuple[str, str]]:
        """(label, value) rows describing the slice, for a two-column table."""
        mesh_shape, mesh_axes = default_mesh(self)
        mesh = ", ".join(f"{axis}={size}" for axis, size in zip(mesh_axes, mesh_shape, strict=True))
        return [
            ("accelerator", self.accelerator),
            ("topology", self.topology),
            ("pod type", self.pod_type),
            ("Ray accelerator type", self.ray_accelerator_type),
            ("device kind", self.device_kind),
            ("hosts", str(self.num_hosts)),
            ("chips per host", str(self.chips_per_host)),
            ("devices per chip", str(self.devices_per_chip)),
            ("devices per host", str(self.devices_per_host)),
            ("chips", str(self.num_chips)),
            ("devices", str(self.num_devices)),
            ("HBM per chip", f"{self.hbm_bytes_per_chip / _GIB:g} GiB"),
            ("HBM per device", f"{self.hbm_bytes_per_chip / self.devices_per_chip / _GIB:g} GiB"),
            ("host bounds", ",".join(map(str, self.host_bounds))),
            ("chips per host bounds", ",".join(map(str, self.chips_per_host_bounds))),
            ("default mesh", f"({mesh})"),
        ]


def parse_slice(topology: str, accelerator: str | None = None) -> SliceSpec:
    """Parse and validate ``topology`` (e.g. '2x2x2') for ``accelerator`` (e.g. 'v4').

    ``accelerator`` defaults to :data:`DEFAULT_ACCELERATOR` ('v6e').  Raises
    ``ValueError`` naming the bad value and the valid forms.
    """
    dims = _parse_topology(topology)
    if accelerator is None:
        gen = GENERATIONS[DEFAULT_ACCELERATOR]
        if len(dims) != gen.ndims:
            raise ValueError(
                f"topology {topology!r} is 3-D (AxBxC) but no accelerator was given and the "
                f"default accelerator {DEFAULT_ACCELERATOR} takes 2-D topologies (AxB); "
                f"pass a 3-D accelerator: "
                f"{', '.join(g.name for g in GENERATIONS.values() if g.ndims == 3)}"
            )
    else:
        gen = GENERATIONS[normalize_accelerator(accelerator)]
    if len(dims) != gen.ndims:
        form = "2-D (AxB)" if gen.ndims == 2 else "3-D (AxBxC)"
        raise ValueError(
            f"topology {topology!r} has {len(dims)} dimensions but {gen.name} slices are "
            f"{form}, e.g. {_example_shapes(gen)}"
        )
    num_chips = math.prod(dims)
    largest = math.prod(_parse_topology(gen.largest_topology))
    if num_chips > largest:
        raise ValueError(
            f"{gen.name} topology {topology!r} has {num_chips} chips, more than the largest "
            f"{gen.name} slice ({largest} chips, {gen.largest_topology}, a whole pod); use a "
            f"slice of at most {largest} chips, e.g. {_example_shapes(gen)}"
        )
    chips_per_host = _chips_per_host(gen, dims, topology)
    num_hosts = num_chips // chips_per_host
    dims3 = (*dims, 1) if len(dims) == 2 else dims
    chips_per_host_bounds = dims3 if num_hosts == 1 else _HOST_BLOCK
    host_bounds = tuple(d // c for d, c in zip(dims3, chips_per_host_bounds, strict=True))
    return SliceSpec(
        accelerator=gen.name,
        topology=_format_dims(dims),
        dims=dims,
        num_chips=num_chips,
        num_hosts=num_hosts,
        chips_per_host=chips_per_host,
        devices_per_chip=gen.devices_per_chip,
        devices_per_host=chips_per_host * gen.devices_per_chip,
        num_devices=num_chips * gen.devices_per_chip,
        pod_type=f"{gen.name}-{num_chips * gen.cores_per_chip}",
        ray_accelerator_type=f"TPU-{gen.name.upper()}",
        hbm_bytes_per_chip=gen.hbm_bytes_per_chip,
        device_kind=gen.device_kind,
        host_bounds=(host_bounds[0], host_bounds[1], host_bounds[2]),
        chips_per_host_bounds=(
            chips_per_host_bounds[0],
            chips_per_host_bounds[1],
            chips_per_host_bounds[2],
        ),
        generation=gen.version,
        cores_per_chip=gen.cores_per_chip,
    )


DEFAULT_AXIS_NAMES = ("data", "model")


def default_mesh_for(num_devices: int, num_hosts: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The default SPMD mesh for ``num_devices`` devices on ``num_hosts`` hosts (processes):
    (hosts, devices per host) over ('data', 'model') on several hosts, else (devices,) over
    ('data',)."""
    if num_hosts > 1:
        if num_devices % num_hosts:
            raise ValueError(f"{num_devices} devices cannot be split evenly over {num_hosts} hosts")
        return (num_hosts, num_devices // num_hosts), DEFAULT_AXIS_NAMES
    return (num_devices,), DEFAULT_AXIS_NAMES[:1]


def default_mesh(spec: SliceSpec) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The default SPMD mesh of ``spec`` (see :func:`default_mesh_for`)."""
    return default_mesh_for(spec.num_devices, spec.num_hosts)


def tpu_host_env(
    spec: SliceSpec,
    host_index: int,
    hostnames: Sequence[str] | None = None,
    *,
    slice_name: str | None = None,
) -> dict[str, str]:
    """The TPU environment host ``host_index`` of ``spec`` has on a GKE TPU VM.

    With ``TPU_SKIP_MDS_QUERY`` set, torch_xla 2.9 (``_internal/tpu.py``
    ``build_tpu_env_from_vars`` / ``get_worker_ips``) reads TPU_ACCELERATOR_TYPE,
    TPU_HOST_BOUNDS, TPU_CHIPS_PER_HOST_BOUNDS, TPU_WORKER_ID and TPU_WORKER_HOSTNAMES
    instead of querying the metadata server; Ray 2.60 reads TPU_ACCELERATOR_TYPE,
    TPU_WORKER_ID, TPU_TOPOLOGY and TPU_NAME (set only when ``slice_name`` is given).

    ``hostnames`` lists every host of the slice, in worker-id order; by default each
    is 'localhost', since simulated hosts share one machine.
    """
    if isinstance(host_index, bool) or not isinstance(host_index, int):
        raise TypeError(
            f"host_index must be an int, got {type(host_index).__name__} {host_index!r}"
        )
    if not 0 <= host_index < spec.num_hosts:
        raise ValueError(
            f"host_index {host_index} is out of range for {spec.pod_type} ({spec.topology}), "
            f"which has {spec.num_hosts} host(s): valid host indices are 0..{spec.num_hosts - 1}"
        )
    if hostnames is None:
        names = ["localhost"] * spec.num_hosts
    else:
        if isinstance(hostnames, str):
            raise TypeError(
                f"hostnames must be a sequence of str, one per host, not the str {hostnames!r}"
            )
        names = list(hostnames)
        if len(names) != spec.num_hosts:
            raise ValueError(
                f"hostnames {names!r} has {len(names)} entries but {spec.pod_type} "
                f"({spec.topology}) has {spec.num_hosts} host(s): give one name per host"
            )
        bad = [n for n in names if not isinstance(n, str) or not n or "," in n or n != n.strip()]
        if bad:
            raise ValueError(
                f"hostnames {bad!r} are not valid: each must be a non-empty str without "
                f"commas or surrounding spaces"
            )
    env = {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": spec.pod_type,
        "TPU_TOPOLOGY": spec.topology,
        "TPU_WORKER_ID": str(host_index),
        "TPU_WORKER_HOSTNAMES": ",".join(names),
        "TPU_HOST_BOUNDS": ",".join(map(str, spec.host_bounds)),
        "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, spec.chips_per_host_bounds)),
    }
    if slice_name is not None:
        if not isinstance(slice_name, str) or not slice_name.strip():
            raise ValueError(f"slice_name {slice_name!r} is not valid: expected a non-empty str")
        env["TPU_NAME"] = slice_name
    return env


# -- several slices joined over the data-center network (multislice) ------------------------

DEFAULT_MEGASCALE_PORT = "8081"
"""The port of the multislice coordinator when none is chosen (Ray 2.60's
``ray._private.accelerators.tpu.DEFAULT_MEGASCALE_PORT``)."""


def check_num_slices(num_slices: object) -> int:
    """``num_slices`` when it is a whole number >= 1; else an error naming it."""
    if isinstance(num_slices, bool) or not isinstance(num_slices, int):
        raise TypeError(
            f"num_slices must be an int (1 for one slice, 2 or more for slices joined over "
            f"DCN), got {type(num_slices).__name__} {num_slices!r}"
        )
    if num_slices < 1:
        raise ValueError(
            f"num_slices {num_slices} is not valid: expected a whole number >= 1 (1 for one "
            f"slice, 2 or more for slices joined over DCN)"
        )
    return num_slices


def check_slice_index(slice_index: object, num_slices: int) -> int:
    """``slice_index`` when it names one of ``num_slices`` slices; else an error naming it."""
    if isinstance(slice_index, bool) or not isinstance(slice_index, int):
        raise TypeError(
            f"slice_index must be an int, got {type(slice_index).__name__} {slice_index!r}"
        )
    if not 0 <= slice_index < num_slices:
        raise ValueError(
            f"slice_index {slice_index} is out of range for {num_slices} slice(s): valid slice "
            f"indices are 0..{num_slices - 1}"
        )
    return slice_index


def check_same_generation(specs: Sequence[SliceSpec]) -> SliceSpec:
    """The one slice shape every slice of a multislice job has (they must all be alike)."""
    kinds = sorted({f"{s.accelerator} {s.topology}" for s in specs})
    if len({s.accelerator for s in specs}) > 1:
        raise ValueError(
            f"the slices mix TPU generations ({', '.join(kinds)}); slices joined over DCN must "
            f"all be of one generation and topology"
        )
    if len(kinds) > 1:
        raise ValueError(
            f"the slices have different topologies ({', '.join(kinds)}); slices joined over DCN "
            f"must all be of one generation and topology"
        )
    return specs[0]


def megascale_env(
    num_slices: int,
    slice_index: int,
    coordinator_host: str = "localhost",
    port: str = DEFAULT_MEGASCALE_PORT,
) -> dict[str, str]:
    """The multislice variables every host of slice ``slice_index`` gets (empty for one slice).

    As Ray 2.60 sets them (``ray.util.tpu.get_tpu_coordinator_env_vars``, used by Ray Train's
    multislice setup): the coordinator is host 0 of slice 0, written 'host:port'.
    """
    check_num_slices(num_slices)
    check_slice_index(slice_index, num_slices)
    if num_slices == 1:
        return {}
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_host}:{port}",
        "MEGASCALE_PORT": str(port),
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_SLICE_ID": str(slice_index),
    }
