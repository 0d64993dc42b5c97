"""How the simulator keeps torch_xla's row-major metadata over CPU values laid out otherwise.

A device tensor reports row-major strides, so PyTorch views ``x.t().contiguous()`` (which is
``x.t()``) to a new shape; the simulator's CPU values of ``x.t()`` cannot take such a view and
hold a copy. Real torch_xla keeps the two one value (a write into either shows in the other,
read on PJRT CPU): the simulator refuses what would tell the copy apart, and nothing else.
"""

from __future__ import annotations

import pytest
import torch


def _grid(dev):
    return torch.arange(12.0, device=dev).view(3, 4)


def test_a_copied_view_computes_and_backpropagates_as_a_view(xlasim_sim):
    import torch_xla

    dev = torch_xla.device()
    w = torch.randn(3, 4, device=dev, requires_grad=True)
    flat = w.t().contiguous().view(12)
    assert flat.stride() == (1,)
    (flat * torch.arange(12.0, device=dev)).sum().backward()
    expected = torch.arange(12.0).view(4, 3).t()
    assert torch.equal(w.grad.cpu(), expected)
    # A view of the copy and a clone of it read the same values.
    assert torch.equal(flat.view(2, 6)[1].cpu(), w.detach().cpu().t().reshape(2, 6)[1])
    assert torch.equal(flat.clone().cpu(), w.detach().cpu().t().reshape(12))


def test_writing_into_a_copied_view_is_refused(xlasim_sim):
    import torch_xla

    dev = torch_xla.device()
    base = _grid(dev)
    flat = base.t().contiguous().view(12)
    with pytest.raises(NotImplementedError, match=r"in-place aten\.add_\.Tensor on view\(\)"):
        flat.add_(1)
    part = base.t().reshape(2, 6)[0]  # a view of the copy holds it too
    with pytest.raises(NotImplementedError, match="transposed or permuted"):
        part.mul_(2)
    with pytest.raises(NotImplementedError, match="in-place"):
        base.t().reshape(12).copy_(torch.zeros(12))  # host data into it
    own = base.t().reshape(12).clone()  # a tensor of its own takes writes
    own.add_(1)
    assert torch.equal(own.cpu(), torch.arange(12.0).view(3, 4).t().reshape(12) + 1)


def test_reading_a_copied_view_after_its_source_changed_is_refused(xlasim_sim):
    import torch_xla

    dev = torch_xla.device()
    base = _grid(dev)
    before = base.t().reshape(12)
    detached = before.detach()
    viewed = before[2:]
    base.add_(100)
    for stale in (before, detached, viewed):
        with pytest.raises(NotImplementedError, match="written in place since"):
            stale.cpu()
        with pytest.raises(NotImplementedError, match="written in place since"):
            stale + 1
    after = base.t().reshape(12)  # taken after the write: current
    assert torch.equal(after.cpu(), torch.arange(12.0).view(3, 4).t().reshape(12) + 100)


def test_in_place_view_ops_and_out_arguments_keep_row_major_strides(xlasim_sim):
    import torch_xla

    dev = torch_xla.device()
    a = _grid(dev)
    a.t_()
    assert (a.shape, a.stride()) == (torch.Size([4, 3]), (3, 1))
    assert torch.equal(a.cpu(), torch.arange(12.0).view(3, 4).t())
    out = torch.empty(0, device=dev)
    torch.arange(6, out=out)
    assert (out.shape, out.stride()) == (torch.Size([6]), (1,))


def test_a_dry_run_views_any_layout(xlasim_sim):
    import xlasim

    with xlasim.simulate(topology="2x2", dry_run=True):
        import torch_xla

        dev = torch_xla.device()
        x = torch.randn(8, 4, device=dev)
        y = x.t().contiguous().view(32)
        assert (y.shape, y.stride()) == (torch.Size([32]), (1,))
        x.add_(1)
        assert y.sum().shape == ()  # shapes only: no values to keep in step


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_manual_sharded_values_are_viewed_per_device(xlasim_sim):
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (1, 4))
    xs.set_global_mesh(mesh)
    x = torch.arange(32.0).reshape(4, 8)
    manual = xs.enable_manual_sharding(x.to("xla"), (None, 1)).global_tensor  # [4, 2] each
    flat = manual.t().contiguous().view(8)
    with pytest.raises(NotImplementedError, match="in-place"):
        flat.add_(1)
    full = xs.disable_manual_sharding(flat, (1,), (32,)).global_tensor
    expected = torch.cat([x[:, 2 * d : 2 * d + 2].t().reshape(8) for d in range(4)])
    assert torch.equal(full.cpu(), expected)


def test_writes_are_counted_only_while_a_copy_of_their_storage_is_held(xlasim_sim):
    """The write counts that tell a stale copy are kept per source storage only while some
    copied view of it lives: a long training loop with one such view per step keeps none."""
    import gc

    import torch_xla

    from xlasim.runtime import tensor as sim_tensor

    dev = torch_xla.device()
    gc.collect()
    earlier = set(sim_tensor._WATCHED)  # copies other tests in this process still hold
    for _ in range(20):
        x = torch.randn(4, 8, device=dev)
        y = x.transpose(0, 1).contiguous().view(32)  # attention's reshape of heads: a copy
        (y * 2).sum().item()
        x.add_(1)  # written after: the copy is stale, nobody reads it
    base = _grid(dev)
    held = base.t().reshape(12)
    gc.collect()
    # the last loop's copy and this one
    assert len(set(sim_tensor._WATCHED) - earlier) == 2
    del x, y, held
    gc.collect()
    assert set(sim_tensor._WATCHED) <= earlier


def test_writes_off_the_op_path_make_a_copied_view_stale(xlasim_sim):
    """A CPU-fallback in-place op and batch norm's running statistics write into the CPU
    values without a new IR value of their own; a copy taken before still counts as stale."""
    import torch_xla

    dev = torch_xla.device()
    x = _grid(dev)
    flat = x.t().reshape(12)
    x.hypot_(torch.ones(3, 4, device=dev))  # torch_xla 2.9 runs hypot_ on its CPU fallback
    with pytest.raises(NotImplementedError, match="written in place since"):
        flat.cpu()
    norm = torch.nn.BatchNorm1d(4).to(dev)
    stats = norm.running_var.view(2, 2).t().reshape(4)
    norm(torch.randn(8, 4, device=dev))
    with pytest.raises(NotImplementedError, match="written in place since"):
        stats.cpu()


def test_as_strided_read_from_other_values_is_held_as_a_copy(xlasim_sim):
    """``as_strided`` of a transposed tensor reads its logical order (a copy of the CPU
    values), and of a slice the tensor the slice was taken from. torch_xla writes into the
    latter elsewhere than it read, and so for strides that skip elements (measured on
    torch_xla 2.9 CPU: ``base.as_strided((2, 2), (1, 3), 1).mul_(-1)`` negates elements
    1, 2, 3, 4 of ``base``, not 1, 2, 4, 5): those refuse writes and go stale."""
    import torch_xla

    dev = torch_xla.device()
    base = _grid(dev)
    of_t = base.t().as_strided((2, 2), (1, 2), 1)
    of_slice = base[1:].as_strided((2, 2), (1, 2), 1)
    skipping = base.as_strided((2, 2), (1, 3), 1)
    for view in (of_t, of_slice, skipping):
        with pytest.raises(NotImplementedError, match="in-place"):
            view.mul_(2)
    # Consecutive elements of the tensor's own values: a view, written through as on CPU
    # (the same result on torch_xla 2.9 CPU).
    dense = base.as_strided((2, 2), (1, 2), 1)
    dense.mul_(torch.tensor([[10.0, 20.0], [30.0, 40.0]], device=dev))
    assert base.cpu().view(-1)[:6].tolist() == [0.0, 10.0, 60.0, 60.0, 160.0, 5.0]
    for view in (of_t, of_slice, skipping):
        with pytest.raises(NotImplementedError, match="written in place since"):
            view.cpu()
