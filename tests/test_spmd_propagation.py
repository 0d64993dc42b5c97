"""Graph-output shardings the simulator can derive, against real torch_xla 2.9 after sync.

Real values (PJRT CPU, 4 devices, t = randn(8, 6) sharded ('x', None) on a (2, 2) mesh, read
with ``_get_xla_sharding_spec`` after ``torch_xla.sync()``): a + b with nothing sharded
'{replicated}'; t.relu(), t * b, (t + 1).relu(), t @ w (w replicated) t's sharding; t.sum()
'{replicated}'; t.t() '{devices=[1,2,2]0,1,2,3 last_tile_dim_replicate}'; t.view(48), t[:4],
t.sum(0) shardings chosen by GSPMD -> UNKNOWN here. z = a.sin() annotated ('x', None) while
pending: z + 42 and (z * b.cos()).relu() get z's sharding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xlasim
from xlasim.sharding.propagation import UNKNOWN, Propagation, _combine, _leaf, parse_spec
from xlasim.sharding.tensor_sharding import TensorSharding

PARTIAL_X = "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"


def test_output_shardings_known_exactly():
    with xlasim.simulate("2x2"):
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        from xlasim.sharding.propagation import UNKNOWN, output_sharding

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        a, b = torch.randn(8, 6).to("xla"), torch.randn(8, 6).to("xla")
        t = torch.randn(8, 6).to("xla")
        xs.mark_sharding(t, mesh, ("x", None))
        w = torch.randn(6, 4).to("xla")
        known = {
            "{replicated}": [a + b, t.sum()],
            PARTIAL_X: [t.relu(), t * b, (t + 1).relu(), t @ w],
            "{devices=[1,2,2]0,1,2,3 last_tile_dim_replicate}": [t.t()],
        }
        for spec, results in known.items():
            for r in results:
                assert output_sharding(r).spec_string() == spec
        for r in (t.view(48), t[:4], t.sum(0)):
            assert output_sharding(r) is UNKNOWN

        # An intermediate annotated while pending passes its sharding on to elementwise
        # consumers, next to replicated values of the same shape (torch_xla 2.9: sharded).
        z = a.sin()
        xs.mark_sharding(z, mesh, ("x", None))
        for r in (z + 42, (z * b.cos()).relu()):
            assert output_sharding(r).spec_string() == PARTIAL_X
        # ...but not to a value it is broadcast into: that is GSPMD's choice.
        row = b[0].sin()
        xs.mark_sharding(row, mesh, ("x",))
        assert output_sharding(row + a) is UNKNOWN


@pytest.mark.parametrize("text", ["{devices=[2,2]0,1,2,3}", PARTIAL_X, "{replicated}", "{manual}"])
def test_spec_strings_parse_back(text):
    from xlasim.sharding.propagation import parse_spec

    assert parse_spec(text).to_string() == text
    assert parse_spec("") is None
    with pytest.raises(ValueError, match="not a sharding spec string"):
        parse_spec("{maximal device=0}")


# -- cost: each value once, any depth --------------------------------------------------------
TILED = "{devices=[2,1]0,1}"
OTHER_TILED = "{devices=[1,2]0,1}"


def _naive_infer(value):
    """The definition the memoised walk must agree with: recurse into every input each time
    it is used (exponential in the number of skip connections, so small graphs only)."""
    if getattr(value, "inputs", None) is None:
        return _leaf(value)
    if value.sharding is not None:  # annotated by the program: that is its sharding
        return tuple(value.sharding.shape), value.sharding
    shape = None if value.shape is None else tuple(value.shape)
    return _combine(value.op, shape, [_naive_infer(i) for i in value.inputs])


def _same(a, b):
    (shape_a, s_a), (shape_b, s_b) = a, b
    if shape_a != shape_b:
        return False
    if s_a is None or s_b is None or s_a is UNKNOWN or s_b is UNKNOWN:
        return s_a is s_b
    return s_a.spec_string() == s_b.spec_string() and s_a.shape == s_b.shape


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_memoised_walk_agrees_with_the_naive_definition(data):
    from xlasim.runtime.graph import Node

    aten = torch.ops.aten
    specs = ["", "{replicated}", TILED, OTHER_TILED]
    values = [
        ((4, 4), torch.float32, data.draw(st.sampled_from(specs)))
        for _ in range(data.draw(st.integers(1, 4)))
    ]
    ops = [aten.add.Tensor, aten.mul.Tensor, aten.relu.default, aten.mm.default]
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(ops))
        arity = 1 if op is aten.relu.default else 2
        # Inputs drawn from everything made so far: shared values and skip connections.
        inputs = tuple(data.draw(st.sampled_from(values)) for _ in range(arity))
        node = Node(0, op, inputs, shape=(4, 4))
        spec = data.draw(st.sampled_from(["", TILED, OTHER_TILED]))
        if spec:  # an intermediate value the program annotated
            node.sharding = TensorSharding(parse_spec(spec), (4, 4))
        values.append(node)
    walk = Propagation()
    for v in reversed(values):
        assert _same(walk.infer(v), _naive_infer(v))


def _residual_chain(h, r, depth):
    for _ in range(depth):
        h = h + torch.relu(h * r)  # h is used twice: a skip connection per block
    return h


@pytest.mark.mat_mul_precision("highest")
def test_deep_residual_chain_keeps_its_sharding_and_values():
    # Reasoned out: every op of the chain is elementwise, its only non-replicated input is
    # the tiled h (r is transferred unannotated, so replicated), so GSPMD keeps h's tiling
    # through all 64 blocks; a matmul by a replicated matrix keeps the row tiling too
    # (measured), one by a sharded one makes the result GSPMD's choice.
    torch.manual_seed(0)
    x_cpu, r_cpu = torch.randn(8, 6), torch.rand(8, 6)
    w_cpu = torch.eye(6)
    expected = _residual_chain(x_cpu, r_cpu, 64)
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        x, r, w = x_cpu.to("xla"), r_cpu.to("xla"), w_cpu.to("xla")
        xs.mark_sharding(x, mesh, ("x", None))
        out = _residual_chain(x, r, 64)
        through_mm = _residual_chain(x @ w, r, 64)
        w_tiled = w_cpu.to("xla")
        xs.mark_sharding(w_tiled, mesh, (None, "x"))
        through_tiled = _residual_chain(x @ w_tiled, r, 64)
        plain = _residual_chain(r, r, 64)
        torch_xla.sync()
        assert torch_xla._XLAC._get_xla_sharding_spec(out) == PARTIAL_X
        assert torch_xla._XLAC._get_xla_sharding_spec(plain) == "{replicated}"
        assert torch_xla._XLAC._get_xla_sharding_spec(through_mm) == PARTIAL_X
        with pytest.raises(NotImplementedError, match="sharding propagation"):
            torch_xla._XLAC._get_xla_sharding_spec(through_tiled)
        assert torch.equal(out.cpu(), expected)
        assert torch.equal(through_mm.cpu(), _residual_chain(x_cpu @ w_cpu, r_cpu, 64))


def test_graph_deeper_than_the_recursion_limit():
    import sys

    depth = sys.getrecursionlimit() + 200
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        h = torch.ones(8, 6).to("xla")
        xs.mark_sharding(h, mesh, ("x", None))
        for _ in range(depth):
            h = h + 1
        torch_xla.sync()
        assert torch_xla._XLAC._get_xla_sharding_spec(h) == PARTIAL_X
        assert torch.equal(h.cpu(), torch.full((8, 6), depth + 1.0))


class _ResidualMLP(torch.nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.relu(block(x))
        return x.sum()


def _sgd_step(model, x):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = model(x)
    loss.backward()
    opt.step()
    return loss


@pytest.mark.mat_mul_precision("highest")
def test_sharded_residual_mlp_of_depth_64_trains_like_eager():
    # Reasoned out: parameters updated in place keep their annotation (the weights' tiling,
    # the biases' '{replicated}' from their unannotated SPMD transfer); the rank-0 loss is
    # replicated; a weight's gradient comes out of a matmul, so its sharding is GSPMD's choice.
    torch.manual_seed(0)
    eager = _ResidualMLP(8, 64)
    x_cpu = torch.randn(4, 8)
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        model = _ResidualMLP(8, 64)
        model.load_state_dict(eager.state_dict())
        model = model.to("xla")
        mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        for block in model.blocks:
            xs.mark_sharding(block.weight, mesh, ("x", "y"))
        loss = _sgd_step(model, x_cpu.to("xla"))
        torch_xla.sync()
        spec = torch_xla._XLAC._get_xla_sharding_spec
        assert spec(loss) == "{replicated}"
        for block in model.blocks:
            assert spec(block.weight) == "{devices=[2,2]0,1,2,3}"
            assert spec(block.bias) == "{replicated}"
        with pytest.raises(NotImplementedError, match="sharding propagation"):
            spec(model.blocks[0].weight.grad)
        expected_loss = _sgd_step(eager, x_cpu)
        # At 'highest' each matmul is within float32 roundoff of the CPU's (not bit-equal:
        # six bfloat16 passes); 64 residual layers compound that to about 1e-5 relative.
        close = {"rtol": 1e-4, "atol": 1e-4}
        torch.testing.assert_close(loss.cpu(), expected_loss.detach(), **close)
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.cpu(), q.detach(), **close)


def test_values_downstream_of_gspmds_choice_are_its_choice_too():
    # Reasoned out: a @ w with both sides tiled in kept dimensions is GSPMD's choice, so is
    # anything computed from it (its transpose included); the sync settles them all and
    # asking for their spec names the missing propagation.
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        a, w = torch.randn(8, 8).to("xla"), torch.randn(8, 8).to("xla")
        xs.mark_sharding(a, mesh, ("x", "y"))
        xs.mark_sharding(w, mesh, ("x", "y"))
        product = a @ w
        results = [product.t(), product + 1, (product.t() @ a).relu()]
        torch_xla.sync()
        for r in results:
            with pytest.raises(NotImplementedError, match="sharding propagation"):
                torch_xla._XLAC._get_xla_sharding_spec(r)
