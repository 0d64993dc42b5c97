"""The collective-based FSDP of torch_xla (one process per device, parameters gathered and
gradients reduce-scattered by explicit collectives): not simulated."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["XlaFullyShardedDataParallel"]


class XlaFullyShardedDataParallel(nn.Module):
    """Present so that programs importing it load; constructing one raises."""

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "xlasim does not simulate XlaFullyShardedDataParallel (FSDP over explicit "
            "collectives between replicas); use the SPMD-based "
            "torch_xla.experimental.spmd_fully_sharded_data_parallel."
            "SpmdFullyShardedDataParallel"
        )
