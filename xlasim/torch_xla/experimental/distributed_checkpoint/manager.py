"""``CheckpointManager``: per-step checkpoints of a sharded state_dict, sync or in the
background, with a bound on how many are kept and a checkpoint when a preemption is signalled.

Each checkpoint is a directory named for its step under the manager's path (any fsspec URL),
holding torch.distributed.checkpoint's files and the manager's own record of the step and when
it was taken; the records are read back when a manager is created, so the oldest-first order
survives restarts.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import fsspec  # type: ignore[import-untyped]
import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from fsspec.core import url_to_fs  # type: ignore[import-untyped]
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from ._helpers import _sharded_cpu_state_dict
from .planners import SPMDLoadPlanner, SPMDSavePlanner

# The manager's record inside each checkpoint directory.
_MANAGER_METADATA_FILE = ".manager_metadata"


@dataclass
class _CheckpointMetadata:
    step: int
    ts: datetime


class CheckpointManager:
    """Takes, tracks, prunes and restores per-step checkpoints under one base path.

    ``save``/``save_async`` are meant to be called every step: they checkpoint when the step is
    a multiple of ``save_interval`` (or a preemption sync point is reached, with
    ``chkpt_on_preemption``) and return whether they did. A process group must exist.
    """

    base_path: str | os.PathLike[str]
    save_interval: int
    max_to_keep: int
    chkpt_on_preemption: bool

    def __init__(
        self,
        path: str,
        save_interval: int,
        max_to_keep: int | None = 0,
        max_pending_async: int | None = 1,
        num_of_threads: int | None = 1,
        process_group: dist.ProcessGroup | None = None,
        chkpt_on_preemption: bool = True,
    ) -> None:
        assert dist.is_initialized(), "A process group is required."
        assert save_interval > 0, "save_interval must be positive"
        assert max_pending_async is not None and max_pending_async > 0, (
            "max_pending_async must be positive"
        )
        assert max_to_keep is not None and max_to_keep >= 0, "max_to_keep must be non-negative"
        self.base_path = os.path.join(path, "")
        self.save_interval = save_interval
        self.max_to_keep = max_to_keep
        self.num_of_threads = num_of_threads
        self.chkpt_on_preemption = chkpt_on_preemption
        self.pg = process_group or dist.new_group()

        # One background writer; the semaphore bounds how many saves may wait for it.
        self._async_worker_pool = ThreadPoolExecutor(max_workers=1)
        self._async_sem = threading.Semaphore(max_pending_async)
        self._async_futures: list[Future[None]] = []
        self._save_mutex = threading.Lock()
        self._tracked_chkpts = self._load_tracked_chkpts()

        if chkpt_on_preemption:
            torch_xla._XLAC._ensure_xla_coordinator_initialized(
                xr.process_index(), xr.process_count(), xr.get_master_ip()
            )
            torch_xla._XLAC._activate_preemption_sync_manager()

    # -- tracking -------------------------------------------------------------------------
    def _load_tracked_chkpts(self) -> deque[_CheckpointMetadata]:
        fs, root = url_to_fs(self.base_path)
        records = []
        unreadable = []
        if not fs.exists(root):
            fs.mkdir(root)
        else:
            for entry in fs.ls(root, detail=False):
                try:
                    with fs.open(os.path.join(entry, _MANAGER_METADATA_FILE), "rb") as f:
                        records.append(pickle.load(f))
                except Exception:  # any unreadable directory is skipped, with a warning
                    unreadable.append(entry)
        if unreadable:
            logging.warning(f"Ignoring invalid checkpoints: {unreadable}")
        return deque(sorted(records, key=lambda record: record.ts))

    def _get_path(self, step: int) -> str:
        return os.path.join(self.base_path, str(step))

    def _delete_chkpt_at_step(self, step: int) -> None:
        if dist.get_rank(self.pg) != 0:
            return
        fs, target = url_to_fs(self._get_path(step))
        if fs.exists(target):
            fs.rm(target, recursive=True)

    def _release_oldest_checkpoints(self) -> None:
        while self.max_to_keep > 0 and len(self._tracked_chkpts) > self.max_to_keep:
            self._delete_chkpt_at_step(self._tracked_chkpts.popleft().step)

    # -- saving ---------------------------------------------------------------------------
    def _wait_for_data(self) -> None:
        torch_xla.sync()
        xm.wait_device_ops()

    def _save(self, step: int, state_dict: Any) -> None:
        """Writes the checkpoint for ``step`` (replacing one already there) and records it."""
        with self._save_mutex:
            path = self._get_path(step)
            self._delete_chkpt_at_step(step)
            writer = FsspecWriter(
                path, thread_count=cast(int, self.num_of_threads), per_thread_copy_ahead=0
            )
            dist_cp.save(
                state_dict=state_dict,
                storage_writer=writer,
                planner=SPMDSavePlanner(),
                process_group=self.pg,
            )
            record = _CheckpointMetadata(step=step, ts=datetime.now())
            self._tracked_chkpts.append(record)
            if dist.get_rank(self.pg) == 0:
                with fsspec.open(os.path.join(path, _MANAGER_METADATA_FILE), "wb") as f:
                    pickle.dump(record, f)
                self._release_oldest_checkpoints()

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a save step: on the interval, or at a preemption sync point."""
        preempted = self.chkpt_on_preemption and self.reached_preemption(step)
        if preempted:
            logging.warning(
                f"Preemption sync point reached at step {step}. Triggering a checkpoint."
            )
        return step % self.save_interval == 0 or preempted

    def save(self, step: int, state_dict: Any, force: bool | None = False) -> bool:
        """Checkpoints ``state_dict`` now if ``step`` is a save step (or ``force``)."""
        if not (self.should_save(step) or force):
            return False
        self._wait_for_data()
        self._save(step, state_dict)
        return True

    def save_async(self, step: int, state_dict: Any, force: bool | None = False) -> bool:
        """Copies ``state_dict`` to the host now and writes it in the background.

        Blocks while ``max_pending_async`` saves are already waiting.
        """
        if not (self.should_save(step) or force):
            return False
        self._wait_for_data()
        host_copy = _sharded_cpu_state_dict(state_dict)
        self._async_sem.acquire()
        future = self._async_worker_pool.submit(self._save, step, host_copy)
        future.add_done_callback(lambda _: self._async_sem.release())
        self._async_futures.append(future)
        return True

    # -- reading --------------------------------------------------------------------------
    def restore(self, step: int, state_dict: Any) -> None:
        """Loads the checkpoint of ``step`` into ``state_dict``'s tensors, in place."""
        tracked = {record.step for record in self._tracked_chkpts}
        assert step in tracked, (
            f"Cannot restore from untracked step {step}. Valid steps are: {tracked}"
        )
        dist_cp.load(
            state_dict=state_dict,
            storage_reader=FsspecReader(self._get_path(step)),
            planner=SPMDLoadPlanner(),
            process_group=self.pg,
        )

    def all_steps(self) -> list[int]:
        """The steps of every tracked checkpoint, ascending."""
        return sorted(record.step for record in self._tracked_chkpts)

    def join(self) -> None:
        """Waits for the background saves started so far."""
        wait(self._async_futures)

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the sync point agreed after a preemption signal (SIGTERM)."""
        assert self.chkpt_on_preemption, (
            "Preemption detection not enabled. Please set `chkpt_on_preemption` "
            " when creating the CheckpointManager"
        )
        return torch_xla._XLAC._sync_point_reached(step)
