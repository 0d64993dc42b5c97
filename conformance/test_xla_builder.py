"""``torch_xla.core.xla_builder`` / ``xla_op_registry``: XLA computations built op by op in
Python and run on device tensors. Every expected value and message below is what real
torch_xla 2.9 gives on PJRT CPU (measured with its own builder)."""

from __future__ import annotations

import pytest
import torch


def test_registered_op_computes_and_keeps_result_types(xla_target):
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.core.xla_op_registry as xor

    dev = torch_xla.device()
    a = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    b = torch.tensor([[4.0, 1.0], [-1.0, 2.0]])
    sub = xor.register("conf_sub", lambda x, y: x - y)
    out = sub(a.to(dev), b.to(dev))
    # One result comes back as a tensor, not a list.
    assert isinstance(out, torch.Tensor) and out.device.type == "xla"
    assert out.cpu().tolist() == (a - b).tolist()

    def parts(x):
        return xb.Op.tuple([x.floor(), x.cast(xb.Type.S32), x > x.zeros_like()])

    split = xor.register("conf_split", parts)
    floors, ints, positive = split(a.to(dev))
    assert (floors.dtype, ints.dtype, positive.dtype) == (torch.float32, torch.int32, torch.bool)
    assert floors.cpu().tolist() == [[1.0, -2.0], [3.0, 0.0]]
    assert ints.cpu().tolist() == [[1, -2], [3, 0]]
    assert positive.cpu().tolist() == [[True, False], [True, True]]


def test_shapes_in_python_form(xla_target):
    import torch_xla
    import torch_xla.core.xla_builder as xb

    dev = torch_xla.device()
    x = torch.zeros(2, 3, device=dev)
    assert xb.tensor_shape(x).shape == {"type": "f32", "sizes": (2, 3)}
    assert xb.tensor_shape([torch.tensor(1, device=dev)])[0].shape == {"type": "s64", "sizes": ()}
    seen = {}

    def body(p0):
        b = p0.builder()
        seen["scalar"] = xb.Op.scalar(b, 2.5).shape().shape  # no dtype: f32
        seen["s32"] = xb.Op.scalar(b, 2, dtype=xb.Type.S32).shape().shape
        seen["iota"] = xb.Op.iota(b, xb.mkshape(xb.Type.S32, (2, 3)), 1).shape().shape
        seen["cmp"] = (p0 < p0).shape().shape
        seen["dot"] = (p0 @ p0.transpose((1, 0))).shape().shape
        pair = xb.Op.tuple((p0, p0.cast(xb.Type.BF16)))
        seen["tuple"] = pair.shape().shape
        return pair

    xb.create_computation("shapes", body, xb.tensor_shape([x]))
    assert seen == {
        "scalar": {"type": "f32", "sizes": ()},
        "s32": {"type": "s32", "sizes": ()},
        "iota": {"type": "s32", "sizes": (2, 3)},
        "cmp": {"type": "pred", "sizes": (2, 3)},
        "dot": {"type": "f32", "sizes": (2, 2)},
        "tuple": ({"type": "f32", "sizes": (2, 3)}, {"type": "bf16", "sizes": (2, 3)}),
    }
    assert xb.Op.to_torch_type(xb.Type.BF16) is torch.bfloat16
    assert xb.Op.to_torch_type(None) is torch.float32
    assert xb.Op.from_torch_type(torch.uint16) == "u16"
    assert len(xb._XLA_PT_TYPE_MAP) == 15


def test_control_flow_and_reductions_compute(xla_target):
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.core.xla_op_registry as xor

    dev = torch_xla.device()

    def power(x, n=None):
        # x ** n by a loop over (i, acc, x) while i < n.
        def cond(i, acc, base):
            return i < xb.Op.scalar(i.builder(), n, dtype=xb.Type.S32)

        def body(i, acc, base):
            step = xb.Op.one(i.builder(), dtype=xb.Type.S32)
            return xb.Op.tuple((i + step, acc * base, base))

        start = xb.Op.zero(x.builder(), dtype=xb.Type.S32)
        return xb.Op.mkwhile((start, x.ones_like(), x), cond, body).get_tuple_element(1)

    x = torch.tensor([2.0, -3.0, 0.5])
    cubed = xor.register("conf_power", power)(x.to(dev), n=3)
    assert cubed.cpu().tolist() == [8.0, -27.0, 0.125]

    def larger_or_product(flag, a, b):
        chosen = flag.mkconditional((a, b), lambda a, b: a.max(b), lambda a, b: a * b)
        return chosen

    a, b = torch.tensor([1.0, 5.0]), torch.tensor([4.0, 2.0])
    op = xor.register("conf_cond", larger_or_product)
    on = op(torch.tensor(True, device=dev), a.to(dev), b.to(dev))
    off = op(torch.tensor(False, device=dev), a.to(dev), b.to(dev))
    assert (on.cpu().tolist(), off.cpu().tolist()) == ([4.0, 5.0], [4.0, 10.0])

    def row_sums(x):
        return x.reduce(xb.Op.scalar(x.builder(), 0.0), lambda p, q: p + q, (1,))

    m = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert xor.register("conf_reduce", row_sums)(m.to(dev)).cpu().tolist() == [6.0, 15.0]

    def shaped(x):
        padded = x.pad(xb.Op.scalar(x.builder(), -1.0), ((1, 0, 0), (0, 1, 1)))
        return xb.Op.tuple((padded, x.slice_in_dim(1, 3, 1), x.rev((0,))))

    padded, sliced, reversed_ = xor.register("conf_shapes", shaped)(m.to(dev))
    assert padded.cpu().tolist() == [
        [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
        [1.0, -1.0, 2.0, -1.0, 3.0, -1.0],
        [4.0, -1.0, 5.0, -1.0, 6.0, -1.0],
    ]
    assert sliced.cpu().tolist() == [[2.0, 3.0], [5.0, 6.0]]
    assert reversed_.cpu().tolist() == [[4.0, 5.0, 6.0], [1.0, 2.0, 3.0]]


def test_builder_errors(xla_target):
    import torch_xla
    import torch_xla.core.xla_builder as xb

    shapes = xb.tensor_shape([torch.zeros(2, 3, device=torch_xla.device())])

    def mixed_types(x):
        return x + xb.Op.scalar(x.builder(), 1, dtype=xb.Type.S32)

    message = "Binary op add with different element types: f32[2,3] and s32[]."
    with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        xb.create_computation("mixed", mixed_types, shapes)

    def wrong_rank(x):
        return x + xb.Op.constant(x.builder(), torch.arange(3.0))

    with pytest.raises(RuntimeError, match=r"Shapes must be equal rank, but are f32\[3\] and"):
        xb.create_computation("rank", wrong_rank, shapes)

    with pytest.raises(RuntimeError, match="Unknown XLA op name: Bogus"):
        xb.create_computation("bogus", lambda x: xb.mkop("Bogus", (x.op,)), shapes)
    # torch_xla's op table spells the right shift 'ShifRight', so `>>` names no known op.
    with pytest.raises(RuntimeError, match="Unknown XLA op name: ShiftRight"):
        xb.create_computation("shift", lambda x: x >> x, shapes)
