"""``torch_xla.distributed.spmd`` on the simulator: the same names as torch_xla 2.9."""

from .xla_sharded_tensor import XLAShard, XLAShardedTensor  # noqa: I001 - order as torch_xla
from .xla_sharding import (
    HybridMesh,
    Mesh,
    ShardingSpec,
    ShardingType,
    XLAPatchedLinear,
    _mark_manual_sharding,
    annotate_custom_sharding,
    apply_backward_optimization_barrier,
    clear_sharding,
    disable_manual_sharding,
    enable_manual_sharding,
    get_1d_mesh,
    get_global_mesh,
    mark_sharding,  # noqa: F401 - left out of torch_xla's __all__ by its missing comma
    mark_sharding_with_gradients,
    set_global_mesh,
    shard_as,
    wrap_if_sharded,
    xla_patched_nn_linear_forward,
)
from .api import auto_policy, xla_distribute_module, xla_distribute_tensor

# torch_xla 2.9's list, including its missing comma ("MarkShardingFunction" "mark_sharding"
# is one string there, so `from ... import *` skips both names) and its duplicates.
__all__ = [
    "auto_policy",
    "XLAShard",
    "XLAShardedTensor",
    "Mesh",
    "HybridMesh",
    "ShardingType",
    "ShardingSpec",
    "XLAPatchedLinear",
    "MarkShardingFunctionmark_sharding",
    "mark_sharding_with_gradients",
    "shard_as",
    "annotate_custom_sharding",
    "clear_sharding",
    "get_1d_mesh",
    "wrap_if_sharded",
    "xla_distribute_tensor",
    "xla_distribute_module",
    "xla_patched_nn_linear_forward",
    "set_global_mesh",
    "get_global_mesh",
    "_mark_manual_sharding",
    "enable_manual_sharding",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "disable_manual_sharding",
    "apply_backward_optimization_barrier",
]
