"""``torch_xla.distributed.fsdp`` on the simulator: the collective-based FSDP
(``XlaFullyShardedDataParallel``, one process per device) with its checkpoint consolidation,
the auto-wrap policies (``wrap``) that it and FSDPv2
(``torch_xla.experimental.spmd_fully_sharded_data_parallel``) use, and ``checkpoint_module``."""

from torch_xla.distributed.fsdp.state_dict_utils import (
    consolidate_sharded_model_checkpoints,
    consolidate_sharded_state_dicts,
)
from torch_xla.distributed.fsdp.utils import checkpoint_module
from torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel import XlaFullyShardedDataParallel

__all__ = [
    "XlaFullyShardedDataParallel",
    "checkpoint_module",
    "consolidate_sharded_model_checkpoints",
    "consolidate_sharded_state_dicts",
]
