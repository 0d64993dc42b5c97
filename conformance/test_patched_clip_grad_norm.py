"""``torch.nn.utils.clip_grad_norm_`` after importing torch_xla: torch_xla 2.9's own (kept
torch's as ``_orig``), as it behaves on CPU (measured there): no gradient gives a zero norm on
the xla device, ``foreach=True`` is refused, and gradients are clipped in place."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")


def test_replaced_on_import(xla_target):
    import torch
    import torch_xla  # noqa: F401

    clip = torch.nn.utils.clip_grad_norm_
    assert clip.__module__ == "torch_xla._patched_functions"
    assert clip._orig.__module__ == "torch.nn.utils.clip_grad"


def test_no_gradient_and_foreach(xla_target):
    import torch
    import torch_xla

    xt = torch.rand(10, 10, dtype=torch.bfloat16).to(torch_xla.device())
    norm = torch.nn.utils.clip_grad_norm_(xt, 1.0)
    assert norm.device.type == "xla"
    assert norm.cpu().item() == 0.0
    with pytest.raises(RuntimeError, match=r"^foreach=True is not supported with XLA$"):
        torch.nn.utils.clip_grad_norm_(xt, 1.0, foreach=True)


def test_clips_in_place(xla_target):
    import torch
    import torch_xla

    device = torch_xla.device()
    a = torch.zeros(2, 2, device=device, requires_grad=True)
    b = torch.zeros(3, device=device, requires_grad=True)
    a.grad = torch.full((2, 2), 3.0).to(device)
    b.grad = torch.full((3,), -4.0).to(device)
    # norms: |a.grad| = 6, |b.grad| = sqrt(48); total sqrt(84)
    norm = torch.nn.utils.clip_grad_norm_([a, b], 1.0)
    assert norm.cpu().item() == pytest.approx(84**0.5, rel=1e-5)
    scale = 1.0 / (84**0.5 + 1e-6)
    assert a.grad.cpu().flatten().tolist() == pytest.approx([3.0 * scale] * 4, rel=1e-5)
    inf_norm = torch.nn.utils.clip_grad_norm_([a, b], 10.0, norm_type=float("inf"))
    assert inf_norm.cpu().item() == pytest.approx(4.0 * scale, rel=1e-5)
