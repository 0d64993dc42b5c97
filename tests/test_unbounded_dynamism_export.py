"""``torch_xla.experimental.unbounded_dynamism_export``: FX passes over an exported graph with a
dynamic dimension, which keep what the graph computes while replacing ops (checked against
the graph before the pass, as upstream's CPU tests do), and the ``xla.dynamic_view`` /
``xla.dynamic_expand`` ops they emit."""

from __future__ import annotations

import torch
from torch.export import Dim


def _export(fn, args, dynamic_shapes):
    from torch_xla.utils.stablehlo_test_utils import wrap_func_as_nn_module

    return torch.export.export(wrap_func_as_nn_module(fn), args, dynamic_shapes=dynamic_shapes)


def test_select_becomes_a_dynamic_view(xlasim_sim):
    from torch_xla.experimental import unbounded_dynamism_export as ude

    args = (torch.rand(4, 3, 5), 1, 2)
    ep = _export(torch.ops.aten.select.int, args, (({0: Dim("bs")}, None, None),))
    before = ep.module()(*args)
    ude.decompose_dynamic_shape_select(ep.graph_module)
    ep.graph_module.recompile()
    assert "aten.select" not in ep.graph_module.code
    assert "aten.slice" in ep.graph_module.code
    ude.replace_dynamic_view_with_xla_op(ep.graph_module)
    ep.graph_module.recompile()
    assert "aten.view" not in ep.graph_module.code
    assert "xla.dynamic_view" in ep.graph_module.code
    assert torch.equal(ep.module()(*args), before)


def test_view_of_a_scaled_dynamic_size(xlasim_sim):
    from torch_xla.experimental import unbounded_dynamism_export as ude

    def fn(x):
        return x.view(x.shape[0] * x.shape[1], -1)

    args = (torch.rand(6, 3, 4),)
    ep = _export(fn, args, (({0: Dim("bs")},),))
    before = ep.module()(*args)
    ude.replace_dynamic_view_with_xla_op(ep.graph_module)
    ep.graph_module.recompile()
    view = next(n for n in ep.graph.nodes if n.target is torch.ops.xla.dynamic_view)
    # The size is the input's dimension 0 times 3, for the output's dimension 0.
    assert view.args[2].op == "placeholder"
    assert view.args[3:] == (0, 0, 3)
    assert torch.equal(ep.module()(*args), before)


def test_dynamic_ops_take_the_size_from_the_source_tensor(xlasim_sim):
    import torch_xla.experimental.xla_dynamic_reshape_ops  # noqa: F401

    x, src = torch.arange(6.0), torch.empty(2, 5)
    view = torch.ops.xla.dynamic_view(x, [1, 3], src, 0, 0, 1.0)
    assert view.shape == (2, 3)
    expanded = torch.ops.xla.dynamic_expand(torch.ones(1, 3), [1, 3], src, 1, 0)
    assert expanded.shape == (5, 3)


def test_norm_arithmetic_matches_torch(xlasim_sim):
    from torch_xla.experimental import unbounded_dynamism_export as ude

    x, w, b = torch.rand(2, 6, 5), torch.rand(6), torch.rand(6)
    # Groups of several channels too: each group is normalised over its channels together.
    expected = torch.nn.functional.group_norm(x, 3, w, b, eps=1e-5)
    assert torch.allclose(
        ude.native_group_norm_impl(x, w, b, 2, 6, 5, 3, 1e-5), expected, atol=1e-5
    )
    lw, lb = torch.rand(5), torch.rand(5)
    expected = torch.nn.functional.layer_norm(x, [5], lw, lb, eps=1e-5)
    assert torch.allclose(ude.native_layer_norm_impl(x, [5], lw, lb, 1e-5), expected, atol=1e-5)


def test_all_passes_keep_the_program(xlasim_sim):
    from torch_xla.experimental import unbounded_dynamism_export as ude

    def fn(x):
        return x[:, 1].unsqueeze(1).reshape(x.shape[0], -1)

    args = (torch.rand(4, 3, 5),)
    ep = _export(fn, args, (({0: Dim("bs")},),))
    assert ude.exported_program_has_symbolic_input_shape(ep)
    before = ep.module()(*args)
    ude.process_exported_program_with_symbolic_input(ep)
    assert "aten.select" not in ep.graph_module.code
    assert "aten.unsqueeze" not in ep.graph_module.code
    assert "xla.dynamic_view" in ep.graph_module.code
    assert torch.equal(ep.module()(*args), before)
