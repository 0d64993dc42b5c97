"""A drop-in ``TorchTrainer`` that runs torch_xla on TPU slices.

``ray.train.torch.TorchTrainer`` turns ``ScalingConfig(use_tpu=True)`` into
``backend='tpu_dist'`` (torch_tpu) and does so by mutating the ``TorchConfig`` it is
given.  This subclass picks :class:`~tpu_backend.config.TPUTorchConfig` instead, never
mutates the caller's config, and checks the config against the slice before Ray starts
any worker.  Slice placement (one worker per host, ``SlicePlacementGroup``) stays Ray's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.train.torch import TorchConfig
from ray.train.torch import TorchTrainer as _RayTorchTrainer

from tpu_backend.config import TPUTorchConfig

__all__ = ["TorchTrainer", "select_torch_config"]


def select_torch_config(torch_config: Any, scaling_config: Any) -> Any:
    """The config the trainer runs with: a (validated) ``TPUTorchConfig`` on TPU runs.

    * ``TPUTorchConfig`` given: checked against ``scaling_config`` and returned as is.
    * ``use_tpu`` with no config, or a plain ``TorchConfig`` with no backend: a new
      ``TPUTorchConfig`` carrying its ``timeout_s`` (the caller's object is untouched).
    * ``use_tpu`` with a plain ``TorchConfig`` naming a backend: ``ValueError``; ``'tpu_dist'``
      is torch_tpu's, which this trainer does not run.
    * no ``use_tpu``: the caller's config (plain Ray Train on CPU/GPU).
    """
    use_tpu = bool(getattr(scaling_config, "use_tpu", False))
    if isinstance(torch_config, TPUTorchConfig):
        torch_config.resolve(scaling_config)
        return torch_config
    if not use_tpu:
        return torch_config
    if torch_config is None:
        config = TPUTorchConfig()
    elif isinstance(torch_config, TorchConfig):
        if torch_config.backend:
            raise ValueError(
                f"TorchConfig(backend={torch_config.backend!r}) cannot run on TPU with "
                f"tpu_backend.TorchTrainer, which runs torch_xla; pass "
                f"tpu_backend.TPUTorchConfig(...) (or no torch_config), or use "
                f"ray.train.torch.TorchTrainer for Ray's 'tpu_dist' (torch_tpu) backend"
            )
        base = {f.name: getattr(torch_config, f.name) for f in dataclasses.fields(TorchConfig)}
        base.pop("backend", None)
        base.pop("init_method", None)
        config = TPUTorchConfig(**base)
    else:
        raise TypeError(
            f"torch_config must be a TorchConfig or TPUTorchConfig, got "
            f"{type(torch_config).__name__}"
        )
    config.resolve(scaling_config)
    return config


class TorchTrainer(_RayTorchTrainer):
    """``ray.train.torch.TorchTrainer`` whose TPU runs use torch_xla SPMD.

    Same arguments as Ray's.  With ``ScalingConfig(use_tpu=True, topology=...,
    accelerator_type=...)`` the run uses :class:`TPUTorchConfig` (SPMD, default mesh)
    unless one is passed; inconsistent settings raise ``ValueError`` here, before
    ``fit()`` starts any worker.
    """

    def __init__(
        self,
        train_loop_per_worker: Any,
        *,
        torch_config: Any = None,
        scaling_config: Any = None,
        **kwargs: Any,
    ) -> None:
        torch_config = select_torch_config(torch_config, scaling_config)
        super().__init__(
            train_loop_per_worker,
            torch_config=torch_config,
            scaling_config=scaling_config,
            **kwargs,
        )
