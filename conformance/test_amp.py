"""Autocast on the XLA device: torch_xla's cast policy and ``torch_xla.amp.autocast``.

Probed on real torch_xla 2.9 (CPU PJRT): inside ``torch.autocast('xla')`` matmuls, linear and
relu run in bfloat16, softmax and the losses in float32, ``cat`` in the widest input type, and
ops outside the policy (``add``, ``gelu``) in their inputs' type. ``torch_xla.amp.autocast``
enables that on TPU only: on another device type it prints a warning and cannot be entered.
"""

from __future__ import annotations

import warnings

import pytest
import torch


def _policy_dtypes(dev: torch.device) -> dict[str, torch.dtype]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).to(dev)
    a = torch.randn(4, 8, device=dev)
    b = torch.randn(8, 8, device=dev)
    target = torch.zeros(4, dtype=torch.long, device=dev)
    y = lin(a)
    return {
        "mm": (a @ b).dtype,
        "linear": y.dtype,
        "relu": torch.relu(a).dtype,
        "softmax": torch.softmax(y, -1).dtype,
        "cross_entropy": torch.nn.functional.cross_entropy(y, target).dtype,
        "cat": torch.cat([y, a]).dtype,
        "add": (y + a).dtype,
        "gelu": torch.nn.functional.gelu(y).dtype,
        "float64_mm": (a.double() @ b.double()).dtype,
    }


EXPECTED = {
    "mm": torch.bfloat16,
    "linear": torch.bfloat16,
    "relu": torch.bfloat16,
    "softmax": torch.float32,
    "cross_entropy": torch.float32,
    "cat": torch.float32,
    "add": torch.float32,
    "gelu": torch.bfloat16,
    "float64_mm": torch.float64,
}


def test_torch_autocast_xla_follows_the_xla_policy(xla_target):
    import torch_xla

    dev = torch_xla.device()
    assert torch.get_autocast_dtype("xla") == torch.bfloat16
    with torch.autocast("xla"):
        assert _policy_dtypes(dev) == EXPECTED
    # Outside the region every op keeps float32.
    assert set(_policy_dtypes(dev).values()) == {torch.float32, torch.float64}

    a = torch.randn(4, 8)
    b = torch.randn(8, 8)
    with torch.autocast("xla", dtype=torch.float16):
        half = a.to(dev) @ b.to(dev)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.cpu().float(), a @ b, rtol=1e-2, atol=1e-2)


def test_autocast_backward_gives_float32_grads(xla_target):
    import torch_xla

    dev = torch_xla.device()
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).to(dev)
    x = torch.randn(16, 8, device=dev)
    with torch.autocast("xla"):
        loss = torch.nn.functional.mse_loss(lin(x), torch.zeros(16, 4, device=dev))
    assert loss.dtype == torch.float32
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32
    assert torch.isfinite(lin.weight.grad.cpu()).all()


def test_torch_xla_amp_autocast(xla_target):
    import torch_xla
    from torch_xla.amp import autocast

    dev = torch_xla.device()
    a = torch.randn(4, 4, device=dev)
    with pytest.raises(AssertionError, match="torch_xla.autocast is available for XLA:TPU"):
        autocast("cpu")
    if xla_target.device_type != "TPU":
        ctx = autocast(dev)
        with (
            pytest.raises(AttributeError, match="'autocast' object has no attribute 'device'"),
            ctx,
        ):
            pass
        return
    with autocast(dev):
        assert (a @ a).dtype == torch.bfloat16
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with autocast(dev, dtype=torch.float16):
            assert (a @ a).dtype == torch.float32  # autocast disabled
    assert any(
        "TPU Autocast only supports dtype of torch.bfloat16" in str(w.message) for w in caught
    )


SYNCFREE_CASES = {
    "Adam": {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True},
    "AdamW": {"lr": 0.01},
    "SGD": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True},
}


def test_syncfree_optimizers_skip_steps_with_found_inf(xla_target):
    """A step with ``found_inf != 0`` changes nothing (not even the step count); the others
    match the torch optimizer of the same name on CPU (real XLA CPU differs from eager CPU by a
    few float32 ulps, measured up to 8e-6 absolute on weights of size ~50 after 4 SGD steps)."""
    import torch_xla
    from torch_xla.amp import syncfree

    dev = torch_xla.device()
    for name, kwargs in SYNCFREE_CASES.items():
        torch.manual_seed(0)
        cpu_model = torch.nn.Linear(4, 2)
        model = torch.nn.Linear(4, 2)
        model.load_state_dict(cpu_model.state_dict())
        model.to(dev)
        opt = getattr(syncfree, name)(model.parameters(), **kwargs)
        cpu_opt = getattr(torch.optim, name)(cpu_model.parameters(), **kwargs)
        x = torch.randn(8, 4)
        for i in range(4):
            skipped = i == 1
            for m, o, data in ((model, opt, x.to(dev)), (cpu_model, cpu_opt, x)):
                o.zero_grad()
                m(data).pow(2).sum().backward()
            before = model.weight.detach().cpu().clone()
            opt.step(found_inf=torch.tensor(float(skipped)).to(dev))
            torch_xla.sync()
            if skipped:
                assert torch.equal(model.weight.detach().cpu(), before), name
            else:
                cpu_opt.step()
        assert opt.state[model.weight]["step"].item() == 3.0, name
        torch.testing.assert_close(
            model.weight.detach().cpu(), cpu_model.weight.detach(), rtol=1e-5, atol=1e-5, msg=name
        )
        # Without found_inf they are the plain torch optimizers.
        assert isinstance(opt, getattr(torch.optim, name))
    with pytest.raises(ValueError, match="The found_inf tensor has to be scalar type"):
        opt.step(found_inf=torch.zeros(2).to(dev))
