"""The collective-based FSDP (``XlaFullyShardedDataParallel``) in one process (world size 1):
what wrapping shows (parameter names and padded shard shapes, ``state_dict()`` keys, shard
metadata), training that equals eager CPU, a state dict that loads back, and consolidation
into the unwrapped module's state dict.

Real torch_xla 2.9 on PJRT CPU trains FSDP in one process only: with several processes
(``torch_xla.launch`` over ``CPU_NUM_DEVICES=4``) the first collective waits in XLA's CPU
rendezvous until the pool breaks; and one process seeing 4 CPU devices fails XLA's HLO
verifier on the gradients' reduce-scatter (shard_count 1 over a group of 4). So this runs on a
one-chip slice; several replicas are checked on the simulator in tests/test_fsdp_sim.py.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")

SEP = "_FSDP_SHARD_SEPARATOR_"
TOL = {"rtol": 1e-5, "atol": 1e-6}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.head(self.body(x)))


def _shard(*parts: str) -> str:
    return SEP.join(["_fsdp_shard", "_fsdp_wrapped_module", "_fpw_module", *parts])


def _wrap(net: nn.Module, **kwargs):
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel
    from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy

    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    return XlaFullyShardedDataParallel(net, auto_wrap_policy=policy, **kwargs)


def _net() -> _Net:
    torch.manual_seed(0)
    return _Net()


def test_wrapping_shows_padded_shards_under_torch_xla_names(xla_target):
    import torch_xla.runtime as xr

    assert xr.world_size() == 1
    model = _wrap(_net())
    inner = "_fsdp_wrapped_module._fpw_module.body.0."
    inner_shard = SEP.join(["_fsdp_shard", "_fsdp_wrapped_module", "_fpw_module"])
    own = [_shard(m, p) for m in ("head", "norm") for p in ("weight", "bias")]
    nested = [inner + inner_shard + SEP + p for p in ("weight", "bias")]
    params = [(n, tuple(p.shape), p.dtype, p.device.type) for n, p in model.named_parameters()]
    assert params == [(n, (128,), torch.float32, "xla") for n in own + nested]
    assert list(model.state_dict()) == [
        *own,
        *[n.replace("_fpw_module.", "") for n in nested],
        "_fsdp_wrapped_module.norm.running_mean",
        "_fsdp_wrapped_module.norm.running_var",
        "_fsdp_wrapped_module.norm.num_batches_tracked",
    ]
    meta = model.get_shard_metadata()
    assert (meta["world_size"], meta["rank"], meta["flatten_info"], meta["buffer_info"]) == (
        1,
        0,
        {},
        {},
    )
    assert meta["shard_info"] == {
        "": {
            _shard("head", "weight"): {
                "_orig_size": torch.Size([4, 16]),
                "_orig_name": "_fsdp_wrapped_module._fpw_module.head.weight",
            },
            _shard("head", "bias"): {
                "_orig_size": torch.Size([4]),
                "_orig_name": "_fsdp_wrapped_module._fpw_module.head.bias",
            },
            _shard("norm", "weight"): {
                "_orig_size": torch.Size([4]),
                "_orig_name": "_fsdp_wrapped_module._fpw_module.norm.weight",
            },
            _shard("norm", "bias"): {
                "_orig_size": torch.Size([4]),
                "_orig_name": "_fsdp_wrapped_module._fpw_module.norm.bias",
            },
        },
        "_fsdp_wrapped_module.body.0": {
            _shard("weight"): {
                "_orig_size": torch.Size([16, 8]),
                "_orig_name": "_fsdp_wrapped_module._fpw_module.weight",
            },
            _shard("bias"): {
                "_orig_size": torch.Size([16]),
                "_orig_name": "_fsdp_wrapped_module._fpw_module.bias",
            },
        },
    }
    # The shard is the flattened parameter, zero-padded.
    head = dict(model.named_parameters())[_shard("head", "weight")].detach().cpu()
    torch.testing.assert_close(head[:64], _net().head.weight.detach().flatten())
    assert not head[64:].any()
    # Dim-0 sharding pads rows only; the multiple of 128 elements no longer applies.
    dim0 = _wrap(_net(), shard_param_on_dim_0=True)
    assert [tuple(p.shape) for p in dim0.parameters()] == [
        (4, 16),
        (4,),
        (4,),
        (4,),
        (16, 8),
        (16,),
    ]


def _train(model: nn.Module, device, steps: int = 3) -> tuple[list[float], nn.Module]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def _assert_consolidates_to(model: nn.Module, plain: nn.Module, names: list[str]) -> None:
    """The wrapper's one-rank checkpoint consolidates to ``names``, in that order, with the
    values of ``plain`` (the unwrapped model trained the same way)."""
    from torch_xla.distributed.fsdp import consolidate_sharded_state_dicts

    state = {k: v.cpu() for k, v in model.state_dict().items()}
    full = consolidate_sharded_state_dicts([state], model.get_shard_metadata())
    assert list(full) == names
    expected = plain.state_dict()
    for name, value in full.items():
        torch.testing.assert_close(value, expected[name].cpu(), **TOL, msg=name)


def test_training_equals_eager_and_the_checkpoint_consolidates(xla_target):
    import torch_xla

    dev = torch_xla.device()
    losses, model = _train(_wrap(_net()), dev)
    eager_losses, _ = _train(_net(), "cpu")
    torch.testing.assert_close(losses, eager_losses, **TOL)
    # The state is compared with the unwrapped model trained on the device: real torch_xla
    # updates BatchNorm's running_var with the biased batch variance, eager torch with the
    # unbiased one.
    _, plain = _train(_net().to(dev), dev)

    _assert_consolidates_to(
        model,
        plain,
        [
            "head.weight",
            "head.bias",
            "norm.weight",
            "norm.bias",
            "body.0.weight",
            "body.0.bias",
            "norm.running_mean",
            "norm.running_var",
            "norm.num_batches_tracked",
        ],
    )

    # A fresh wrapper loads the sharded state dict back.
    again = _wrap(_Net())
    again.load_state_dict(model.state_dict())
    for (name, a), (_, b) in zip(
        again.state_dict().items(), model.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a.cpu(), b.cpu(), msg=name)


def test_bfloat16_compute_keeps_float32_shards(xla_target):
    import torch_xla

    model = _wrap(_net(), compute_dtype=torch.bfloat16)
    out = model(torch.randn(8, 8).to(torch_xla.device()))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    assert {b.dtype for b in model.buffers() if b.is_floating_point()} == {torch.bfloat16}
    # A buffer cast on the CPU and then moved loses its note of the original dtype; one
    # already on the device keeps it (under its name with ``_fpw_module``).
    assert model.get_shard_metadata()["buffer_info"] == {}
    on_device = _wrap(_net().to(torch_xla.device()), compute_dtype=torch.bfloat16)
    assert on_device.get_shard_metadata()["buffer_info"] == {
        f"_fsdp_wrapped_module._fpw_module.norm.{name}": {"_orig_dtype": torch.float32}
        for name in ("running_mean", "running_var")
    }


def test_original_names_of_the_shards(xla_target):
    # torch_xla 2.9 lists the root's own shards once per wrapper in the tree, under that
    # wrapper's path; the inner wrapper's shards are not listed.
    pairs = _wrap(_net()).get_original_names_and_sharded_parameters()
    own = ["head.weight", "head.bias", "norm.weight", "norm.bias"]
    assert [n for n, _ in pairs] == own + [f"body.0.{n}" for n in own]
    assert {tuple(p.shape) for _, p in pairs} == {(128,)}


def test_what_wrapping_refuses(xla_target):
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP

    with pytest.raises(RuntimeError, match="already wrapped with FSDP"):
        FSDP(FSDP(nn.Linear(2, 2)))
    with pytest.raises(RuntimeError, match="must define a `forward` method"):
        FSDP(nn.ModuleList([nn.Linear(2, 2)]))
    with pytest.raises(TypeError, match="only fp32 parameters are supported"):
        FSDP(nn.Linear(2, 2).half())
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        FSDP(nn.Linear(2, 2), compute_dtype=torch.float64)
    with pytest.raises(ValueError, match="sharding_rank and sharding_world_size must be"):
        FSDP(nn.Linear(2, 2), sharding_groups=[[0]])


def test_coalesced_gathers_refuse_a_pinned_layout(xla_target):
    import torch_xla
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP

    model = FSDP(nn.Linear(4, 2), coalesce_all_gather_ops=True)
    with pytest.raises(RuntimeError, match=r"list of tensors input, pin_layout=True is not yet"):
        model(torch.ones(1, 4).to(torch_xla.device()))
    # Without the pin, parameters sharded along dim 0 are gathered as usual.
    torch.manual_seed(0)
    plain = nn.Linear(4, 2)
    torch.manual_seed(0)
    model = FSDP(
        nn.Linear(4, 2),
        coalesce_all_gather_ops=True,
        pin_layout_in_collective_ops=False,
        shard_param_on_dim_0=True,
    )
    x = torch.ones(1, 4)
    torch.testing.assert_close(model(x.to(torch_xla.device())).cpu(), plain(x), **TOL)


def test_flattened_parameters_train_as_eager_and_consolidate(xla_target):
    import torch_xla

    net = _net()
    net.norm.bias.requires_grad_(False)
    model = _wrap(net, flatten_parameters=True)
    flat = SEP.join(["_fsdp_shard", "_fsdp_wrapped_module", "flat_param_"])
    inner = "_fsdp_wrapped_module._fpw_module.body.0."
    # Trainable and frozen parameters are flattened apart: 64 + 4 + 4, then 4; 128 + 16.
    shapes = [(n, tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()]
    assert shapes == [
        (f"{flat}0", (128,), True),
        (f"{flat}1", (128,), False),
        (f"{inner}{flat}0", (256,), True),
    ]
    meta = model.get_shard_metadata()
    assert meta["flatten_info"] == {
        "_fsdp_wrapped_module.flat_param_0": (
            ["_fpw_module.head.weight", "_fpw_module.head.bias", "_fpw_module.norm.weight"],
            [torch.Size([4, 16]), torch.Size([4]), torch.Size([4])],
            [64, 4, 4],
        ),
        "_fsdp_wrapped_module.flat_param_1": (["_fpw_module.norm.bias"], [torch.Size([4])], [4]),
        "_fsdp_wrapped_module.body.0._fsdp_wrapped_module.flat_param_0": (
            ["_fpw_module.weight", "_fpw_module.bias"],
            [torch.Size([16, 8]), torch.Size([16])],
            [128, 16],
        ),
    }
    assert meta["shard_info"][""][f"{flat}0"] == {
        "_orig_size": torch.Size([72]),
        "_orig_name": "_fsdp_wrapped_module.flat_param_0",
    }

    dev = torch_xla.device()
    losses, model = _train(model, dev)
    reference = _net()
    reference.norm.bias.requires_grad_(False)
    eager_losses, _ = _train(reference, "cpu")
    torch.testing.assert_close(losses, eager_losses, **TOL)
    plain_net = _net()
    plain_net.norm.bias.requires_grad_(False)
    _, plain = _train(plain_net.to(dev), dev)
    # Buffers first, then the parameters split out of the flat vectors.
    _assert_consolidates_to(
        model,
        plain,
        [
            "norm.running_mean",
            "norm.running_var",
            "norm.num_batches_tracked",
            "head.weight",
            "head.bias",
            "norm.weight",
            "norm.bias",
            "body.0.weight",
            "body.0.bias",
        ],
    )


def test_no_sync_accumulates_until_the_next_synchronized_backward(xla_target):
    import torch_xla

    model = _wrap(_net())
    x = torch.randn(8, 8).to(torch_xla.device())
    model(x).square().mean().backward()
    once = [p.grad.cpu() for p in model.parameters()]
    model.zero_grad()
    with model.no_sync():
        model(x).square().mean().backward()
    assert [p.grad for p in model.parameters()] == [None] * len(once)
    model(x).square().mean().backward()
    for a, b in zip(once, model.parameters(), strict=True):
        torch.testing.assert_close(b.grad.cpu(), 2 * a, **TOL)


def test_a_module_on_the_meta_device_is_materialized(xla_target):
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP

    # Without param_init_fn: on the CPU, by the module's reset_parameters().
    model = FSDP(nn.Linear(4, 2, device="meta"))
    shards = [p.detach().cpu() for p in model.parameters()]
    assert [tuple(s.shape) for s in shards] == [(128,), (128,)]
    assert shards[0][:8].abs().max() > 0 and not shards[0][8:].any()

    def fill(module: nn.Module) -> None:
        module.to_empty(device="cpu")
        with torch.no_grad():
            for p in module.parameters():
                p.fill_(0.5)

    model = FSDP(nn.Linear(4, 2, device="meta"), param_init_fn=fill)
    assert [p.detach().cpu()[:2].tolist() for p in model.parameters()] == [[0.5, 0.5]] * 2
