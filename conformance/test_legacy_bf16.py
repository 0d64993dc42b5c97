"""``XLA_USE_BF16`` and ``XLA_DOWNCAST_BF16`` (deprecated, still honoured by torch_xla 2.9): the
device stores floating values in a narrower type while ``dtype`` keeps the logical one.

Values recorded from real torch_xla 2.9 on CPU: float32 is stored as bfloat16 under both;
float64 as bfloat16 under XLA_USE_BF16 and as float32 under XLA_DOWNCAST_BF16; Python scalars
that ops take are uploaded in the stored type; the variables are read when the first floating
tensor is made on a device (so a test sets them before that).
"""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("variable", ["XLA_USE_BF16", "XLA_DOWNCAST_BF16"])
def test_floating_values_are_stored_narrower(xla_target, variable, monkeypatch):
    monkeypatch.setenv(variable, "1")
    import torch_xla

    dev = torch_xla.device()
    host = torch.tensor([1.0001, 3.14159265, 1e-3, 65504.0])
    t = host.to(dev)
    assert t.dtype == torch.float32
    assert t.cpu().tolist() == [1.0, 3.140625, 0.00099945068359375, 65536.0]
    # 1.0001 reaches the device as bfloat16, that is 1.0.
    assert (t * 1.0001).cpu().tolist() == [1.0, 3.140625, 0.00099945068359375, 65536.0]
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=g), torch.randn(256, 64, generator=g)
    product = (a.to(dev) @ b.to(dev)).cpu()
    assert product.dtype == torch.float32
    # bfloat16 products summed in float32 and rounded once (XLA:CPU and the CPU kernel sum in
    # different orders: within one bfloat16 ulp of each other).
    expected = (a.bfloat16() @ b.bfloat16()).float()
    assert torch.equal(product, product.bfloat16().float())
    assert ((product - expected).abs() <= expected.abs() * 2.0**-7 + 1e-6).all()
    wide = torch.tensor([1.0001, 1.0 + 2.0**-30], dtype=torch.float64).to(dev)
    assert wide.dtype == torch.float64
    stored = [1.0, 1.0] if variable == "XLA_USE_BF16" else [1.000100016593933, 1.0]
    assert wide.cpu().tolist() == stored
    counts = torch.tensor([3, 5]).to(dev) * 7  # integers are untouched
    assert counts.cpu().tolist() == [21, 35]
