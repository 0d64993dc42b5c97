"""``_XLAC._get_xla_tensors_hlo``: graphs of device data (the parameters with their
shardings under SPMD, the returned tuple, the instruction ids, and the empty text for tensors
torch_xla holds as plain data) and graphs of pending ops (instruction ids in lowering order,
HLO post-order, scalars as constants or parameters, layouts, custom-calls for sharding).
Every expected text was read from real torch_xla 2.9 on PJRT CPU (4 devices), at the mat-mul
precision each test names: torch_xla writes the precision into a dot when it lowers the graph."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

# The texts below are the default precision's (a dot without operand_precision).
pytestmark = pytest.mark.mat_mul_precision("default")


def _hlo(tensors):
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(tensors)


def _module(params: list[tuple[str, str, str]], outputs: list[int]) -> str:
    """The module text for parameters (shape, layout, sharding suffix) returned in order."""
    n = len(params)
    full = [shape + lay for shape, lay, _ in params]
    outs = ", ".join(full[i] for i in outputs)
    signature = ", ".join(f"p{i}.{i + 1}: {p[0]}" for i, p in enumerate(params))
    body = "".join(
        f"  %p{i}.{i + 1} = {full[i]} parameter({i}){p[2]}\n" for i, p in enumerate(params)
    )
    operands = ", ".join(f"{full[i]} %p{i}.{i + 1}" for i in outputs)
    return (
        f"HloModule IrToHlo.{n + 2}, entry_computation_layout={{({', '.join(full)})->({outs})}}"
        f"\n\nENTRY %IrToHlo.{n + 2} ({signature}) -> "
        f"({', '.join(params[i][0] for i in outputs)}) {{\n{body}"
        f"  ROOT %tuple.{n + 1} = ({outs}) tuple({operands})\n}}\n\n"
    )


def test_moved_data_until_the_step_barrier(xla_target):
    import torch_xla

    a = torch.randn(4, 2).to("xla")
    b = torch.ones(3, dtype=torch.int32).to("xla")
    c = torch.tensor(2.0).to("xla")
    assert _hlo([a, b, c]) == _module(
        [("f32[4,2]", "{1,0}", ""), ("s32[3]", "{0}", ""), ("f32[]", "", "")], [0, 1, 2]
    )
    torch_xla.sync()
    assert _hlo([a, b, c]) == ""  # plain device data now: no IR value to lower


def test_sharded_data_under_spmd(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    a = torch.randn(4, 2).to("xla")
    b = torch.ones(3, dtype=torch.int32).to("xla")
    c = torch.tensor(2.0).to("xla")
    assert _hlo([a]) == ""  # still on the host: the upload waits for a sharding or a use
    mesh = xs.Mesh(np.arange(4), (4, 1))
    xs.mark_sharding(a, mesh, (0, None))
    xs.mark_sharding(b, mesh, (0,))
    rows = ("f32[4,2]", "{1,0}", ", sharding={devices=[4,1]0,1,2,3}")
    ints = ("s32[3]", "{0}", ", sharding={devices=[4]0,1,2,3}")
    assert _hlo([a, c]) == _module([rows], [0])
    # One parameter per buffer, returned as often as it is asked for.
    assert _hlo([b, a, a]) == _module([ints, rows], [0, 1, 1])
    torch_xla.sync()
    assert _hlo([a]) == _module([rows], [0])  # sharded data keeps its IR value
    d = torch.randn(2, 2).to("xla")
    _ = d * 3  # a use uploads it, replicated
    assert _hlo([d]) == _module([("f32[2,2]", "{1,0}", ", sharding={replicated}")], [0])


def _text(*lines: str) -> str:
    """A module's text from its lines, as torch_xla ends it."""
    return "\n".join(lines) + "\n\n"


# Pending ops. Every expected text below is what real torch_xla 2.9 printed for the program.
def test_arithmetic_with_tensors_and_python_scalars(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    torch.manual_seed(0)
    a = torch.randn(1, 4).to("xla")
    b = torch.randn(1, 4).to("xla")
    # alpha (1) is a constant multiplying the other operand; ids follow lowering order.
    assert _hlo([a + b]) == _text(
        "HloModule IrToHlo.8, entry_computation_layout={(f32[1,4]{1,0}, "
        "f32[1,4]{1,0})->(f32[1,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.8 (p0.2: f32[1,4], p1.3: f32[1,4]) -> (f32[1,4]) {",
        "  %p1.3 = f32[1,4]{1,0} parameter(1)",
        "  %p0.2 = f32[1,4]{1,0} parameter(0)",
        "  %constant.1 = f32[] constant(1)",
        "  %broadcast.4 = f32[1,4]{1,0} broadcast(f32[] %constant.1), dimensions={}",
        "  %multiply.5 = f32[1,4]{1,0} multiply(f32[1,4]{1,0} %p0.2, f32[1,4]{1,0} %broadcast.4)",
        "  %add.6 = f32[1,4]{1,0} add(f32[1,4]{1,0} %p1.3, f32[1,4]{1,0} %multiply.5)",
        "  ROOT %tuple.7 = (f32[1,4]{1,0}) tuple(f32[1,4]{1,0} %add.6)",
        "}",
    )
    # 3 is one f32[] parameter for both uses, 1 (alpha) a constant per use; 2 - a is rsub.
    assert _hlo([a * 3 + 3, 2 - a]) == _text(
        "HloModule IrToHlo.16, entry_computation_layout={(f32[], f32[1,4]{1,0}, "
        "f32[])->(f32[1,4]{1,0}, f32[1,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.16 (p0.2: f32[], p1.3: f32[1,4], p2.10: f32[]) -> (f32[1,4], f32[1,4]) {",
        "  %p1.3 = f32[1,4]{1,0} parameter(1)",
        "  %p0.2 = f32[] parameter(0)",
        "  %broadcast.4 = f32[1,4]{1,0} broadcast(f32[] %p0.2), dimensions={}",
        "  %multiply.5 = f32[1,4]{1,0} multiply(f32[1,4]{1,0} %p1.3, f32[1,4]{1,0} %broadcast.4)",
        "  %constant.1 = f32[] constant(1)",
        "  %multiply.6 = f32[] multiply(f32[] %p0.2, f32[] %constant.1)",
        "  %broadcast.7 = f32[1,4]{1,0} broadcast(f32[] %multiply.6), dimensions={}",
        "  %add.8 = f32[1,4]{1,0} add(f32[1,4]{1,0} %multiply.5, f32[1,4]{1,0} %broadcast.7)",
        "  %p2.10 = f32[] parameter(2)",
        "  %broadcast.13 = f32[1,4]{1,0} broadcast(f32[] %p2.10), dimensions={}",
        "  %constant.9 = f32[] constant(1)",
        "  %broadcast.11 = f32[1,4]{1,0} broadcast(f32[] %constant.9), dimensions={}",
        "  %multiply.12 = f32[1,4]{1,0} multiply(f32[1,4]{1,0} %p1.3, f32[1,4]{1,0} %broadcast.11)",
        "  %subtract.14 = f32[1,4]{1,0} subtract(f32[1,4]{1,0} %broadcast.13, f32[1,4]{1,0} "
        "%multiply.12)",
        "  ROOT %tuple.15 = (f32[1,4]{1,0}, f32[1,4]{1,0}) tuple(f32[1,4]{1,0} %add.8, "
        "f32[1,4]{1,0} %subtract.14)",
        "}",
    )


@pytest.mark.parametrize("level", ["high", "highest"])
def test_a_dot_carries_the_precision_in_force_when_it_is_lowered(xla_target, level):
    import torch_xla

    torch.manual_seed(0)
    a, b = torch.randn(2, 3).to("xla"), torch.randn(3, 2).to("xla")
    product = a @ b
    dot = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    assert f"{dot}\n" in _hlo([product])
    with warnings.catch_warnings():
        # After tracing (torch_xla reads the level when it lowers); the simulator warns that
        # its values were computed at the earlier level.
        warnings.simplefilter("ignore")
        torch_xla._XLAC._xla_set_mat_mul_precision(level)
    assert f"{dot}, operand_precision={{{level},{level}}}\n" in _hlo([product])


def test_matmul_transpose_reduce_and_reshapes(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    torch.manual_seed(0)
    c = torch.randn(2, 3).to("xla")
    a = torch.randn(1, 4).to("xla")
    # The transpose keeps its operand's memory order: layout {0,1}.
    assert _hlo([c.t() @ c]) == _text(
        "HloModule IrToHlo.5, entry_computation_layout={(f32[2,3]{1,0})->(f32[3,3]{1,0})}",
        "",
        "ENTRY %IrToHlo.5 (p0.1: f32[2,3]) -> (f32[3,3]) {",
        "  %p0.1 = f32[2,3]{1,0} parameter(0)",
        "  %transpose.2 = f32[3,2]{0,1} transpose(f32[2,3]{1,0} %p0.1), dimensions={1,0}",
        "  %dot.3 = f32[3,3]{1,0} dot(f32[3,2]{0,1} %transpose.2, f32[2,3]{1,0} %p0.1), "
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "  ROOT %tuple.4 = (f32[3,3]{1,0}) tuple(f32[3,3]{1,0} %dot.3)",
        "}",
    )
    # A sum reduces with an add computation; its unused element count stays in the text.
    assert _hlo([c.sum(1), c.relu().view(6)]) == _text(
        "HloModule IrToHlo.14, entry_computation_layout={(f32[2,3]{1,0})->(f32[2]{0}, f32[6]{0})}",
        "",
        "%AddComputation.4 (x.5: f32[], y.6: f32[]) -> f32[] {",
        "  %x.5 = f32[] parameter(0)",
        "  %y.6 = f32[] parameter(1)",
        "  ROOT %add.7 = f32[] add(f32[] %x.5, f32[] %y.6)",
        "}",
        "",
        "ENTRY %IrToHlo.14 (p0.1: f32[2,3]) -> (f32[2], f32[6]) {",
        "  %constant.3 = s32[] constant(3)",
        "  %p0.1 = f32[2,3]{1,0} parameter(0)",
        "  %constant.2 = f32[] constant(0)",
        "  %reduce.8 = f32[2]{0} reduce(f32[2,3]{1,0} %p0.1, f32[] %constant.2), "
        "dimensions={1}, to_apply=%AddComputation.4",
        "  %constant.9 = f32[] constant(0)",
        "  %broadcast.10 = f32[2,3]{1,0} broadcast(f32[] %constant.9), dimensions={}",
        "  %maximum.11 = f32[2,3]{1,0} maximum(f32[2,3]{1,0} %p0.1, f32[2,3]{1,0} %broadcast.10)",
        "  %reshape.12 = f32[6]{0} reshape(f32[2,3]{1,0} %maximum.11)",
        "  ROOT %tuple.13 = (f32[2]{0}, f32[6]{0}) tuple(f32[2]{0} %reduce.8, f32[6]{0} "
        "%reshape.12)",
        "}",
    )
    assert _hlo([a.expand(3, 4)]) == _text(
        "HloModule IrToHlo.6, entry_computation_layout={(f32[1,4]{1,0})->(f32[3,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.6 (p0.1: f32[1,4]) -> (f32[3,4]) {",
        "  %p0.1 = f32[1,4]{1,0} parameter(0)",
        "  %broadcast.2 = f32[1,4]{1,0} broadcast(f32[1,4]{1,0} %p0.1), dimensions={0,1}",
        "  %reshape.3 = f32[4]{0} reshape(f32[1,4]{1,0} %broadcast.2)",
        "  %broadcast.4 = f32[3,4]{1,0} broadcast(f32[4]{0} %reshape.3), dimensions={1}",
        "  ROOT %tuple.5 = (f32[3,4]{1,0}) tuple(f32[3,4]{1,0} %broadcast.4)",
        "}",
    )


@pytest.mark.parametrize(
    ("dtype", "name"),
    [(torch.float8_e5m2, "f8e5m2"), (torch.float8_e4m3fn, "f8e4m3fn"), (torch.bfloat16, "bf16")],
)
def test_a_dot_of_narrow_floats_keeps_their_type(xla_target, dtype, name):
    # pytorch/xla's TPU CI (test_fp8.py) looks for the float8 types around the dot.
    x = torch.randn(3, 5).to(dtype).to("xla")
    w = torch.randn(5, 8).to(dtype).to("xla")
    assert _hlo([x @ w]) == _text(
        f"HloModule IrToHlo.5, entry_computation_layout={{({name}[5,8]{{1,0}}, "
        f"{name}[3,5]{{1,0}})->({name}[3,8]{{1,0}})}}",
        "",
        f"ENTRY %IrToHlo.5 (p0.1: {name}[5,8], p1.2: {name}[3,5]) -> ({name}[3,8]) {{",
        f"  %p1.2 = {name}[3,5]{{1,0}} parameter(1)",
        f"  %p0.1 = {name}[5,8]{{1,0}} parameter(0)",
        f"  %dot.3 = {name}[3,8]{{1,0}} dot({name}[3,5]{{1,0}} %p1.2, {name}[5,8]{{1,0}} "
        "%p0.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        f"  ROOT %tuple.4 = ({name}[3,8]{{1,0}}) tuple({name}[3,8]{{1,0}} %dot.3)",
        "}",
    )


def _spmd_mesh(xla_target):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    return xs.Mesh(np.arange(4), (1, 4))


def test_custom_sharding_nodes(xla_target):
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    x = torch.ones(2, 2).to("xla")
    xs.mark_sharding(x, mesh, (0, 1))
    x.add_(1)  # an in-place update keeps the tensor's sharding through a custom-call
    assert _hlo([x]) == _text(
        "HloModule IrToHlo.9, entry_computation_layout={(f32[2,2]{1,0})->(f32[2,2]{1,0})}",
        "",
        "ENTRY %IrToHlo.9 (p0.3: f32[2,2]) -> (f32[2,2]) {",
        "  %p0.3 = f32[2,2]{1,0} parameter(0), sharding={devices=[1,4]0,1,2,3}",
        "  %constant.2 = f32[] constant(1)",
        "  %constant.1 = f32[] constant(1)",
        "  %multiply.4 = f32[] multiply(f32[] %constant.2, f32[] %constant.1)",
        "  %broadcast.5 = f32[2,2]{1,0} broadcast(f32[] %multiply.4), dimensions={}",
        "  %add.6 = f32[2,2]{1,0} add(f32[2,2]{1,0} %p0.3, f32[2,2]{1,0} %broadcast.5)",
        "  %custom-call.7 = f32[2,2]{1,0} custom-call(f32[2,2]{1,0} %add.6), "
        'custom_call_target="Sharding", sharding={devices=[1,4]0,1,2,3}',
        "  ROOT %tuple.8 = (f32[2,2]{1,0}) tuple(f32[2,2]{1,0} %custom-call.7)",
        "}",
    )
    a = torch.randn(1, 4).to("xla") + torch.randn(1, 4).to("xla")
    a = xs.mark_sharding(a, mesh, (0, 1))
    a += 0  # through XLAShardedTensor: no custom-call after the add
    assert _hlo([a.global_tensor]) == _text(
        "HloModule IrToHlo.14, entry_computation_layout={(f32[1,4]{1,0}, "
        "f32[1,4]{1,0})->(f32[1,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.14 (p0.4: f32[1,4], p1.5: f32[1,4]) -> (f32[1,4]) {",
        "  %p1.5 = f32[1,4]{1,0} parameter(1), sharding={replicated}",
        "  %p0.4 = f32[1,4]{1,0} parameter(0), sharding={replicated}",
        "  %constant.3 = f32[] constant(1)",
        "  %broadcast.6 = f32[1,4]{1,0} broadcast(f32[] %constant.3), dimensions={}",
        "  %multiply.7 = f32[1,4]{1,0} multiply(f32[1,4]{1,0} %p0.4, f32[1,4]{1,0} %broadcast.6)",
        "  %add.8 = f32[1,4]{1,0} add(f32[1,4]{1,0} %p1.5, f32[1,4]{1,0} %multiply.7)",
        "  %custom-call.9 = f32[1,4]{1,0} custom-call(f32[1,4]{1,0} %add.8), "
        'custom_call_target="Sharding", sharding={devices=[1,4]0,1,2,3}',
        "  %constant.2 = f32[] constant(0)",
        "  %constant.1 = f32[] constant(1)",
        "  %multiply.10 = f32[] multiply(f32[] %constant.2, f32[] %constant.1)",
        "  %broadcast.11 = f32[1,4]{1,0} broadcast(f32[] %multiply.10), dimensions={}",
        "  %add.12 = f32[1,4]{1,0} add(f32[1,4]{1,0} %custom-call.9, f32[1,4]{1,0} %broadcast.11)",
        "  ROOT %tuple.13 = (f32[1,4]{1,0}) tuple(f32[1,4]{1,0} %add.12)",
        "}",
    )
    d = torch.randn(2, 4).to("xla")
    xs.mark_sharding(d, mesh, (0, 1))
    xs.annotate_custom_sharding(d, mesh, (1, 0))
    assert _hlo([d]) == _text(
        "HloModule IrToHlo.4, entry_computation_layout={(f32[2,4]{1,0})->(f32[2,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.4 (p0.1: f32[2,4]) -> (f32[2,4]) {",
        "  %p0.1 = f32[2,4]{1,0} parameter(0), sharding={devices=[1,4]0,1,2,3}",
        "  %custom-call.2 = f32[2,4]{1,0} custom-call(f32[2,4]{1,0} %p0.1), "
        'custom_call_target="Sharding", sharding={devices=[4,1]0,1,2,3}',
        "  ROOT %tuple.3 = (f32[2,4]{1,0}) tuple(f32[2,4]{1,0} %custom-call.2)",
        "}",
    )


def test_manual_sharding_custom_calls(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    w = torch.zeros(8, 8).to("xla")
    w += 1
    wt = xs.mark_sharding(w, mesh, (0, 1))
    xs.clear_sharding(wt)  # leaves the custom-call, without its sharding
    wt = xs._mark_manual_sharding(wt)
    replicated = torch_xla._XLAC.OpSharding([], [], [], xs.ShardingType.REPLICATED)
    full = torch_xla._XLAC._spmd_shard_to_full_shape(wt.global_tensor, replicated, w.shape, w.dtype)
    z = torch.zeros(8, 8).to("xla")
    zt = xs.mark_sharding(z, mesh, (0, 1))
    shards = torch_xla._XLAC._spmd_full_to_shard_shape(zt.global_tensor)
    assert _hlo([shards, full]) == _text(
        "HloModule IrToHlo.13, entry_computation_layout={(f32[8,8]{1,0}, "
        "f32[8,8]{1,0})->(f32[8,2]{1,0}, f32[8,8]{1,0})}",
        "",
        "ENTRY %IrToHlo.13 (p0.1: f32[8,8], p1.5: f32[8,8]) -> (f32[8,2], f32[8,8]) {",
        "  %p0.1 = f32[8,8]{1,0} parameter(0), sharding={devices=[1,4]0,1,2,3}",
        "  %custom-call.2 = f32[8,2]{1,0} custom-call(f32[8,8]{1,0} %p0.1), "
        'custom_call_target="SPMDFullToShardShape", sharding={manual}',
        "  %p1.5 = f32[8,8]{1,0} parameter(1), sharding={replicated}",
        "  %constant.4 = f32[] constant(1)",
        "  %constant.3 = f32[] constant(1)",
        "  %multiply.6 = f32[] multiply(f32[] %constant.4, f32[] %constant.3)",
        "  %broadcast.7 = f32[8,8]{1,0} broadcast(f32[] %multiply.6), dimensions={}",
        "  %add.8 = f32[8,8]{1,0} add(f32[8,8]{1,0} %p1.5, f32[8,8]{1,0} %broadcast.7)",
        "  %custom-call.9 = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %add.8), "
        'custom_call_target="Sharding"',
        "  %custom-call.10 = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %custom-call.9), "
        'custom_call_target="Sharding", sharding={manual}',
        "  %custom-call.11 = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %custom-call.10), "
        'custom_call_target="SPMDShardToFullShape", sharding={replicated}',
        "  ROOT %tuple.12 = (f32[8,2]{1,0}, f32[8,8]{1,0}) tuple(f32[8,2]{1,0} "
        "%custom-call.2, f32[8,8]{1,0} %custom-call.11)",
        "}",
    )


def test_spmd_collectives_of_a_manual_region(xla_target):
    # The SPMD all-reduce / reduce-scatter pytorch/xla's TPU CI (test_xla_sharding.py) checks:
    # values and text on 4 devices.
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    xs.set_global_mesh(_spmd_mesh(xla_target))
    x = xs.enable_manual_sharding(torch.ones(8, 8).to("xla"), (None, None)).global_tensor
    x = torch_xla._XLAC._xla_spmd_all_reduce(xm.REDUCE_SUM, x, 0.25, [[0, 1, 2, 3]])
    x = xs.disable_manual_sharding(x, (None, None), x.shape).global_tensor
    assert _hlo([x]) == _text(
        "HloModule IrToHlo.14, entry_computation_layout={(f32[8,8]{1,0})->(f32[8,8]{1,0})}",
        "",
        "%AddComputation.3 (x.4: f32[], y.5: f32[]) -> f32[] {",
        "  %x.4 = f32[] parameter(0)",
        "  %y.5 = f32[] parameter(1)",
        "  ROOT %add.6 = f32[] add(f32[] %x.4, f32[] %y.5)",
        "}",
        "",
        "ENTRY %IrToHlo.14 (p0.1: f32[8,8]) -> (f32[8,8]) {",
        "  %p0.1 = f32[8,8]{1,0} parameter(0), sharding={replicated}",
        "  %custom-call.2 = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %p0.1), "
        'custom_call_target="SPMDFullToShardShape", sharding={manual}',
        "  %all-reduce.7 = f32[8,8]{1,0} all-reduce(f32[8,8]{1,0} %custom-call.2), "
        "channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, "
        "to_apply=%AddComputation.3",
        "  %constant.8 = f32[] constant(0.25)",
        "  %broadcast.9 = f32[8,8]{1,0} broadcast(f32[] %constant.8), dimensions={}",
        "  %multiply.10 = f32[8,8]{1,0} multiply(f32[8,8]{1,0} %all-reduce.7, "
        "f32[8,8]{1,0} %broadcast.9)",
        "  %custom-call.11 = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %multiply.10), "
        'custom_call_target="Sharding", sharding={manual}',
        "  %custom-call.12 = f32[8,8]{1,0} custom-call(f32[8,8]{1,0} %custom-call.11), "
        'custom_call_target="SPMDShardToFullShape", sharding={replicated}',
        "  ROOT %tuple.13 = (f32[8,8]{1,0}) tuple(f32[8,8]{1,0} %custom-call.12)",
        "}",
    )
    assert torch.equal(x.cpu(), torch.ones(8, 8))
    y = xs.enable_manual_sharding(torch.ones(8, 8).to("xla"), (None, None)).global_tensor
    y = torch_xla._XLAC._xla_spmd_reduce_scatter(xm.REDUCE_SUM, y, 1.0, -1, 4, [[0, 1, 2, 3]])
    y = xs.disable_manual_sharding(y, (None, None), y.shape).global_tensor
    text = _hlo([y])
    assert (
        "%reduce-scatter.7 = f32[8,2]{1,0} reduce-scatter(f32[8,8]{1,0} %custom-call.2), "
        "channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={1}, "
        "to_apply=%AddComputation.3"
    ) in text
    assert torch.equal(y.cpu(), torch.full((8, 2), 4.0))


def test_gradient_of_a_sharded_intermediate(xla_target):
    from torch_xla.distributed.spmd.xla_sharding import MarkShardingFunction

    mesh = _spmd_mesh(xla_target)
    v = torch.randn(4, 4, requires_grad=True).to("xla")
    p = v @ v
    p.retain_grad()
    MarkShardingFunction.apply(p, mesh, (0, 1)).sum().backward()
    # The seed gradient of the scalar loss, expanded to p's shape, under p's sharding.
    assert _hlo([p.grad]) == _text(
        "HloModule IrToHlo.9, entry_computation_layout={()->(f32[4,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.9 () -> (f32[4,4]) {",
        "  %constant.1 = f32[] constant(1)",
        "  %broadcast.2 = f32[] broadcast(f32[] %constant.1), dimensions={}",
        "  %reshape.3 = f32[1,1]{1,0} reshape(f32[] %broadcast.2)",
        "  %broadcast.4 = f32[1,1]{1,0} broadcast(f32[1,1]{1,0} %reshape.3), dimensions={0,1}",
        "  %reshape.5 = f32[] reshape(f32[1,1]{1,0} %broadcast.4)",
        "  %broadcast.6 = f32[4,4]{1,0} broadcast(f32[] %reshape.5), dimensions={}",
        "  %custom-call.7 = f32[4,4]{1,0} custom-call(f32[4,4]{1,0} %broadcast.6), "
        'custom_call_target="Sharding", sharding={devices=[1,4]0,1,2,3}',
        "  ROOT %tuple.8 = (f32[4,4]{1,0}) tuple(f32[4,4]{1,0} %custom-call.7)",
        "}",
    )


def test_max_over_a_dim(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    x = torch.randn(4, 6).to("xla")
    values, indices = torch.max(x * 2, 0)
    # One IR node for both outputs: both reduces are in the module whichever is asked for,
    # and the index reducer's ids start 12 after the iota.
    assert _hlo([indices, values]) == _text(
        "HloModule IrToHlo.43, entry_computation_layout={(f32[], f32[4,6]{1,0})->(s64[6]{0}, "
        "f32[6]{0})}",
        "",
        "%MaxComputation.7 (x.8: f32[], y.9: f32[]) -> f32[] {",
        "  %x.8 = f32[] parameter(0)",
        "  %y.9 = f32[] parameter(1)",
        "  ROOT %maximum.10 = f32[] maximum(f32[] %x.8, f32[] %y.9)",
        "}",
        "",
        "%minmax_func.27 (lhs_value.28: f32[], lhs_index.29: s32[], rhs_value.30: f32[], "
        "rhs_index.31: s32[]) -> (f32[], s32[]) {",
        "  %lhs_value.28 = f32[] parameter(0)",
        "  %rhs_value.30 = f32[] parameter(2)",
        "  %compare.32 = pred[] compare(f32[] %lhs_value.28, f32[] %rhs_value.30), direction=GE",
        "  %select.33 = f32[] select(pred[] %compare.32, f32[] %lhs_value.28, f32[] %rhs_value.30)",
        "  %compare.35 = pred[] compare(f32[] %lhs_value.28, f32[] %rhs_value.30), direction=EQ",
        "  %lhs_index.29 = s32[] parameter(1)",
        "  %rhs_index.31 = s32[] parameter(3)",
        "  %minimum.36 = s32[] minimum(s32[] %lhs_index.29, s32[] %rhs_index.31)",
        "  %select.34 = s32[] select(pred[] %compare.32, s32[] %lhs_index.29, s32[] %rhs_index.31)",
        "  %select.37 = s32[] select(pred[] %compare.35, s32[] %minimum.36, s32[] %select.34)",
        "  ROOT %tuple.38 = (f32[], s32[]) tuple(f32[] %select.33, s32[] %select.37)",
        "}",
        "",
        "ENTRY %IrToHlo.43 (p0.1: f32[], p1.2: f32[4,6]) -> (s64[6], f32[6]) {",
        "  %constant.6 = s32[] constant(4)",
        "  %p1.2 = f32[4,6]{1,0} parameter(1)",
        "  %p0.1 = f32[] parameter(0)",
        "  %broadcast.3 = f32[4,6]{1,0} broadcast(f32[] %p0.1), dimensions={}",
        "  %multiply.4 = f32[4,6]{1,0} multiply(f32[4,6]{1,0} %p1.2, f32[4,6]{1,0} %broadcast.3)",
        "  %iota.14 = s32[4,6]{1,0} iota(), iota_dimension=0",
        "  %constant.12 = f32[] constant(-inf)",
        "  %constant.13 = s32[] constant(0)",
        "  %reduce.39 = (f32[6]{0}, s32[6]{0}) reduce(f32[4,6]{1,0} %multiply.4, "
        "s32[4,6]{1,0} %iota.14, f32[] %constant.12, s32[] %constant.13), dimensions={0}, "
        "to_apply=%minmax_func.27",
        "  %get-tuple-element.40 = s32[6]{0} get-tuple-element((f32[6]{0}, s32[6]{0}) "
        "%reduce.39), index=1",
        "  %convert.41 = s64[6]{0} convert(s32[6]{0} %get-tuple-element.40)",
        "  %constant.5 = f32[] constant(-3.40282347e+38)",
        "  %reduce.11 = f32[6]{0} reduce(f32[4,6]{1,0} %multiply.4, f32[] %constant.5), "
        "dimensions={0}, to_apply=%MaxComputation.7",
        "  ROOT %tuple.42 = (s64[6]{0}, f32[6]{0}) tuple(s64[6]{0} %convert.41, f32[6]{0} "
        "%reduce.11)",
        "}",
    )


def test_linear_layer_and_optimization_barrier(xla_target):
    import torch_xla.core.xla_model as xm

    torch.manual_seed(0)
    a = torch.randn(2, 3).to("xla")
    b = torch.randn(3).to("xla")
    x = a.t() * 2
    y = b.sum(0, keepdim=True).view(1)
    z = a.view(2, 3)  # the same sizes: no reshape
    xm.optimization_barrier_([x, y, z])
    # One tuple through the barrier; each tensor's value is its element of the result.
    assert _hlo([x, z]) == _text(
        "HloModule IrToHlo.21, entry_computation_layout={(f32[2,3]{1,0}, f32[3]{0}, "
        "f32[])->(f32[3,2]{1,0}, f32[2,3]{1,0})}",
        "",
        "%AddComputation.5 (x.6: f32[], y.7: f32[]) -> f32[] {",
        "  %x.6 = f32[] parameter(0)",
        "  %y.7 = f32[] parameter(1)",
        "  ROOT %add.8 = f32[] add(f32[] %x.6, f32[] %y.7)",
        "}",
        "",
        "ENTRY %IrToHlo.21 (p0.1: f32[2,3], p1.2: f32[3], p2.11: f32[]) -> (f32[3,2], f32[2,3]) {",
        "  %constant.4 = s32[] constant(3)",
        "  %p0.1 = f32[2,3]{1,0} parameter(0)",
        "  %transpose.12 = f32[3,2]{0,1} transpose(f32[2,3]{1,0} %p0.1), dimensions={1,0}",
        "  %p2.11 = f32[] parameter(2)",
        "  %broadcast.13 = f32[3,2]{1,0} broadcast(f32[] %p2.11), dimensions={}",
        "  %multiply.14 = f32[3,2]{1,0} multiply(f32[3,2]{0,1} %transpose.12, f32[3,2]{1,0} "
        "%broadcast.13)",
        "  %p1.2 = f32[3]{0} parameter(1)",
        "  %constant.3 = f32[] constant(0)",
        "  %reduce.9 = f32[] reduce(f32[3]{0} %p1.2, f32[] %constant.3), dimensions={0}, "
        "to_apply=%AddComputation.5",
        "  %reshape.10 = f32[1]{0} reshape(f32[] %reduce.9)",
        "  %tuple.15 = (f32[3,2]{1,0}, f32[1]{0}, f32[2,3]{1,0}) tuple(f32[3,2]{1,0} "
        "%multiply.14, f32[1]{0} %reshape.10, f32[2,3]{1,0} %p0.1)",
        "  %opt-barrier.16 = (f32[3,2]{1,0}, f32[1]{0}, f32[2,3]{1,0}) "
        "opt-barrier((f32[3,2]{1,0}, f32[1]{0}, f32[2,3]{1,0}) %tuple.15)",
        "  %get-tuple-element.18 = f32[1]{0} get-tuple-element((f32[3,2]{1,0}, f32[1]{0}, "
        "f32[2,3]{1,0}) %opt-barrier.16), index=1",
        "  %get-tuple-element.17 = f32[3,2]{1,0} get-tuple-element((f32[3,2]{1,0}, "
        "f32[1]{0}, f32[2,3]{1,0}) %opt-barrier.16), index=0",
        "  %get-tuple-element.19 = f32[2,3]{1,0} get-tuple-element((f32[3,2]{1,0}, "
        "f32[1]{0}, f32[2,3]{1,0}) %opt-barrier.16), index=2",
        "  ROOT %tuple.20 = (f32[3,2]{1,0}, f32[2,3]{1,0}) tuple(f32[3,2]{1,0} "
        "%get-tuple-element.17, f32[2,3]{1,0} %get-tuple-element.19)",
        "}",
    )
    linear = torch.nn.Linear(3, 5).to("xla")
    # addmm: the dot, then the bias expanded to the output's shape and added.
    assert _hlo([linear(a)]) == _text(
        "HloModule IrToHlo.12, entry_computation_layout={(f32[5]{0}, f32[5,3]{1,0}, "
        "f32[2,3]{1,0})->(f32[2,5]{1,0})}",
        "",
        "ENTRY %IrToHlo.12 (p0.1: f32[5], p1.2: f32[5,3], p2.4: f32[2,3]) -> (f32[2,5]) {",
        "  %p2.4 = f32[2,3]{1,0} parameter(2)",
        "  %p1.2 = f32[5,3]{1,0} parameter(1)",
        "  %transpose.3 = f32[3,5]{0,1} transpose(f32[5,3]{1,0} %p1.2), dimensions={1,0}",
        "  %dot.5 = f32[2,5]{1,0} dot(f32[2,3]{1,0} %p2.4, f32[3,5]{0,1} %transpose.3), "
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "  %p0.1 = f32[5]{0} parameter(0)",
        "  %reshape.6 = f32[1,5]{1,0} reshape(f32[5]{0} %p0.1)",
        "  %broadcast.7 = f32[1,5]{1,0} broadcast(f32[1,5]{1,0} %reshape.6), dimensions={0,1}",
        "  %reshape.8 = f32[5]{0} reshape(f32[1,5]{1,0} %broadcast.7)",
        "  %broadcast.9 = f32[2,5]{1,0} broadcast(f32[5]{0} %reshape.8), dimensions={1}",
        "  %add.10 = f32[2,5]{1,0} add(f32[2,5]{1,0} %dot.5, f32[2,5]{1,0} %broadcast.9)",
        "  ROOT %tuple.11 = (f32[2,5]{1,0}) tuple(f32[2,5]{1,0} %add.10)",
        "}",
    )


def test_unary_elementwise_ops_keep_their_operand_layout(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    x = torch.rand(2, 3).to("xla")
    assert _hlo([x.t().sin().exp(), (-x).sigmoid()]) == _text(
        "HloModule IrToHlo.8, entry_computation_layout={(f32[2,3]{1,0})->(f32[3,2]{0,1}, "
        "f32[2,3]{1,0})}",
        "",
        "ENTRY %IrToHlo.8 (p0.1: f32[2,3]) -> (f32[3,2], f32[2,3]) {",
        "  %p0.1 = f32[2,3]{1,0} parameter(0)",
        "  %transpose.2 = f32[3,2]{0,1} transpose(f32[2,3]{1,0} %p0.1), dimensions={1,0}",
        "  %sine.3 = f32[3,2]{0,1} sine(f32[3,2]{0,1} %transpose.2)",
        "  %exponential.4 = f32[3,2]{0,1} exponential(f32[3,2]{0,1} %sine.3)",
        "  %negate.5 = f32[2,3]{1,0} negate(f32[2,3]{1,0} %p0.1)",
        "  %logistic.6 = f32[2,3]{1,0} logistic(f32[2,3]{1,0} %negate.5)",
        "  ROOT %tuple.7 = (f32[3,2]{0,1}, f32[2,3]{1,0}) tuple(f32[3,2]{0,1} %exponential.4, "
        "f32[2,3]{1,0} %logistic.6)",
        "}",
    )


# select, stack and mean: the texts are real torch_xla 2.9's on PJRT CPU for these programs.
def test_select_is_a_one_wide_slice_reshaped_without_its_dim(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    torch.manual_seed(0)
    x = torch.randn(3, 4, 5).to("xla")
    y = torch.randn(4, 5).to("xla")
    v = torch.randn(4).to("xla")
    assert _hlo([x[1], x.select(1, -1)]) == _text(
        "HloModule IrToHlo.7, entry_computation_layout={(f32[3,4,5]{2,1,0})->(f32[4,5]{1,0}, "
        "f32[3,5]{1,0})}",
        "",
        "ENTRY %IrToHlo.7 (p0.1: f32[3,4,5]) -> (f32[4,5], f32[3,5]) {",
        "  %p0.1 = f32[3,4,5]{2,1,0} parameter(0)",
        "  %slice.2 = f32[1,4,5]{2,1,0} slice(f32[3,4,5]{2,1,0} %p0.1), slice={[1:2], [0:4], "
        "[0:5]}",
        "  %reshape.3 = f32[4,5]{1,0} reshape(f32[1,4,5]{2,1,0} %slice.2)",
        "  %slice.4 = f32[3,1,5]{2,1,0} slice(f32[3,4,5]{2,1,0} %p0.1), slice={[0:3], [3:4], "
        "[0:5]}",
        "  %reshape.5 = f32[3,5]{1,0} reshape(f32[3,1,5]{2,1,0} %slice.4)",
        "  ROOT %tuple.6 = (f32[4,5]{1,0}, f32[3,5]{1,0}) tuple(f32[4,5]{1,0} %reshape.3, "
        "f32[3,5]{1,0} %reshape.5)",
        "}",
    )
    # A rank-1 select gives a scalar; the slice of a transposed value has the default layout.
    assert _hlo([v[-1], y.t()[1]]) == _text(
        "HloModule IrToHlo.9, entry_computation_layout={(f32[4]{0}, f32[4,5]{1,0})->(f32[], "
        "f32[4]{0})}",
        "",
        "ENTRY %IrToHlo.9 (p0.1: f32[4], p1.4: f32[4,5]) -> (f32[], f32[4]) {",
        "  %p0.1 = f32[4]{0} parameter(0)",
        "  %slice.2 = f32[1]{0} slice(f32[4]{0} %p0.1), slice={[3:4]}",
        "  %reshape.3 = f32[] reshape(f32[1]{0} %slice.2)",
        "  %p1.4 = f32[4,5]{1,0} parameter(1)",
        "  %transpose.5 = f32[5,4]{0,1} transpose(f32[4,5]{1,0} %p1.4), dimensions={1,0}",
        "  %slice.6 = f32[1,4]{1,0} slice(f32[5,4]{0,1} %transpose.5), slice={[1:2], [0:4]}",
        "  %reshape.7 = f32[4]{0} reshape(f32[1,4]{1,0} %slice.6)",
        "  ROOT %tuple.8 = (f32[], f32[4]{0}) tuple(f32[] %reshape.3, f32[4]{0} %reshape.7)",
        "}",
    )


def test_stack_reshapes_each_input_in_order_then_concatenates(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    torch.manual_seed(0)
    y = torch.randn(4, 5).to("xla")
    v = torch.randn(4).to("xla")
    # One parameter for y, one reshape per listed input (y twice).
    assert _hlo([torch.stack([y, y.sin(), y])]) == _text(
        "HloModule IrToHlo.8, entry_computation_layout={(f32[4,5]{1,0})->(f32[3,4,5]{2,1,0})}",
        "",
        "ENTRY %IrToHlo.8 (p0.1: f32[4,5]) -> (f32[3,4,5]) {",
        "  %p0.1 = f32[4,5]{1,0} parameter(0)",
        "  %reshape.3 = f32[1,4,5]{2,1,0} reshape(f32[4,5]{1,0} %p0.1)",
        "  %sine.2 = f32[4,5]{1,0} sine(f32[4,5]{1,0} %p0.1)",
        "  %reshape.4 = f32[1,4,5]{2,1,0} reshape(f32[4,5]{1,0} %sine.2)",
        "  %reshape.5 = f32[1,4,5]{2,1,0} reshape(f32[4,5]{1,0} %p0.1)",
        "  %concatenate.6 = f32[3,4,5]{2,1,0} concatenate(f32[1,4,5]{2,1,0} %reshape.3, "
        "f32[1,4,5]{2,1,0} %reshape.4, f32[1,4,5]{2,1,0} %reshape.5), dimensions={0}",
        "  ROOT %tuple.7 = (f32[3,4,5]{2,1,0}) tuple(f32[3,4,5]{2,1,0} %concatenate.6)",
        "}",
    )
    # A single input still gets a concatenate; the inputs' own ops lower last first.
    assert _hlo([torch.stack([y], -1), torch.stack([v[0], v[1]])]) == _text(
        "HloModule IrToHlo.13, entry_computation_layout={(f32[4,5]{1,0}, "
        "f32[4]{0})->(f32[4,5,1]{2,1,0}, f32[2]{0})}",
        "",
        "ENTRY %IrToHlo.13 (p0.1: f32[4,5], p1.4: f32[4]) -> (f32[4,5,1], f32[2]) {",
        "  %p0.1 = f32[4,5]{1,0} parameter(0)",
        "  %reshape.2 = f32[4,5,1]{2,1,0} reshape(f32[4,5]{1,0} %p0.1)",
        "  %concatenate.3 = f32[4,5,1]{2,1,0} concatenate(f32[4,5,1]{2,1,0} %reshape.2), "
        "dimensions={2}",
        "  %p1.4 = f32[4]{0} parameter(1)",
        "  %slice.7 = f32[1]{0} slice(f32[4]{0} %p1.4), slice={[0:1]}",
        "  %reshape.8 = f32[] reshape(f32[1]{0} %slice.7)",
        "  %reshape.9 = f32[1]{0} reshape(f32[] %reshape.8)",
        "  %slice.5 = f32[1]{0} slice(f32[4]{0} %p1.4), slice={[1:2]}",
        "  %reshape.6 = f32[] reshape(f32[1]{0} %slice.5)",
        "  %reshape.10 = f32[1]{0} reshape(f32[] %reshape.6)",
        "  %concatenate.11 = f32[2]{0} concatenate(f32[1]{0} %reshape.9, f32[1]{0} "
        "%reshape.10), dimensions={0}",
        "  ROOT %tuple.12 = (f32[4,5,1]{2,1,0}, f32[2]{0}) tuple(f32[4,5,1]{2,1,0} "
        "%concatenate.3, f32[2]{0} %concatenate.11)",
        "}",
    )


def test_mean_scales_the_sum_by_a_guarded_reciprocal_then_converts(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    torch.manual_seed(0)
    x = torch.randn(3, 4, 5).to("xla")
    y = torch.randn(4, 5).to("xla")
    # The sum's element count (unused by a sum) feeds 1/count, NaN for no elements.
    assert _hlo([x.mean(-1)]) == _text(
        "HloModule IrToHlo.20, entry_computation_layout={(f32[3,4,5]{2,1,0})->(f32[3,4]{1,0})}",
        "",
        "%AddComputation.4 (x.5: f32[], y.6: f32[]) -> f32[] {",
        "  %x.5 = f32[] parameter(0)",
        "  %y.6 = f32[] parameter(1)",
        "  ROOT %add.7 = f32[] add(f32[] %x.5, f32[] %y.6)",
        "}",
        "",
        "ENTRY %IrToHlo.20 (p0.1: f32[3,4,5]) -> (f32[3,4]) {",
        "  %p0.1 = f32[3,4,5]{2,1,0} parameter(0)",
        "  %constant.2 = f32[] constant(0)",
        "  %reduce.8 = f32[3,4]{1,0} reduce(f32[3,4,5]{2,1,0} %p0.1, f32[] %constant.2), "
        "dimensions={2}, to_apply=%AddComputation.4",
        "  %constant.3 = s32[] constant(5)",
        "  %constant.9 = s32[] constant(0)",
        "  %compare.14 = pred[] compare(s32[] %constant.3, s32[] %constant.9), direction=NE",
        "  %constant.10 = f32[] constant(1)",
        "  %convert.12 = f32[] convert(s32[] %constant.3)",
        "  %divide.13 = f32[] divide(f32[] %constant.10, f32[] %convert.12)",
        "  %constant.11 = f32[] constant(nan)",
        "  %select.15 = f32[] select(pred[] %compare.14, f32[] %divide.13, f32[] %constant.11)",
        "  %broadcast.16 = f32[3,4]{1,0} broadcast(f32[] %select.15), dimensions={}",
        "  %multiply.17 = f32[3,4]{1,0} multiply(f32[3,4]{1,0} %reduce.8, f32[3,4]{1,0} "
        "%broadcast.16)",
        "  %convert.18 = f32[3,4]{1,0} convert(f32[3,4]{1,0} %multiply.17)",
        "  ROOT %tuple.19 = (f32[3,4]{1,0}) tuple(f32[3,4]{1,0} %convert.18)",
        "}",
    )
    # keepdim reshapes before the convert; a mean of everything multiplies two scalars.
    assert _hlo([x.mean((0, 2), keepdim=True), y.t().mean()]) == _text(
        "HloModule IrToHlo.39, entry_computation_layout={(f32[3,4,5]{2,1,0}, "
        "f32[4,5]{1,0})->(f32[1,4,1]{2,1,0}, f32[])}",
        "",
        "%AddComputation.4 (x.5: f32[], y.6: f32[]) -> f32[] {",
        "  %x.5 = f32[] parameter(0)",
        "  %y.6 = f32[] parameter(1)",
        "  ROOT %add.7 = f32[] add(f32[] %x.5, f32[] %y.6)",
        "}",
        "",
        "%AddComputation.24 (x.25: f32[], y.26: f32[]) -> f32[] {",
        "  %x.25 = f32[] parameter(0)",
        "  %y.26 = f32[] parameter(1)",
        "  ROOT %add.27 = f32[] add(f32[] %x.25, f32[] %y.26)",
        "}",
        "",
        "ENTRY %IrToHlo.39 (p0.1: f32[3,4,5], p1.20: f32[4,5]) -> (f32[1,4,1], f32[]) {",
        "  %p0.1 = f32[3,4,5]{2,1,0} parameter(0)",
        "  %constant.2 = f32[] constant(0)",
        "  %reduce.8 = f32[4]{0} reduce(f32[3,4,5]{2,1,0} %p0.1, f32[] %constant.2), "
        "dimensions={0,2}, to_apply=%AddComputation.4",
        "  %constant.3 = s32[] constant(15)",
        "  %constant.9 = s32[] constant(0)",
        "  %compare.14 = pred[] compare(s32[] %constant.3, s32[] %constant.9), direction=NE",
        "  %constant.10 = f32[] constant(1)",
        "  %convert.12 = f32[] convert(s32[] %constant.3)",
        "  %divide.13 = f32[] divide(f32[] %constant.10, f32[] %convert.12)",
        "  %constant.11 = f32[] constant(nan)",
        "  %select.15 = f32[] select(pred[] %compare.14, f32[] %divide.13, f32[] %constant.11)",
        "  %broadcast.16 = f32[4]{0} broadcast(f32[] %select.15), dimensions={}",
        "  %multiply.17 = f32[4]{0} multiply(f32[4]{0} %reduce.8, f32[4]{0} %broadcast.16)",
        "  %reshape.18 = f32[1,4,1]{2,1,0} reshape(f32[4]{0} %multiply.17)",
        "  %convert.19 = f32[1,4,1]{2,1,0} convert(f32[1,4,1]{2,1,0} %reshape.18)",
        "  %p1.20 = f32[4,5]{1,0} parameter(1)",
        "  %transpose.21 = f32[5,4]{0,1} transpose(f32[4,5]{1,0} %p1.20), dimensions={1,0}",
        "  %constant.22 = f32[] constant(0)",
        "  %reduce.28 = f32[] reduce(f32[5,4]{0,1} %transpose.21, f32[] %constant.22), "
        "dimensions={0,1}, to_apply=%AddComputation.24",
        "  %constant.23 = s32[] constant(20)",
        "  %constant.29 = s32[] constant(0)",
        "  %compare.34 = pred[] compare(s32[] %constant.23, s32[] %constant.29), direction=NE",
        "  %constant.30 = f32[] constant(1)",
        "  %convert.32 = f32[] convert(s32[] %constant.23)",
        "  %divide.33 = f32[] divide(f32[] %constant.30, f32[] %convert.32)",
        "  %constant.31 = f32[] constant(nan)",
        "  %select.35 = f32[] select(pred[] %compare.34, f32[] %divide.33, f32[] %constant.31)",
        "  %multiply.36 = f32[] multiply(f32[] %reduce.28, f32[] %select.35)",
        "  %convert.37 = f32[] convert(f32[] %multiply.36)",
        "  ROOT %tuple.38 = (f32[1,4,1]{2,1,0}, f32[]) tuple(f32[1,4,1]{2,1,0} %convert.19, "
        "f32[] %convert.37)",
        "}",
    )


def test_ops_that_only_move_elements_lower_alike_for_every_dtype(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)

    w = torch.randint(-128, 127, (8, 5), dtype=torch.int8).to("xla")
    b = torch.randn(2, 3, dtype=torch.bfloat16).to("xla")
    i = torch.arange(6, dtype=torch.int32).to("xla")
    # Real torch_xla 2.9's texts on PJRT CPU: the float32 ops' lowering, with each dtype.
    assert _hlo([w.t(), w[2]]) == _text(
        "HloModule IrToHlo.6, entry_computation_layout={(s8[8,5]{1,0})->(s8[5,8]{0,1}, s8[5]{0})}",
        "",
        "ENTRY %IrToHlo.6 (p0.1: s8[8,5]) -> (s8[5,8], s8[5]) {",
        "  %p0.1 = s8[8,5]{1,0} parameter(0)",
        "  %transpose.2 = s8[5,8]{0,1} transpose(s8[8,5]{1,0} %p0.1), dimensions={1,0}",
        "  %slice.3 = s8[1,5]{1,0} slice(s8[8,5]{1,0} %p0.1), slice={[2:3], [0:5]}",
        "  %reshape.4 = s8[5]{0} reshape(s8[1,5]{1,0} %slice.3)",
        "  ROOT %tuple.5 = (s8[5,8]{0,1}, s8[5]{0}) tuple(s8[5,8]{0,1} %transpose.2, s8[5]{0} "
        "%reshape.4)",
        "}",
    )
    assert _hlo(
        [torch.stack([b, b.permute(1, 0).reshape(2, 3)], 1), i.view(2, 3).clone()]
    ) == _text(
        "HloModule IrToHlo.10, entry_computation_layout={(bf16[2,3]{1,0}, "
        "s32[6]{0})->(bf16[2,2,3]{2,1,0}, s32[2,3]{1,0})}",
        "",
        "ENTRY %IrToHlo.10 (p0.1: bf16[2,3], p1.7: s32[6]) -> (bf16[2,2,3], s32[2,3]) {",
        "  %p0.1 = bf16[2,3]{1,0} parameter(0)",
        "  %reshape.4 = bf16[2,1,3]{2,1,0} reshape(bf16[2,3]{1,0} %p0.1)",
        "  %transpose.2 = bf16[3,2]{0,1} transpose(bf16[2,3]{1,0} %p0.1), dimensions={1,0}",
        "  %reshape.3 = bf16[2,3]{1,0} reshape(bf16[3,2]{0,1} %transpose.2)",
        "  %reshape.5 = bf16[2,1,3]{2,1,0} reshape(bf16[2,3]{1,0} %reshape.3)",
        "  %concatenate.6 = bf16[2,2,3]{2,1,0} concatenate(bf16[2,1,3]{2,1,0} %reshape.4, "
        "bf16[2,1,3]{2,1,0} %reshape.5), dimensions={1}",
        "  %p1.7 = s32[6]{0} parameter(1)",
        "  %reshape.8 = s32[2,3]{1,0} reshape(s32[6]{0} %p1.7)",
        "  ROOT %tuple.9 = (bf16[2,2,3]{2,1,0}, s32[2,3]{1,0}) tuple(bf16[2,2,3]{2,1,0} "
        "%concatenate.6, s32[2,3]{1,0} %reshape.8)",
        "}",
    )


# scan: the texts are real torch_xla 2.9's on PJRT CPU for these programs.
def test_scan_lowers_to_a_while_calling_the_step_computation(xla_target):
    import torch_xla  # noqa: F401  (registers the xla device)
    from torch_xla.experimental.scan import scan

    torch.manual_seed(0)

    def fn(carry, x):
        c1, c2 = carry
        return (c1 + x, c2.cos()), x.sin()

    init = (torch.randn(2, 3).to("xla").requires_grad_(), torch.randn(5).to("xla"))
    xs = torch.randn(4, 2, 3).to("xla").requires_grad_()
    (c1, c2), ys = scan(fn, init, xs)
    # One xla::scan node: a call of the loop, every output of it taken out. The step's
    # inputs are multiplied by 1; it returns the carry and y, then what the backward saves
    # (c2 for cos), all written into zero-filled buffers one slice per iteration.
    state = (
        "(s64[], f32[2,3]{1,0}, f32[5]{0}, f32[4,2,3]{2,1,0}, f32[4,2,3]{2,1,0}, "
        "/*index=5*/f32[4,5]{1,0})"
    )
    bare = "(s64[], f32[2,3], f32[5], f32[4,2,3], f32[4,2,3], /*index=5*/f32[4,5])"
    assert _hlo([ys, c2, c1]) == _text(
        "HloModule IrToHlo.94, entry_computation_layout={(f32[4,2,3]{2,1,0}, f32[5]{0}, "
        "f32[2,3]{1,0})->(f32[4,2,3]{2,1,0}, f32[5]{0}, f32[2,3]{1,0})}",
        "",
        "%FnComputation.15 (p0.18: f32[2,3], p1.22: f32[2,3], p2.29: f32[5]) -> (f32[2,3], "
        "f32[5], f32[2,3], f32[5]) {",
        "  %p1.22 = f32[2,3]{1,0} parameter(1)",
        "  %constant.21 = f32[] constant(1)",
        "  %broadcast.23 = f32[2,3]{1,0} broadcast(f32[] %constant.21), dimensions={}",
        "  %multiply.24 = f32[2,3]{1,0} multiply(f32[2,3]{1,0} %p1.22, f32[2,3]{1,0} "
        "%broadcast.23)",
        "  %p0.18 = f32[2,3]{1,0} parameter(0)",
        "  %constant.17 = f32[] constant(1)",
        "  %broadcast.19 = f32[2,3]{1,0} broadcast(f32[] %constant.17), dimensions={}",
        "  %multiply.20 = f32[2,3]{1,0} multiply(f32[2,3]{1,0} %p0.18, f32[2,3]{1,0} "
        "%broadcast.19)",
        "  %constant.16 = f32[] constant(1)",
        "  %broadcast.25 = f32[2,3]{1,0} broadcast(f32[] %constant.16), dimensions={}",
        "  %multiply.26 = f32[2,3]{1,0} multiply(f32[2,3]{1,0} %multiply.20, f32[2,3]{1,0} "
        "%broadcast.25)",
        "  %add.27 = f32[2,3]{1,0} add(f32[2,3]{1,0} %multiply.24, f32[2,3]{1,0} %multiply.26)",
        "  %p2.29 = f32[5]{0} parameter(2)",
        "  %constant.28 = f32[] constant(1)",
        "  %broadcast.30 = f32[5]{0} broadcast(f32[] %constant.28), dimensions={}",
        "  %multiply.31 = f32[5]{0} multiply(f32[5]{0} %p2.29, f32[5]{0} %broadcast.30)",
        "  %cosine.32 = f32[5]{0} cosine(f32[5]{0} %multiply.31)",
        "  %sine.33 = f32[2,3]{1,0} sine(f32[2,3]{1,0} %multiply.20)",
        "  ROOT %tuple.34 = (f32[2,3]{1,0}, f32[5]{0}, f32[2,3]{1,0}, f32[5]{0}) "
        "tuple(f32[2,3]{1,0} %add.27, f32[5]{0} %cosine.32, f32[2,3]{1,0} %sine.33, f32[5]{0} "
        "%multiply.31)",
        "}",
        "",
        f"%Body.35 (p0.36: {bare}) -> {bare} {{",
        f"  %p0.36 = {state} parameter(0)",
        f"  %get-tuple-element.37 = s64[] get-tuple-element({state} %p0.36), index=0",
        "  %constant.64 = s64[] constant(1)",
        "  %add.65 = s64[] add(s64[] %get-tuple-element.37, s64[] %constant.64)",
        f"  %get-tuple-element.40 = f32[4,2,3]{{2,1,0}} get-tuple-element({state} %p0.36), index=3",
        "  %constant.43 = s64[] constant(0)",
        "  %broadcast.44 = s64[] broadcast(s64[] %constant.43), dimensions={}",
        "  %constant.45 = s64[] constant(0)",
        "  %broadcast.46 = s64[] broadcast(s64[] %constant.45), dimensions={}",
        "  %dynamic-slice.47 = f32[1,2,3]{2,1,0} dynamic-slice(f32[4,2,3]{2,1,0} "
        "%get-tuple-element.40, s64[] %get-tuple-element.37, s64[] %broadcast.44, s64[] "
        "%broadcast.46), dynamic_slice_sizes={1,2,3}",
        "  %reshape.48 = f32[2,3]{1,0} reshape(f32[1,2,3]{2,1,0} %dynamic-slice.47)",
        f"  %get-tuple-element.38 = f32[2,3]{{1,0}} get-tuple-element({state} %p0.36), index=1",
        f"  %get-tuple-element.39 = f32[5]{{0}} get-tuple-element({state} %p0.36), index=2",
        "  %call.49 = (f32[2,3]{1,0}, f32[5]{0}, f32[2,3]{1,0}, f32[5]{0}) call(f32[2,3]{1,0} "
        "%reshape.48, f32[2,3]{1,0} %get-tuple-element.38, f32[5]{0} %get-tuple-element.39), "
        "to_apply=%FnComputation.15",
        "  %get-tuple-element.50 = f32[2,3]{1,0} get-tuple-element((f32[2,3]{1,0}, f32[5]{0}, "
        "f32[2,3]{1,0}, f32[5]{0}) %call.49), index=0",
        "  %get-tuple-element.51 = f32[5]{0} get-tuple-element((f32[2,3]{1,0}, f32[5]{0}, "
        "f32[2,3]{1,0}, f32[5]{0}) %call.49), index=1",
        f"  %get-tuple-element.41 = f32[4,2,3]{{2,1,0}} get-tuple-element({state} %p0.36), index=4",
        "  %get-tuple-element.52 = f32[2,3]{1,0} get-tuple-element((f32[2,3]{1,0}, f32[5]{0}, "
        "f32[2,3]{1,0}, f32[5]{0}) %call.49), index=2",
        "  %broadcast.53 = f32[1,2,3]{2,1,0} broadcast(f32[2,3]{1,0} %get-tuple-element.52), "
        "dimensions={1,2}",
        "  %constant.54 = s64[] constant(0)",
        "  %broadcast.55 = s64[] broadcast(s64[] %constant.54), dimensions={}",
        "  %constant.56 = s64[] constant(0)",
        "  %broadcast.57 = s64[] broadcast(s64[] %constant.56), dimensions={}",
        "  %dynamic-update-slice.58 = f32[4,2,3]{2,1,0} dynamic-update-slice(f32[4,2,3]{2,1,0} "
        "%get-tuple-element.41, f32[1,2,3]{2,1,0} %broadcast.53, s64[] %get-tuple-element.37, "
        "s64[] %broadcast.55, s64[] %broadcast.57)",
        f"  %get-tuple-element.42 = f32[4,5]{{1,0}} get-tuple-element({state} %p0.36), index=5",
        "  %get-tuple-element.59 = f32[5]{0} get-tuple-element((f32[2,3]{1,0}, f32[5]{0}, "
        "f32[2,3]{1,0}, f32[5]{0}) %call.49), index=3",
        "  %broadcast.60 = f32[1,5]{1,0} broadcast(f32[5]{0} %get-tuple-element.59), "
        "dimensions={1}",
        "  %constant.61 = s64[] constant(0)",
        "  %broadcast.62 = s64[] broadcast(s64[] %constant.61), dimensions={}",
        "  %dynamic-update-slice.63 = f32[4,5]{1,0} dynamic-update-slice(f32[4,5]{1,0} "
        "%get-tuple-element.42, f32[1,5]{1,0} %broadcast.60, s64[] %get-tuple-element.37, s64[] "
        "%broadcast.62)",
        f"  ROOT %tuple.66 = {state} tuple(s64[] %add.65, f32[2,3]{{1,0}} %get-tuple-element.50, "
        "f32[5]{0} %get-tuple-element.51, f32[4,2,3]{2,1,0} %get-tuple-element.40, "
        "f32[4,2,3]{2,1,0} %dynamic-update-slice.58, /*index=5*/f32[4,5]{1,0} "
        "%dynamic-update-slice.63)",
        "}",
        "",
        f"%Condition.67 (p0.68: {bare}) -> pred[] {{",
        f"  %p0.68 = {state} parameter(0)",
        f"  %get-tuple-element.70 = f32[2,3]{{1,0}} get-tuple-element({state} %p0.68), index=1",
        f"  %get-tuple-element.71 = f32[5]{{0}} get-tuple-element({state} %p0.68), index=2",
        f"  %get-tuple-element.72 = f32[4,2,3]{{2,1,0}} get-tuple-element({state} %p0.68), index=3",
        f"  %get-tuple-element.73 = f32[4,2,3]{{2,1,0}} get-tuple-element({state} %p0.68), index=4",
        f"  %get-tuple-element.74 = f32[4,5]{{1,0}} get-tuple-element({state} %p0.68), index=5",
        f"  %get-tuple-element.69 = s64[] get-tuple-element({state} %p0.68), index=0",
        "  %constant.75 = s64[] constant(4)",
        "  ROOT %compare.76 = pred[] compare(s64[] %get-tuple-element.69, s64[] %constant.75), "
        "direction=LT",
        "}",
        "",
        "%scan.77 (p0.78: s64[], p1.79: f32[2,3], p2.80: f32[5], p3.81: f32[4,2,3], p4.82: "
        f"f32[4,2,3], p5.83: f32[4,5]) -> {bare} {{",
        "  %p0.78 = s64[] parameter(0)",
        "  %p1.79 = f32[2,3]{1,0} parameter(1)",
        "  %p2.80 = f32[5]{0} parameter(2)",
        "  %p3.81 = f32[4,2,3]{2,1,0} parameter(3)",
        "  %p4.82 = f32[4,2,3]{2,1,0} parameter(4)",
        "  %p5.83 = f32[4,5]{1,0} parameter(5)",
        f"  %tuple.84 = {state} tuple(s64[] %p0.78, f32[2,3]{{1,0}} %p1.79, f32[5]{{0}} %p2.80, "
        "f32[4,2,3]{2,1,0} %p3.81, f32[4,2,3]{2,1,0} %p4.82, /*index=5*/f32[4,5]{1,0} %p5.83)",
        f"  ROOT %while.85 = {state} while({state} %tuple.84), condition=%Condition.67, "
        "body=%Body.35",
        "}",
        "",
        "ENTRY %IrToHlo.94 (p0.11: f32[4,2,3], p1.12: f32[5], p2.13: f32[2,3]) -> (f32[4,2,3], "
        "f32[5], f32[2,3]) {",
        "  %constant.14 = s64[] constant(0)",
        "  %p2.13 = f32[2,3]{1,0} parameter(2)",
        "  %p1.12 = f32[5]{0} parameter(1)",
        "  %p0.11 = f32[4,2,3]{2,1,0} parameter(0)",
        "  %constant.6 = f32[] constant(0)",
        "  %reshape.7 = f32[1,1,1]{2,1,0} reshape(f32[] %constant.6)",
        "  %broadcast.8 = f32[1,1,1]{2,1,0} broadcast(f32[1,1,1]{2,1,0} %reshape.7), "
        "dimensions={0,1,2}",
        "  %reshape.9 = f32[] reshape(f32[1,1,1]{2,1,0} %broadcast.8)",
        "  %broadcast.10 = f32[4,2,3]{2,1,0} broadcast(f32[] %reshape.9), dimensions={}",
        "  %constant.1 = f32[] constant(0)",
        "  %reshape.2 = f32[1,1]{1,0} reshape(f32[] %constant.1)",
        "  %broadcast.3 = f32[1,1]{1,0} broadcast(f32[1,1]{1,0} %reshape.2), dimensions={0,1}",
        "  %reshape.4 = f32[] reshape(f32[1,1]{1,0} %broadcast.3)",
        "  %broadcast.5 = f32[4,5]{1,0} broadcast(f32[] %reshape.4), dimensions={}",
        f"  %call.86 = {state} call(s64[] %constant.14, f32[2,3]{{1,0}} %p2.13, f32[5]{{0}} "
        "%p1.12, "
        "f32[4,2,3]{2,1,0} %p0.11, f32[4,2,3]{2,1,0} %broadcast.10, /*index=5*/f32[4,5]{1,0} "
        "%broadcast.5), to_apply=%scan.77",
        f"  %get-tuple-element.87 = s64[] get-tuple-element({state} %call.86), index=0",
        f"  %get-tuple-element.90 = f32[4,2,3]{{2,1,0}} get-tuple-element({state} %call.86), "
        "index=3",
        f"  %get-tuple-element.92 = f32[4,5]{{1,0}} get-tuple-element({state} %call.86), index=5",
        f"  %get-tuple-element.91 = f32[4,2,3]{{2,1,0}} get-tuple-element({state} %call.86), "
        "index=4",
        f"  %get-tuple-element.89 = f32[5]{{0}} get-tuple-element({state} %call.86), index=2",
        f"  %get-tuple-element.88 = f32[2,3]{{1,0}} get-tuple-element({state} %call.86), index=1",
        "  ROOT %tuple.93 = (f32[4,2,3]{2,1,0}, f32[5]{0}, f32[2,3]{1,0}) tuple(f32[4,2,3]{2,1,0} "
        "%get-tuple-element.91, f32[5]{0} %get-tuple-element.89, f32[2,3]{1,0} "
        "%get-tuple-element.88)",
        "}",
    )


def test_scan_layers_loop_of_linear_layers(xla_target):
    import torch_xla
    from torch import nn
    from torch_xla.experimental.scan_layers import scan_layers

    torch.manual_seed(0)
    layers = [nn.Linear(4, 4).to("xla") for _ in range(3)]
    x = torch.randn(4).to("xla")
    torch_xla.sync()
    # The layers' stacked weights and biases are the xs; tuples of six or more list
    # every fifth element with its index.
    state = (
        "(s64[], f32[4]{0}, f32[3,4,4]{2,1,0}, f32[3,4]{1,0}, f32[3,4,4]{2,1,0}, "
        "/*index=5*/f32[3,1,4]{2,1,0})"
    )
    bare = "(s64[], f32[4], f32[3,4,4], f32[3,4], f32[3,4,4], /*index=5*/f32[3,1,4])"
    assert _hlo([scan_layers(layers, x)]) == _text(
        "HloModule IrToHlo.113, entry_computation_layout={(f32[4]{0}, f32[4]{0}, f32[4]{0}, "
        "f32[4,4]{1,0}, f32[4,4]{1,0}, /*index=5*/f32[4,4]{1,0}, f32[4]{0})->(f32[4]{0})}",
        "",
        "%FnComputation.27 (p0.30: f32[4], p1.34: f32[4,4], p2.39: f32[4]) -> (f32[4], f32[4,4], "
        "f32[1,4]) {",
        "  %p2.39 = f32[4]{0} parameter(2)",
        "  %constant.38 = f32[] constant(1)",
        "  %broadcast.40 = f32[4]{0} broadcast(f32[] %constant.38), dimensions={}",
        "  %multiply.41 = f32[4]{0} multiply(f32[4]{0} %p2.39, f32[4]{0} %broadcast.40)",
        "  %reshape.42 = f32[1,4]{1,0} reshape(f32[4]{0} %multiply.41)",
        "  %p1.34 = f32[4,4]{1,0} parameter(1)",
        "  %constant.33 = f32[] constant(1)",
        "  %broadcast.35 = f32[4,4]{1,0} broadcast(f32[] %constant.33), dimensions={}",
        "  %multiply.36 = f32[4,4]{1,0} multiply(f32[4,4]{1,0} %p1.34, f32[4,4]{1,0} "
        "%broadcast.35)",
        "  %transpose.37 = f32[4,4]{0,1} transpose(f32[4,4]{1,0} %multiply.36), dimensions={1,0}",
        "  %dot.43 = f32[1,4]{1,0} dot(f32[1,4]{1,0} %reshape.42, f32[4,4]{0,1} %transpose.37), "
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "  %reshape.44 = f32[4]{0} reshape(f32[1,4]{1,0} %dot.43)",
        "  %p0.30 = f32[4]{0} parameter(0)",
        "  %constant.29 = f32[] constant(1)",
        "  %broadcast.31 = f32[4]{0} broadcast(f32[] %constant.29), dimensions={}",
        "  %multiply.32 = f32[4]{0} multiply(f32[4]{0} %p0.30, f32[4]{0} %broadcast.31)",
        "  %constant.28 = f32[] constant(1)",
        "  %broadcast.45 = f32[4]{0} broadcast(f32[] %constant.28), dimensions={}",
        "  %multiply.46 = f32[4]{0} multiply(f32[4]{0} %multiply.32, f32[4]{0} %broadcast.45)",
        "  %add.47 = f32[4]{0} add(f32[4]{0} %reshape.44, f32[4]{0} %multiply.46)",
        "  ROOT %tuple.48 = (f32[4]{0}, f32[4,4]{0,1}, f32[1,4]{1,0}) tuple(f32[4]{0} %add.47, "
        "f32[4,4]{0,1} %transpose.37, f32[1,4]{1,0} %reshape.42)",
        "}",
        "",
        f"%Body.49 (p0.50: {bare}) -> {bare} {{",
        f"  %p0.50 = {state} parameter(0)",
        f"  %get-tuple-element.51 = s64[] get-tuple-element({state} %p0.50), index=0",
        "  %constant.83 = s64[] constant(1)",
        "  %add.84 = s64[] add(s64[] %get-tuple-element.51, s64[] %constant.83)",
        f"  %get-tuple-element.54 = f32[3,4]{{1,0}} get-tuple-element({state} %p0.50), index=3",
        "  %constant.63 = s64[] constant(0)",
        "  %broadcast.64 = s64[] broadcast(s64[] %constant.63), dimensions={}",
        "  %dynamic-slice.65 = f32[1,4]{1,0} dynamic-slice(f32[3,4]{1,0} %get-tuple-element.54, "
        "s64[] %get-tuple-element.51, s64[] %broadcast.64), dynamic_slice_sizes={1,4}",
        "  %reshape.66 = f32[4]{0} reshape(f32[1,4]{1,0} %dynamic-slice.65)",
        f"  %get-tuple-element.53 = f32[3,4,4]{{2,1,0}} get-tuple-element({state} %p0.50), index=2",
        "  %constant.57 = s64[] constant(0)",
        "  %broadcast.58 = s64[] broadcast(s64[] %constant.57), dimensions={}",
        "  %constant.59 = s64[] constant(0)",
        "  %broadcast.60 = s64[] broadcast(s64[] %constant.59), dimensions={}",
        "  %dynamic-slice.61 = f32[1,4,4]{2,1,0} dynamic-slice(f32[3,4,4]{2,1,0} "
        "%get-tuple-element.53, s64[] %get-tuple-element.51, s64[] %broadcast.58, s64[] "
        "%broadcast.60), dynamic_slice_sizes={1,4,4}",
        "  %reshape.62 = f32[4,4]{1,0} reshape(f32[1,4,4]{2,1,0} %dynamic-slice.61)",
        f"  %get-tuple-element.52 = f32[4]{{0}} get-tuple-element({state} %p0.50), index=1",
        "  %call.67 = (f32[4]{0}, f32[4,4]{0,1}, f32[1,4]{1,0}) call(f32[4]{0} %reshape.66, "
        "f32[4,4]{1,0} %reshape.62, f32[4]{0} %get-tuple-element.52), to_apply=%FnComputation.27",
        "  %get-tuple-element.68 = f32[4]{0} get-tuple-element((f32[4]{0}, f32[4,4]{0,1}, "
        "f32[1,4]{1,0}) %call.67), index=0",
        f"  %get-tuple-element.55 = f32[3,4,4]{{2,1,0}} get-tuple-element({state} %p0.50), index=4",
        "  %get-tuple-element.69 = f32[4,4]{0,1} get-tuple-element((f32[4]{0}, f32[4,4]{0,1}, "
        "f32[1,4]{1,0}) %call.67), index=1",
        "  %broadcast.70 = f32[1,4,4]{2,1,0} broadcast(f32[4,4]{0,1} %get-tuple-element.69), "
        "dimensions={1,2}",
        "  %constant.71 = s64[] constant(0)",
        "  %broadcast.72 = s64[] broadcast(s64[] %constant.71), dimensions={}",
        "  %constant.73 = s64[] constant(0)",
        "  %broadcast.74 = s64[] broadcast(s64[] %constant.73), dimensions={}",
        "  %dynamic-update-slice.75 = f32[3,4,4]{2,1,0} dynamic-update-slice(f32[3,4,4]{2,1,0} "
        "%get-tuple-element.55, f32[1,4,4]{2,1,0} %broadcast.70, s64[] %get-tuple-element.51, "
        "s64[] %broadcast.72, s64[] %broadcast.74)",
        f"  %get-tuple-element.56 = f32[3,1,4]{{2,1,0}} get-tuple-element({state} %p0.50), index=5",
        "  %get-tuple-element.76 = f32[1,4]{1,0} get-tuple-element((f32[4]{0}, f32[4,4]{0,1}, "
        "f32[1,4]{1,0}) %call.67), index=2",
        "  %broadcast.77 = f32[1,1,4]{2,1,0} broadcast(f32[1,4]{1,0} %get-tuple-element.76), "
        "dimensions={1,2}",
        "  %constant.78 = s64[] constant(0)",
        "  %broadcast.79 = s64[] broadcast(s64[] %constant.78), dimensions={}",
        "  %constant.80 = s64[] constant(0)",
        "  %broadcast.81 = s64[] broadcast(s64[] %constant.80), dimensions={}",
        "  %dynamic-update-slice.82 = f32[3,1,4]{2,1,0} dynamic-update-slice(f32[3,1,4]{2,1,0} "
        "%get-tuple-element.56, f32[1,1,4]{2,1,0} %broadcast.77, s64[] %get-tuple-element.51, "
        "s64[] %broadcast.79, s64[] %broadcast.81)",
        f"  ROOT %tuple.85 = {state} tuple(s64[] %add.84, f32[4]{{0}} %get-tuple-element.68, "
        "f32[3,4,4]{2,1,0} %get-tuple-element.53, f32[3,4]{1,0} %get-tuple-element.54, "
        "f32[3,4,4]{2,1,0} %dynamic-update-slice.75, /*index=5*/f32[3,1,4]{2,1,0} "
        "%dynamic-update-slice.82)",
        "}",
        "",
        f"%Condition.86 (p0.87: {bare}) -> pred[] {{",
        f"  %p0.87 = {state} parameter(0)",
        f"  %get-tuple-element.89 = f32[4]{{0}} get-tuple-element({state} %p0.87), index=1",
        f"  %get-tuple-element.90 = f32[3,4,4]{{2,1,0}} get-tuple-element({state} %p0.87), index=2",
        f"  %get-tuple-element.91 = f32[3,4]{{1,0}} get-tuple-element({state} %p0.87), index=3",
        f"  %get-tuple-element.92 = f32[3,4,4]{{2,1,0}} get-tuple-element({state} %p0.87), index=4",
        f"  %get-tuple-element.93 = f32[3,1,4]{{2,1,0}} get-tuple-element({state} %p0.87), index=5",
        f"  %get-tuple-element.88 = s64[] get-tuple-element({state} %p0.87), index=0",
        "  %constant.94 = s64[] constant(3)",
        "  ROOT %compare.95 = pred[] compare(s64[] %get-tuple-element.88, s64[] %constant.94), "
        "direction=LT",
        "}",
        "",
        "%scan.96 (p0.97: s64[], p1.98: f32[4], p2.99: f32[3,4,4], p3.100: f32[3,4], p4.101: "
        f"f32[3,4,4], p5.102: f32[3,1,4]) -> {bare} {{",
        "  %p0.97 = s64[] parameter(0)",
        "  %p1.98 = f32[4]{0} parameter(1)",
        "  %p2.99 = f32[3,4,4]{2,1,0} parameter(2)",
        "  %p3.100 = f32[3,4]{1,0} parameter(3)",
        "  %p4.101 = f32[3,4,4]{2,1,0} parameter(4)",
        "  %p5.102 = f32[3,1,4]{2,1,0} parameter(5)",
        f"  %tuple.103 = {state} tuple(s64[] %p0.97, f32[4]{{0}} %p1.98, f32[3,4,4]{{2,1,0}} "
        "%p2.99, "
        "f32[3,4]{1,0} %p3.100, f32[3,4,4]{2,1,0} %p4.101, /*index=5*/f32[3,1,4]{2,1,0} %p5.102)",
        f"  ROOT %while.104 = {state} while({state} %tuple.103), condition=%Condition.86, "
        "body=%Body.49",
        "}",
        "",
        "ENTRY %IrToHlo.113 (p0.11: f32[4], p1.12: f32[4], p2.13: f32[4], p3.18: f32[4,4], p4.19: "
        "f32[4,4], p5.20: f32[4,4], p6.25: f32[4]) -> (f32[4]) {",
        "  %constant.26 = s64[] constant(0)",
        "  %p6.25 = f32[4]{0} parameter(6)",
        "  %p5.20 = f32[4,4]{1,0} parameter(5)",
        "  %reshape.21 = f32[1,4,4]{2,1,0} reshape(f32[4,4]{1,0} %p5.20)",
        "  %p4.19 = f32[4,4]{1,0} parameter(4)",
        "  %reshape.22 = f32[1,4,4]{2,1,0} reshape(f32[4,4]{1,0} %p4.19)",
        "  %p3.18 = f32[4,4]{1,0} parameter(3)",
        "  %reshape.23 = f32[1,4,4]{2,1,0} reshape(f32[4,4]{1,0} %p3.18)",
        "  %concatenate.24 = f32[3,4,4]{2,1,0} concatenate(f32[1,4,4]{2,1,0} %reshape.21, "
        "f32[1,4,4]{2,1,0} %reshape.22, f32[1,4,4]{2,1,0} %reshape.23), dimensions={0}",
        "  %p2.13 = f32[4]{0} parameter(2)",
        "  %reshape.14 = f32[1,4]{1,0} reshape(f32[4]{0} %p2.13)",
        "  %p1.12 = f32[4]{0} parameter(1)",
        "  %reshape.15 = f32[1,4]{1,0} reshape(f32[4]{0} %p1.12)",
        "  %p0.11 = f32[4]{0} parameter(0)",
        "  %reshape.16 = f32[1,4]{1,0} reshape(f32[4]{0} %p0.11)",
        "  %concatenate.17 = f32[3,4]{1,0} concatenate(f32[1,4]{1,0} %reshape.14, f32[1,4]{1,0} "
        "%reshape.15, f32[1,4]{1,0} %reshape.16), dimensions={0}",
        "  %constant.6 = f32[] constant(0)",
        "  %reshape.7 = f32[1,1,1]{2,1,0} reshape(f32[] %constant.6)",
        "  %broadcast.8 = f32[1,1,1]{2,1,0} broadcast(f32[1,1,1]{2,1,0} %reshape.7), "
        "dimensions={0,1,2}",
        "  %reshape.9 = f32[] reshape(f32[1,1,1]{2,1,0} %broadcast.8)",
        "  %broadcast.10 = f32[3,4,4]{2,1,0} broadcast(f32[] %reshape.9), dimensions={}",
        "  %constant.1 = f32[] constant(0)",
        "  %reshape.2 = f32[1,1,1]{2,1,0} reshape(f32[] %constant.1)",
        "  %broadcast.3 = f32[1,1,1]{2,1,0} broadcast(f32[1,1,1]{2,1,0} %reshape.2), "
        "dimensions={0,1,2}",
        "  %reshape.4 = f32[1]{0} reshape(f32[1,1,1]{2,1,0} %broadcast.3)",
        "  %broadcast.5 = f32[3,1,4]{2,1,0} broadcast(f32[1]{0} %reshape.4), dimensions={1}",
        f"  %call.105 = {state} call(s64[] %constant.26, f32[4]{{0}} %p6.25, f32[3,4,4]{{2,1,0}} "
        "%concatenate.24, f32[3,4]{1,0} %concatenate.17, f32[3,4,4]{2,1,0} %broadcast.10, "
        "/*index=5*/f32[3,1,4]{2,1,0} %broadcast.5), to_apply=%scan.96",
        f"  %get-tuple-element.106 = s64[] get-tuple-element({state} %call.105), index=0",
        f"  %get-tuple-element.108 = f32[3,4,4]{{2,1,0}} get-tuple-element({state} %call.105), "
        "index=2",
        f"  %get-tuple-element.109 = f32[3,4]{{1,0}} get-tuple-element({state} %call.105), index=3",
        f"  %get-tuple-element.110 = f32[3,4,4]{{2,1,0}} get-tuple-element({state} %call.105), "
        "index=4",
        f"  %get-tuple-element.111 = f32[3,1,4]{{2,1,0}} get-tuple-element({state} %call.105), "
        "index=5",
        f"  %get-tuple-element.107 = f32[4]{{0}} get-tuple-element({state} %call.105), index=1",
        "  ROOT %tuple.112 = (f32[4]{0}) tuple(f32[4]{0} %get-tuple-element.107)",
        "}",
    )


def test_einsum_linear_forward_is_a_dot_marked_without_gradients(xla_target):
    import torch_xla

    torch.manual_seed(0)
    w = torch.randn(4, 2).to("xla")
    x3 = torch.randn(4, 3, 2).to("xla")
    x2 = torch.randn(5, 2).to("xla")
    linear = torch.ops.xla.einsum_linear_forward
    # Real torch_xla 2.9's texts on PJRT CPU: no reshape whatever the input's rank, and no
    # operand precision even at 'highest' (unlike mm).
    assert _hlo([linear(x3, w, None), linear(x2.sin(), w, None)]) == _text(
        "HloModule IrToHlo.10, entry_computation_layout={(f32[4,2]{1,0}, f32[4,3,2]{2,1,0}, "
        "f32[5,2]{1,0})->(f32[4,3,4]{2,1,0}, f32[5,4]{1,0})}",
        "",
        "ENTRY %IrToHlo.10 (p0.1: f32[4,2], p1.2: f32[4,3,2], p2.5: f32[5,2]) -> (f32[4,3,4], "
        "f32[5,4]) {",
        "  %p1.2 = f32[4,3,2]{2,1,0} parameter(1)",
        "  %p0.1 = f32[4,2]{1,0} parameter(0)",
        "  %dot.3 = f32[4,3,4]{2,1,0} dot(f32[4,3,2]{2,1,0} %p1.2, f32[4,2]{1,0} %p0.1), "
        "lhs_contracting_dims={2}, rhs_contracting_dims={1}, "
        'frontend_attributes={grad_x="false",grad_y="false"}',
        "  %transpose.4 = f32[4,3,4]{2,1,0} transpose(f32[4,3,4]{2,1,0} %dot.3), "
        "dimensions={0,1,2}",
        "  %p2.5 = f32[5,2]{1,0} parameter(2)",
        "  %sine.6 = f32[5,2]{1,0} sine(f32[5,2]{1,0} %p2.5)",
        "  %dot.7 = f32[5,4]{1,0} dot(f32[5,2]{1,0} %sine.6, f32[4,2]{1,0} %p0.1), "
        "lhs_contracting_dims={1}, rhs_contracting_dims={1}, "
        'frontend_attributes={grad_x="false",grad_y="false"}',
        "  %transpose.8 = f32[5,4]{1,0} transpose(f32[5,4]{1,0} %dot.7), dimensions={0,1}",
        "  ROOT %tuple.9 = (f32[4,3,4]{2,1,0}, f32[5,4]{1,0}) tuple(f32[4,3,4]{2,1,0} "
        "%transpose.4, f32[5,4]{1,0} %transpose.8)",
        "}",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the simulator's note on the pending values' level
        torch_xla._XLAC._xla_set_mat_mul_precision("highest")
    assert _hlo([linear(x3, w, None)]) == _text(
        "HloModule IrToHlo.6, entry_computation_layout={(f32[4,2]{1,0}, "
        "f32[4,3,2]{2,1,0})->(f32[4,3,4]{2,1,0})}",
        "",
        "ENTRY %IrToHlo.6 (p0.1: f32[4,2], p1.2: f32[4,3,2]) -> (f32[4,3,4]) {",
        "  %p1.2 = f32[4,3,2]{2,1,0} parameter(1)",
        "  %p0.1 = f32[4,2]{1,0} parameter(0)",
        "  %dot.3 = f32[4,3,4]{2,1,0} dot(f32[4,3,2]{2,1,0} %p1.2, f32[4,2]{1,0} %p0.1), "
        "lhs_contracting_dims={2}, rhs_contracting_dims={1}, "
        'frontend_attributes={grad_x="false",grad_y="false"}',
        "  %transpose.4 = f32[4,3,4]{2,1,0} transpose(f32[4,3,4]{2,1,0} %dot.3), "
        "dimensions={0,1,2}",
        "  ROOT %tuple.5 = (f32[4,3,4]{2,1,0}) tuple(f32[4,3,4]{2,1,0} %transpose.4)",
        "}",
    )
