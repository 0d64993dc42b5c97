"""Simulated ``torch_xla.experimental.scan_layers``: layers of one structure run in sequence
through ``scan``, each step calling the first layer with that layer's parameters and buffers
(what torch_xla runs, so a layer's Python attributes come from the first one)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch._functorch.partitioners import default_partition

from .scan import scan


def _check_same_structure(kind: Sequence[Mapping[str, torch.Tensor]]) -> None:
    """Every layer's tensors have the first layer's names and shapes (torch_xla's errors)."""
    if not kind:
        return
    first = kind[0]
    for idx, other in enumerate(kind[1:], start=1):
        missing, extra = set(first) - set(other), set(other) - set(first)
        if missing or extra:
            message = f"Layer {idx} has mismatched keys."
            if missing:
                message += f" Missing keys: {missing}."
            if extra:
                message += f" Extra keys: {extra}."
            raise ValueError(message)
        for key, tensor in first.items():
            if other[key].shape != tensor.shape:
                raise ValueError(
                    f"Shape mismatch for '{key}' in layer {idx}: "
                    f"expected {tensor.shape}, got {other[key].shape}."
                )


def scan_layers(
    layers: Iterable[nn.Module],
    input_data: Any,
    partition_fn: Any = default_partition,
    is_layer_pure: bool = False,
) -> Any:
    """The last layer's output, each layer taking the previous one's (``input_data`` when
    ``layers`` is empty)."""
    layers = list(layers)
    if not layers:
        return input_data
    params = [dict(layer.named_parameters()) for layer in layers]
    buffers = [dict(layer.named_buffers()) for layer in layers]
    _check_same_structure(params)
    _check_same_structure(buffers)
    stacked = tuple(
        {name: torch.stack([d[name] for d in dicts]) for name in dicts[0]}
        for dicts in (params, buffers)
    )
    final, _ = scan(
        _one_layer_fn(layers[0], partition_fn, is_layer_pure),
        input_data,
        stacked,
        partition_fn,
        is_layer_pure,
    )
    return final


# The step function made for a pure layer, by (id(partition_fn), id(first layer)): torch_xla
# keeps it, so scanning the same layers again reuses the traced step (a module-level dict, as
# there, which its tests inspect and clear).
_ONE_LAYER_CACHE: dict[tuple[int, int], Callable[..., Any]] = {}


def _one_layer_fn(first: nn.Module, partition_fn: Any, is_layer_pure: bool) -> Callable[..., Any]:
    key = (id(partition_fn), id(first))
    if is_layer_pure and key in _ONE_LAYER_CACHE:
        return _ONE_LAYER_CACHE[key]
    template = copy.deepcopy(first)

    def one_layer(carry: Any, weights: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        merged = {**weights[0], **weights[1]}
        return torch.func.functional_call(template, merged, carry, strict=True), None

    if is_layer_pure:
        _ONE_LAYER_CACHE[key] = one_layer
    return one_layer
