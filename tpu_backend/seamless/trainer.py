"""``SeamlessTPUTrainer``: prepares model, optimizer and loader for the detected device."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import fields
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tpu_backend import compile_cache, context
from tpu_backend.precision import SeamlessConfig
from tpu_backend.seamless.device import (
    DeviceInfo,
    detect_device,
    device_kind,
    in_ray_train,
    to_device,
)
from tpu_backend.seamless.forwarding import Forwarded
from tpu_backend.seamless.loader import BatchSharding, DeviceBatches, distribute
from tpu_backend.seamless.optimizer import SeamlessOptimizer
from tpu_backend.topology import parse_slice

__all__ = ["SeamlessTPUTrainer", "replicate_over_mesh"]


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
            valid = ", ".join(f.name for f in fields(SeamlessConfig))
            raise TypeError(f"{e}; valid settings: {valid}") from None
        if device is not None:
            device = torch.device(device)
            self.info = (
                detect_device()
                if device.type == "xla"
                else DeviceInfo(
                    kind=device_kind(device),
                    device=device,
                    in_ray_train=in_ray_train(),
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

    # -- what the loop may ask (see DeviceInfo) ------------------------------------------
    device = Forwarded("info")
    spmd = Forwarded("info")
    mesh = Forwarded("info")
    num_processes = Forwarded("info")
    """Processes of this job (SPMD: hosts; otherwise ranks)."""
    num_data_loaders = Forwarded("info")
    """Processes loading distinct parts of each global batch; per-process batch size =
    global batch size // num_data_loaders (1 under SPMD: each host loads it all)."""
    process_index = Forwarded("info")

    @property
    def is_xla(self) -> bool:
        return self.info.kind == "xla"

    @property
    def is_main_process(self) -> bool:
        return self.info.process_index == 0

    # -- set-up ------------------------------------------------------------------------
    def _setup_device(self) -> None:
        cfg = self.config
        if self.info.kind == "cuda" and cfg.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(cfg.memory_fraction, self.device)
        if self.info.kind != "xla":
            return
        if cfg.compile_cache_size is not None and os.environ.get(
            compile_cache.MEMORY_CACHE_ENV
        ) != str(cfg.compile_cache_size):
            compile_cache.set_memory_cache_size(cfg.compile_cache_size)
        if cfg.compile_cache and not os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
            assert cfg.compile_cache_dir is not None
            spec = None
            state = context._state
            if state is not None and state.slice_topology:
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
                replicate_over_mesh(model, self.mesh)
            elif self.num_processes > 1:
                import torch_xla.core.xla_model as xm  # deferred: XLA only

                # One process per chip: start every replica from rank 0's weights, as DDP does.
                xm.broadcast_master_param(model)
            return model
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            if self.info.kind == "cuda":
                return DistributedDataParallel(model, device_ids=[self.device])
            return DistributedDataParallel(model)
        return model

    def prepare_optimizer(self, optimizer: Any) -> Any:
        """Wrap ``optimizer``; point it at the prepared model's parameters if it was built
        on the model before :meth:`prepare_model` moved it."""
        if isinstance(optimizer, SeamlessOptimizer):
            return optimizer
        moved = self._moved_params
        if moved:
            for group in optimizer.param_groups:
                group["params"] = [moved.get(id(p), p) for p in group["params"]]
            for old_id, new in moved.items():
                for key in [k for k in optimizer.state if id(k) == old_id]:
                    optimizer.state[new] = optimizer.state.pop(key)
        return SeamlessOptimizer(optimizer, self._optimizer_step)

    def prepare_data_loader(self, loader: Any) -> Any:
        """A loader yielding batches on the device (see the module docstring)."""
        loader = distribute(loader, self.num_data_loaders, self.process_index)
        if not self.is_xla:
            return DeviceBatches(loader, self.device)
        import torch_xla.distributed.parallel_loader as pl  # deferred: XLA only

        kwargs: dict[str, Any] = {}
        if self.spmd and self.mesh is not None:
            kwargs["input_sharding"] = BatchSharding(self.mesh, minibatch=False)
        return pl.MpDeviceLoader(loader, self.device, **kwargs)

    def prepare(self, *objects: Any) -> Any:
        """Accelerate-style: prepare each module, optimizer and data loader, in order."""
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
        return _checked_autocast(torch.autocast(self.device.type, dtype=torch.bfloat16))

    def _optimizer_step(self, optimizer: Any, closure: Any) -> Any:
        if not self.is_xla:
            result = optimizer.step(closure) if closure is not None else optimizer.step()
            self.steps += 1
            return result
        # Deferred: XLA only.
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
        tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
        if tensor.numel() != 1:
            raise ValueError(f"reduce_mean() takes a scalar, got shape {tuple(tensor.shape)}")
        if self.is_xla:
            if not self.spmd and self.num_processes > 1:
                import torch_xla.core.xla_model as xm  # deferred: XLA only

                reduced = xm.all_reduce(xm.REDUCE_SUM, tensor.float())
                return float(reduced.item()) / self.num_processes
            return float(tensor.float().item())
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
        return compile_cache.compile_stats()


def replicate_over_mesh(model: Any, mesh: Any) -> None:
    """Mark every parameter and buffer of ``model`` that is on the XLA device and has no
    sharding yet as replicated over ``mesh``.

    So the first SPMD step's graph already has the input shardings of every later step
    (left unsharded, torch_xla 2.9 compiles step 2 again: see the package docstring).
    Tensors that are not on XLA are left alone; sharded ones (FSDPv2, ``mark_sharding``)
    keep their sharding.
    """
    # torch_xla is imported only on a detected XLA device.
    import torch_xla.distributed.spmd as xs

    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.device.type == "xla" and not _has_sharding(tensor):
            xs.mark_sharding(tensor, mesh, (None,) * tensor.dim())


def _has_sharding(tensor: Any) -> bool:
    import torch_xla  # deferred: XLA only

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
