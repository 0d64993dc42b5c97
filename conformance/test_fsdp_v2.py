"""FSDPv2 (``SpmdFullyShardedDataParallel``) and the auto-wrap policies it uses.

Every expected value here was read from real torch_xla 2.9 on PJRT CPU (4 devices,
``xr.use_spmd()``). Models are built on the CPU and moved to the device separately for the
wrapped and the reference copy: a deep copy of a device model is not used, because real
torch_xla gives the source of a device-side clone a replicated sharding, which FSDPv2 then
leaves alone.
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn


class _TwoLayers(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(128, 64)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.relu(self.fc1(x))))


def _spmd(xla_target):
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()


def _mesh(shape, names):
    import torch_xla.distributed.spmd as xs

    return xs.Mesh(np.arange(4), shape, names)


def _spec(t: torch.Tensor) -> str:
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(t)


def test_parameters_and_output_are_sharded_over_fsdp(xla_target):
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    _spmd(xla_target)
    mesh = _mesh((4, 1), ("fsdp", "tensor"))
    model = _TwoLayers().to("xla")
    model.fc1 = FSDPv2(model.fc1, mesh=mesh)
    model.fc2 = FSDPv2(model.fc2, mesh=mesh)
    model = FSDPv2(model, mesh=mesh)
    # Each parameter on its largest dimension (the first of equal ones).
    assert _spec(model.fc1.weight) == "{devices=[1,4]0,1,2,3}"
    assert _spec(model.fc1.bias) == "{devices=[4]0,1,2,3}"
    assert _spec(model.fc2.weight) == "{devices=[1,4]0,1,2,3}"
    tall = FSDPv2(nn.Sequential(nn.Linear(3, 10)), mesh=mesh)
    assert _spec(tall[0].weight) == "{devices=[4,1]0,1,2,3}"
    square = FSDPv2(nn.Linear(8, 8), mesh=mesh)
    assert _spec(square.weight) == "{devices=[4,1]0,1,2,3}"

    x = torch.randn(16, 128).to("xla")
    xs.mark_sharding(x, mesh, ("fsdp", None))
    out = model(x)
    assert _spec(out) == "{devices=[4,1]0,1,2,3}"
    assert isinstance(model.module, _TwoLayers)


def test_wrapped_model_computes_what_the_plain_one_does(xla_target):
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    _spmd(xla_target)
    mesh = _mesh((4, 1), ("fsdp", "tensor"))
    torch.manual_seed(0)
    cpu_model = _TwoLayers()
    plain = _TwoLayers()
    plain.load_state_dict(cpu_model.state_dict())
    plain = plain.to("xla")
    wrapped = FSDPv2(cpu_model, mesh=mesh)
    assert str(next(wrapped.module.parameters()).device) == "xla:0"
    assert _spec(wrapped.fc1.weight) == "{devices=[1,4]0,1,2,3}"

    x = torch.randn(16, 128)
    outs = [m(x.to("xla")) for m in (plain, wrapped)]
    for out in outs:
        (out * out).sum().backward()
    torch.testing.assert_close(outs[1].cpu(), outs[0].cpu())
    for name, ref in plain.named_parameters():
        got = wrapped.module.get_parameter(name)
        assert ref.grad is not None and got.grad is not None, name
        torch.testing.assert_close(got.grad.cpu(), ref.grad.cpu(), msg=name)
    # A second step from the updated weights still agrees.
    for model in (plain, wrapped):
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    torch.testing.assert_close(wrapped(x.to("xla")).cpu(), plain(x.to("xla")).cpu())


def test_extra_data_axis_shards_the_batch_over_two_axes(xla_target):
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    _spmd(xla_target)
    mesh = _mesh((2, 2, 1), ("data", "fsdp", "tensor"))
    model = FSDPv2(_TwoLayers(), mesh=mesh, extra_data_axis="data")
    # Parameters over fsdp only, replicated over data; the output over both.
    assert _spec(model.fc1.weight) == "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
    assert _spec(model.fc1.bias) == "{devices=[2,2]0,2,1,3 last_tile_dim_replicate}"
    out = model(torch.randn(16, 128).to("xla"))
    assert _spec(out) == "{devices=[4,1]0,1,2,3}"


def test_bad_arguments(xla_target):
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    _spmd(xla_target)
    with pytest.raises(ValueError, match=r"^No mesh is provided and no global mesh is set\. "):
        FSDPv2(_TwoLayers())
    with pytest.raises(ValueError, match=r"^The mesh must have an axis named 'fsdp'\.$"):
        FSDPv2(_TwoLayers(), mesh=_mesh((4,), ("data",)))
    xs.set_global_mesh(_mesh((2, 2), ("data", "fsdp")))
    with pytest.raises(ValueError, match=r"^The provided ddp axis is not in the mesh\.$"):
        FSDPv2(_TwoLayers(), extra_data_axis="ddp")
    wrapped = FSDPv2(_TwoLayers())
    with pytest.raises(RuntimeError, match=r"^Cannot wrap a module that is already wrapped "):
        FSDPv2(wrapped)
    with pytest.raises(RuntimeError, match=re.escape("*must define a `forward` method")):
        FSDPv2(nn.ModuleList([nn.Linear(2, 2)]))


class _Pair(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.kind = kind

    def forward(self, x: torch.Tensor):
        y = self.lin(x)
        return (y, 3) if self.kind == "tuple" else {"y": y}


def test_default_output_sharding_of_tuples_and_other_outputs(xla_target):
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    _spmd(xla_target)
    mesh = _mesh((4,), ("fsdp",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = FSDPv2(_Pair("tuple"), mesh=mesh)(torch.randn(8, 8).to("xla"))
    assert _spec(out[0]) == "{devices=[4,1]0,1,2,3}"
    assert any(
        str(w.message).startswith("The output is a tuple, but only the first element is sharded")
        for w in caught
    )
    with pytest.raises(RuntimeError, match=r"^The output type is not supported: <class 'dict'>"):
        FSDPv2(_Pair("dict"), mesh=mesh)(torch.randn(8, 8).to("xla"))
    custom = []
    model = FSDPv2(_Pair("dict"), mesh=mesh, shard_output=lambda o, m: custom.append((o, m)))
    model(torch.randn(8, 8).to("xla"))
    assert len(custom) == 1 and custom[0][1] is mesh and _spec(custom[0][0]["y"]) == ""


def test_auto_wrap_policies(xla_target):
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp.wrap import (
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    _spmd(xla_target)
    xs.set_global_mesh(_mesh((4,), ("fsdp",)))
    by_type = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Linear})
    model = FSDPv2(_TwoLayers(), auto_wrap_policy=by_type)
    assert isinstance(model.fc1, FSDPv2) and isinstance(model.fc2, FSDPv2)
    assert not isinstance(model.relu, FSDPv2)
    assert _spec(model.fc1.weight) == "{devices=[1,4]0,1,2,3}"

    # fc1 holds 8256 parameters, fc2 65: only fc1 reaches the size threshold.
    by_size = functools.partial(size_based_auto_wrap_policy, min_num_params=1000)
    model = FSDPv2(_TwoLayers(), auto_wrap_policy=by_size)
    assert isinstance(model.fc1, FSDPv2) and not isinstance(model.fc2, FSDPv2)
    assert _spec(model.fc2.weight) == "{devices=[1,4]0,1,2,3}"

    untouched = FSDPv2(
        _TwoLayers(), auto_wrap_policy=by_type, auto_wrapper_callable=lambda m, **kw: m
    )
    assert not isinstance(untouched.fc1, FSDPv2)

    prewrapped = _TwoLayers()
    prewrapped.fc1 = FSDPv2(prewrapped.fc1)
    with pytest.raises(ValueError, match=r"^Expected fc1 to NOT be SpmdFullyShardedDataParallel "):
        FSDPv2(prewrapped, auto_wrap_policy=by_type)


def test_checkpoint_module_keeps_values_and_gradients(xla_target):
    import torch_xla
    from torch_xla.distributed.fsdp import checkpoint_module

    torch.manual_seed(0)
    # With dropout: the recomputation in backward must draw the forward's mask again.
    plain = _TwoLayers(dropout=0.5)
    checkpointed = _TwoLayers(dropout=0.5)
    checkpointed.load_state_dict(plain.state_dict())
    plain, checkpointed = plain.to("xla"), checkpoint_module(checkpointed.to("xla"))
    assert hasattr(checkpointed, "_xla_checkpointed_forward_original")
    x = torch.randn(4, 128)
    outs = []
    for model in (plain, checkpointed):
        torch_xla.manual_seed(7)
        xin = x.to("xla").requires_grad_()
        out = model(xin)
        out.sum().backward()
        outs.append((out.cpu(), xin.grad.cpu(), model.fc1.weight.grad.cpu()))
    for got, ref in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(got, ref)


class _Box(nn.Module):
    """A wrapper standing in for FSDP: records what it wrapped and with which settings."""

    def __init__(self, module: nn.Module, **settings) -> None:
        super().__init__()
        self.inner, self.settings = module, settings


def test_recursive_wrap_walks_depth_first_and_counts_parameters(xla_target):
    from torch_xla.distributed.fsdp.wrap import (
        always_wrap_policy,
        lambda_auto_wrap_policy,
        recursive_wrap,
        size_based_auto_wrap_policy,
    )

    def tree():
        return nn.Sequential(
            nn.Linear(10, 10),
            nn.Sequential(nn.Linear(10, 2), nn.ReLU()),
            nn.MultiheadAttention(4, 2),
        )

    model, count = recursive_wrap(tree(), always_wrap_policy, _Box, [], [], tag=1)
    assert isinstance(model, _Box) and model.settings == {"tag": 1} and count == 110 + 22 + 80
    assert isinstance(model.inner[1], _Box) and isinstance(model.inner[1].inner[0], _Box)
    assert isinstance(model.inner[1].inner[1], _Box)  # a module without parameters too

    root = tree()
    model, count = recursive_wrap(root, always_wrap_policy, _Box, [], [], only_wrap_children=True)
    assert model is root and isinstance(root[0], _Box) and count == 212

    ignored = tree()
    _, count = recursive_wrap(
        ignored, always_wrap_policy, _Box, {ignored[0]}, set(ignored[0].parameters())
    )
    assert not isinstance(ignored[0], _Box) and count == 102

    picks = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.ReLU))
    picked = tree()
    recursive_wrap(picked, picks, _Box, [], [])
    assert isinstance(picked[1][1], _Box) and not isinstance(picked[1][0], _Box)

    # The attention block is a leaf the size policy does not look into (its defaults): it is
    # not wrapped on its own, its parameters fall to the wrapper of the enclosing module.
    assert nn.MultiheadAttention in size_based_auto_wrap_policy.FORCE_LEAF_MODULES
    assert nn.ModuleList in size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
    sized = tree()
    by_size = functools.partial(size_based_auto_wrap_policy, min_num_params=50)
    model, count = recursive_wrap(sized, by_size, _Box, [], [])
    assert isinstance(model, _Box) and count == 212
    assert isinstance(sized[0], _Box) and not isinstance(sized[2], _Box)
    assert not isinstance(sized[1], _Box)  # 22 parameters: below the threshold
