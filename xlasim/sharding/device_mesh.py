"""Logical device meshes over a TPU slice's physical torus (``HybridMesh``'s layout).

``HybridMesh`` lays a logical mesh onto the chips' physical coordinates so that each logical
axis runs along whole torus axes where it can (more links, faster collectives), splitting
physical axes only when no whole-axis layout exists.  The resulting device order is what
torch_xla 2.9 produces (its layout follows JAX's ``mesh_utils``), including its preferences
between equally sized candidates; ``tests/test_spmd_logic.py`` pins it against torch_xla's
own expected meshes.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

DeviceAttributes = list[dict[str, Any]]
PhysicalMesh = Callable[[DeviceAttributes, Any], np.ndarray]


def physical_tpu_mesh(device_attributes: DeviceAttributes, devices: Any) -> np.ndarray:
    """``devices`` (indices into ``device_attributes``) placed at their chip coordinates."""
    coords = [device_attributes[d]["coords"] for d in devices]
    # The extent comes from the lexicographically last coordinate (not a per-axis max) and
    # unfilled cells stay uninitialised, both as in torch_xla; real slices are full boxes.
    extent = tuple(c + 1 for c in max(coords))
    grid = np.empty(extent, dtype=int)
    for (x, y, z, *_), device in zip(coords, devices, strict=False):
        grid[x, y, z] = device
    return grid


def create_device_mesh(
    device_attributes: DeviceAttributes,
    mesh_shape: Sequence[int],
    devices: Sequence[int],
    *,
    physical_mesh: PhysicalMesh = physical_tpu_mesh,
) -> np.ndarray:
    """``devices`` as a ``mesh_shape`` array laid out on their slice's torus."""
    if np.prod(mesh_shape) != len(devices):
        raise ValueError(
            f"Number of devices {len(devices)} must equal the product of mesh_shape {mesh_shape}"
        )
    torus = physical_mesh(device_attributes, devices)
    whole = _layout_on_whole_axes(torus, mesh_shape)
    return whole if whole is not None else _layout_splitting_axes(torus, mesh_shape)


def create_hybrid_device_mesh(
    device_attributes: DeviceAttributes,
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int],
    *,
    physical_mesh: PhysicalMesh = physical_tpu_mesh,
) -> np.ndarray:
    """One ``ici_mesh_shape`` mesh per slice, the slices tiled (by slice index) as dcn."""
    by_slice: dict[Any, list[int]] = {}
    for index, attrs in enumerate(device_attributes):
        by_slice.setdefault(attrs["slice_index"], []).append(index)
    slices = [by_slice[key] for key in sorted(by_slice)]
    if np.prod(dcn_mesh_shape) != len(slices):
        raise ValueError(
            f"Number of slices {len(slices)} must equal the product of "
            f"dcn_mesh_shape {dcn_mesh_shape}"
        )
    meshes = [
        create_device_mesh(device_attributes, ici_mesh_shape, members, physical_mesh=physical_mesh)
        for members in slices
    ]
    layout = np.arange(len(slices)).reshape(dcn_mesh_shape).tolist()
    return np.block(_map_nested(layout, meshes.__getitem__))


def _map_nested(nested: Any, fn: Callable[[int], Any]) -> Any:
    if isinstance(nested, list):
        return [_map_nested(item, fn) for item in nested]
    return fn(nested)


# -- layout on whole physical axes ----------------------------------------------------------


def _whole_axes_for(free: list[int], size: int) -> tuple[int, ...] | None:
    # Most physical axes first (more bandwidth), then the first combination in order.
    for count in (3, 2, 1):
        for axes in itertools.combinations(range(len(free)), count):
            if np.prod([free[a] for a in axes]) == size:
                return axes
    return None


def _layout_on_whole_axes(torus: np.ndarray, mesh_shape: Sequence[int]) -> np.ndarray | None:
    """Each logical axis on a set of whole physical axes, or None where one does not fit.

    Logical axes are ordered by increasing network intensity, so the last is placed first.
    """
    free = list(torus.shape)
    placed: list[tuple[int, ...]] = [() for _ in mesh_shape]
    for logical in reversed(range(len(mesh_shape))):
        axes = _whole_axes_for(free, mesh_shape[logical])
        if axes is None:
            if mesh_shape[logical] > 1:
                return None
            continue
        placed[logical] = axes
        for a in axes:
            free[a] = 0
    order = [a for axes in placed for a in axes]
    return torus.transpose(order).reshape(mesh_shape)


# -- layout splitting physical axes ----------------------------------------------------------


def _prime_factors(n: int) -> list[int]:
    """Trial division up to sqrt(n) + 1, as torch_xla does it.

    Where that leaves a prime cofactor, torch_xla keeps only the cofactor (14 -> [7]); the
    layout must match torch_xla's, so this does the same.
    """
    assert n > 0
    limit = math.isqrt(n) + 1
    found: list[int] = []
    rest, p = n, 2
    while rest > 1 and p <= limit:
        if rest % p:
            p += 1
        else:
            found.append(p)
            rest //= p
    return found if rest == 1 else [rest]


def _candidate_splits(available: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """Every per-physical-axis split of ``size`` that divides the axes' remaining sizes."""
    wanted = Counter(_prime_factors(size))
    # Physical axis a offers prime p as often as p divides its remaining size.
    offers: dict[int, list[int]] = {p: [] for p in wanted}
    for axis, remaining in enumerate(available):
        for p in _prime_factors(int(remaining)):
            if p in offers:
                offers[p].append(axis)
    per_prime = [(p, set(itertools.combinations(offers[p], count))) for p, count in wanted.items()]
    for choice in itertools.product(*(picks for _, picks in per_prime)):
        split = np.ones(len(available), dtype=np.int64)
        for (p, _), axes in zip(per_prime, choice, strict=True):
            for axis in axes:
                split[axis] *= p
        yield split


def _split_rank(
    split: np.ndarray, torus_shape: Sequence[int], used: np.ndarray
) -> tuple[Any, int, Any, tuple[int, ...]]:
    """Sort key: higher is better."""
    whole = [s for s, extent in zip(split, torus_shape, strict=True) if s == extent]
    return (
        # the most devices on whole physical axes, then the most whole axes,
        np.prod(whole),
        sum(1 for s in whole if s > 1),
        # then sharing axes already carrying more intensive logical axes, then by value
        np.prod([s for s, u in zip(split, used, strict=True) if u > 1]),
        tuple(int(s) for s in split),
    )


def _layout_splitting_axes(torus: np.ndarray, mesh_shape: Sequence[int]) -> np.ndarray:
    """Each logical axis on a product of (possibly partial) physical axes."""
    if np.prod(torus.shape) != np.prod(mesh_shape):
        raise ValueError(
            "The number of devices in physical mesh"
            f" {torus.shape} does not match the number of devices"
            f" in logical mesh {mesh_shape}."
        )
    logical_shape = tuple(mesh_shape)
    # sizes[p, l]: how much of physical axis p logical axis l spans.
    sizes = np.ones((torus.ndim, len(logical_shape)), dtype=np.int64)
    for logical in reversed(range(len(logical_shape))):
        used = np.prod(sizes, axis=-1)
        available = np.array(torus.shape) // used
        best = max(
            _candidate_splits(available, logical_shape[logical]),
            key=lambda split: _split_rank(split, torus.shape, used),
            default=None,
        )
        sizes[:, logical] = best  # type: ignore[assignment]  # None fails as in torch_xla
    # Split each physical axis into its per-logical-axis parts (row-major, so the more
    # intensive logical axes get the minor, better-connected part), then gather the parts
    # of each logical axis together.
    parts = torus.reshape(sizes.flatten())
    n_logical = len(logical_shape)
    order = [p * n_logical + lg for lg in range(n_logical) for p in range(torus.ndim)]
    return parts.transpose(order).reshape(logical_shape)
