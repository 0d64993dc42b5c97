"""When data moved from the host under SPMD starts to report ``'{replicated}'``.

``.to('xla')`` under SPMD leaves a tensor unannotated (``''``). torch_xla 2.9 gives it a
replicated sharding when it is cloned or copied (at once, the copy inherits it), or at the
next step barrier once an op has used it; a factory's output or a pending value does not
count as moved data. A program that tests ``_get_xla_sharding_spec(t) == ''`` to decide
whether to shard a tensor (FSDPv2 does) depends on exactly this. Every expectation was read
from real torch_xla 2.9 on PJRT CPU (4 devices, ``xr.use_spmd()``).
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch

REPLICATED = "{replicated}"
ROWS = "{devices=[4,1]0,1,2,3}"


def _spmd(xla_target):
    """SPMD on a 4-device target, and torch_xla's sharding-spec query. (Called from the test
    body: the xla_cpu target runs the body, not its fixtures, in its own process.)"""
    import torch_xla
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    return torch_xla._XLAC._get_xla_sharding_spec


def _moved():
    return torch.randn(4, 4).to("xla")


def _sync():
    import torch_xla

    torch_xla.sync()


def test_clone_and_copy_replicate_moved_data_at_once(xla_target):
    spmd = _spmd(xla_target)
    src = _moved()
    copied = src.clone()
    assert (spmd(src), spmd(copied)) == (REPLICATED, REPLICATED)

    used = _moved()
    kept = used * 2
    assert spmd(used) == ""  # a use alone changes nothing before the barrier
    assert (spmd(used.clone()), spmd(used)) == (REPLICATED, REPLICATED)
    assert spmd(kept) == ""

    src, dst = _moved(), _moved()
    dst.copy_(src)
    assert (spmd(src), spmd(dst)) == (REPLICATED, REPLICATED)

    dst = torch.zeros(4, 4, device="xla")
    dst.copy_(_moved())
    assert spmd(dst) == REPLICATED


def test_pending_values_and_factory_outputs_are_not_moved_data(xla_target):
    spmd = _spmd(xla_target)
    pending = _moved() + 1
    assert (spmd(pending.clone()), spmd(pending)) == ("", "")
    made = torch.zeros(4, 4, device="xla")
    assert (spmd(made.clone()), spmd(made)) == ("", "")
    detached = _moved().detach()
    assert spmd(detached) == ""


def test_copy_takes_a_sharded_source_and_keeps_its_own_otherwise(xla_target):
    spmd = _spmd(xla_target)
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(4), (4, 1))
    src = _moved()
    xs.mark_sharding(src, mesh, (0, None))
    dst = torch.zeros(4, 4, device="xla")
    dst.copy_(src)
    assert spmd(dst) == ROWS

    dst = _moved()
    xs.mark_sharding(dst, mesh, (0, None))
    dst.copy_(_moved() + 1)  # an unannotated pending source
    assert spmd(dst) == ROWS
    dst.copy_(_moved())  # moved data: replicated, and the destination takes it
    assert spmd(dst) == REPLICATED


def test_the_barrier_replicates_moved_data_an_op_used(xla_target):
    spmd = _spmd(xla_target)
    used, dropped, read, untouched = _moved(), _moved(), _moved(), _moved()
    kept = used * 2
    del_me = dropped * 2
    del del_me  # its result is gone, but the barrier still syncs the used data
    read.sum().item()  # a read executes a graph but is no barrier
    assert (spmd(used), spmd(dropped), spmd(read)) == ("", "", "")
    _sync()
    assert (spmd(used), spmd(dropped), spmd(read), spmd(kept)) == (REPLICATED,) * 4
    assert spmd(untouched) == ""  # never used: still unannotated

    later = _moved()
    _sync()
    _ = later + 1
    _sync()
    assert spmd(later) == REPLICATED


def test_a_moved_model_after_a_step_and_its_deep_copy(xla_target):
    spmd = _spmd(xla_target)
    model = torch.nn.Linear(4, 4).to("xla")
    model(torch.ones(2, 4).to("xla")).sum().backward()
    _sync()
    assert (spmd(model.weight), spmd(model.bias), spmd(model.weight.grad)) == (REPLICATED,) * 3

    fresh = torch.nn.Linear(4, 4).to("xla")
    twin = copy.deepcopy(fresh)
    assert (spmd(fresh.weight), spmd(twin.weight)) == (REPLICATED, REPLICATED)


def _info(t):
    import torch_xla

    text = torch_xla._XLAC._get_xla_tensor_debug_info(t)
    return re.sub(r"^(TensorID|AliasID): \d+\n", "", text, flags=re.M)


def test_debug_text_of_moved_data_around_barriers(xla_target):
    _spmd(xla_target)
    device_data = (
        "IR: [UNKNOWN_SCALAR[]] xla::device_data, xla_shape=f32[4,4]{1,0}, "
        "dynamic_dims: (), device=SPMD:0\n"
    )
    head = "XLATensor {\nDevice: SPMD:0\nXLA Shape: f32[4,4]\n"
    sharded = (
        "XLAShardedData: \n  Data Device: SPMD:0\n  Data Shape: f32[4,4]\n"
        "  OpSharding: {replicated}\n  NumShards: 4\n"
    )
    cloned = _moved()
    cloned.clone()
    assert _info(cloned) == (
        head + "ShardingSpec: {replicated}\n" + device_data + "XLAData: None\n"
        "Tensor on host: None\n}\n"
    )
    used = _moved()
    _ = used * 2
    _sync()
    assert _info(used) == (
        head + "ShardingSpec: {replicated}\nIR: None\n" + sharded + "Tensor on host: None\n}\n"
    )
    # A barrier uploads data still waiting on the host, and torch_xla keeps the host copy.
    waited = _moved()
    _sync()
    assert _info(waited) == (
        head + "ShardingSpec: None\nIR: None\n" + sharded + "Tensor on host: with size [4, 4]\n}\n"
    )
    _ = waited + 1
    assert _info(waited) == (
        head
        + "ShardingSpec: None\n"
        + device_data
        + sharded
        + "Tensor on host: with size [4, 4]\n}\n"
    )
    _sync()
    assert _info(waited) == (
        head + "ShardingSpec: {replicated}\n" + device_data + sharded
        + "Tensor on host: with size [4, 4]\n}\n"
    )  # fmt: skip


def test_eager_mode_runs_the_transfer_without_annotating_it(xla_target):
    """In eager mode a ``.to('xla')`` (an ``empty`` run at once, then the transfer) and a
    bare ``empty`` report ``''``, as moved data does lazily, and an eager op on the data
    leaves it so until the barrier; a filled factory and an op's result run replicated."""
    import torch_xla

    spmd = _spmd(xla_target)
    torch_xla.experimental.eager_mode(True)
    try:
        moved = _moved()
        empty = torch.empty(4, 4, device="xla")
        filled = torch.ones(4, 4, device="xla")
        assert (spmd(moved), spmd(empty), spmd(filled)) == ("", "", REPLICATED)
        result = moved * 2
        assert (spmd(moved), spmd(result)) == ("", REPLICATED)
        _sync()
        assert spmd(moved) == REPLICATED
    finally:
        torch_xla.experimental.eager_mode(False)
