# mypy: disable-error-code="override,attr-defined,call-arg"
# (torch's ProcessGroup stubs do not describe the Python-subclass protocol torch_xla uses.)
"""The ``xla`` torch.distributed backend of the simulator.

PYTEST_DONT_REWRITE: its asserts must read exactly as torch_xla's.

Collectives move the simulated device tensors' values through a gloo group built on the same
store, so processes of a simulated slice really exchange data; results are copied back into the
``xla`` tensors, which is what the real backend's collectives leave behind.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.distributed as dist
import torch_xla.runtime as xr
from torch._C._distributed_c10d import ProcessGroup


def _create_xla_process_group(prefix_store: Any, rank: int, size: int, timeout: Any) -> Any:
    assert not xr.is_spmd(), (
        "XLA backend is not supported with SPMD. Please use a CPU process group instead."
    )
    return ProcessGroupXla(prefix_store, rank, size, timeout)


def _completed(result: Any) -> Any:
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


class ProcessGroupXla(ProcessGroup):
    def __init__(self, prefix_store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(rank, size)
        self.prefix_store = prefix_store
        self.timeout = timeout
        self._gloo = dist.ProcessGroupGloo(prefix_store, rank, size, timeout)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "xla"

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _through_gloo(self, tensors: list[torch.Tensor], call: Any) -> Any:
        cpu = [t.cpu() for t in tensors]
        call(cpu).wait()
        with torch.no_grad():
            for dst, src in zip(tensors, cpu, strict=True):
                dst.copy_(src)
        return _completed(tensors)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._through_gloo(tensors, lambda cpu: self._gloo.allreduce(cpu, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._through_gloo(tensors, lambda cpu: self._gloo.broadcast(cpu, opts))

    def allgather(
        self,
        output_tensors_list: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Any:
        cpu_out = [[t.cpu() for t in outs] for outs in output_tensors_list]
        cpu_in = [t.cpu() for t in input_tensors]
        self._gloo.allgather(cpu_out, cpu_in).wait()
        with torch.no_grad():
            for outs, cpus in zip(output_tensors_list, cpu_out, strict=True):
                for dst, src in zip(outs, cpus, strict=True):
                    dst.copy_(src)
        return _completed(output_tensors_list)

    def barrier(self, opts: Any = None) -> Any:
        self._gloo.barrier().wait()
        return _completed(None)


def _register() -> None:
    # Registration is process-global in torch.distributed and survives leaving a simulation.
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create_xla_process_group, devices="xla")
    rdzv_module = importlib.import_module("torch.distributed.rendezvous")

    if "xla" not in rdzv_module._rendezvous_handlers:
        dist.register_rendezvous_handler("xla", _dispatch_rendezvous)


def _dispatch_rendezvous(
    url: str, timeout: Any = dist.constants.default_pg_timeout, **kwargs: Any
) -> Any:
    # Resolved at call time: the handler outlives the simulation that registered it, and
    # each simulation imports its own copy of the rendezvous module.
    import torch_xla._internal.rendezvous as current

    return current.pjrt_rendezvous_handler(url, timeout=timeout, **kwargs)


_register()
