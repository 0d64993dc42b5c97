"""Exceptions for parts of torch_xla the simulator does not have, raised where Python expects
another kind: a missing attribute must stay an ``AttributeError`` (``hasattr``, ``getattr`` with
a default) and a missing module a ``ModuleNotFoundError`` (import fallbacks), yet each is also
the ``NotImplementedError`` the simulator raises for every behaviour it does not simulate, so
``except NotImplementedError`` catches it too."""

from __future__ import annotations


class UnsimulatedAttribute(AttributeError, NotImplementedError):
    """An attribute of a simulated torch_xla module that the simulator does not provide."""


class UnsimulatedModule(ModuleNotFoundError, NotImplementedError):
    """A torch_xla (or TorchTPU) module that the simulator does not provide."""
