"""``torch_xla.experimental`` on the simulator: the simulated submodules live below it."""

from .eager import eager_mode, eager_mode_context, is_eager_mode

__all__ = ["eager_mode", "eager_mode_context", "is_eager_mode"]
