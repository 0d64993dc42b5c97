"""``torch_xla.experimental.assume_pure``: a pure PyTorch function traced once per input
shapes.

As in torch_xla, torchax turns the PyTorch function into a JAX function, and its forward and
backward run through ``xla_builder.call_jax`` (each one node of the lazy graph; on the simulator
JAX computes them on the CPU). Needs jax (the ``tpu-compiler`` extra) and the torchax package.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch_xla.core.xla_builder as xb
from torch import nn
from torch_xla._internal.jax_workarounds import maybe_get_jax, maybe_get_torchax, requires_jax


def _torchax() -> Any:
    torchax = maybe_get_torchax()
    if torchax is None or maybe_get_jax() is None:
        raise AssertionError("Jax is required for this feature")
    return torchax


@requires_jax
def assume_pure(fn, *, add_rng_seed_argument=False):
    """``fn``, assumed pure (its outputs depend only on its inputs), traced once per input
    shapes and non-tensor argument values, and differentiable through ``jax.vjp``.

    With ``add_rng_seed_argument=True`` the returned function takes a keyword ``rng_seed`` (an
    int or a uint32 XLA tensor) that seeds the random ops inside ``fn``.
    """
    torchax = _torchax()
    jax_view = torchax.interop.jax_view
    if not add_rng_seed_argument:
        return j2t_autograd(jax_view(fn))

    def seeded(rng_seed: Any, *args: Any, **kwargs: Any) -> Any:
        # Traced by torchax: rng_seed is a torchax tensor whose JAX array seeds its generator.
        torchax.default_env().manual_seed(rng_seed._elem)
        return fn(*args, **kwargs)

    through_jax = j2t_autograd(jax_view(seeded))

    def with_seed(*args: Any, **kwargs: Any) -> Any:
        rng_seed = kwargs.pop("rng_seed", None)
        assert rng_seed is not None, "Missing keyword argument rng_seed."
        if isinstance(rng_seed, int):
            rng_seed = torch.tensor(rng_seed, dtype=torch.uint32, device="xla")
        return through_jax(rng_seed, *args, **kwargs)

    return with_seed


@requires_jax
def j2t_autograd(fn):
    """A PyTorch autograd function computing the JAX function ``fn`` with ``jax.vjp``: forward
    and backward each go through ``xla_builder.call_jax``, the residuals saved between them."""
    torchax = _torchax()

    def through_call_jax(jax_fn: Callable[..., Any], *args: Any) -> Any:
        return xb.call_jax(jax_fn, args)

    return torchax.interop.j2t_autograd(fn, call_jax=through_call_jax)


def _pure_forward(module: nn.Module, params: Any, buffers: Any, args: Any, kwargs: Any) -> Any:
    return torch.func.functional_call(module, (params, buffers), args, kwargs)


class PureModule(nn.Module):
    """``module`` whose forward is pure: its functional forward (parameters and buffers passed
    in) runs under ``assume_pure``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module
        self._pure_forward = assume_pure(functools.partial(_pure_forward, self._module))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        params = dict(self._module.named_parameters())
        buffers = dict(self._module.named_buffers())
        return self._pure_forward(params, buffers, args, kwargs)


def _lowering_not_simulated(name: str) -> NotImplementedError:
    return NotImplementedError(
        "xlasim does not lower a traced function to an HLO computation "
        f"(torch_xla.experimental.assume_pure.{name})"
    )


def make_fake_inputs(input):  # noqa: A002 - torch_xla's parameter name
    raise _lowering_not_simulated("make_fake_inputs")


def prepare_computation_inputs(fn_ctx, flat_fake_inputs, flat_inputs):
    raise _lowering_not_simulated("prepare_computation_inputs")


# torch_xla's cache of assume_pure_torch's lowered computations (by function name); callers
# clear it. Empty here: the simulator does not lower traced functions.
_XLA_COMPUTATION_CACHE: dict[str, Any] = {}


def assume_pure_torch(func, use_cache=False):
    raise _lowering_not_simulated("assume_pure_torch")
