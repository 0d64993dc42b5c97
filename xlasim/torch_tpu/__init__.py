"""TorchTPU (``torch_tpu`` 0.2.0) as the simulator serves it, imported as ``torch_tpu`` inside a
simulation: the ``tpu`` device, ``torch.tpu`` and its public modules. What is not simulated
raises ``NotImplementedError`` naming it (docs/torch-tpu.md lists both)."""

from torch_tpu import _loader as _  # noqa: F401  (loading is what importing TorchTPU does)
