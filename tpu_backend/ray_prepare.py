"""Ray Train's ``prepare_model()`` and ``prepare_data_loader()`` on the backend's workers.

Ray 2.60 decides from its world size alone: with more than one worker it wraps the model in
``DistributedDataParallel`` and each worker moves its batches whole to its device.  Under
torch_xla SPMD one worker per host drives every chip of the slice as one program: the model
is one (replicated) model, gradients come out global because the compiler inserts the
reductions, and DDP has nothing to do (its gloo all-reduce would only add the hosts' already
global gradients together).  What a batch needs instead is to become one global tensor split
over the mesh.

On every worker of the backend (:func:`set_up_worker`, run by the driver) Ray's two helpers
are replaced by ones that, under SPMD, do what the seamless wrappers do:

* ``prepare_model(model)``: the model moves to ``torch_xla.device()`` and its parameters and
  buffers are replicated over the backend's mesh
  (:func:`tpu_backend.seamless.trainer.replicate_over_mesh`); it is never wrapped.
* ``prepare_data_loader(loader)``: Ray's own ``DistributedSampler`` per host when the loader
  has none (Ray's rules; its rank is the gloo rank = the host index), then batches on the
  XLA device through ``MpDeviceLoader`` with dim 0 split over the mesh
  (:class:`tpu_backend.seamless.loader.BatchSharding`); with several hosts each host's batch is
  its part of the global batch (``minibatch`` input sharding), hosts in host order.

Arguments that cannot apply under SPMD raise ``ValueError`` naming them; the rest are
honoured.  Without SPMD (one process per chip, the ``xla`` process group) ``prepare_model``
is Ray's (DDP over that group, as torch_xla runs DDP) and ``prepare_data_loader`` adds Ray's
sampler and then goes through ``MpDeviceLoader`` too: Ray's own loader only moves batches, so
a loop with no ``torch_xla.sync()`` of its own would trace one ever longer graph (real
torch_xla 2.9 compiles anew at every step).  Outside this backend the helpers are Ray's.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from ray.train._internal import session as _v1_session

from tpu_backend import context
from tpu_backend.bootstrap import WorkerBootstrap, bootstrap_worker
from tpu_backend.seamless.loader import BatchSharding
from tpu_backend.seamless.trainer import replicate_over_mesh

__all__ = ["ShardedBatches", "install", "set_up_worker"]

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_HELPERS = ("prepare_model", "prepare_data_loader")
# Where Ray 2.60 keeps the helpers a training function can reach: the public module
# (``ray.train.torch.prepare_model``) and the two modules that define them (V1, and V2, the
# default, which the public names come from).
_RAY_MODULES = (
    "ray.train.torch",
    "ray.train.torch.train_loop_utils",
    "ray.train.v2.torch.train_loop_utils",
)


def _spmd_state() -> context.XlaWorkerState | None:
    state = context._state
    return state if state is not None and state.spmd else None


def _v1_amp_enabled() -> bool:
    """Whether Ray Train V1's ``accelerate(amp=True)`` was called in this session (V2, the
    default, refuses ``accelerate``)."""
    get_session = getattr(_v1_session, "get_session", None)
    accelerator = getattr(get_session() if get_session else None, "accelerator", None)
    return bool(getattr(accelerator, "amp_is_enabled", False))


def _prepare_model(
    state: context.XlaWorkerState,
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """``ray.train.torch.prepare_model`` under SPMD: the model on the XLA device, replicated
    over the mesh, not wrapped.

    ``parallel_strategy='ddp'`` (Ray's default) and ``None`` both mean data parallel, which
    the mesh already is.  ``move_to_device=False`` leaves the model where it is (parameters
    already on XLA are still replicated); a ``torch.device`` must be an XLA one.
    """
    if parallel_strategy not in ("ddp", None):
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) cannot apply under "
            f"torch_xla SPMD: Ray's 'fsdp' is torch.distributed FullyShardedDataParallel, "
            f"which runs on CUDA only. Valid here: 'ddp' (the default) or None, which both "
            f"replicate the model over the mesh while batches split over its data axis; to "
            f"shard the parameters wrap the model in torch_xla's FSDPv2 "
            f"(torch_xla.experimental.spmd_fully_sharded_data_parallel."
            f"SpmdFullyShardedDataParallel) yourself and pass parallel_strategy=None"
        )
    if parallel_strategy_kwargs:
        raise ValueError(
            f"prepare_model(parallel_strategy_kwargs={parallel_strategy_kwargs!r}) cannot "
            f"apply under torch_xla SPMD: they are DistributedDataParallel arguments, and the "
            f"model is not wrapped in DDP (one program drives every chip and the compiler "
            f"inserts the gradient reductions); pass none"
        )
    if _v1_amp_enabled():
        raise ValueError(
            "ray.train.torch.accelerate(amp=True) cannot apply under torch_xla SPMD: its "
            "GradScaler and torch.cuda.amp autocast are CUDA's; call accelerate() without "
            "amp and put the forward pass in torch.autocast('xla', dtype=torch.bfloat16)"
        )
    if isinstance(move_to_device, torch.device) and move_to_device.type != "xla":
        raise ValueError(
            f"prepare_model(move_to_device={move_to_device!r}) cannot apply under torch_xla "
            f"SPMD, where the batches are on the XLA device; valid: True (the default), "
            f"False (you move the model), or an XLA device such as torch_xla.device()"
        )
    # Deferred: torch_xla is set up by the bootstrap before any training function runs.
    import torch_xla

    target = move_to_device if isinstance(move_to_device, torch.device) else torch_xla.device()
    if move_to_device:
        model = model.to(target)
    replicate_over_mesh(model, state.mesh)
    if state.process_index == 0:
        logger.info(
            "Model on %s, replicated over the SPMD mesh %s; no DistributedDataParallel under SPMD",
            target,
            tuple(state.mesh.mesh_shape),
        )
    return model


def _prepare_data_loader(
    state: context.XlaWorkerState,
    ray_helper: Callable[..., Any],
    data_loader: torch.utils.data.DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> Any:
    """``ray.train.torch.prepare_data_loader`` on the backend: under SPMD per-host batches,
    sharded over the mesh; without SPMD each process's batches (see the module docstring).

    ``add_dist_sampler`` is Ray's (with one host there is nothing to split);
    ``move_to_device=False`` returns the CPU loader, whose batches are then this host's part
    only; ``auto_transfer`` (transfers overlapping the step) is ``MpDeviceLoader``'s
    background transfer when True and a transfer at each ``next()`` when False.
    ``ray_helper`` is Ray's own ``prepare_data_loader``, which adds the sampler.
    """
    if state.process_count > 1 and add_dist_sampler:
        # Ray's rules for when and how (shuffle unless the loader was sequential, not for
        # an IterableDataset, not over a user's DistributedSampler); its sampler takes
        # rank and replicas from the process group: under SPMD the gloo group (host index,
        # host count), without it the xla group (process index, process count).
        data_loader = ray_helper(data_loader, add_dist_sampler=True, move_to_device=False)
    if not move_to_device:
        return data_loader
    # Deferred: torch_xla is set up by the bootstrap before any training function runs.
    import torch_xla

    sharding = BatchSharding(state.mesh, minibatch=state.process_count > 1) if state.spmd else None
    return ShardedBatches(data_loader, torch_xla.device(), sharding, prefetch=auto_transfer)


class ShardedBatches:
    """Iterates a CPU loader, yielding each batch on the XLA device split by ``sharding``
    (``None``: whole, without SPMD).

    ``prefetch``: through torch_xla's ``MpDeviceLoader`` (background transfer); otherwise
    each batch is transferred when asked for.  Either way the step's graph runs when the
    next batch is asked for (``torch_xla.sync()``), as ``MpDeviceLoader`` does, so a loop
    with no sync of its own runs one graph per step.  Other attributes (``sampler``,
    ``dataset``, ``batch_size``) are the loader's, so ``loader.sampler.set_epoch(epoch)``
    works as on Ray's loader.
    """

    def __init__(self, loader: Any, device: Any, sharding: Any, *, prefetch: bool) -> None:
        self.loader = loader
        self.device = device
        self.sharding = sharding
        self.prefetch = prefetch

    def __iter__(self) -> Iterator[Any]:
        # Deferred: XLA workers only.
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.parallel_loader as pl

        if self.prefetch:
            yield from pl.MpDeviceLoader(self.loader, self.device, input_sharding=self.sharding)
            return
        for batch in self.loader:
            torch_xla.sync()
            yield xm.send_cpu_data_to_device([batch], self.device, self.sharding)[0]
        torch_xla.sync()

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        # Only for attributes the object itself lacks; none before __init__ (copy, pickle).
        if "loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)


def _model_helper(ray_helper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(ray_helper)
    def helper(*args: Any, **kwargs: Any) -> Any:
        state = _spmd_state()
        if state is None:
            return ray_helper(*args, **kwargs)
        return _prepare_model(state, *args, **kwargs)

    helper._xla_wraps = ray_helper  # type: ignore[attr-defined]
    return helper


def _loader_helper(ray_helper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(ray_helper)
    def helper(*args: Any, **kwargs: Any) -> Any:
        state = context._state
        if state is None:
            return ray_helper(*args, **kwargs)
        return _prepare_data_loader(state, ray_helper, *args, **kwargs)

    helper._xla_wraps = ray_helper  # type: ignore[attr-defined]
    return helper


def install() -> None:
    """Route Ray Train's ``prepare_model``/``prepare_data_loader`` on this worker process
    through the backend's versions (Ray's own run whenever the backend is not set up here,
    and Ray's ``prepare_model`` without SPMD)."""
    modules = []
    for name in _RAY_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue  # a Ray release without Train V2: the others still hold the helpers
    if not any(hasattr(m, h) for m in modules for h in _HELPERS):
        raise RuntimeError(
            f"this Ray release has no {' or '.join(_HELPERS)} in {', '.join(_RAY_MODULES)}: "
            f"tpu_backend cannot prepare models and loaders for SPMD; use "
            f"tpu_backend.seamless.SeamlessTPUTrainer"
        )
    makers = {"prepare_model": _model_helper, "prepare_data_loader": _loader_helper}
    with _LOCK:
        made: dict[int, Any] = {}  # one wrapper per Ray function, wherever it is reachable
        for module in modules:
            for name, make in makers.items():
                original = getattr(module, name, None)
                if original is None or hasattr(original, "_xla_wraps"):
                    continue
                if id(original) not in made:
                    made[id(original)] = make(original)
                setattr(module, name, made[id(original)])


def set_up_worker(b: WorkerBootstrap) -> dict[str, Any]:
    """Runs on a worker: the bootstrap, then Ray Train's helpers pointed at it."""
    summary = bootstrap_worker(b)
    install()
    return summary
