"""One training loop for TPU (torch_xla), GPU and CPU, with no torch_xla call in it.

::

    trainer = SeamlessTPUTrainer(model, mixed_precision="bf16")
    model, optimizer, loader = trainer.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        with trainer.autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()             # on XLA: reduce (if needed), step, one sync
        print(trainer.reduce_mean(loss))

The device is picked TPU -> GPU -> CPU (:func:`detect_device`).  On XLA:

* the model moves to the XLA device; under SPMD its parameters are explicitly replicated
  over the mesh, so the first step's graph already has the input shardings every later
  step has (left unsharded, torch_xla 2.9 compiles step 2 again because its parameters come
  back ``{replicated}``; checked on PJRT CPU);
* ``optimizer.step()`` all-reduces gradients only where torch_xla needs it (multi-process
  without SPMD; under SPMD the compiler inserts the reductions), steps, and calls
  ``torch_xla.sync()`` exactly once, so the whole step is one compiled graph and the loss
  is materialized by it (reading it afterwards costs no extra graph);
* the data loader becomes a ``MpDeviceLoader``; under SPMD with input sharding along the
  mesh's first (data) axis, taken from the backend's mesh inside a Ray Train worker
  (``tpu_backend.get_xla_mesh()``), else the global mesh or a 1-D mesh over all devices.
  With several SPMD hosts every host iterates the same global batch and torch_xla
  transfers only the shards its devices hold (``trainer.num_data_loaders`` is 1).

Elsewhere the model is wrapped in ``DistributedDataParallel`` and the loader given a
``DistributedSampler`` when ``torch.distributed`` is initialized with several ranks (Ray
Train's CPU/GPU workers), and batches are moved to the device.

``import tpu_backend.seamless`` never imports torch_xla; it is imported only once an XLA
device has been detected.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_backend.precision import SeamlessConfig

__all__ = [
    "DeviceInfo",
    "SeamlessTPUTrainer",
    "detect_device",
    "to_device",
]

# torch_xla's _internal/tpu.py counts TPU chips this way (PCI vendor Google, TPU device ids).
_PCI_DEVICES = "/sys/bus/pci/devices"
_GOOGLE_VENDOR = "0x1ae0"
_TPU_DEVICE_IDS = frozenset({"0x0027", "0x005e", "0x0063", "0x006f", "0x0056", "0x0062", "0x0076"})


@dataclass(frozen=True)
class DeviceInfo:
    """Where the loop runs."""

    kind: str
    """'xla', 'cuda' or 'cpu'."""
    device: Any
    """The ``torch.device`` to put tensors on."""
    spmd: bool = False
    mesh: Any = None
    """The SPMD mesh batches are sharded over (None without SPMD)."""
    in_ray_train: bool = False
    num_processes: int = 1
    """Processes of this job (SPMD: hosts; otherwise ranks)."""
    process_index: int = 0
    num_data_loaders: int = 1
    """Processes that load distinct parts of each global batch: the ranks of CPU/GPU and
    multi-process XLA runs; 1 under SPMD, where every host iterates the same global batch
    and torch_xla transfers each host's addressable shards of it."""


def _has_tpu_chips() -> bool:
    try:
        entries = list(Path(_PCI_DEVICES).glob("*/vendor"))
    except OSError:
        return False
    for vendor in entries:
        try:
            if vendor.read_text().strip() != _GOOGLE_VENDOR:
                continue
            if (vendor.parent / "device").read_text().strip() in _TPU_DEVICE_IDS:
                return True
        except OSError:
            continue
    return False


def _simulator_active() -> bool:
    # Peek only: the backend never imports the simulator.
    sim = sys.modules.get("xlasim")
    is_active = getattr(sim, "is_active", None)
    return bool(is_active()) if callable(is_active) else False


def xla_configured() -> bool:
    """Whether this process should use torch_xla: importable and an XLA device configured.

    Configured means: the backend bootstrapped this worker, the simulator is active,
    ``PJRT_DEVICE`` is set, or the host has TPU chips.  Without one of those, importing
    torch_xla would fall back to its CPU client, which is not what a GPU/CPU loop wants.
    """
    from tpu_backend import context

    if context._state is not None or _simulator_active():
        return True
    if "torch_xla" in sys.modules:
        return bool(os.environ.get("PJRT_DEVICE")) or _has_tpu_chips()
    try:
        if importlib.util.find_spec("torch_xla") is None:
            return False
    except (ImportError, ValueError):
        return False
    return bool(os.environ.get("PJRT_DEVICE")) or _has_tpu_chips()


def _in_ray_train() -> bool:
    if "ray" not in sys.modules:
        return False
    try:
        import ray.train

        ray.train.get_context().get_world_rank()
    except Exception:  # noqa: BLE001 - any failure means "not inside a training function"
        return False
    return True


def _xla_mesh(spmd: bool, in_ray: bool) -> Any:
    if not spmd:
        return None
    if in_ray:
        from tpu_backend.context import get_xla_mesh

        mesh = get_xla_mesh()
        if mesh is not None:
            return mesh
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    mesh = xs.get_global_mesh()
    if mesh is None:
        n = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    return mesh


def detect_device() -> DeviceInfo:
    """TPU (torch_xla) -> GPU -> CPU, inside or outside a Ray Train worker."""
    import torch

    in_ray = _in_ray_train()
    if xla_configured():
        import torch_xla
        import torch_xla.runtime as xr

        spmd = xr.is_spmd()
        if spmd:
            count, index, loaders = xr.process_count(), xr.process_index(), 1
        else:
            count, index = xr.world_size(), xr.global_ordinal()
            loaders = count
        return DeviceInfo(
            kind="xla",
            device=torch_xla.device(),
            spmd=spmd,
            mesh=_xla_mesh(spmd, in_ray),
            in_ray_train=in_ray,
            num_processes=count,
            process_index=index,
            num_data_loaders=loaders,
        )
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    count = dist.get_world_size() if distributed else 1
    index = dist.get_rank() if distributed else 0
    if in_ray:
        import ray.train.torch

        device = ray.train.torch.get_device()
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return DeviceInfo(
        kind=device.type if device.type in ("cuda", "cpu") else "cpu",
        device=device,
        in_ray_train=in_ray,
        num_processes=count,
        process_index=index,
        num_data_loaders=count,
    )


def _move(value: Any, device: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    def one(v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) and v.device != device else v

    return tree_map(one, value)


def to_device(*values: Any, device: Any = None) -> Any:
    """Move tensors (or nested lists/tuples/dicts of them) to the detected device.

    One argument returns the moved value, several return a tuple.
    """
    if not values:
        raise TypeError("to_device() needs at least one tensor (or nested structure) to move")
    target = device if device is not None else detect_device().device
    moved = tuple(_move(v, target) for v in values)
    return moved[0] if len(moved) == 1 else moved


_optimizer_class: Any = None


def _seamless_optimizer_class() -> Any:
    """``SeamlessOptimizer``, made on first use so that importing this module needs no torch.

    A real ``torch.optim.Optimizer`` subclass (LR schedulers check ``isinstance``), as HF
    accelerate's ``AcceleratedOptimizer`` is: it holds the user's optimizer and shares its
    ``param_groups``, ``state`` and ``defaults``; only ``step()`` differs.
    """
    global _optimizer_class
    if _optimizer_class is not None:
        return _optimizer_class
    import torch

    class SeamlessOptimizer(torch.optim.Optimizer):
        """An optimizer whose ``step()`` does what the device needs (module docstring)."""

        def __init__(self, optimizer: Any, trainer: SeamlessTPUTrainer) -> None:
            # No super().__init__: the wrapped optimizer owns the parameter groups.
            self.optimizer = optimizer
            self._trainer = trainer

        @property
        def param_groups(self) -> Any:
            return self.optimizer.param_groups

        @param_groups.setter
        def param_groups(self, value: Any) -> None:
            self.optimizer.param_groups = value

        @property
        def state(self) -> Any:
            return self.optimizer.state

        @state.setter
        def state(self, value: Any) -> None:
            self.optimizer.state = value

        @property
        def defaults(self) -> Any:
            return self.optimizer.defaults

        @defaults.setter
        def defaults(self, value: Any) -> None:
            self.optimizer.defaults = value

        def step(self, closure: Any = None) -> Any:
            return self._trainer._optimizer_step(self.optimizer, closure)

        def zero_grad(self, set_to_none: bool = True) -> None:
            self.optimizer.zero_grad(set_to_none=set_to_none)

        def add_param_group(self, param_group: dict[str, Any]) -> None:
            self.optimizer.add_param_group(param_group)

        def state_dict(self) -> Any:
            return self.optimizer.state_dict()

        def load_state_dict(self, state_dict: Any) -> None:
            self.optimizer.load_state_dict(state_dict)

        def __getstate__(self) -> Any:
            return self.optimizer.__getstate__()

        def __repr__(self) -> str:
            return f"SeamlessOptimizer({self.optimizer!r})"

    SeamlessOptimizer.__module__ = __name__
    SeamlessOptimizer.__qualname__ = "SeamlessOptimizer"
    _optimizer_class = SeamlessOptimizer
    return SeamlessOptimizer


def __getattr__(name: str) -> Any:
    if name == "SeamlessOptimizer":
        return _seamless_optimizer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _DeviceBatches:
    """Iterates a CPU loader, yielding batches on ``device`` (non-XLA devices)."""

    def __init__(self, loader: Any, device: Any) -> None:
        self.loader = loader
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield _move(batch, self.device)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)


class _BatchSharding:
    """``input_sharding`` for ``MpDeviceLoader``: dim 0 over the mesh's data axis.

    One ``ShardingSpec`` per tensor rank, because a batch mixes ranks (images and labels)
    and torch_xla leaves a tensor whose rank differs from the spec's unsharded.  torch_xla
    calls ``xla_spec(t)`` and reads ``minibatch`` on it, nothing else.
    """

    def __init__(self, mesh: Any, minibatch: bool) -> None:
        self.mesh = mesh
        self.minibatch = minibatch
        names = getattr(mesh, "axis_names", None)
        self.axis: Any = names[0] if names else 0
        self._specs: dict[int, Any] = {}

    def spec_for(self, rank: int) -> Any:
        spec = self._specs.get(rank)
        if spec is None:
            import torch_xla.distributed.spmd as xs

            spec = xs.ShardingSpec(self.mesh, (self.axis,) + (None,) * (rank - 1), self.minibatch)
            self._specs[rank] = spec
        return spec

    @property
    def partition_spec(self) -> tuple[Any, ...]:
        return (self.axis,)

    def can_apply(self, t: Any) -> bool:
        return t.dim() > 0

    def xla_spec(self, t: Any) -> Any:
        if t.dim() == 0:
            return None
        return self.spec_for(t.dim()).xla_spec(t)

    def __bool__(self) -> bool:
        return True


class SeamlessTPUTrainer:
    """Prepares a model, optimizer and data loader for whatever device this process has.

    Args:
        model: The ``torch.nn.Module`` to train (prepared at construction; the prepared
            module is ``trainer.model``).
        optimizer: Optional; prepared too when given (``trainer.optimizer``).
        precision, mixed_precision, compile_cache, compile_cache_dir, compile_cache_size,
        compile_cache_readonly, compilation_timeout, memory_fraction: see
            :class:`tpu_backend.precision.SeamlessConfig`.
        config: A ready :class:`SeamlessConfig` instead of the keyword settings.
        device: Force a device (``torch.device``); default :func:`detect_device`.
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        *,
        config: SeamlessConfig | None = None,
        device: Any = None,
        **settings: Any,
    ) -> None:
        if config is not None and settings:
            raise ValueError(
                f"pass either config=SeamlessConfig(...) or keyword settings, not both "
                f"(got config and {sorted(settings)})"
            )
        try:
            self.config = config if config is not None else SeamlessConfig(**settings)
        except TypeError as e:
            from dataclasses import fields

            valid = ", ".join(f.name for f in fields(SeamlessConfig))
            raise TypeError(f"{e}; valid settings: {valid}") from None
        if device is not None:
            import torch

            device = torch.device(device)
            self.info = (
                detect_device()
                if device.type == "xla"
                else DeviceInfo(
                    kind=device.type if device.type == "cuda" else "cpu",
                    device=device,
                    in_ray_train=_in_ray_train(),
                )
            )
            if device.type == "xla" and self.info.kind != "xla":
                raise ValueError(
                    f"device {device} was requested but no XLA device is configured (torch_xla "
                    f"importable and PJRT_DEVICE set, TPU chips present, or the simulator active)"
                )
        else:
            self.info = detect_device()
        self.config.check_device(self.info.kind)
        self.steps = 0
        self._moved_params: dict[int, Any] = {}
        self._setup_device()
        self.model = self.prepare_model(model) if model is not None else None
        self.optimizer = self.prepare_optimizer(optimizer) if optimizer is not None else None

    # -- what the loop may ask ---------------------------------------------------------
    @property
    def device(self) -> Any:
        return self.info.device

    @property
    def is_xla(self) -> bool:
        return self.info.kind == "xla"

    @property
    def spmd(self) -> bool:
        return self.info.spmd

    @property
    def mesh(self) -> Any:
        return self.info.mesh

    @property
    def num_processes(self) -> int:
        """Processes of this job (SPMD: hosts; otherwise ranks)."""
        return self.info.num_processes

    @property
    def num_data_loaders(self) -> int:
        """Processes loading distinct parts of each global batch; per-process batch size =
        global batch size // num_data_loaders (1 under SPMD: each host loads it all)."""
        return self.info.num_data_loaders

    @property
    def process_index(self) -> int:
        return self.info.process_index

    @property
    def is_main_process(self) -> bool:
        return self.info.process_index == 0

    # -- set-up ------------------------------------------------------------------------
    def _setup_device(self) -> None:
        cfg = self.config
        if self.info.kind == "cuda" and cfg.memory_fraction is not None:
            import torch

            torch.cuda.set_per_process_memory_fraction(cfg.memory_fraction, self.device)
        if self.info.kind != "xla":
            return
        from tpu_backend import compile_cache

        if cfg.compile_cache_size is not None and os.environ.get(
            compile_cache.MEMORY_CACHE_ENV
        ) != str(cfg.compile_cache_size):
            compile_cache.set_memory_cache_size(cfg.compile_cache_size)
        if cfg.compile_cache and not os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
            assert cfg.compile_cache_dir is not None
            spec = None
            from tpu_backend import context

            state = context._state
            if state is not None and state.slice_topology:
                from tpu_backend.topology import parse_slice

                spec = parse_slice(state.slice_topology, state.slice_accelerator)
            readonly = cfg.compile_cache_readonly
            if readonly == "auto":
                readonly = "followers"  # without the driver's marker exchange
            compile_cache.initialize_cache(
                cfg.compile_cache_dir,
                spec=spec,
                host_index=self.info.process_index,
                readonly=readonly,
            )

    def prepare_model(self, model: Any) -> Any:
        """Move (and cast) the model; replicate it over the mesh or wrap it in DDP."""
        import torch

        before = list(model.parameters())
        if self.config.precision == "bf16":
            model = model.to(torch.bfloat16)
        model = model.to(self.device)
        # Moving to XLA (or casting) makes new Parameter objects; an optimizer built on the
        # old ones would step tensors the model no longer uses.
        for old, new in zip(before, model.parameters(), strict=True):
            if old is not new:
                self._moved_params[id(old)] = new
        if self.is_xla:
            if self.spmd and self.mesh is not None:
                import torch_xla.distributed.spmd as xs

                for tensor in list(model.parameters()) + list(model.buffers()):
                    if not _has_sharding(tensor):
                        xs.mark_sharding(tensor, self.mesh, (None,) * tensor.dim())
            elif self.num_processes > 1:
                import torch_xla.core.xla_model as xm

                # One process per chip: start every replica from rank 0's weights, as DDP does.
                xm.broadcast_master_param(model)
            return model
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            from torch.nn.parallel import DistributedDataParallel

            if self.info.kind == "cuda":
                return DistributedDataParallel(model, device_ids=[self.device])
            return DistributedDataParallel(model)
        return model

    def prepare_optimizer(self, optimizer: Any) -> Any:
        """Wrap ``optimizer``; point it at the prepared model's parameters if it was built
        on the model before :meth:`prepare_model` moved it."""
        cls = _seamless_optimizer_class()
        if isinstance(optimizer, cls):
            return optimizer
        moved = self._moved_params
        if moved:
            for group in optimizer.param_groups:
                group["params"] = [moved.get(id(p), p) for p in group["params"]]
            for old_id, new in moved.items():
                for key in [k for k in optimizer.state if id(k) == old_id]:
                    optimizer.state[new] = optimizer.state.pop(key)
        return cls(optimizer, self)

    def prepare_data_loader(self, loader: Any) -> Any:
        """A loader yielding batches on the device (see the module docstring)."""
        loader = self._distribute(loader)
        if not self.is_xla:
            return _DeviceBatches(loader, self.device)
        import torch_xla.distributed.parallel_loader as pl

        kwargs: dict[str, Any] = {}
        if self.spmd and self.mesh is not None:
            kwargs["input_sharding"] = _BatchSharding(self.mesh, minibatch=False)
        return pl.MpDeviceLoader(loader, self.device, **kwargs)

    def _distribute(self, loader: Any) -> Any:
        """Give a plain DataLoader a DistributedSampler when several processes load data."""
        from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

        if self.num_data_loaders <= 1 or not isinstance(loader, DataLoader):
            return loader
        if isinstance(loader.sampler, DistributedSampler) or loader.batch_sampler is None:
            return loader
        sampler: DistributedSampler[Any] = DistributedSampler(
            loader.dataset,
            num_replicas=self.num_data_loaders,
            rank=self.process_index,
            shuffle=isinstance(loader.sampler, RandomSampler),
            drop_last=loader.drop_last,
        )
        return DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            generator=loader.generator,
            persistent_workers=loader.persistent_workers,
        )

    def prepare(self, *objects: Any) -> Any:
        """Accelerate-style: prepare each module, optimizer and data loader, in order."""
        import torch

        out: list[Any] = list(objects)
        kinds = []
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                kinds.append(0)
            elif isinstance(obj, torch.optim.Optimizer):
                kinds.append(1)
            elif isinstance(obj, Iterable):
                kinds.append(2)
            else:
                raise TypeError(
                    f"prepare() cannot prepare a {type(obj).__name__}; valid: torch.nn.Module, "
                    f"torch.optim.Optimizer, or an iterable data loader"
                )
        # Models first: optimizers are re-pointed at the moved parameters.
        for kind in (0, 1, 2):
            for i, obj in enumerate(objects):
                if kinds[i] != kind:
                    continue
                if kind == 0:
                    out[i] = self.model = self.prepare_model(obj)
                elif kind == 1:
                    out[i] = self.optimizer = self.prepare_optimizer(obj)
                else:
                    out[i] = self.prepare_data_loader(obj)
        return out[0] if len(out) == 1 else tuple(out)

    def to_device(self, *values: Any) -> Any:
        """Move tensors (or nested structures) to this trainer's device."""
        return to_device(*values, device=self.device)

    # -- per step ----------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The mixed-precision region for forward passes (a no-op with ``'no'``)."""
        if self.config.mixed_precision != "bf16":
            return contextlib.nullcontext()
        import torch

        return _checked_autocast(torch.autocast(self.device.type, dtype=torch.bfloat16))

    def _optimizer_step(self, optimizer: Any, closure: Any) -> Any:
        if not self.is_xla:
            result = optimizer.step(closure) if closure is not None else optimizer.step()
            self.steps += 1
            return result
        import torch_xla
        import torch_xla.core.xla_model as xm

        if not self.spmd:
            # Several replicas (xmp.spawn / the xla process group): average gradients, as
            # xm.optimizer_step does; it is a no-op with one replica.
            xm.reduce_gradients(optimizer)
        result = optimizer.step(closure) if closure is not None else optimizer.step()
        torch_xla.sync()
        self.steps += 1
        return result

    def reduce_mean(self, value: Any) -> float:
        """The mean of a scalar over every process's share of the global batch, as a float.

        Under SPMD the loss already covers the global batch; with several CPU/GPU ranks it
        is averaged over them (all ranks must call this together).
        """
        import torch

        tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
        if tensor.numel() != 1:
            raise ValueError(f"reduce_mean() takes a scalar, got shape {tuple(tensor.shape)}")
        if self.is_xla:
            if not self.spmd and self.num_processes > 1:
                import torch_xla.core.xla_model as xm

                reduced = xm.all_reduce(xm.REDUCE_SUM, tensor.float())
                return float(reduced.item()) / self.num_processes
            return float(tensor.float().item())
        import torch.distributed as dist

        if self.num_processes > 1 and dist.is_available() and dist.is_initialized():
            tensor = tensor.float().clone()
            dist.all_reduce(tensor)
            return float(tensor.item()) / self.num_processes
        return float(tensor.float().item())

    # -- statistics --------------------------------------------------------------------
    def compile_stats(self) -> Any:
        """Compilation counters (hits, misses, compile time) on XLA; None elsewhere."""
        if not self.is_xla:
            return None
        from tpu_backend.compile_cache import compile_stats

        return compile_stats()


def _has_sharding(tensor: Any) -> bool:
    import torch_xla

    try:
        return bool(torch_xla._XLAC._get_xla_sharding_spec(tensor))
    except Exception:  # noqa: BLE001 - no sharding information: treat as unsharded
        return False


@contextlib.contextmanager
def _checked_autocast(ctx: Any) -> Iterator[None]:
    try:
        with ctx:
            yield
    except NotImplementedError as e:
        if "AutocastXLA" in str(e):
            raise NotImplementedError(
                "mixed_precision='bf16' needs torch.autocast('xla'), whose AutocastXLA kernels "
                "this torch_xla runtime does not provide (the xlasim simulator does not "
                "simulate autocast); use precision='bf16' or mixed_precision='no'"
            ) from e
        raise
