"""``as_strided`` on ``xla`` tensors, as real torch_xla 2.9 computes it (read on PJRT CPU).

An XLA tensor has no storage: torch_xla reads the sizes, strides and offset against the
row-major elements of a reference tensor, which is the tensor a chain of slices started from
(kept on each slice, through a sync and a ``detach()``, not through a ``clone()``), or else
the tensor itself. A transposed tensor is read in its logical order, where eager CPU reads
the storage it shares with its base.
"""

from __future__ import annotations

import pytest
import torch


def _grid():
    return torch.arange(1.0, 13.0).reshape(3, 4)


def _read(reference: torch.Tensor, size, stride, offset=0) -> torch.Tensor:
    """The expected values: ``reference``'s row-major elements viewed as asked."""
    return reference.flatten().clone().as_strided(size, stride, offset)


def test_views_are_read_in_their_logical_order(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a = torch.arange(1.0, 10.0).reshape(3, 3)
    # The case as measured on torch_xla 2.9; eager CPU gives [[2, 4], [3, 5]] here.
    assert a.to(dev).t().as_strided((2, 2), (1, 2), 1).cpu().tolist() == [[4, 2], [7, 5]]
    g = _grid()
    x = g.to(dev)
    cases = {
        "t()": (x.t(), g.t()),
        "permute": (x.unsqueeze(0).permute(2, 0, 1), g.unsqueeze(0).permute(2, 0, 1)),
        "expand": (x[0].expand(3, 4), g[0].expand(3, 4)),
        "select": (x[1].unsqueeze(0).expand(2, 4), g[1].unsqueeze(0).expand(2, 4)),
        "chunk": (x.chunk(2, dim=1)[1], g.chunk(2, dim=1)[1]),  # a split, not a slice
        "slice then t()": (x[1:].t()[1:], g[1:].t()),  # the slice's root is the t()
        "clone of a slice": (x[1:].clone(), g[1:]),
    }
    for name, (view, reference) in cases.items():
        for size, stride, offset in [((2, 2), (1, 3), 1), ((2, 3), (3, 1), 0), ((3,), (2,), 0)]:
            got = view.as_strided(size, stride, offset).cpu()
            assert torch.equal(got, _read(reference, size, stride, offset)), (name, size, stride)


def test_slices_are_read_against_the_tensor_they_were_taken_from(xla_target):
    import torch_xla

    dev = torch_xla.device()
    g = _grid()
    x = g.to(dev)
    size, stride = (2, 2), (1, 3)
    for name, view in {
        "a[1:]": x[1:],
        "a[:, 1:]": x[:, 1:],
        "a[1:][:, 1:]": x[1:][:, 1:],
        "a[::2]": x[::2],
        "narrow": x.narrow(1, 1, 2),
        "a[1:].detach()": x[1:].detach(),
    }.items():
        assert torch.equal(view.as_strided(size, stride, 1).cpu(), _read(g, size, stride, 1)), name
    # No offset given: an xla tensor's storage offset, 0 (eager CPU: the slice's own).
    assert torch.equal(x[1:].as_strided(size, stride).cpu(), _read(g, size, stride))
    kept = x[1:]
    torch_xla.sync()  # the root outlives a sync
    assert torch.equal(kept.as_strided(size, stride, 1).cpu(), _read(g, size, stride, 1))


def test_strides_a_slice_can_take_are_taken_as_a_slice(xla_target):
    """Strides that are the row-major ones but for one dimension's multiple are taken as a
    slice with that multiple (rounded down) as its step: one below the row-major stride
    gives a step of 0, so no elements along that dimension (measured on torch_xla 2.9)."""
    import torch_xla

    dev = torch_xla.device()
    x = torch.arange(1.0, 13.0).reshape(4, 3).to(dev)
    assert x.as_strided((2, 3), (6, 1), 0).cpu().tolist() == [[1, 2, 3], [7, 8, 9]]
    assert x.as_strided((2, 3), (5, 1), 0).cpu().tolist() == [[1, 2, 3], [4, 5, 6]]
    assert x.as_strided((3, 3), (1, 1), 0).shape == (0, 3)


def test_strides_past_the_elements_are_refused(xla_target):
    import torch_xla

    dev = torch_xla.device()
    x = _grid().to(dev)
    # Gathered elements: torch_xla checks the extent the strides span (not the offset).
    with pytest.raises(
        RuntimeError,
        match=r"as_strided: storage not big enough for size \[2, 2\]: 20 \(needed\) vs 4 "
        r"\(actual\)",
    ):
        x[1].as_strided((2, 2), (1, 3), 0)
    # Consecutive elements: torch_xla fails to lower the graph (at .cpu()); the simulator
    # refuses at the op.
    with pytest.raises(RuntimeError, match=r"storage_offset \+ slice_size <= input_element_count"):
        x.t().as_strided((4, 4), (4, 1), 0).cpu()
