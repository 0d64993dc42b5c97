"""``torch_xla.amp``: autocast on XLA devices and the sync-free optimizers (``amp.syncfree``).

torch_xla 2.9 has no ``torch_xla.amp.GradScaler``; programs use ``torch.amp.GradScaler`` instead.
"""

from .autocast_mode import autocast  # noqa: F401
