"""FX passes that rewrite an exported graph with one dynamic (symbolic) input dimension into ops
torch_xla's tracer lowers with unbounded dynamic shapes: a ``view``/``expand`` whose size is
symbolic becomes ``xla.dynamic_view``/``xla.dynamic_expand`` (the size named by a tensor's
dimension), and ops with no such lowering become ones that have it (``select`` as a slice
and a view, ``split_with_sizes`` as slices, an ``unsqueeze`` as a view, layer and group norm
as arithmetic).

Each pass edits ``gm.graph`` in place; the caller recompiles the module.  The rewritten graph
computes what the original did, on any device.  Every pass handles one dynamic dimension per
tensor and raises ``AssertionError`` (torch_xla's check) for more.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch_xla.experimental.xla_dynamic_reshape_ops  # noqa: F401 - defines the ops emitted
from torch._guards import detect_fake_mode
from torch.fx import Graph, GraphModule, subgraph_rewriter
from torch_xla.utils.stablehlo_test_utils import wrap_func_as_nn_module

aten = torch.ops.aten

# ``slice``'s end when it runs to the end of the dimension.
_TO_THE_END = torch.iinfo(torch.int64).max


def call_function(
    graph: Graph,
    target: Callable[..., Any],
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> torch.fx.Node:
    """A new ``call_function`` node whose ``meta["val"]`` is ``target`` run on its arguments'
    example values (fake tensors and symbolic sizes, as export leaves them)."""
    node = graph.call_function(target, args, kwargs)
    _fill_example(node)
    return node


def _fill_example(node: torch.fx.Node) -> None:
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    mode = detect_fake_mode(list(args))
    with mode if mode is not None else contextlib.nullcontext():
        node.meta["val"] = node.target(*args, **kwargs)  # type: ignore[operator]


def _symbolic_dims(node: Any) -> list[int]:
    return [i for i, d in enumerate(node.meta["val"].shape) if not isinstance(d, int)]


def _one_symbolic_dim(node: Any) -> int | None:
    dims = _symbolic_dims(node)
    assert len(dims) <= 1, "Only 1 dimention can be symbolic."
    return dims[0] if dims else None


def _calls(gm: GraphModule, *targets: Any) -> list[Any]:
    # Any: the passes read nodes' arguments as the ops' own (tensors, ints, size lists).
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def _shape_with_sizes(graph: Graph, source: Any, skip: int | None = None) -> list[Any]:
    """``source``'s shape as view arguments: static sizes as ints, the symbolic one as a
    ``sym_size`` node of ``source`` (the dimension ``skip`` left out)."""
    shape: list[Any] = []
    for dim, size in enumerate(source.meta["val"].shape):
        if dim == skip:
            continue
        if not isinstance(size, int):
            size = call_function(graph, aten.sym_size.int, (source, dim))
        shape.append(size)
    return shape


# -- the norms as arithmetic ---------------------------------------------------------------------
def native_layer_norm_impl(
    input: torch.Tensor,  # noqa: A002 - aten's names
    normalized_shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """``native_layer_norm``'s output over the last dimension, in elementwise ops."""
    mean = torch.mean(input, -1, keepdim=True)
    inverse_std = torch.rsqrt(torch.var(input, -1, keepdim=True, correction=0) + eps)
    return (input - mean) * inverse_std * weight + bias


def native_group_norm_impl(
    input: torch.Tensor,  # noqa: A002 - aten's names
    weight: torch.Tensor,
    bias: torch.Tensor,
    N: Any,  # noqa: N803
    C: Any,  # noqa: N803
    HxW: Any,  # noqa: N803
    group: Any,
    eps: float,
) -> torch.Tensor:
    """``native_group_norm``'s output for an ``(N, C, L)`` input, in elementwise ops: each of the
    ``group`` groups of channels is normalised over its channels and positions."""
    grouped = input.reshape(input.shape[0], group, -1)
    mean = torch.mean(grouped, -1, keepdim=True)
    inverse_std = torch.rsqrt(torch.var(grouped, -1, keepdim=True, correction=0) + eps)
    normalised = ((grouped - mean) * inverse_std).reshape(input.shape)
    return normalised * weight.unsqueeze(-1) + bias.unsqueeze(-1)


def native_layer_norm_pattern(
    x: torch.Tensor, dim: Sequence[int], weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    # The getitem is part of the pattern: the exported graph takes the output from the tuple.
    return torch.ops.aten.native_layer_norm.default(x, dim, weight, bias, eps)[0]


def native_group_norm_pattern(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    N: Any,  # noqa: N803
    C: Any,  # noqa: N803
    HxW: Any,  # noqa: N803
    group: Any,
    eps: float,
) -> torch.Tensor:
    return torch.ops.aten.native_group_norm.default(x, weight, bias, N, C, HxW, group, eps)[0]


def decompose_dynamic_native_layer_norm(gm: GraphModule) -> None:
    for node in _calls(gm, aten.native_layer_norm.default):
        if len(node.args[1]) != 1:
            raise NotImplementedError(
                "xlasim: decomposing native_layer_norm over more than the last dimension "
                "is not simulated"
            )
    subgraph_rewriter.replace_pattern_with_filters(
        gm, native_layer_norm_pattern, native_layer_norm_impl, ignore_literals=True
    )


def decompose_dynamic_native_group_norm(gm: GraphModule) -> None:
    subgraph_rewriter.replace_pattern_with_filters(
        gm, native_group_norm_pattern, native_group_norm_impl, ignore_literals=True
    )


# -- ops rewritten into ones with a dynamic lowering -------------------------------------------
def decompose_dynamic_shape_select(gm: GraphModule) -> None:
    """``select(x, dim, i)`` on a tensor with a symbolic dimension: ``slice`` of ``[i, i+1)``,
    then a ``view`` without ``dim`` (the view pass makes that dynamic)."""
    graph = gm.graph
    for node in _calls(gm, aten.select.int):
        source, dim, index = node.args[0], node.args[1], node.args[2]
        symbolic = _one_symbolic_dim(source)
        if symbolic is None:
            continue
        assert symbolic != dim, "Selected dim cannot be symbolic."
        with graph.inserting_before(node):
            sliced = call_function(graph, aten.slice.Tensor, (source, dim, index, index + 1, 1))
            shape = _shape_with_sizes(graph, source, skip=dim % source.meta["val"].dim())
            view = call_function(graph, aten.view.default, (sliced, shape))
        node.replace_all_uses_with(view)
        graph.erase_node(node)


def decompose_split_with_sizes(gm: GraphModule) -> None:
    """``split_with_sizes`` of a tensor with a symbolic dimension: one ``slice`` per part, which
    the parts' readers (``getitem``) read instead."""
    graph = gm.graph
    for node in _calls(gm, aten.split_with_sizes.default):
        source, sizes, dim = node.args[0], node.args[1], node.args[2]
        symbolic = _one_symbolic_dim(source)
        if symbolic is None:
            continue
        assert symbolic != dim % source.meta["val"].dim(), (
            "Split along symbolic dim is not supported."
        )
        with graph.inserting_before(node):
            bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
            parts = [
                call_function(graph, aten.slice.Tensor, (source, dim, start, end))
                for start, end in zip(bounds, bounds[1:], strict=False)
            ]
        for reader in list(node.users):
            assert reader.target is operator.getitem
            reader.replace_all_uses_with(parts[reader.args[1]])


def flatten_embedding_indices_tensor(gm: GraphModule) -> None:
    """``embedding`` with symbolically shaped indices: the indices flattened to one dimension
    (a ``reshape`` of the symbolic size times the static ones), the output reshaped back."""
    graph = gm.graph
    for node in _calls(gm, aten.embedding.default):
        weight, indices = node.args[0], node.args[1]
        symbolic = _one_symbolic_dim(indices)
        if symbolic is None:
            continue
        static = 1
        for dim, size in enumerate(indices.meta["val"].shape):
            if dim != symbolic:
                static *= size
        with graph.inserting_before(node):
            out_shape = _shape_with_sizes(graph, indices)
            flat = call_function(graph, operator.mul, (out_shape[symbolic], static))
            flat_indices = call_function(graph, aten.reshape, (indices, [flat]))
        node.args = (weight, flat_indices, *node.args[2:])
        _fill_example(node)
        with graph.inserting_after(node):
            restored = graph.call_function(
                aten.reshape, (node, [*out_shape, weight.meta["val"].shape[-1]])
            )
        _fill_example(restored)
        for user in [u for u in node.users if u is not restored]:
            user.replace_input_with(node, restored)


def remove_no_op_slice(gm: GraphModule) -> None:
    """Drops each ``slice`` from 0 to the end of its dimension (it is its input)."""
    graph = gm.graph
    for node in _calls(gm, aten.slice.Tensor):
        start = node.args[2] if len(node.args) > 2 else None
        end = node.args[3] if len(node.args) > 3 else None
        if start == 0 and end == _TO_THE_END:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def dynamic_unsqueeze_to_view(gm: GraphModule) -> None:
    """``unsqueeze`` of a tensor with a symbolic dimension as a ``view`` (with a 1 inserted)."""
    graph = gm.graph
    for node in _calls(gm, aten.unsqueeze.default):
        source, dim = node.args[0], node.args[1]
        if _one_symbolic_dim(source) is None:
            continue
        with graph.inserting_before(node):
            shape = _shape_with_sizes(graph, source)
            dim %= len(shape) + 1
            shape.insert(dim, 1)
            view = call_function(graph, aten.view.default, (source, shape))
        node.replace_all_uses_with(view)
        graph.erase_node(node)


# -- view and expand to torch_xla's dynamic ops ----------------------------------------------
_VIEWS = (
    aten.view,
    aten.view.default,
    aten.reshape,
    aten.reshape.default,
    aten._unsafe_view,
    aten._unsafe_view.default,
)


def _symbolic_sizes(sizes: Sequence[Any]) -> list[tuple[int, Any]]:
    return [(dim, size) for dim, size in enumerate(sizes) if not isinstance(size, int)]


def replace_dynamic_expand_with_xla_op(gm: GraphModule) -> None:
    """``expand`` to a size with one symbolic entry (a ``sym_size`` of some tensor) becomes
    ``xla.dynamic_expand`` naming that tensor and dimension."""
    for node in _calls(gm, aten.expand.default):
        symbolic = _symbolic_sizes(node.args[1])
        if not symbolic:
            continue
        assert len(symbolic) == 1
        target_dim, size = symbolic[0]
        source = node.args[0]
        if "val" in source.meta:
            source_shape = source.meta["val"].shape
            assert len(source_shape) == len(node.args[1])
            for have, want in zip(source_shape, node.args[1], strict=True):
                if not isinstance(have, int) and not isinstance(want, int):
                    assert have == want.meta["val"], (
                        "Expanded symbolic dim to a different symbolic size is not supported."
                    )
        assert size.op == "call_function" and size.target == aten.sym_size.int
        node.target = torch.ops.xla.dynamic_expand
        node.args = (*node.args, size.args[0], size.args[1], target_dim)


def replace_dynamic_view_with_xla_op(gm: GraphModule) -> None:
    """A view to a size with one symbolic entry (a ``sym_size`` of some tensor, or it times an
    int) becomes ``xla.dynamic_view`` naming that tensor, dimension and factor."""
    for node in _calls(gm, *_VIEWS):
        symbolic = _symbolic_sizes(node.args[1])
        if not symbolic:
            continue
        assert len(symbolic) == 1, "Only 1 symoblic dim in view src tensor is supported."
        target_dim, size = symbolic[0]
        factor = 1
        if size.target is operator.mul:
            left, right = size.args
            assert isinstance(left, int) or isinstance(right, int)
            factor, size = (right, left) if isinstance(right, int) else (left, right)
        else:
            assert size.target == aten.sym_size.int
        node.target = torch.ops.xla.dynamic_view
        node.args = (
            node.args[0],
            list(node.args[1]),
            *node.args[2:],
            size.args[0],
            size.args[1],
            target_dim,
            int(factor),
        )


def exported_program_has_symbolic_input_shape(ep: torch.export.ExportedProgram) -> bool:
    for node in ep.graph_module.graph.nodes:
        example = node.meta.get("val")
        if node.op == "placeholder" and hasattr(example, "shape") and _symbolic_dims(node):
            return True
    return False


# First the ops without a dynamic lowering become ones with it (the norms as arithmetic, the
# rest as slices and views); then the views and expands with a symbolic size become
# torch_xla's dynamic ops.
_DECOMPOSITIONS = (
    decompose_dynamic_native_layer_norm,
    decompose_dynamic_native_group_norm,
    decompose_split_with_sizes,
    decompose_dynamic_shape_select,
    dynamic_unsqueeze_to_view,
    flatten_embedding_indices_tensor,
    remove_no_op_slice,
)
_TO_DYNAMIC_OPS = (replace_dynamic_expand_with_xla_op, replace_dynamic_view_with_xla_op)


def process_exported_program_with_symbolic_input(ep: torch.export.ExportedProgram) -> None:
    module = ep.graph_module
    for rewrite in (*_DECOMPOSITIONS, *_TO_DYNAMIC_OPS):
        rewrite(module)
        module.graph.eliminate_dead_code()
        module.graph.lint()
        module.recompile()


__all__ = [
    "call_function",
    "decompose_dynamic_native_group_norm",
    "decompose_dynamic_native_layer_norm",
    "decompose_dynamic_shape_select",
    "decompose_split_with_sizes",
    "dynamic_unsqueeze_to_view",
    "exported_program_has_symbolic_input_shape",
    "flatten_embedding_indices_tensor",
    "native_group_norm_impl",
    "native_group_norm_pattern",
    "native_layer_norm_impl",
    "native_layer_norm_pattern",
    "process_exported_program_with_symbolic_input",
    "remove_no_op_slice",
    "replace_dynamic_expand_with_xla_op",
    "replace_dynamic_view_with_xla_op",
    "wrap_func_as_nn_module",
]
