"""TorchDynamo sees a simulated device tensor as the plain ``xla`` tensor it stands for.

Dynamo fakeifies a plain tensor (a ``FakeTensor`` on the ``xla`` device) and traces the user's
code into a graph, but it refuses a tensor subclass with its own ``__torch_dispatch__`` unless
the subclass is a traceable wrapper, whose graph would run on the wrapped CPU values instead of
on the device.  :class:`~xlasim.runtime.tensor.XlaSimTensor` is a plain tensor as far as the
traced program goes, so dynamo's variable builder is taught to wrap it like one: the graph it
hands a backend (``openxla``) then takes the same fake ``xla`` tensors as on real torch_xla, and
the compiled function is called with the simulated tensors themselves.

Dynamo is heavy to import and most programs never use it, so the builder is changed when
``torch._dynamo`` is imported (at once when it already is).  torch_xla 2.9 also changes
three of dynamo's and AOTAutograd's settings when it is imported; they are set at the same
time, as :func:`install` is called where the simulated ``torch_xla`` is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

from xlasim.runtime.tensor import XlaSimTensor

_DYNAMO = "torch._dynamo"


def _teach_dynamo() -> None:
    # Deferred: only reached once torch._dynamo is (being) imported.
    import torch._dynamo.config
    import torch._dynamo.trace_rules
    import torch._functorch.config
    from torch._dynamo.variables import builder

    # What torch_xla 2.9's import sets: static shapes, floats baked in, view replay.
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.specialize_float = True
    torch._functorch.config.view_replay_for_aliased_outputs = True
    # torch_xla's runtime is C++, which dynamo never sees; the simulator's is Python, and a
    # frame of it running while a compiled function falls back to eager must not be traced.
    torch._dynamo.trace_rules.add("xlasim.runtime")
    wrap = builder.VariableBuilder._wrap
    if getattr(wrap, "_xlasim", False):
        return
    infer = builder.infer_subclass_type

    def _wrap(self: Any, value: Any) -> Any:
        if type(value) is XlaSimTensor:
            return self.wrap_tensor(value)
        return wrap(self, value)

    def infer_subclass_type(value: Any) -> Any:
        return None if type(value) is XlaSimTensor else infer(value)

    _wrap._xlasim = True  # type: ignore[attr-defined]
    builder.VariableBuilder._wrap = _wrap  # type: ignore[method-assign]
    builder.infer_subclass_type = infer_subclass_type


class _OnDynamoImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_teach_dynamo` right after ``torch._dynamo`` has been executed."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None):
        if fullname != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_teach(module: ModuleType) -> None:
            exec_module(module)
            _teach_dynamo()

        loader.exec_module = exec_then_teach  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Dynamo traces simulated tensors from now on (once it is imported)."""
    if _DYNAMO in sys.modules:
        _teach_dynamo()
    elif not any(isinstance(f, _OnDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnDynamoImport())
