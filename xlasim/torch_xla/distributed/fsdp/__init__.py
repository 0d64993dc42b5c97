"""``torch_xla.distributed.fsdp`` on the simulator: the auto-wrap policies (``wrap``) that
FSDPv2 (``torch_xla.experimental.spmd_fully_sharded_data_parallel``) uses, and
``checkpoint_module``. The collective-based FSDP (``XlaFullyShardedDataParallel``) and its
checkpoint consolidation are present but raise ``NotImplementedError``."""

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
