"""The ``xla://`` init method, with torch_xla's rules for rank and world size."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch_xla import runtime as xr
from torch_xla.utils import utils as xu

from xlasim.runtime import listeners, state

_store_lock = threading.Lock()


def pjrt_rendezvous_handler(
    url: str, timeout: datetime.timedelta = dist.constants.default_pg_timeout, **kwargs: Any
) -> Iterator[tuple[Any, int, int]]:
    master_ip = xu.getenv_as("MASTER_ADDR", str)
    if not master_ip:
        # Only a TPU runtime discovers its master worker; every other device type (the CPU
        # client) meets on this machine, as torch_xla's handler does.
        master_ip = xr.get_master_ip() if xr.device_type() == "TPU" else "localhost"
    master_port = xu.getenv_as("MASTER_PORT", int, 12355)
    with _store_lock:
        # Process-global, as the real module's store is: the simulated modules are re-imported
        # by each simulation, but a listening store must be created once per process.
        store = state.PROCESS.rendezvous_store
        if store is None:
            # Listening on MASTER_ADDR only: every simulated host runs on this machine.
            store = state.PROCESS.rendezvous_store = listeners.store(
                master_ip,
                master_port,
                xr.process_count(),
                is_master=xr.process_index() == 0,
                timeout=timeout,
            )
    # In SPMD, rank and world size come from the process index and count; otherwise from
    # the device ordinal and replication world size.
    world_size = xr.process_count() if xr.is_spmd() else xr.world_size()
    rank = xr.process_index() if xr.is_spmd() else xr.global_ordinal()
    yield (store, rank, world_size)
