"""``GraphInputMatcher`` of torch_xla's dynamo bridge: the inputs of a traced graph for a new
call, the graph's device data in its order, each taken from the call's arguments where it was
one of the traced call's arguments and kept from tracing otherwise (parameters, constants)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch_xla._XLAC as _xlac


class GraphInputMatcher:
    """``tensor_id_to_arg_idx``: traced argument's tensor id -> its argument position;
    ``graph_input_tensor_ids``/``graph_input_xla_values``: the graph's device data (as
    ``_get_tensors_xla_device_data_node`` lists it); ``xla_args_tensor_id``: the ids of the
    traced call's arguments, whose values are not kept (each call brings its own)."""

    def __init__(
        self,
        tensor_id_to_arg_idx: dict[int, int],
        graph_input_tensor_ids: list[int],
        graph_input_xla_values: list[Any],
        xla_args_tensor_id: set[int],
    ) -> None:
        self.tensor_id_to_arg_idx = tensor_id_to_arg_idx
        self.graph_input_tensor_ids = graph_input_tensor_ids
        self.graph_input_xla_values = [
            None if tid in xla_args_tensor_id else value
            for tid, value in zip(graph_input_tensor_ids, graph_input_xla_values, strict=True)
        ]
        self.seed_info_id = _xlac._get_seed_info_id()
        self.arg_idxs = [tensor_id_to_arg_idx.get(tid) for tid in graph_input_tensor_ids]

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        inputs = []
        for tid, kept, arg_idx in zip(
            self.graph_input_tensor_ids, self.graph_input_xla_values, self.arg_idxs, strict=True
        ):
            if arg_idx is not None:
                assert kept is None, "Graph input tensor should not be cached."
                inputs.append(args[arg_idx])
            elif tid == self.seed_info_id:
                raise NotImplementedError(
                    "xlasim does not simulate the RNG seed among a traced graph's inputs"
                )
            else:
                assert kept is not None, "Traced Tensor cannot be None."
                inputs.append(kept)
        return inputs
