"""The metadata of ``xla`` tensors, as real torch_xla 2.9 reports it (read on PJRT CPU).

torch_xla derives a tensor's strides from its XLA shape alone: row-major strides and storage
offset 0 for every tensor, views included (``w.t()`` of a ``[1, 64]`` weight has strides
``(1, 1)``), and it answers contiguous for every memory format. PyTorch picks some backward
formulas by strides (the weight gradient of ``mm``), so the graphs built on a device follow
from this: a Linear's weight gradient lowers to one HLO text. Host copies (``.cpu()``) are
row-major too, unless a memory format is asked for.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _row_major(shape):
    """Each dim's stride: the product of the sizes after it (a size 0 zeroes those before)."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def test_views_and_results_report_row_major_strides(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a = torch.arange(12.0, device=dev).view(3, 4)
    b = torch.randn(2, 3, 4, 5, device=dev)
    w = torch.randn(1, 64, device=dev)
    tensors = {
        "w.t()": w.t(),
        "a.t()": a.t(),
        "a.transpose(0, 1)": a.transpose(0, 1),
        "a.mT": a.mT,
        "a[:, 1:3]": a[:, 1:3],
        "a[1:]": a[1:],
        "a[:, 1]": a[:, 1],
        "a[::2]": a[::2],
        "a.narrow(1, 1, 2)": a.narrow(1, 1, 2),
        "a.unsqueeze(1)": a.unsqueeze(1),
        "a expanded": a.unsqueeze(0).expand(2, 3, 4),
        "a.diagonal()": a.diagonal(),
        "a.split(2, 1)[1]": a.split(2, dim=1)[1],
        "a.t().reshape(12)": a.t().reshape(12),
        "a.t().contiguous().view(12)": a.t().contiguous().view(12),
        "a.t().detach()": a.t().detach(),
        "a.t() + 1": a.t() + 1,
        "a.t() @ a": a.t() @ a,
        "b.permute(0, 2, 3, 1)": b.permute(0, 2, 3, 1),
        "b[..., 0]": b[..., 0],
        "unfold": a[0].unfold(0, 2, 1),
        "empty_strided": torch.empty_strided((3, 4), (1, 3), device=dev),
        "empty_like(a.t())": torch.empty_like(a.t()),
        "CPU transposed moved": torch.randn(3, 4).t().to(dev),
        "CPU channels-last moved": torch.randn(2, 3, 4, 4)
        .to(memory_format=torch.channels_last)
        .to(dev),
        "size-0 dim": torch.empty(2, 0, 3, device=dev),
    }
    for name, t in tensors.items():
        assert t.stride() == _row_major(t.shape), name
        assert t.storage_offset() == 0, name
        assert t.is_contiguous(), name
    assert w.t().stride() == (1, 1)
    assert a.t().stride() == (3, 1)
    assert torch.empty(2, 0, 3, device=dev).stride() == (0, 3, 1)  # not torch's (3, 3, 1)

    # contiguous() is the tensor itself, whatever view it is.
    view = a.t()
    assert view.contiguous() is view
    # The values are the view's, as on the CPU.
    cpu = torch.arange(12.0).view(3, 4)
    assert torch.equal(a.t().contiguous().view(12).cpu(), cpu.t().reshape(12))
    assert torch.equal(a.t().reshape(2, 6).cpu(), cpu.t().reshape(2, 6))


def test_contiguous_in_every_memory_format(xla_target):
    import torch_xla

    dev = torch_xla.device()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, device=dev)
    conv = torch.nn.Conv2d(3, 4, 3).to(dev)
    y = conv(x)
    for t in (x, y, conv.weight, x.permute(0, 2, 3, 1), torch.randn(3, 4, device=dev)):
        assert t.is_contiguous(memory_format=torch.channels_last)
        assert t.is_contiguous(memory_format=torch.channels_last_3d)
        assert t.is_contiguous(memory_format=torch.contiguous_format)
    assert x.contiguous(memory_format=torch.channels_last) is x
    for t in (
        x.to(memory_format=torch.channels_last),
        torch.empty(2, 3, 8, 8, device=dev, memory_format=torch.channels_last),
        torch.empty_like(x, memory_format=torch.channels_last),
        conv.to(memory_format=torch.channels_last).weight,
    ):
        assert t.stride() == _row_major(t.shape)
    out = conv(x.to(memory_format=torch.channels_last))
    assert out.stride() == _row_major(out.shape)
    assert torch.allclose(out.cpu(), y.cpu())


def test_host_copies_are_row_major(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a = torch.randn(3, 4, device=dev)
    x = torch.randn(2, 3, 4, 5, device=dev)
    assert a.t().cpu().stride() == (3, 1)
    assert a.t().to("cpu").stride() == (3, 1)
    assert a[:, 1:3].cpu().stride() == (2, 1)
    assert a[0].expand(3, 4).cpu().stride() == (4, 1)
    assert x.permute(0, 2, 3, 1).cpu().stride() == (60, 15, 3, 1)
    assert x.to(memory_format=torch.channels_last).cpu().stride() == (60, 20, 5, 1)
    assert not x.cpu().is_contiguous(memory_format=torch.channels_last)
    # A memory format asked for is given.
    assert x.to("cpu", memory_format=torch.channels_last).stride() == (60, 1, 15, 3)
    assert torch.equal(a.t().cpu(), a.cpu().t())


@pytest.mark.mat_mul_precision("default")  # the text of the default level (no operand_precision)
def test_a_linear_weight_gradient_lowers_as_on_a_device(xla_target):
    import torch_xla

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1).to("xla")
    x = torch.randn(4, 3).to("xla")
    lin(x).sum().backward()
    grad = lin.weight.grad
    assert grad.stride() == (3, 1)
    assert lin.weight.t().stride() == (1, 1)
    # The weight gradient of mm(x, w.t()) for a w.t() with strides (1, 1): x.t() @ g, then
    # transposed back (a w.t() reporting the CPU's (1, 3) gives (g.t() @ x) instead).
    assert torch_xla._XLAC._get_xla_tensors_hlo([grad]) == (
        "HloModule IrToHlo.12, entry_computation_layout={(f32[4,3]{1,0})->(f32[1,3]{0,1})}\n"
        "\n"
        "ENTRY %IrToHlo.12 (p0.7: f32[4,3]) -> (f32[1,3]) {\n"
        "  %p0.7 = f32[4,3]{1,0} parameter(0)\n"
        "  %transpose.8 = f32[3,4]{0,1} transpose(f32[4,3]{1,0} %p0.7), dimensions={1,0}\n"
        "  %constant.1 = f32[] constant(1)\n"
        "  %broadcast.2 = f32[] broadcast(f32[] %constant.1), dimensions={}\n"
        "  %reshape.3 = f32[1,1]{1,0} reshape(f32[] %broadcast.2)\n"
        "  %broadcast.4 = f32[1,1]{1,0} broadcast(f32[1,1]{1,0} %reshape.3), dimensions={0,1}\n"
        "  %reshape.5 = f32[1]{0} reshape(f32[1,1]{1,0} %broadcast.4)\n"
        "  %broadcast.6 = f32[4,1]{1,0} broadcast(f32[1]{0} %reshape.5), dimensions={1}\n"
        "  %dot.9 = f32[3,1]{1,0} dot(f32[3,4]{0,1} %transpose.8, f32[4,1]{1,0} %broadcast.6),"
        " lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        "  %transpose.10 = f32[1,3]{0,1} transpose(f32[3,1]{1,0} %dot.9), dimensions={1,0}\n"
        "  ROOT %tuple.11 = (f32[1,3]{0,1}) tuple(f32[1,3]{0,1} %transpose.10)\n"
        "}\n"
        "\n"
    )
    torch_xla.sync()
    expected = torch.ones(4, 1).t() @ x.cpu()
    # At the default mat-mul precision a TPU rounds x to bfloat16 (within 2**-8 of each value).
    assert ((grad.cpu() - expected).abs() <= 2**-8 * x.cpu().abs().sum(0) + 1e-6).all()


def test_sharded_tensors_report_the_global_strides(xla_target):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xla_target.num_devices
    if n < 2:
        pytest.skip(f"{xla_target} has one device: nothing to shard")
    xr.use_spmd()
    mesh = xs.Mesh(np.arange(n), (n, 1))
    st = xs.mark_sharding(torch.randn(2 * n, 4).to("xla"), mesh, (0, None))
    assert type(st).__name__ == "XLAShardedTensor"
    assert st.stride() == (4, 1)
    images = torch.randn(n, 3, 2, 2).to("xla")
    st4 = xs.mark_sharding(images, mesh, (0, None, None, None))
    assert st4.stride() == (12, 4, 2, 1)
    # The wrapper computes contiguity from its strides; the xla tensor inside answers yes.
    assert not st4.is_contiguous(memory_format=torch.channels_last)
    assert st4.global_tensor.is_contiguous(memory_format=torch.channels_last)
