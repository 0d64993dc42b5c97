"""TorchTPU (``torch_tpu`` 0.2.0) as the simulator serves it, imported as ``torch_tpu`` inside a
simulation: the ``tpu`` device, ``torch.tpu`` and its public modules. What is not simulated
raises ``NotImplementedError`` naming it (docs/torch-tpu.md lists both)."""

import torch

# TorchTPU 0.2.0's wheel requires torch >= 2.11 (pip installs it nowhere else); its loader
# uses device-allocator hooks older torch lacks.
if torch.__version__ < "2.11":
    raise ImportError(
        f"torch_tpu 0.2.0 needs torch >= 2.11.0 (its wheel requires torch>=2.11.0,<=2.15.0); "
        f"this process has torch {torch.__version__}"
    )

from torch_tpu import _loader as _  # noqa: E402, F401  (loading is what importing TorchTPU does)
