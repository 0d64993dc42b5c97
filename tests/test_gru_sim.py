"""``torch_xla.experimental.gru.GRU``: importing torch_xla puts it in ``torch.nn.GRU``'s place.

Facts from real torch_xla 2.9 on CPU (upstream's test_gru.py, CPU CI): ``nn.GRU`` is the scan
GRU with torch's class as ``nn.GRU._orig``; ``bidirectional=True`` gives torch's class; the
scan GRU has torch's methods and signatures, and its outputs, final hidden state and gradients
match torch's GRU. Outside the simulation ``nn.GRU`` is torch's own again.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

import xlasim

TORCH_GRU = nn.GRU


def test_scan_gru_matches_torch_and_stands_in_for_it():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla.backends
        from torch_xla.experimental.gru import GRU

        # float32 products as on the CPU the facts were measured on (a TPU's default rounds
        # them to bfloat16)
        torch_xla.backends.set_mat_mul_precision("highest")

        assert nn.GRU is GRU and nn.GRU._orig is TORCH_GRU
        assert type(nn.GRU(4, 8, bidirectional=True)) is TORCH_GRU
        assert inspect.signature(GRU.forward) == inspect.signature(TORCH_GRU.forward)
        assert inspect.signature(GRU.__init__) == inspect.signature(TORCH_GRU.__init__)

        torch.manual_seed(0)
        reference = TORCH_GRU(4, 8, num_layers=2)
        scanned = nn.GRU(4, 8, num_layers=2)
        scanned.load_state_dict(reference.state_dict())
        scanned = scanned.to("xla")
        x = torch.randn(5, 3, 4)
        h0 = torch.randn(2, 3, 8)
        x_dev = x.to("xla").requires_grad_(True)
        x.requires_grad_(True)
        out, h = reference(x, h0)
        out_dev, h_dev = scanned(x_dev, h0.to("xla"))
        torch.testing.assert_close(out_dev.cpu(), out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(h_dev.cpu(), h, atol=1e-5, rtol=1e-5)
        (out.sum() + h.sum()).backward()
        (out_dev.sum() + h_dev.sum()).backward()
        torch.testing.assert_close(x_dev.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)
        for name, p in reference.named_parameters():
            grad = scanned.get_parameter(name).grad
            torch.testing.assert_close(grad.cpu(), p.grad, atol=1e-4, rtol=1e-4)

        one = torch.randn(5, 4)  # unbatched
        torch.testing.assert_close(scanned(one.to("xla"))[0].cpu(), reference(one)[0].detach())
    assert nn.GRU is TORCH_GRU
