"""``torch_xla.utils.checkpoint``: the gradients of a checkpointed function are those of the
plain function (dropout masks included), and its errors; texts and behaviour as real
torch_xla 2.9 on CPU gives them for the same programs."""

from __future__ import annotations

import pytest
import torch


def test_checkpointed_gradients_match_the_plain_run(xlasim_sim):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.utils.checkpoint as ck

    dev = torch_xla.device()
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).to(dev)
    x = torch.randn(2, 4, device=dev, requires_grad=True)

    def f(a):
        return torch.nn.functional.dropout(lin(a), 0.5)

    xm.set_rng_state(7)
    ck.checkpoint(f, x).sum().backward()
    weight_grad = lin.weight.grad.cpu().clone()
    lin.zero_grad()
    plain = x.detach().clone().requires_grad_()
    xm.set_rng_state(7)
    f(plain).sum().backward()
    torch.testing.assert_close(plain.grad.cpu(), x.grad.cpu())
    torch.testing.assert_close(lin.weight.grad.cpu(), weight_grad)
    assert ck.chkpt_status.in_chkpt_bwd is False


def test_bound_module_method_is_rerun_behind_a_barrier(xlasim_sim):
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.utils.checkpoint as ck

    dev = torch_xla.device()
    m = torch.nn.Linear(3, 3).to(dev)
    x = torch.randn(2, 3, device=dev, requires_grad=True)
    ck.checkpoint(m.forward, x).sum().backward()
    assert m.weight.grad is not None and x.grad is not None
    torch_xla.sync()
    assert met.counter_value("UncachedCompile") is not None


def test_errors(xlasim_sim):
    import torch_xla
    import torch_xla.utils.checkpoint as ck

    dev = torch_xla.device()
    w = torch.randn(2, device=dev, requires_grad=True)
    with pytest.raises(ValueError, match=r"^XLA currently does not support use_reentrant==False$"):
        ck.checkpoint(lambda a: a * 2, w, use_reentrant=False)
    with pytest.raises(ValueError, match=r"^Unexpected keyword arguments: foo,bar$"):
        ck.checkpoint(lambda a: a * 2, w, foo=1, bar=2)
    assert not ck.checkpoint(lambda a: a * 2, torch.randn(2, device=dev)).requires_grad
    out = ck.checkpoint(lambda a: a.detach() * 2, w)
    with pytest.raises(RuntimeError, match=r"^none of output has requires_grad=True, this "):
        out.sum().backward()
    with pytest.raises(RuntimeError, match=r"^Checkpointing is not compatible with \.grad\(\)"):
        torch.autograd.grad(ck.checkpoint(lambda a: a * 2, w).sum(), w)
    # A failed rerun leaves the flag set.
    assert ck.chkpt_status.in_chkpt_bwd is True
    ck.chkpt_status.in_chkpt_bwd = False
