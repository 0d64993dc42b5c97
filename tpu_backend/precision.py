"""The seamless trainer's settings: what maps to torch_xla 2.9, and what not.

Implemented, because torch_xla 2.9 has a real mechanism for them:

* ``precision='bf16'``: the model's floating parameters and buffers are cast to bfloat16
  (the explicit replacement for the deprecated ``XLA_USE_BF16``).  ``'fp32'`` (default)
  leaves them alone.
* ``mixed_precision='bf16'``: forward passes inside :meth:`SeamlessTPUTrainer.autocast` run
  under ``torch.autocast(device_type, dtype=torch.bfloat16)``: ``'xla'`` on TPU (what
  ``torch_xla.amp.autocast`` does), ``'cuda'`` / ``'cpu'`` elsewhere.  ``'no'`` (default)
  turns it off.  bf16 needs no loss scaling.  fp16 is rejected: torch_xla's autocast on
  TPU is bf16-only.
* ``compile_cache`` / ``compile_cache_dir``: torch_xla's persistent compilation cache
  (``xr.initialize_cache``), see :mod:`tpu_backend.compile_cache`.
* ``compile_cache_size``: the in-memory compiled-graph LRU, ``XLA_COMPILATION_CACHE_SIZE``.
* ``memory_fraction``: only on CUDA, ``torch.cuda.set_per_process_memory_fraction``.

Rejected with an error naming the knob (no torch_xla 2.9 mechanism exists, so accepting
them would silently do nothing):

* ``compilation_timeout``: XLA compiles synchronously inside ``torch_xla.sync()``; no
  torch_xla or PJRT option bounds a compile.
* ``memory_fraction`` on XLA: torch_xla 2.9 declares ``PJRT_ALLOCATOR_FRACTION`` but never
  reads it, and the TPU client has no per-process memory fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tpu_backend.compile_cache import READONLY_POLICIES, check_cache_base

__all__ = ["MIXED_PRECISION_MODES", "PRECISIONS", "SeamlessConfig"]

PRECISIONS = ("fp32", "bf16")
MIXED_PRECISION_MODES = ("no", "bf16")


@dataclass(frozen=True)
class SeamlessConfig:
    precision: str = "fp32"
    mixed_precision: str = "no"
    compile_cache: bool = False
    compile_cache_dir: str | None = None
    compile_cache_size: int | None = None
    compile_cache_readonly: Any = "followers"
    compilation_timeout: float | None = None
    memory_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision {self.precision!r} is not valid; valid: 'fp32' (default) or "
                f"'bf16' (cast the model to bfloat16)"
            )
        if self.mixed_precision not in MIXED_PRECISION_MODES:
            hint = (
                " (torch_xla's autocast on TPU is bfloat16-only)"
                if self.mixed_precision in ("fp16", "float16")
                else ""
            )
            raise ValueError(
                f"mixed_precision {self.mixed_precision!r} is not valid{hint}; valid: 'no' "
                f"(default) or 'bf16' (torch.autocast to bfloat16)"
            )
        if self.precision == "bf16" and self.mixed_precision == "bf16":
            raise ValueError(
                "precision='bf16' already runs everything in bfloat16; mixed_precision='bf16' "
                "would do nothing on top of it: set one of them"
            )
        if not isinstance(self.compile_cache, bool):
            raise ValueError(f"compile_cache {self.compile_cache!r} is not valid: True or False")
        if self.compile_cache and not (
            isinstance(self.compile_cache_dir, str) and self.compile_cache_dir
        ):
            raise ValueError(
                "compile_cache=True needs compile_cache_dir (a directory path; the cache goes "
                "under <dir>/<pod type>-<topology>/torch_xla-<version>)"
            )
        if self.compile_cache:
            check_cache_base(self.compile_cache_dir, "compile_cache_dir")
        if not self.compile_cache and self.compile_cache_dir is not None:
            raise ValueError(
                f"compile_cache_dir {self.compile_cache_dir!r} is set but compile_cache=False; "
                f"set compile_cache=True or drop compile_cache_dir"
            )
        if self.compile_cache_readonly not in READONLY_POLICIES or (
            self.compile_cache_readonly in (0, 1)
            and not isinstance(self.compile_cache_readonly, bool)
        ):
            raise ValueError(
                f"compile_cache_readonly {self.compile_cache_readonly!r} is not valid; valid: "
                f"True, False, 'followers', 'auto'"
            )
        size = self.compile_cache_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(
                f"compile_cache_size {size!r} is not valid: expected an int >= 1 (compiled "
                f"graphs kept in memory, XLA_COMPILATION_CACHE_SIZE; default 2048)"
            )
        if self.compilation_timeout is not None:
            raise ValueError(
                f"compilation_timeout={self.compilation_timeout!r} is not supported: torch_xla "
                f"2.9 compiles synchronously inside torch_xla.sync() and has no setting that "
                f"bounds a compile; bound the run instead (TPUTorchConfig(timeout_s=..., "
                f"bootstrap_timeout_s=...) or Ray's FailureConfig)"
            )
        fraction = self.memory_fraction
        if fraction is not None and (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not math.isfinite(fraction)
            or not 0 < fraction <= 1
        ):
            raise ValueError(
                f"memory_fraction {fraction!r} is not valid: expected a number in (0, 1]"
            )

    def check_device(self, kind: str) -> None:
        """Reject settings that have no meaning on the device kind ('tpu', 'xla', 'cuda',
        'cpu')."""
        if self.memory_fraction is not None and kind == "tpu":
            raise ValueError(
                f"memory_fraction={self.memory_fraction!r} is not supported on TorchTPU's tpu "
                f"device: torch.tpu has no per-process memory fraction; it applies on CUDA only"
            )
        if self.memory_fraction is not None and kind == "xla":
            raise ValueError(
                f"memory_fraction={self.memory_fraction!r} is not supported on XLA: torch_xla "
                f"2.9 has no per-process memory fraction for TPU (PJRT_ALLOCATOR_FRACTION is "
                f"declared but never read); drop it, or run on CUDA where it maps to "
                f"torch.cuda.set_per_process_memory_fraction"
            )
        if self.memory_fraction is not None and kind == "cpu":
            raise ValueError(
                f"memory_fraction={self.memory_fraction!r} is not supported on CPU: there is "
                f"no device memory pool to limit; it applies on CUDA only"
            )
