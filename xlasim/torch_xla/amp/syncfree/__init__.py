"""``torch_xla.amp.syncfree``: optimizers whose ``step(found_inf=...)`` never syncs the host.

With ``found_inf`` (a 0-dim tensor, as ``GradScaler`` computes it) the update runs as torch_xla's
fused ``_XLAC`` optimizer step, which skips the update on device when ``found_inf != 0``;
without it they are the plain torch optimizers.
"""

from .adam import Adam
from .adamw import AdamW
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW"]
