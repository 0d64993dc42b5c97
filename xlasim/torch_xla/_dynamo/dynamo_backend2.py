"""``torch_xla._dynamo.dynamo_backend2``: a dynamo backend that runs the FX graph as one JAX
function (torchax traces it) through ``xla_builder.JaxCallable``; on the simulator JAX
computes it on the CPU. Needs jax (the ``tpu-compiler`` extra) and the torchax package."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch
import torch_xla
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch_xla.core import xla_builder as xb

from xlasim.runtime import jax_interop


def _dynamo_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """``gm`` as a boxed function computing it through JAX, with a fresh random seed per
    call (a uint32 XLA tensor the JAX function seeds torchax's generator with)."""
    try:
        torchax = importlib.import_module("torchax")
        importlib.import_module("torchax.interop")
        jax = jax_interop.layer().jax_module()
    except (ImportError, ModuleNotFoundError):
        print("To use this dynamo backend, please install torchax")
        raise
    jax.config.update("jax_enable_x64", True)
    env = torchax.default_env()
    device = torch_xla.device()

    def as_jax(*args: Any, initial_rng_key: Any) -> Any:
        env.manual_seed(initial_rng_key)
        with env:
            out = gm(*torchax.interop.torch_view(args))
        return torchax.interop.jax_view(out)

    computation = xb.JaxCallable(as_jax)

    def compiled(*args: Any, **kwargs: Any) -> Any:
        kwargs["initial_rng_key"] = torch.randint(0, 2**32, (), dtype=torch.uint32, device=device)
        return computation(*args, **kwargs)

    return make_boxed_func(compiled)


def dynamo_backend(fx: torch.fx.GraphModule, args: Any) -> Any:
    return aot_function(fx, fw_compiler=_dynamo_backend)
