"""``torch_xla.distributed.zero_redundancy_optimizer``: ZeRO-1, an optimizer whose state each
replica keeps for its shard of every parameter. The simulator does not simulate it; the
module is here so that programs importing it load (on a CPU device, upstream's own ZeRO-1
test imports it and then runs nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor
from torch.optim import Optimizer


class ZeroRedundancyOptimizer(Optimizer):
    def __init__(
        self,
        params: Iterator[Tensor],
        optimizer_class: type[Optimizer],
        optimizer_dtype: Any | None = None,
        grad_clipping: bool = True,
        max_norm: float | None = None,
        pin_layout: bool = True,
        sharding_groups: Any | None = None,
        grad_norm_groups: Any | None = None,
        lazy_init: bool = False,
        bucket_cap_mb_all_gather: int = 0,
        bucket_cap_mb_reduce_scatter: int = 0,
        use_grad_acc_hook: bool = False,
        save_master_weights: bool = False,
        higher_cc_precision: bool = False,
        **defaults: Any,
    ) -> None:
        raise NotImplementedError(
            "xlasim does not simulate torch_xla.distributed.zero_redundancy_optimizer."
            "ZeroRedundancyOptimizer (ZeRO-1 sharded optimizer state)"
        )
