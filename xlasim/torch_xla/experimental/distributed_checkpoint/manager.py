"""``CheckpointManager``: per-step checkpoints of a sharded state_dict, sync or in the
background, with a bound on how many are kept and a checkpoint when a preemption is signalled.

Each checkpoint is a directory named for its step under the manager's path (any fsspec URL),
holding torch.distributed.checkpoint's files and the manager's own record of the step and when
it was taken; the records are read back when a manager is created, so the oldest-first order
survives restarts.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
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

# The manager's record inside each checkpoint directory. torch_xla uses the same file name and
# pickles the same record class (found by its module path), so either can read the other's.
_MANAGER_METADATA_FILE = ".manager_metadata"


@dataclass
class _CheckpointMetadata:
    step: int
    ts: datetime


def _read_record(fs: Any, directory: str) -> _CheckpointMetadata | None:
    try:
        with fs.open(os.path.join(directory, _MANAGER_METADATA_FILE), "rb") as f:
            return cast(_CheckpointMetadata, pickle.load(f))
    except Exception:  # no readable record: not one of the manager's checkpoints
        return None


class _StepDirectories:
    """The checkpoint directories under one base path: one per step, each with its record."""

    def __init__(self, base: str) -> None:
        self.base = base

    def of(self, step: int) -> str:
        return os.path.join(self.base, str(step))

    def scan(self) -> list[_CheckpointMetadata]:
        """The records found under the base (created when missing), oldest first."""
        fs, root = url_to_fs(self.base)
        if not fs.exists(root):
            fs.mkdir(root)
            return []
        entries = fs.ls(root, detail=False)
        records = [_read_record(fs, entry) for entry in entries]
        skipped = [entry for entry, record in zip(entries, records, strict=True) if record is None]
        if skipped:
            logging.warning(f"Ignoring invalid checkpoints: {skipped}")
        return sorted((r for r in records if r is not None), key=attrgetter("ts"))

    def write_record(self, record: _CheckpointMetadata) -> None:
        target = os.path.join(self.of(record.step), _MANAGER_METADATA_FILE)
        with fsspec.open(target, "wb") as out:
            pickle.dump(record, out)

    def remove(self, step: int) -> None:
        fs, target = url_to_fs(self.of(step))
        if fs.exists(target):
            fs.rm(target, recursive=True)


class _BackgroundWriter:
    """One thread that writes checkpoints; handing it work blocks while ``limit`` earlier
    checkpoints are still waiting or being written."""

    def __init__(self, limit: int) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1)
        self._free = threading.Semaphore(limit)
        self._handed: list[Future[None]] = []

    def hand(self, work: Callable[[], None]) -> None:
        self._free.acquire()
        future = self._thread.submit(work)
        future.add_done_callback(lambda _: self._free.release())
        self._handed.append(future)

    def wait(self) -> None:
        wait(self._handed)


def _listen_for_preemption() -> None:
    """Starts the sync manager that turns a SIGTERM into an agreed sync point (the
    distributed runtime's coordinator is started first if this process has none)."""
    torch_xla._XLAC._ensure_xla_coordinator_initialized(
        xr.process_index(), xr.process_count(), xr.get_master_ip()
    )
    torch_xla._XLAC._activate_preemption_sync_manager()


def _computed(state_dict: Any) -> Any:
    """``state_dict`` once its pending device computations have run and finished."""
    torch_xla.sync()
    xm.wait_device_ops()
    return state_dict


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
        # Public as in torch_xla: the group every checkpoint is coordinated over (a new
        # subgroup of the default one unless given), and the writer's thread count.
        self.pg = process_group or dist.new_group()
        self.num_of_threads = num_of_threads
        self.save_interval, self.max_to_keep = save_interval, max_to_keep
        self.chkpt_on_preemption = chkpt_on_preemption
        self.base_path = os.path.join(path, "")  # with a trailing separator, as torch_xla's

        self._dirs = _StepDirectories(self.base_path)
        self._kept = deque(self._dirs.scan())  # oldest first
        self._one_at_a_time = threading.Lock()
        self._background = _BackgroundWriter(max_pending_async)
        if chkpt_on_preemption:
            _listen_for_preemption()

    def _leads(self) -> bool:
        """Rank 0 of the group alone writes records and removes directories."""
        return dist.get_rank(self.pg) == 0

    # torch_xla's name for it: tests patch an instance's ``_save`` to hold a background save.
    def _save(self, step: int, state_dict: Any) -> None:
        """Writes the checkpoint of ``step`` (replacing one already there) and tracks it."""
        with self._one_at_a_time:
            if self._leads():
                self._dirs.remove(step)
            writer = FsspecWriter(
                self._dirs.of(step),
                thread_count=cast(int, self.num_of_threads),
                per_thread_copy_ahead=0,
            )
            dist_cp.save(
                state_dict=state_dict,
                storage_writer=writer,
                planner=SPMDSavePlanner(),
                process_group=self.pg,
            )
            self._track(_CheckpointMetadata(step=step, ts=datetime.now()))

    def _track(self, record: _CheckpointMetadata) -> None:
        # Every rank tracks the checkpoint; only the leader records it and prunes, so the
        # others keep listing the steps it removed (as in torch_xla).
        self._kept.append(record)
        if not self._leads():
            return
        self._dirs.write_record(record)
        surplus = len(self._kept) - self.max_to_keep if self.max_to_keep else 0
        for _ in range(surplus):
            self._dirs.remove(self._kept.popleft().step)

    def _due(self, step: int, force: bool | None) -> bool:
        # should_save runs even when forced: it is also where a preemption gets noticed.
        return self.should_save(step) or bool(force)

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a save step: on the interval, or at a preemption sync point."""
        if self.chkpt_on_preemption and self.reached_preemption(step):
            logging.warning(
                f"Preemption sync point reached at step {step}. Triggering a checkpoint."
            )
            return True
        return step % self.save_interval == 0

    def save(self, step: int, state_dict: Any, force: bool | None = False) -> bool:
        """Checkpoints ``state_dict`` now if ``step`` is a save step (or ``force``)."""
        due = self._due(step, force)
        if due:
            self._save(step, _computed(state_dict))
        return due

    def save_async(self, step: int, state_dict: Any, force: bool | None = False) -> bool:
        """Copies ``state_dict`` to the host now and writes it in the background.

        Blocks while ``max_pending_async`` saves are already waiting.
        """
        due = self._due(step, force)
        if due:
            host_copy = _sharded_cpu_state_dict(_computed(state_dict))
            self._background.hand(functools.partial(self._save, step, host_copy))
        return due

    def restore(self, step: int, state_dict: Any) -> None:
        """Loads the checkpoint of ``step`` into ``state_dict``'s tensors, in place."""
        steps = {record.step for record in self._kept}
        assert step in steps, f"Cannot restore from untracked step {step}. Valid steps are: {steps}"
        reader = FsspecReader(self._dirs.of(step))
        dist_cp.load(
            state_dict=state_dict,
            storage_reader=reader,
            planner=SPMDLoadPlanner(),
            process_group=self.pg,
        )

    def all_steps(self) -> list[int]:
        """The steps of every tracked checkpoint, ascending."""
        return sorted(record.step for record in self._kept)

    def join(self) -> None:
        """Waits for the background saves started so far."""
        self._background.wait()

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the sync point agreed after a preemption signal (SIGTERM)."""
        assert self.chkpt_on_preemption, (
            "Preemption detection not enabled. Please set `chkpt_on_preemption` "
            " when creating the CheckpointManager"
        )
        return torch_xla._XLAC._sync_point_reached(step)
