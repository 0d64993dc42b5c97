"""The simulated slice as seen by this process.

One ``SimRuntime`` is active at a time (a stack, for nested ``simulate()``); everything the
simulated ``torch_xla`` modules report is derived from it, so a fresh runtime means fresh state.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from tpu_backend.topology import SliceSpec, tpu_host_env
from xlasim.runtime.graph import GraphCache
from xlasim.runtime.metrics import Metrics

# Environment variables torch_xla itself reads or writes; saved on activation and restored on
# deactivation so a simulation never leaks its SPMD mode or cache settings into the caller.
TORCH_XLA_ENV = (
    "XLA_USE_SPMD",
    "XLA_AUTO_SPMD",
    "XLA_PERSISTENT_CACHE_PATH",
    "XLA_PERSISTENT_CACHE_READ_ONLY",
    "PJRT_DEVICE",
)


class SimRuntime:
    def __init__(self, spec: SliceSpec, host_index: int = 0) -> None:
        tpu_host_env(spec, host_index)  # the slice model's host-index check
        self.spec = spec
        self.host_index = host_index
        self.metrics = Metrics()
        self.graphs = GraphCache(self)
        self.default_device_index = 0
        # (run_async, closure, args), queued by xm.add_step_closure and run after a sync.
        self.step_closures: list[tuple[bool, Callable[..., Any], tuple[Any, ...]]] = []
        # Set by xmp.spawn; 0 means "not replicated", which is what world_size() reads.
        self.replication_devices = 0
        # Set once a tensor lives on a device: torch_xla then calls the SPMD config locked.
        self.devices_used = False
        self.generator = torch.Generator().manual_seed(0)
        self.rng_seed = 0
        self.extras: dict[str, Any] = {}
        self._saved_env: dict[str, str | None] = {}

    # -- environment ---------------------------------------------------------------------
    def save_env(self) -> None:
        self._saved_env = {k: os.environ.get(k) for k in TORCH_XLA_ENV}

    def restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    # -- device model --------------------------------------------------------------------
    @property
    def spmd(self) -> bool:
        # torch_xla decides SPMD from the environment flag, so a user setting it directly
        # is honoured exactly as on the real runtime.
        flag = os.environ.get("XLA_USE_SPMD", "")
        return flag == "true" or (flag.isdigit() and int(flag) > 0)

    @property
    def device_type(self) -> str:
        return "TPU"

    def global_device_ids(self) -> list[int]:
        return list(range(self.spec.num_devices))

    def addressable_device_ids(self) -> list[int]:
        per_host = self.spec.devices_per_host
        start = self.host_index * per_host
        return list(range(start, start + per_host))

    def real_devices(self) -> list[str]:
        """The host's runtime devices, named by global id as PJRT names them."""
        return [f"{self.device_type}:{i}" for i in self.addressable_device_ids()]

    def xla_devices(self) -> list[str]:
        """What ``_XLAC._xla_get_devices`` lists: one virtual device under SPMD."""
        devices = self.real_devices()
        return devices[:1] if self.spmd else devices


_stack: list[SimRuntime] = []

# State that real torch_xla keeps per process rather than per runtime (e.g. the xla://
# rendezvous store), kept here because the simulated modules are re-imported per simulation.
PROCESS_STATE: dict[str, Any] = {}


def current() -> SimRuntime:
    if not _stack:
        raise RuntimeError(
            "xlasim: no simulated TPU slice is active in this process; use "
            "`with xlasim.simulate(topology=...)`, `xlasim run`, or set XLASIM_TOPOLOGY"
        )
    return _stack[-1]


def active() -> SimRuntime | None:
    return _stack[-1] if _stack else None


def push(runtime: SimRuntime) -> None:
    _stack.append(runtime)


def pop(runtime: SimRuntime) -> None:
    if not _stack or _stack[-1] is not runtime:
        raise RuntimeError("xlasim: simulations must be exited in the reverse order of entry")
    _stack.pop()
