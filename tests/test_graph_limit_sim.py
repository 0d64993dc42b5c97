"""``torch_xla.compile(f, max_different_graphs=N)`` (``xlasim.runtime.graph_limit``).

Facts measured on real torch_xla 2.9 with ``PJRT_DEVICE=CPU``: calling the compiled function
again with the same op sequence makes no new graph; with ``N=1`` an in-place ``add_`` is traced
as ``aten::add``, and a second sequence raises RuntimeError naming the op that left the known
graph and the one it expected, with XLA shapes and layouts (``f32[3,4]{1,0}``); a new input
shape is a new sequence; a function ending where the known graph goes on names its last op
(upstream's test_dynamic_shapes_detector.py, CPU CI)."""

from __future__ import annotations

import pytest
import torch

import xlasim

_LIMIT = "Maximum number of different graphs allowed per function exceeded: 1\n"


def test_graphs_beyond_the_limit_are_refused():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        def f(x, step):
            y = x * 2
            if step == 0:
                y.add_(1)
            elif step == 1:
                y = y / 3
            return y

        x = torch.rand(3, 4, device="xla")
        compiled = torch_xla.compile(f, max_different_graphs=1)
        compiled(x, 0)
        compiled(x, 0)  # the same graph again
        with pytest.raises(RuntimeError) as info:
            compiled(x, 1)
        assert str(info.value) == (
            _LIMIT + "Got: [] aten::div, xla_shape=f32[3,4]{1,0}, dynamic_dims: ()\n"
            "Expected: [] aten::add, xla_shape=f32[3,4]{1,0}, dynamic_dims: ()\n"
        )
        with pytest.raises(RuntimeError) as info:
            compiled(x, 2)
        assert str(info.value) == (
            _LIMIT + "Reached the end of the function at: [] aten::mul, "
            "xla_shape=f32[3,4]{1,0}, dynamic_dims: ()\n"
            "Expected: [] aten::add, xla_shape=f32[3,4]{1,0}, dynamic_dims: ()\n"
        )
        with pytest.raises(RuntimeError) as info:
            compiled(torch.rand(2, device="xla"), 0)
        assert str(info.value).startswith(
            _LIMIT + "Got: [] aten::mul, xla_shape=f32[2]{0}, dynamic_dims: ()\n"
        )
        # after a refusal the function still runs its known graph
        assert torch.equal(compiled(x, 0).cpu(), (x * 2 + 1).cpu())
