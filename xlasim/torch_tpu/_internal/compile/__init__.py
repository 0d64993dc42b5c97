"""TorchTPU's ``torch.compile`` backend, ``"tpu"``, on the simulated device.

TorchTPU lowers a TorchDynamo graph to StableHLO and compiles it for the TPU; the simulator
runs the graph's ATen ops eagerly on the ``tpu`` device instead (AOTAutograd, no code
generation), so a compiled program computes what it computes eagerly. Which backend a
``torch.compile`` call gets, and Inductor's refusal of tpu inputs, are TorchTPU's. Every graph
the backend gets is a compile on a TPU, so each is also recorded for the simulator's
recompilation report: a call site that compiles a second, different graph (a new input shape
under ``dynamic=False``, a new dtype) is a recompilation, with what changed.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import torch
from torch._dynamo.backends import registry
from torch.utils import _pytree as pytree

from xlasim.runtime import state, tpu_device
from xlasim.runtime.graph import GraphRecord, InputInfo, user_site

BACKEND: Final[str] = "tpu"

INDUCTOR_TPU_ERROR: Final[str] = (
    "torch.compile(..., backend='inductor') on TPU is experimental and does"
    " not yet have full TPU support; compilation is likely to fail with"
    " cryptic errors, e.g."
    " https://github.com/google-pytorch/torch_tpu/issues/4300. Pass"
    " backend='tpu' or do not specify `backend` in torch.compile to use"
    " TorchTPU, which does have full TPU support. If you do want to run"
    " Inductor on TPU, you can bypass this error by passing"
    " options={'tpu_backend': 'pallas'}."
)


def tpu_backend(graph_module: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
    """The ``"tpu"`` backend: the graph's ATen ops, run eagerly on the simulated device."""
    runtime = state.active()
    if runtime is not None:
        runtime.graphs.note_backend_compile(_graph_record(graph_module, example_inputs))
    return registry.lookup_backend("aot_eager")(graph_module, example_inputs, **kwargs)


def _graph_record(graph_module: torch.fx.GraphModule, example_inputs: Any) -> GraphRecord:
    """What the graph is keyed on: its code and its tensor inputs' shapes and dtypes, at the
    user's line that called the compiled function."""
    flat, _ = pytree.tree_flatten(example_inputs)
    inputs = tuple(InputInfo(tuple(x.shape), x.dtype) for x in flat if isinstance(x, torch.Tensor))
    nodes = graph_module.graph.nodes
    ops = tuple(str(n.target) for n in nodes if n.op in ("call_function", "call_method"))
    outputs = sum(len(pytree.tree_leaves(n.args)) for n in nodes if n.op == "output")
    key = hash((graph_module.code, inputs))
    return GraphRecord(key, user_site(), ops, inputs, outputs)


def has_tpu_inputs(example_inputs: Any) -> bool:
    flat, _ = pytree.tree_flatten(example_inputs)
    return any(isinstance(x, torch.Tensor) and x.device.type == BACKEND for x in flat)


def default_backend_selector(graph_module: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """What ``torch.compile`` without a backend compiles with: ``"tpu"`` for tpu inputs, the
    stock default (Inductor) otherwise."""
    name = BACKEND if has_tpu_inputs(example_inputs) else "inductor"
    return registry.lookup_backend(name)(graph_module, example_inputs, **kwargs)


def _is_tpu_backend(backend: Any) -> bool:
    return backend == BACKEND or backend is default_backend_selector or backend is tpu_backend


_torch_compile = torch.compile
_inductor_call = torch._TorchCompileInductorWrapper.__call__


@functools.wraps(_torch_compile)
def tpu_compile(*args: Any, **kwargs: Any) -> Any:
    if not tpu_device.device_count():  # outside a simulation: stock torch.compile
        return _torch_compile(*args, **kwargs)
    if kwargs.get("backend") is None:
        kwargs["backend"] = default_backend_selector
    if "dynamic" not in kwargs and _is_tpu_backend(kwargs["backend"]):
        kwargs["dynamic"] = False
    return _torch_compile(*args, **kwargs)


@functools.wraps(_inductor_call)
def _inductor_refusing_tpu(self: Any, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
    if getattr(self, "config", {}).get("tpu_backend") != "pallas" and has_tpu_inputs(inputs):
        raise RuntimeError(INDUCTOR_TPU_ERROR)
    return _inductor_call(self, model, inputs, *args, **kwargs)


def install() -> None:
    """Registers the ``"tpu"`` backend and TorchTPU's ``torch.compile`` defaults (once)."""
    if BACKEND not in registry._COMPILER_FNS:
        registry.register_backend(tpu_backend, BACKEND)
    torch.compile = tpu_compile
    torch._TorchCompileInductorWrapper.__call__ = _inductor_refusing_tpu  # type: ignore[method-assign,assignment]
