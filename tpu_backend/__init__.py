"""Ray Train backend for torch_xla SPMD on TPU slices.

Kept import-light on purpose: importing ``tpu_backend`` must not pull in torch,
torch_xla or ray (the simulator and CLI import the topology model from here).
"""

from tpu_backend.topology import (
    DEFAULT_ACCELERATOR,
    SliceSpec,
    default_mesh,
    parse_slice,
    tpu_host_env,
)

__all__ = ["DEFAULT_ACCELERATOR", "SliceSpec", "default_mesh", "parse_slice", "tpu_host_env"]
