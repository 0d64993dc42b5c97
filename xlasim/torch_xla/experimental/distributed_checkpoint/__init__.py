"""``torch_xla.experimental.distributed_checkpoint`` on the simulator (torch_xla 2.9).

Checkpoints of state_dicts holding sharded ``xla`` tensors through
``torch.distributed.checkpoint``: each host writes and reads only its own devices' shards, and
a checkpoint taken with one mesh loads into tensors sharded over another.
"""

from .manager import CheckpointManager
from .planners import SPMDLoadPlanner, SPMDSavePlanner
from .util import prime_optimizer

__all__ = [
    "CheckpointManager",
    "SPMDSavePlanner",
    "SPMDLoadPlanner",
    "prime_optimizer",
]
