"""``as_strided`` as torch_xla 2.9 computes it: over row-major values, not a storage.

An XLA tensor has no storage to index. torch_xla reads ``as_strided``'s sizes, strides and
offset against the row-major elements of a reference tensor: the tensor a chain of
``slice`` views (and ``as_strided`` results) started from, which torch_xla keeps on each of
them, or else the tensor itself; a transposed tensor is read in its logical order, not in
the order of the CPU values it was computed from. Measured on torch_xla 2.9 (CPU):
``torch.arange(1., 10.).reshape(3, 3).t().as_strided((2, 2), (1, 2), 1)`` is
``[[4, 2], [7, 5]]`` there (eager CPU: ``[[2, 4], [3, 5]]``).

Three ways of computing it, picked from the arguments as torch_xla picks them:

- a slice of one dimension, when the strides are the reference's row-major strides but for
  one dimension whose stride is a multiple (rounded down) of its row-major one, and the size
  is the reference's but smaller there (offset 0). A stride that is not a whole multiple
  takes the rounded-down step, and one below the row-major stride a step of 0, which gives
  no elements along that dimension (measured: ``(4, 3)`` viewed ``(3, 3), (1, 1)`` is empty);
- a reshape of consecutive elements when the strides are non-overlapping and dense: the
  graph fails to lower when they run past the reference's elements;
- a gather of each element otherwise, after a check that the strides' extent fits in the
  reference's element count (torch_xla's check, which leaves the offset out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from xlasim.sharding.messages import torch_xla_error


def compute(
    value: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int
) -> torch.Tensor:
    """``value.as_strided(size, stride, offset)`` as torch_xla reads it (``value`` being the
    reference tensor's values). A view of ``value``'s CPU storage where they are laid out
    row-major; a copy otherwise."""
    size, stride = tuple(size), tuple(stride)
    if len(size) != len(stride):
        raise RuntimeError(
            f"Check failed: size.size() == stride.size(): mismatch in length of size "
            f"({len(size)}) and stride({len(stride)})"
        )
    if any(s < 0 for s in stride):
        value.as_strided(size, stride)  # PyTorch's own refusal of negative strides
    shape = tuple(value.shape)
    if offset == 0:
        sliced = _one_dim_slice(value, shape, size, stride)
        if sliced is not None:
            return sliced
    flat = value.reshape(-1)  # the row-major elements (a view when they are laid out so)
    start = flat.storage_offset()
    count = flat.numel()
    if non_overlapping_and_dense(size, stride):
        needed = offset + math.prod(size)
        if needed > count:
            raise torch_xla_error(
                RuntimeError,
                f"Check failed: storage_offset + slice_size <= input_element_count "
                f"({needed} vs. {count})",
                "torch_xla raises this when the graph holding the as_strided is lowered "
                "(at the next sync or .cpu()); the simulator raises it at the op",
            )
        return flat.as_strided(size, stride, start + offset)
    extent = 0 if 0 in size else 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    itemsize = value.element_size()
    if count * itemsize < extent * itemsize:
        raise RuntimeError(
            f"Check failed: tensor.numel() * itemsize >= storage_size: as_strided: storage "
            f"not big enough for size {list(size)}: {extent * itemsize} (needed) vs {count} "
            f"(actual)."
        )
    if extent and offset + extent > count:
        raise NotImplementedError(
            f"xlasim: as_strided{size, stride, offset} reads past the {count} elements of "
            f"its input: torch_xla gathers them with indices out of range there, which the "
            f"simulator does not reproduce"
        )
    return flat.as_strided(size, stride, start + offset)


def non_overlapping_and_dense(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether ``size``/``stride`` cover consecutive elements once each (dimensions of
    fewer than two elements impose nothing)."""
    expected = 1
    spanning = [(n, s) for n, s in zip(size, stride, strict=True) if n > 1]
    for n, s in sorted(spanning, key=_by_stride):
        if s != expected:
            return False
        expected *= n
    return True


def _by_stride(dim: tuple[int, int]) -> int:
    return dim[1]


def _row_major(shape: tuple[int, ...]) -> list[int]:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return strides


def _one_dim_slice(
    value: torch.Tensor, shape: tuple[int, ...], size: tuple[int, ...], stride: tuple[int, ...]
) -> torch.Tensor | None:
    """The slice torch_xla takes instead of a general ``as_strided`` where the arguments
    allow it, or None where they do not."""
    row = _row_major(shape)
    if len(stride) == len(shape):
        off_row = [d for d in range(len(shape)) if stride[d] != row[d]]
        smaller = [d for d in range(len(shape)) if size[d] != shape[d]]
        if len(off_row) > 1 or len(smaller) != 1:
            return None
        dim = smaller[0]
        if size[dim] > shape[dim]:
            return None
        step = 1
        if off_row:
            if off_row[0] != dim or row[dim] == 0:
                return None
            step = stride[dim] // row[dim]
            if size[dim] * step > shape[dim]:
                return None
        if step == 0:
            return value.narrow(dim, 0, 0)
        picked = (slice(None),) * dim + (slice(None, None, step),)
        return value.narrow(dim, 0, size[dim] * step)[picked]
    if len(stride) + 1 == len(shape):
        return _drop_one_dim(value, shape, row, size, stride)
    return None


def _drop_one_dim(
    value: torch.Tensor,
    shape: tuple[int, ...],
    row: list[int],
    size: tuple[int, ...],
    stride: tuple[int, ...],
) -> torch.Tensor | None:
    """One dimension fewer than the input: torch_xla takes index 0 of the dimension the
    strides leave out (the last one when they leave out none)."""
    skipped = -1
    j = len(stride) - 1
    for d in range(len(shape) - 1, -1, -1):
        if j < 0:
            break
        if stride[j] != row[d]:
            if skipped != -1:
                return None
            skipped = d
            continue  # the same stride is read against the next dimension
        j -= 1
    kept = [n for d, n in enumerate(shape) if d != (skipped % len(shape))]
    if skipped == -1:
        if list(size) != list(shape[: len(size)]):
            return None
    elif any(size[d] != shape[d] for d in range(min(skipped, len(size)))) or any(
        size[d] != shape[d + 1] for d in range(skipped + 1, len(size))
    ):
        return None
    if list(size) != kept:
        raise NotImplementedError(
            f"xlasim: as_strided{size, stride} on a tensor of shape {list(shape)}: torch_xla "
            f"takes index 0 of dimension {skipped} there, giving a tensor of shape {kept}, "
            f"not the size asked for, which the simulator does not reproduce"
        )
    return value.select(skipped, 0)
