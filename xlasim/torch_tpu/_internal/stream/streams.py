"""``torch.tpu.Stream`` and ``torch.tpu.Event`` on the simulated device.

TorchTPU keeps one implicit stream per device: its streams carry ids (so that FSDP and other
device-generic code can hand them around) and its events snapshot the work pending when they
are recorded. The simulated device computes eagerly, so nothing is ever pending: an event
completes when it is recorded (its time is the host's then), and waiting does nothing.
TorchTPU's own unimplemented methods raise its own error.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Self

import torch

NOT_IMPLEMENTED_STREAMS_MSG = (
    "Streams and Events are not fully implemented in TorchTPU. Please file a"
    " feature request describing your use case."
)

# Stream ids of this process: 0 is each device's default stream.
_next_stream_id = itertools.count(1)
_current_stream_id: dict[int, int] = {}


def device_index(device: Any = None) -> int:
    if device is None:
        return torch.accelerator.current_device_index()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.accelerator.current_device_index() if index is None else index


def current_stream_id(index: int) -> int:
    return _current_stream_id.get(index, 0)


def set_current_stream_id(stream_id: int, index: int) -> None:
    _current_stream_id[index] = stream_id


class TpuStream(torch.Stream):
    """A stream of work on a TPU device (one implicit stream per device underneath)."""

    def __new__(
        cls,
        device: Any = None,
        priority: int = 0,
        stream_id: int | None = None,
        *,
        pinned: Any = None,
        **kwargs: Any,
    ) -> Self:
        if pinned is not None:
            raise NotImplementedError(
                "torch.tpu.Stream(pinned=...) is not simulated by xlasim yet "
                "(docs/torch-tpu.md lists what is)"
            )
        index = device_index(device)
        if stream_id is None:
            stream_id = next(_next_stream_id)
        return super().__new__(
            cls,
            stream_id=stream_id,
            device_index=index,
            device_type=torch.accelerator.current_stream().device_type,
            priority=priority,
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, event: torch.Event) -> None:
        event.wait()

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        if event is None:
            event = TpuEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        raise NotImplementedError(NOT_IMPLEMENTED_STREAMS_MSG)

    def synchronize(self) -> None:
        """Nothing to wait for: every op has finished when it returns."""

    def priority_range(self) -> Any:
        raise NotImplementedError(NOT_IMPLEMENTED_STREAMS_MSG)

    def __repr__(self) -> str:
        return "<torch.tpu.TpuStream>"


class TpuEvent(torch.Event):
    """A point in the device's work: complete as soon as it is recorded, on this device."""

    def __new__(
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
        device: Any = None,
    ) -> Self:
        return super().__new__(
            cls,
            device=torch.device("tpu") if device is None else device,
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._recorded_at: float | None = None

    def record(self, stream: torch.Stream | None = None) -> Self:  # type: ignore[override]
        if stream is None:
            stream = torch.accelerator.current_stream()
        elif not isinstance(stream, torch.Stream):
            raise TypeError(f"expected torch.Stream, but got {type(stream).__name__}")
        super().record(stream)
        self._recorded_at = time.perf_counter()  # the work recorded is done: eager device
        return self

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Nothing to wait for (TorchTPU makes it a no-op too)."""

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds of host time from this event's completion to ``end_event``'s (torch's
        own method accepts only a plain ``torch.Event``; the recorded times are the same)."""
        if not isinstance(end_event, TpuEvent):
            raise TypeError(f"expected a torch.tpu.Event, got {type(end_event).__name__}")
        start, end = self._recorded_at, end_event._recorded_at
        if start is None or end is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end - start) * 1e3

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> Any:
        raise NotImplementedError(NOT_IMPLEMENTED_STREAMS_MSG)

    def ipc_handle(self) -> Any:
        raise NotImplementedError(NOT_IMPLEMENTED_STREAMS_MSG)

    def __repr__(self) -> str:
        return "<torch.tpu.TpuEvent>"


class TpuStreamContext:
    """``torch.tpu.stream(s)``: ``s`` is the current stream inside."""

    def __init__(self, stream: TpuStream | None) -> None:
        self.stream = stream
        self.prev_stream_id: int | None = None

    def __enter__(self) -> None:
        if self.stream is None:
            return
        index = self.stream.device_index
        self.prev_stream_id = current_stream_id(index)
        set_current_stream_id(self.stream.stream_id, index)

    def __exit__(self, *exc: object) -> None:
        if self.stream is None or self.prev_stream_id is None:
            return
        set_current_stream_id(self.prev_stream_id, self.stream.device_index)
