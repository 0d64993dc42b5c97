"""The collective-based FSDP of torch_xla ("FSDPv1"): one process per device, each keeping a
shard of every parameter; the forward all-gathers full parameters from the shards and the
backward reduce-scatters their gradients back onto the shards, averaged over the world.

On the simulator the collectives are the replicas' real ``xm.all_gather`` and
``xm.reduce_scatter``, so sharded training computes what data-parallel training on the
global batch computes. Each parameter is flattened, padded to a multiple of
``world_size * _shard_size_multiple`` elements (or, with ``shard_param_on_dim_0``, padded
along dim 0 to a multiple of ``world_size``) and split evenly; the shard is registered on
the wrapper as ``_fsdp_shard.<name relative to the wrapper>`` with ``.`` spelled
``_FSDP_SHARD_SEPARATOR_``, which is what ``parameters()``, ``named_parameters()`` and
``state_dict()`` show, as in torch_xla. With ``flatten_parameters=True`` the parameters
sharded are each wrapper's ``flat_param_<i>`` vectors (see ``xla_flatten_params_wrapper``).

The gather is one autograd function per parameter, whose backward is the reduce-scatter:
gradients land on the shards directly (torch_xla gets the same result from hooks on the
full parameters). Optimization barriers, bucketing and memory freeing only shape torch_xla's
compiled graphs, not values; the simulator keeps the gathered parameters until the next
forward.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch import nn
from torch_xla.distributed.fsdp.wrap import _wrap_children
from torch_xla.distributed.fsdp.xla_flatten_params_wrapper import XlaFlattenParamsWrapper

__all__ = ["XlaFullyShardedDataParallel"]

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_SEPARATOR = "_FSDP_SHARD_SEPARATOR_"
_DEBUG_OPTIONS = (
    "_debug_dummy_forward_pass",
    "_debug_dummy_all_gather_op",
    "_debug_dummy_all_reduce_op",
    "_debug_dummy_reduce_scatter_op",
    "_debug_dummy_optimization_barrier_op",
)


def _map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((k, _map_tensors(fn, v)) for k, v in value.items())
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_map_tensors(fn, v) for v in value)
    return value


def _predivide_factor(world_size: int) -> float:
    # The gradient is divided in two steps, before and after the sum, by powers of two near
    # sqrt(world_size), as torch_xla does (it keeps low-precision sums in range).
    # The first power of two that no longer divides world_size or whose square reaches it.
    power = 0
    while world_size % (1 << power) == 0 and (1 << (2 * power)) < world_size:
        power += 1
    return float(1 << power)


def _materialize(module: nn.Module, param_init_fn: Callable[[nn.Module], None] | None) -> None:
    """A module built on the meta device gets real storage: from ``param_init_fn`` when
    given, else by ``module.reset_parameters()`` on CPU."""
    if not any(p.is_meta for p in module.parameters()):
        return
    if param_init_fn is not None:
        if not callable(param_init_fn):
            raise ValueError(
                f"Expected {param_init_fn} to be callable but got {type(param_init_fn)}"
            )
        param_init_fn(module)
        return
    module.to_empty(device="cpu")
    with torch.no_grad():
        module.reset_parameters()  # type: ignore[operator]


class _GatherFullParam(torch.autograd.Function):
    """Forward: the full parameter from every replica's shard. Backward: the gradient,
    reduce-scattered back to this replica's shard."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, owner: Any, index: int) -> torch.Tensor:
        ctx.owner, ctx.index = owner, index
        return owner._gather(shard, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return ctx.owner._scatter_grad(grad, ctx.index), None, None


class XlaFullyShardedDataParallel(nn.Module):
    """Shards ``module``'s parameters over the replicas (see the module docstring).

    Build the optimizer after wrapping, over ``fsdp.parameters()`` (the shards), and step it
    with ``optimizer.step()``: gradients are already averaged.
    """

    def __init__(
        self,
        module: nn.Module,
        reshard_after_forward: bool = True,
        flatten_parameters: bool = False,
        execute_sharding_on_init: bool = True,
        optimization_barrier_in_forward: bool = True,
        optimization_barrier_in_backward: bool = True,
        sync_on_finalization: bool = False,
        disable_reshard_on_root: bool = True,
        compute_dtype: torch.dtype | None = None,
        buffer_dtype: torch.dtype | None = None,
        fp32_reduce_scatter: bool = False,
        sharding_groups: list[list[int]] | None = None,
        sharding_rank: int | None = None,
        sharding_world_size: int | None = None,
        shard_param_on_dim_0: bool = False,
        pin_layout_in_collective_ops: bool = True,
        reduce_scatter_bucket_size_mb: int | None = 0,
        coalesce_all_gather_ops: bool = False,
        auto_wrap_policy: Callable[..., bool] | None = None,
        auto_wrapper_callable: Callable[..., Any] | None = None,
        param_init_fn: Callable[[nn.Module], None] | None = None,
        _shard_size_multiple: int = 128,
        _use_xla_patched_linear: bool = True,
        _debug_dummy_forward_pass: bool = False,
        _debug_msg: str = "xla_fsdp",
        _debug_print: bool = False,
        _debug_dummy_all_gather_op: bool = False,
        _debug_dummy_all_reduce_op: bool = False,
        _debug_dummy_reduce_scatter_op: bool = False,
        _debug_dummy_optimization_barrier_op: bool = False,
    ) -> None:
        if isinstance(module, XlaFullyShardedDataParallel):
            raise RuntimeError(
                "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, "
                "first wrap the inner child modules before wrapping the outer parent module."
            )
        # The forward the instance will run (a patched one counts, e.g. checkpoint_module's).
        forward = getattr(getattr(module, "forward", None), "__func__", None)
        if forward is None or forward is nn.Module.forward:
            raise RuntimeError(
                "The module wrapped by FSDP *must define a `forward` method and call it "
                "during the module's forward pass for FSDP to work correctly.* Hence, do not "
                "wrap `nn.ModuleList` or `nn.ModuleDict` with FSDP (since they don't have "
                "`forward` defined), and do not perform the forward pass in other ways apart "
                "from the `forward` method. (i.e. you should directly call the FSDP-wrapped "
                "module itself in your code, instead of using any of its submodules or its "
                "weights)."
            )
        debug = {
            "_debug_dummy_forward_pass": _debug_dummy_forward_pass,
            "_debug_dummy_all_gather_op": _debug_dummy_all_gather_op,
            "_debug_dummy_all_reduce_op": _debug_dummy_all_reduce_op,
            "_debug_dummy_reduce_scatter_op": _debug_dummy_reduce_scatter_op,
            "_debug_dummy_optimization_barrier_op": _debug_dummy_optimization_barrier_op,
        }
        for name in _DEBUG_OPTIONS:
            if debug[name]:
                raise NotImplementedError(
                    f"xlasim does not simulate XlaFullyShardedDataParallel's {name}=True "
                    "(a debugging stand-in for the real computation)"
                )
        flat_shards = not (shard_param_on_dim_0 or _shard_size_multiple == 1)
        if coalesce_all_gather_ops and not pin_layout_in_collective_ops and flat_shards:
            raise NotImplementedError(
                "xlasim does not simulate XlaFullyShardedDataParallel's "
                "coalesce_all_gather_ops=True with flattened shards (torch_xla 2.9 then never "
                "gathers the full parameters); use shard_param_on_dim_0=True or "
                "_shard_size_multiple=1 with it"
            )
        if compute_dtype is not None and compute_dtype not in FLOAT_DTYPES:
            raise ValueError(f"compute_dtype must be one of {FLOAT_DTYPES}, not {compute_dtype}")
        if buffer_dtype is not None and buffer_dtype not in FLOAT_DTYPES:
            raise ValueError(f"buffer_dtype must be one of {FLOAT_DTYPES}, not {buffer_dtype}")
        if sharding_groups is not None and (sharding_rank is None or sharding_world_size is None):
            raise ValueError(
                "sharding_rank and sharding_world_size must be provided when sharding_groups "
                "is specified"
            )
        super().__init__()

        if auto_wrap_policy is not None:
            _wrap_children(
                module,
                auto_wrap_policy,
                auto_wrapper_callable or XlaFullyShardedDataParallel,
                XlaFullyShardedDataParallel,
                "FullyShardedDataParallel",
                reshard_after_forward=reshard_after_forward,
                flatten_parameters=flatten_parameters,
                execute_sharding_on_init=execute_sharding_on_init,
                optimization_barrier_in_forward=optimization_barrier_in_forward,
                optimization_barrier_in_backward=optimization_barrier_in_backward,
                sync_on_finalization=sync_on_finalization,
                disable_reshard_on_root=disable_reshard_on_root,
                compute_dtype=compute_dtype,
                buffer_dtype=buffer_dtype,
                fp32_reduce_scatter=fp32_reduce_scatter,
                sharding_groups=sharding_groups,
                sharding_rank=sharding_rank,
                sharding_world_size=sharding_world_size,
                shard_param_on_dim_0=shard_param_on_dim_0,
                pin_layout_in_collective_ops=pin_layout_in_collective_ops,
                param_init_fn=param_init_fn,
                _shard_size_multiple=_shard_size_multiple,
                _use_xla_patched_linear=_use_xla_patched_linear,
                _debug_msg=_debug_msg,
                _debug_print=_debug_print,
            )

        self.reshard_after_forward = reshard_after_forward
        self._orig_reshard_after_forward = reshard_after_forward
        self.disable_reshard_on_root = disable_reshard_on_root
        self.flatten_parameters = flatten_parameters
        self.optimization_barrier_in_forward = optimization_barrier_in_forward
        self.optimization_barrier_in_backward = optimization_barrier_in_backward
        self.sync_on_finalization = sync_on_finalization
        self.compute_dtype = compute_dtype or torch.float32
        self.buffer_dtype = buffer_dtype or self.compute_dtype
        self.fp32_reduce_scatter = fp32_reduce_scatter
        # Flattened vectors are never cut along a dim 0 of their own; the 128-element multiple
        # is dropped whenever dim-0 sharding was asked for, as torch_xla does.
        self._shard_param_on_dim_0 = shard_param_on_dim_0 and not flatten_parameters
        self._shard_size_multiple = 1 if shard_param_on_dim_0 else _shard_size_multiple
        self._use_xla_patched_linear = _use_xla_patched_linear
        self.coalesce_all_gather_ops = coalesce_all_gather_ops
        self.reduce_scatter_bucket_size_mb = reduce_scatter_bucket_size_mb
        self.pin_layout_in_collective_ops = pin_layout_in_collective_ops
        self.sharding_groups = sharding_groups
        if sharding_groups is None:
            self.rank, self.world_size = xr.global_ordinal(), xr.world_size()
        else:
            self.rank, self.world_size = int(sharding_rank), int(sharding_world_size)  # type: ignore[arg-type]
        self._debug_msg, self._debug_print = _debug_msg, _debug_print
        self.gradient_predivide_factor = _predivide_factor(self.world_size)
        self.gradient_postdivide_factor = self.world_size / self.gradient_predivide_factor
        self._reduce_scatter_scale = 1.0

        _materialize(module, param_init_fn)
        groups: list[list[nn.Parameter]] = [[]]
        if flatten_parameters:
            # Parameters an inner wrapper already sharded stay out; trainable and frozen ones
            # are flattened apart.
            own = [p for p in module.parameters() if not getattr(p, "_is_sharded", False)]
            groups = [[p for p in own if p.requires_grad]]
            frozen = [p for p in own if not p.requires_grad]
            if frozen:
                groups.append(frozen)
        self._fsdp_wrapped_module: nn.Module = XlaFlattenParamsWrapper(
            module, param_list=groups, auto_unflatten_state_dict=False
        )
        self.xla_device = torch_xla.device()
        self._shard_parameters()
        self._cast_buffers(self.buffer_dtype)

        self._is_root: bool | None = None
        self._require_backward_grad_sync = True
        self._unsynced_grads: dict[int, torch.Tensor] = {}
        self._finalization_queued = False
        self._root_fsdp: XlaFullyShardedDataParallel | None = None
        if execute_sharding_on_init:
            torch_xla.sync()

    # ----- sharding -----------------------------------------------------------------------

    def _shard_parameters(self) -> None:
        """Replace every parameter not yet sharded (by an inner wrapper) with its shard,
        registered on this wrapper; the module keeps the full parameter as a plain attribute
        that the forward fills in."""
        first: dict[nn.Parameter, tuple[nn.Module, str]] = {}
        self.full_param_infos: list[tuple[str, nn.Module, str]] = []
        self.shared_full_param_infos: list[tuple[nn.Module, str, nn.Module, str]] = []
        self.sharded_params: list[nn.Parameter] = []
        for module_name, m in self.named_modules():
            for n, p in m.named_parameters(recurse=False):
                if p.dtype != torch.float32:
                    raise TypeError("only fp32 parameters are supported")
                if getattr(p, "_is_sharded", False):
                    continue
                if p in first:
                    self.shared_full_param_infos.append((m, n, *first[p]))
                    continue
                first[p] = (m, n)
                self.full_param_infos.append((module_name, m, n))
                self.sharded_params.append(self._make_shard(p, f"{module_name}.{n}"))
        for (_, m, n), shard in zip(self.full_param_infos, self.sharded_params, strict=True):
            m._parameters.pop(n)
            object.__setattr__(m, n, torch.zeros(1, device=self.xla_device))
            self.register_parameter(shard._name, shard)  # type: ignore[attr-defined]
        for m, n, first_m, first_n in self.shared_full_param_infos:
            m._parameters.pop(n)
            object.__setattr__(m, n, getattr(first_m, first_n))

    @torch.no_grad()
    def _make_shard(self, full: nn.Parameter, orig_name: str) -> nn.Parameter:
        padded = self._flatten_and_pad(full.detach())
        size = padded.shape[0] // self.world_size
        data = padded[self.rank * size : (self.rank + 1) * size].clone()
        shard = nn.Parameter(data.to(self.xla_device), requires_grad=full.requires_grad)
        shard._is_sharded = True  # type: ignore[attr-defined]
        shard._orig_size = full.size()  # type: ignore[attr-defined]
        shard._orig_name = orig_name  # type: ignore[attr-defined]
        shard._name = f"_fsdp_shard.{orig_name}".replace(".", _SEPARATOR)  # type: ignore[attr-defined]
        return shard

    def _flatten_and_pad(self, tensor: torch.Tensor) -> torch.Tensor:
        multiple = self.world_size * self._shard_size_multiple
        if self._shard_param_on_dim_0:
            extra = -tensor.size(0) % multiple
            return F.pad(tensor, [0, 0] * (tensor.dim() - 1) + [0, extra]) if extra else tensor
        flat = tensor.flatten()
        extra = -flat.numel() % multiple
        return F.pad(flat, [0, extra]) if extra else flat

    @torch.no_grad()
    def _cast_buffers(self, dtype: torch.dtype) -> None:
        # Every buffer below this wrapper, inner wrappers' included (the outermost wrapper's
        # buffer_dtype wins, as in torch_xla), in the given dtype on the device; the original
        # dtype is remembered on the cast buffer for consolidation.
        for module in self.modules():
            for name, buf in list(module.named_buffers(recurse=False)):
                if buf is None:
                    continue
                if torch.is_floating_point(buf) and buf.dtype != dtype:
                    orig = buf.dtype
                    buf = buf.to(dtype)
                    buf._orig_dtype = orig  # type: ignore[attr-defined]
                if buf.device != self.xla_device:
                    buf = buf.to(self.xla_device)
                setattr(module, name, buf)

    # ----- the collectives ------------------------------------------------------------------

    @torch.no_grad()
    def _gather(self, shard: torch.Tensor, index: int) -> torch.Tensor:
        orig_size = self.sharded_params[index]._orig_size  # type: ignore[attr-defined]
        data = shard.detach()
        if data.dtype != self.compute_dtype:
            data = data.to(self.compute_dtype)
        pin = self.pin_layout_in_collective_ops
        if self._shard_param_on_dim_0:
            return xm.all_gather(data, groups=self.sharding_groups, pin_layout=pin)[: orig_size[0]]
        rows = data.view(-1, self._shard_size_multiple)
        padded = xm.all_gather(rows, groups=self.sharding_groups, pin_layout=pin).flatten()
        return padded[: math.prod(orig_size)].view(orig_size)

    @torch.no_grad()
    def _scatter_grad(self, grad: torch.Tensor, index: int) -> torch.Tensor | None:
        root = self._root_fsdp
        if root is not None and root.sync_on_finalization and not root._finalization_queued:
            root._finalization_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(root._finalize_backward)
        held = self._unsynced_grads.pop(index, None)
        if held is not None:
            grad = grad + held
        if not self._require_backward_grad_sync:
            # Inside no_sync: the full gradient waits here for the next synchronized backward.
            self._unsynced_grads[index] = grad
            return None
        if self.gradient_predivide_factor > 1:
            grad = grad / self.gradient_predivide_factor
        flat = self._flatten_and_pad(grad)
        if flat.dtype != torch.float32 and self.fp32_reduce_scatter:
            flat = flat.to(torch.float32)
        reduced = xm.reduce_scatter(
            xm.REDUCE_SUM,
            flat,
            scale=self._reduce_scatter_scale,
            scatter_dim=0,
            shard_count=self.world_size,
            groups=self.sharding_groups,
            pin_layout=self.pin_layout_in_collective_ops,
        )
        if reduced.dtype != torch.float32:
            reduced = reduced.to(torch.float32)
        if self.gradient_postdivide_factor > 1:
            reduced = reduced / self.gradient_postdivide_factor
        return reduced

    def _finalize_backward(self) -> None:
        self._finalization_queued = False
        torch_xla.sync()

    # ----- forward --------------------------------------------------------------------------

    def _lazy_init(self) -> None:
        if self._is_root is not None:
            return
        self._is_root = True
        # A plain attribute: assigning a module would register it as a submodule (a cycle).
        object.__setattr__(self, "_root_fsdp", self)
        for name, m in self.named_modules():
            if name and isinstance(m, XlaFullyShardedDataParallel):
                if m._is_root is None:
                    m._is_root = False
                object.__setattr__(m, "_root_fsdp", self)
        if self._debug_print:
            xm.master_print(
                f"root FSDP got {len(list(self.parameters()))} total params "
                f"(_debug_msg: {self._debug_msg}).",
                flush=True,
            )
        if self.disable_reshard_on_root:
            self.reshard_after_forward = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._lazy_init()
        if self.coalesce_all_gather_ops and self.pin_layout_in_collective_ops:
            # torch_xla gathers the coalesced shards with one list all_gather, which refuses
            # a pinned layout.
            raise RuntimeError(
                "For xm.all_gather with list of tensors input, pin_layout=True is not yet "
                "supported."
            )
        if self.compute_dtype != torch.float32:

            def cast(t: torch.Tensor) -> torch.Tensor:
                if torch.is_floating_point(t) and t.dtype != self.compute_dtype:
                    return t.to(self.compute_dtype)
                return t

            args, kwargs = _map_tensors(cast, args), _map_tensors(cast, kwargs)
        gathered: dict[tuple[int, str], torch.Tensor] = {}
        for index, ((_, m, n), shard) in enumerate(
            zip(self.full_param_infos, self.sharded_params, strict=True)
        ):
            full = _GatherFullParam.apply(shard, self, index)
            object.__setattr__(m, n, full)
            gathered[(id(m), n)] = full
        for m, n, first_m, first_n in self.shared_full_param_infos:
            object.__setattr__(m, n, gathered[(id(first_m), first_n)])
        return self._fsdp_wrapped_module(*args, **kwargs)

    # ----- public helpers -------------------------------------------------------------------

    @property
    def module(self) -> XlaFlattenParamsWrapper:
        """The wrapped module, as ``DDP.module`` (torch_xla's flatten wrapper around it)."""
        wrapper = self._fsdp_wrapped_module
        assert isinstance(wrapper, XlaFlattenParamsWrapper)
        return wrapper

    @property
    def params_with_grad(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.grad is not None]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_fsdp_wrapped_module"], name)

    def __getitem__(self, key: Any) -> Any:
        return self.module.__getitem__(key)

    def extra_repr(self) -> str:
        return (
            f"world_size={self.world_size}, rank={self.rank}, "
            f"compute_dtype={self.compute_dtype}, buffer_dtype={self.buffer_dtype}, "
            f"flatten_parameters={self.flatten_parameters}, "
            f"reshard_after_forward={self.reshard_after_forward}, "
            f"sharding_groups={self.sharding_groups}"
        )

    def set_gradient_divide_factors(self, pre: float, post: float, recursive: bool) -> None:
        """Divide gradients by ``pre`` before the reduce-scatter and ``post`` after it; (1, 1)
        averages inside the reduce-scatter instead."""
        if recursive:
            for m in self.modules():
                if isinstance(m, XlaFullyShardedDataParallel) and m is not self:
                    m.set_gradient_divide_factors(pre, post, False)
        self.gradient_predivide_factor, self.gradient_postdivide_factor = pre, post
        self._reduce_scatter_scale = 1.0 / self.world_size if (pre, post) == (1, 1) else 1.0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside keep full gradients (no reduce-scatter); the first
        backward after it reduce-scatters them together with its own."""
        self._lazy_init()
        assert self._is_root, "no_sync on inner FSDP is not supported"
        wrappers = [m for m in self.modules() if isinstance(m, XlaFullyShardedDataParallel)]
        saved = [m._require_backward_grad_sync for m in wrappers]
        for m in wrappers:
            m._require_backward_grad_sync = False
        try:
            yield
        finally:
            for m, flag in zip(wrappers, saved, strict=True):
                m._require_backward_grad_sync = flag

    @torch.no_grad()
    def clip_grad_norm_(
        self,
        max_norm: float | int,
        norm_type: float | int = 2.0,
        groups: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """Scale every shard's gradient so that the norm over the whole model (all replicas'
        shards) is at most ``max_norm``; returns that norm. Call it on every replica."""
        assert self._is_root, "clip_grad_norm should only be called on the root (parent) instance"
        max_norm, norm_type = float(max_norm), float(norm_type)
        params = self.params_with_grad
        pin = self.pin_layout_in_collective_ops
        if not params:
            local = torch.tensor(0.0)
        elif norm_type == math.inf:
            local = torch.stack([p.grad.detach().abs().max() for p in params]).max()  # type: ignore[union-attr]
        else:
            norms = [torch.norm(p.grad.detach(), norm_type) for p in params]  # type: ignore[union-attr]
            local = torch.norm(torch.stack(norms), norm_type)
        if norm_type == math.inf:
            total = xm.all_reduce(xm.REDUCE_MAX, local, groups=groups, pin_layout=pin)
        else:
            total = xm.all_reduce(xm.REDUCE_SUM, local**norm_type, groups=groups, pin_layout=pin)
            total = total ** (1.0 / norm_type)
        coef = torch.clip(max_norm / (total + 1e-6), 0.0, 1.0)
        for p in params:
            p.grad.detach().mul_(coef)  # type: ignore[union-attr]
        return total

    def get_original_names_and_sharded_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(original name, shard) pairs. torch_xla 2.9 lists this wrapper's own shards once
        per wrapper in the tree (under each wrapper's prefix); so does the simulator."""
        out = []
        for module_name, m in self.named_modules():
            if isinstance(m, XlaFullyShardedDataParallel):
                prefix = f"{module_name}." if module_name else ""
                for p in self.sharded_params:
                    name = prefix + p._orig_name  # type: ignore[attr-defined]
                    name = name.replace("_fsdp_wrapped_module.", "").replace("_fpw_module.", "")
                    out.append((name, p))
        return out

    def get_shard_metadata(self) -> dict[str, Any]:
        """What ``consolidate_sharded_state_dicts`` needs besides the per-rank state dicts:
        each wrapper's shards' original names and sizes, the flattened parameters' layouts,
        cast buffers' original dtypes, and this rank's place in the world."""
        return {
            "shard_info": self._shard_origins(),
            "flatten_info": self._flat_param_layouts(),
            "buffer_info": self._cast_buffer_dtypes(),
            "world_size": self.world_size,
            "rank": self.rank,
        }

    def _shard_origins(self) -> dict[str, Any]:
        """Per wrapper (by module path, as the state dict names it): each shard's original
        parameter name and size."""
        origins: dict[str, Any] = {}
        for module_name, m in self.named_modules(remove_duplicate=False):
            if isinstance(m, XlaFullyShardedDataParallel):
                origins[module_name.replace("_fpw_module.", "")] = {
                    p._name: {"_orig_size": p._orig_size, "_orig_name": p._orig_name}  # type: ignore[attr-defined]
                    for p in m.sharded_params
                }
        return origins

    def _flat_param_layouts(self) -> dict[str, Any]:
        """Per flattened parameter (by its state-dict name): how to cut it back into the
        parameters it holds."""
        layouts = {}
        for module_name, m in self.named_modules(remove_duplicate=False):
            if isinstance(m, XlaFlattenParamsWrapper):
                path = module_name.replace("_fpw_module.", "")
                for i in range(len(m.flat_param_names)):
                    key = f"{path}.flat_param_{i}" if path else f"flat_param_{i}"
                    layouts[key] = m.metadata(i)
        return layouts

    def _cast_buffer_dtypes(self) -> dict[str, Any]:
        """The dtype each buffer had before ``buffer_dtype`` cast it."""
        return {
            name: {"_orig_dtype": buf._orig_dtype}
            for name, buf in self.named_buffers()
            if buf is not None and hasattr(buf, "_orig_dtype")
        }
