"""The process's distributed-runtime coordinator and its preemption sync manager.

torch_xla starts a coordination service client for the process
(``_ensure_xla_coordinator_initialized``); a preemption sync manager registered on it catches
SIGTERM, and every process then agrees on one step at which to checkpoint before it stops
(``_sync_point_reached`` is True at that step only). On the simulator the processes do not
share such a service, so the agreement is only simulated where one process holds the whole
slice: there the sync point is the first step asked after the signal.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from xlasim.sharding.op_sharding import check_failed


@dataclass
class PreemptionSync:
    """SIGTERM watching: the handler it replaced, and whether a signal awaits its sync point."""

    previous_handler: Any
    signalled: threading.Event = field(default_factory=threading.Event)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        self.signalled.set()


@dataclass
class Coordinator:
    """Whether the coordinator is up, with which rank/world, and its sync manager if any."""

    initialized: bool = False
    global_rank: int = 0
    world_size: int = 1
    preemption: PreemptionSync | None = None

    def ensure_initialized(self, global_rank: int, world_size: int) -> None:
        # A second call is a no-op, as in torch_xla: the first rank and size stay.
        if not self.initialized:
            self.initialized, self.global_rank, self.world_size = True, global_rank, world_size

    def _check_initialized(self) -> None:
        if not self.initialized:
            raise check_failed(
                "client->CoordinatorInitialized()", "Coordinator must be initialized"
            )

    def activate_preemption_sync(self, processes_share_slice: bool) -> None:
        self._check_initialized()
        if self.world_size > 1 and not processes_share_slice:
            raise NotImplementedError(
                "xlasim does not simulate the preemption sync point agreed between "
                f"{self.world_size} processes (torch_xla._XLAC._activate_preemption_sync_manager)"
            )
        if threading.current_thread() is not threading.main_thread():
            raise NotImplementedError(
                "xlasim catches SIGTERM with a Python signal handler, which only the main "
                "thread can install: activate the preemption sync manager from the main thread"
            )
        if self.preemption is None:
            watcher = PreemptionSync(previous_handler=signal.getsignal(signal.SIGTERM))
            signal.signal(signal.SIGTERM, watcher.on_sigterm)
            self.preemption = watcher

    def deactivate_preemption_sync(self) -> None:
        # Deactivating twice, or without a coordinator, is allowed by torch_xla.
        watcher, self.preemption = self.preemption, None
        if watcher is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, watcher.previous_handler)

    def sync_point_reached(self, step: int) -> bool:
        self._check_initialized()
        if self.preemption is None:
            raise check_failed(
                "preemption_sync_manager_ != nullptr",
                "A PreemptionSyncManager has not been registered with the XlaCoordinator.",
            )
        # One process holds the slice, so the first step asked after the signal is the
        # sync point; later steps are not.
        if self.preemption.signalled.is_set():
            self.preemption.signalled.clear()
            return True
        return False
