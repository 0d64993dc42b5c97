"""The ``tpu_dist`` and ``tpu`` process groups: collectives of ``tpu`` tensors between processes.

TorchTPU's own process group (``ProcessGroupTpu``) is a ``ProcessGroup`` of its own, made by the
creator it registers for both backend names; here one is too. Its collectives run over gloo,
PyTorch's CPU collective library, on the CPU tensors that alias each ``tpu`` tensor's bytes:
the simulated chips' memory is host memory, so gloo reads and writes the ``tpu`` tensors
themselves (no copy, in-place results land in them) and the processes exchange real values
over loopback, with gloo's tested algorithms, reduce ops, timeouts and errors, rather than
collective code of our own. Tensors of other devices have no backend in such a group, as in a
group whose only backend is registered for ``tpu``.

It is a Python subclass of ``ProcessGroup`` (torch's c10d ``Backend`` cannot be subclassed in
Python): torch's trampoline sends the C++ callers (DDP's reducer, the functional collectives)
to the methods here as well as ``torch.distributed``'s Python API. gloo has no coalesced
all-gather or reduce-scatter of flat tensors and no list all-to-all; those run as several of
gloo's collectives and return once done.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    ProcessGroupGloo,
    ReduceScatterOptions,
    Work,
)

from xlasim.runtime import tpu_device

_BACKEND_NAMES = ("tpu_dist", "tpu")

# Every simulated host of a simulation is this machine: its processes meet on loopback,
# whatever the machine's host name resolves to.
_LOOPBACK = "127.0.0.1"


def _cpu_views(value: Any) -> Any:
    """``value``'s ``tpu`` tensors as the CPU tensors over the same bytes (nested lists kept)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != tpu_device.DEVICE_TYPE:
            raise RuntimeError(f"No backend type associated with device type {value.device.type}")
        return tpu_device.cpu_view(value)
    return [_cpu_views(v) for v in value]


# torch's stubs type ProcessGroup's methods as overloads of its Python API; the methods here
# are the C++ virtuals' (one signature each, as torch's trampoline calls them).
_ProcessGroup: Any = dist.ProcessGroup
_Work: Any = Work
_Gloo: Any = ProcessGroupGloo


class _DoneWork(_Work):
    """A collective that has finished on return (one composed of several of gloo's)."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._result = result
        self._future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future


def _wait_all(works: Sequence[Work], result: list[torch.Tensor]) -> Work:
    for work in works:
        work.wait()
    return _DoneWork(result)


class ProcessGroupTpu(_ProcessGroup):
    """A process group of ``tpu`` tensors whose collectives gloo runs on their CPU aliases."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        backend_name: str = "tpu_dist",
    ) -> None:
        super().__init__(rank, size)
        options = _Gloo._Options()
        options._timeout = timeout
        options._devices = [_Gloo.create_device(hostname=_LOOPBACK)]
        self._gloo = _Gloo(store, rank, size, options)
        # gloo stands as the group's backend of the tpu device: the group's name, description
        # and device types are kept there, as in a group torch assembles from a backend.
        self._register_backend(
            torch.device(tpu_device.DEVICE_TYPE), dist.ProcessGroup.BackendType.CUSTOM, self._gloo
        )
        # ...and as its default backend: torch 2.15 attaches its flight recorder to every new
        # group with device types, and the recorder asks the default backend for the group's name.
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        self._backend_name = backend_name

    def getBackendName(self) -> str:  # noqa: N802  (the C++ virtual torch calls by this name)
        return self._backend_name

    # Reductions.
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self._gloo.allreduce(_cpu_views(tensors), opts or AllreduceOptions())

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self._gloo.allreduce_coalesced(
            _cpu_views(tensors), opts or AllreduceCoalescedOptions()
        )

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        return self._gloo.reduce(_cpu_views(tensors), opts)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        return self._gloo.reduce_scatter(
            _cpu_views(outputs), _cpu_views(inputs), opts or ReduceScatterOptions()
        )

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Work:
        return self._gloo._reduce_scatter_base(
            _cpu_views(output), _cpu_views(input), opts or ReduceScatterOptions()
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        # gloo has no coalesced form: one reduce-scatter per pair, in order on every rank.
        works = [
            self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)
        ]
        return _wait_all(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # Gathers and scatters.
    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        return self._gloo.allgather(_cpu_views(outputs), _cpu_views(inputs), opts)

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        return self._gloo.allgather_coalesced(_cpu_views(outputs), _cpu_views(inputs), opts)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> Work:
        return self._gloo._allgather_base(_cpu_views(output), _cpu_views(input), opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _wait_all(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Work:
        return self._gloo.gather(_cpu_views(outputs), _cpu_views(inputs), opts)

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Work:
        return self._gloo.scatter(_cpu_views(outputs), _cpu_views(inputs), opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self._gloo.broadcast(_cpu_views(tensors), opts or BroadcastOptions())

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Work:
        return self._gloo.alltoall_base(
            _cpu_views(output),
            _cpu_views(input),
            output_split_sizes,
            input_split_sizes,
            opts or AllToAllOptions(),
        )

    alltoall_base = all_to_all_single

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        # gloo exchanges one flat buffer per rank (it has no list form): the inputs go out
        # packed, in rank order, and each rank's part is unpacked into its output.
        out_views, in_views = _cpu_views(outputs), _cpu_views(inputs)
        dtype = in_views[0].dtype
        sent = torch.cat([t.reshape(-1) for t in in_views])
        received = torch.empty(sum(t.numel() for t in out_views), dtype=dtype)
        self._gloo.alltoall_base(
            received,
            sent,
            [t.numel() for t in out_views],
            [t.numel() for t in in_views],
            opts or AllToAllOptions(),
        ).wait()
        for view, part in zip(
            out_views, received.split([t.numel() for t in out_views]), strict=True
        ):
            view.copy_(part.view_as(view))
        return _DoneWork(outputs)

    # Synchronization and point to point.
    def barrier(self, opts: Any = None) -> Work:
        return self._gloo.barrier(opts or BarrierOptions())

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        self._gloo.monitored_barrier(timeout, wait_all_ranks)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        return self._gloo.send(_cpu_views(tensors), dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        return self._gloo.recv(_cpu_views(tensors), src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Work:
        return self._gloo.recv_anysource(_cpu_views(tensors), tag)

    def shutdown(self) -> None:
        self._gloo.shutdown()

    def abort(self) -> None:
        self._gloo.abort()


_first_created = False


def _check_first_size(size: int) -> None:
    """TorchTPU lays its first group over every process of the job (``WORLD_SIZE``, as
    launchers set it); a first group of another size is its error."""
    world = os.environ.get("WORLD_SIZE", "")
    if not _first_created and world.isdigit() and int(world) != size:
        raise RuntimeError(
            "the first initialized ProcessGroupTpu must be of size WORLD_SIZE "
            f"(expected size {int(world)}, got {size})"
        )


def _creator(backend_name: str) -> Any:
    def create_process_group(
        store: dist.Store, rank: int, size: int, timeout: datetime.timedelta
    ) -> ProcessGroupTpu:
        global _first_created
        _check_first_size(size)
        group = ProcessGroupTpu(store, rank, size, timeout, backend_name)
        _first_created = True
        return group

    create_process_group.__name__ = "create_process_group"
    return create_process_group


def register() -> None:
    """Registers the ``tpu_dist`` and ``tpu`` backends for the ``tpu`` device, as TorchTPU does."""
    for name in _BACKEND_NAMES:
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _creator(name), devices=[tpu_device.DEVICE_TYPE])
