"""Consolidating the per-rank checkpoints of XlaFullyShardedDataParallel, which the simulator
does not provide: present so that programs importing them load; calling them raises."""

from __future__ import annotations

from typing import Any

__all__ = ["consolidate_sharded_model_checkpoints", "consolidate_sharded_state_dicts"]


def consolidate_sharded_state_dicts(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        "xlasim does not simulate consolidate_sharded_state_dicts (checkpoints of "
        "XlaFullyShardedDataParallel, which is not simulated)"
    )


def consolidate_sharded_model_checkpoints(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        "xlasim does not simulate consolidate_sharded_model_checkpoints (checkpoints of "
        "XlaFullyShardedDataParallel, which is not simulated)"
    )
