# mypy: disable-error-code="override,attr-defined,call-arg"
# (torch's ProcessGroup stubs do not describe the Python-subclass protocol torch_xla uses.)
"""The ``xla`` torch.distributed backend of the simulator.

PYTEST_DONT_REWRITE: its asserts must read exactly as torch_xla's.

As in torch_xla, the process group's collectives are the ``xm`` collectives on the ``xla``
tensors themselves (so they are recorded in the pending graph and the replicas meet when it
runs), over the group's replica mesh; nothing else is exchanged, and the store the group is
built on goes unused (``prefix_store=None`` is fine). ``dist.new_group`` is wrapped to give
each new ``xla`` group its mesh.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch._C._distributed_c10d import ProcessGroup, ReduceScatterOptions

_POINT_TO_POINT_WARNING = (
    "Individual send/recv ops are inefficient on an XLA device. Consider using "
    "xla_model.collective_permute() and specifying all source-target pairs."
)
# torch's reduce ops compare equal to these but do not hash alike: looked up by equality.
_REDUCE_TYPES = (
    (dist.ReduceOp.SUM, xm.REDUCE_SUM),
    (dist.ReduceOp.PRODUCT, xm.REDUCE_MUL),
    (dist.ReduceOp.BAND, xm.REDUCE_AND),
    (dist.ReduceOp.BOR, xm.REDUCE_OR),
    (dist.ReduceOp.MIN, xm.REDUCE_MIN),
    (dist.ReduceOp.MAX, xm.REDUCE_MAX),
)


def _create_xla_process_group(prefix_store: Any, rank: int, size: int, timeout: Any) -> Any:
    assert not xr.is_spmd(), (
        "XLA backend is not supported with SPMD. Please use a CPU process group instead."
    )
    return ProcessGroupXla(prefix_store, rank, size, timeout)


def _completed(result: Any) -> Any:
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _same_shapes_or_raise(tensors: list[torch.Tensor]) -> None:
    first = tensors[0].shape
    for i, t in enumerate(tensors[1:], start=1):
        if t.shape != first:
            raise ValueError(f"Input {i}'s shape is different from input 0: {t.shape} vs {first}")


def _flattened(lists: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for tensors in lists for t in tensors]


class ProcessGroupXla(ProcessGroup):
    """torch.distributed's process group over the replicas' ``xla`` devices."""

    def __init__(self, prefix_store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(rank, size)
        self.prefix_store = prefix_store
        self.timeout = timeout
        # Replica groups of the collectives; empty: one group of every replica.
        self._mesh: list[list[int]] = []

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "xla"

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _reduce_type(self, op: Any) -> str:
        for torch_op, reduce_type in _REDUCE_TYPES:
            if op == torch_op:
                return reduce_type
        if op == dist.ReduceOp.BXOR:
            raise NotImplementedError(f"reduce op {op}")
        raise ValueError(f"Invalid reduce op {op}")

    def _shard_count(self) -> int:
        return len(self._mesh[0]) if self._mesh else self.size()

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        reduce_type = self._reduce_type(opts.reduceOp)
        xm.all_reduce(reduce_type, tensors, groups=self._mesh, pin_layout=False)
        return _completed(tensors)

    def _gather_rows(self, value: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Every replica's ``value`` concatenated along dim 0 (a scalar as one row)."""
        scalar = value.dim() == 0
        rows = value.reshape(1) if scalar else value
        return xm.all_gather(rows, dim=0, groups=self._mesh, pin_layout=False), scalar

    def _allgather_base(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, opts: Any):  # noqa: ANN202
        # dist.all_gather_into_tensor: the output holds the pieces concatenated or stacked.
        gathered, scalar = self._gather_rows(input_tensor)
        rows = 1 if scalar else input_tensor.shape[0]
        for candidate in (gathered, torch.stack(torch.split(gathered, rows, dim=0), dim=0)):
            if candidate.shape == output_tensor.shape:
                output_tensor.copy_(candidate, non_blocking=True)
                return _completed([output_tensor])
        raise ValueError(
            f"Input shape {input_tensor.shape} and output shape {output_tensor.shape} are not "
            "compatible for all_gather_into_tensor. Input must be stacked or concatenated to "
            "create output."
        )

    def allgather(
        self,
        output_tensors_list: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Any:
        for outputs, value in zip(output_tensors_list, input_tensors, strict=False):
            gathered, scalar = self._gather_rows(value)
            pieces = torch.split(gathered, 1 if scalar else value.shape[0])
            with torch.no_grad():
                for out, piece in zip(outputs, pieces, strict=False):
                    out.copy_(piece.reshape(()) if scalar else piece)
        return _completed(_flattened(output_tensors_list))

    def allgather_coalesced(
        self,
        output_tensors_list: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> Any:
        gathered = xm.all_gather(input_tensors, groups=self._mesh, pin_layout=False)
        for outputs, value, result in zip(
            output_tensors_list, input_tensors, gathered, strict=False
        ):
            for out, piece in zip(outputs, torch.split(result, value.shape[0]), strict=False):
                out.copy_(piece)
        return _completed(_flattened(output_tensors_list))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        root = tensors[opts.rootTensor]
        # The option names the root by its rank in this group; the collective by its global one.
        source = dist.get_global_rank(self, opts.rootRank)
        xm.collective_broadcast([root], source, groups=self._mesh, pin_layout=False)
        return _completed([root])

    def _reduce_scatter(self, opts: Any, value: Any, output: Any) -> None:
        xm.reduce_scatter(
            self._reduce_type(opts.reduceOp), value, scale=1.0, scatter_dim=0,
            shard_count=self._shard_count(), groups=self._mesh, output=output, pin_layout=False,
        )  # fmt: skip

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors_list: list[list[torch.Tensor]],
        opts: Any,
    ) -> Any:
        for inputs, output in zip(input_tensors_list, output_tensors, strict=False):
            _same_shapes_or_raise(inputs)
            self._reduce_scatter(opts, torch.cat(inputs), output)
        return _completed(output_tensors)

    def reduce_scatter_coalesced(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors_list: list[list[torch.Tensor]],
        opts: Any,
    ) -> Any:
        for inputs in input_tensors_list:
            _same_shapes_or_raise(inputs)
        self._reduce_scatter(
            opts, [torch.cat(inputs) for inputs in input_tensors_list], output_tensors
        )
        return _completed(output_tensors)

    def _reduce_scatter_base(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, opts: Any
    ):  # noqa: ANN202
        self._reduce_scatter(opts, input_tensor, output_tensor)
        return _completed(output_tensor)

    def barrier(self, opts: Any = None) -> Any:
        # Collectives meet when their graph runs, in program order: nothing to wait for here.
        return _completed([])

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        # Every replica reduces (the programs must match); only the root keeps the result.
        reduce_type = self._reduce_type(opts.reduceOp)
        for tensor in tensors:
            reduced = xm.all_reduce(reduce_type, inputs=tensor)
            torch_xla.sync()
            if xr.global_ordinal() == opts.rootRank:
                tensor.copy_(reduced)
        return _completed(tensors)

    def allreduce_coalesced(self, *args: Any) -> Any:
        raise NotImplementedError

    def alltoall(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        opts: Any,
    ) -> Any:
        count = len(input_tensor_list)
        exchanged = xm.all_to_all(
            torch.stack(input_tensor_list, dim=0),
            split_dimension=0, concat_dimension=0, split_count=count,
        )  # fmt: skip
        for out, piece in zip(
            output_tensor_list, torch.chunk(exchanged, count, dim=0), strict=False
        ):
            out.copy_(piece.squeeze(dim=0))
        return _completed(output_tensor_list)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002 - torch's name
        output_split_sizes: Any,
        input_split_sizes: Any,
        opts: Any,
    ) -> Any:
        assert not output_split_sizes and not input_split_sizes, (
            "XLA doesn't support specifying non-empty output_split_sizes and input_split_sizes"
        )
        output.copy_(xm.all_to_all(input, 0, 0, xr.world_size(), pin_layout=False))
        return _completed(output)

    def gather(
        self,
        output_tensors_list: list[list[torch.Tensor]],
        input_tensor_list: list[torch.Tensor],
        opts: Any,
    ) -> Any:
        # Every replica gathers (the programs must match); only the root keeps the pieces.
        is_root = xr.global_ordinal() == opts.rootRank
        for i, value in enumerate(input_tensor_list):
            scalar = value.dim() == 0
            gathered = xm.all_gather(
                value.clone().reshape(1) if scalar else value,
                dim=0, groups=self._mesh, pin_layout=False,
            )  # fmt: skip
            torch_xla.sync()
            if not is_root:
                continue
            outputs = output_tensors_list[i]
            if scalar:
                pieces: Any = [gathered[j] for j in range(xr.world_size())]
            else:
                pieces = torch.split(gathered, value.shape[0], dim=0)
            for out, piece in zip(outputs, pieces, strict=False):
                out.copy_(piece if piece.shape == out.shape else piece.reshape(out.shape))
        return _completed(output_tensors_list if is_root else [[]])

    def scatter(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensors_list: list[list[torch.Tensor]],
        opts: Any,
    ) -> Any:
        # A sum-reduce-scatter where only the root contributes non-zero values.
        if xr.global_ordinal() == opts.rootRank:
            inputs = input_tensors_list
        else:
            inputs = [[torch.zeros_like(out)] * xr.world_size() for out in output_tensor_list]
        sum_opts = ReduceScatterOptions()
        sum_opts.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]
        return self.reduce_scatter(output_tensor_list, inputs, sum_opts)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> Any:
        logging.warning(_POINT_TO_POINT_WARNING)
        sent = []
        for tensor in tensors:
            sent.append(xm.collective_permute(tensor, pairs=[[xr.global_ordinal(), dst_rank]]))
            torch_xla.sync()
        return _completed(sent)

    def recv(self, out_tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> Any:
        logging.warning(_POINT_TO_POINT_WARNING)
        received = []
        for out in out_tensors:
            value = xm.collective_permute(out, pairs=[[src_rank, xr.global_ordinal()]])
            torch_xla.sync()
            with torch.no_grad():
                out.copy_(value)
            received.append(value)
        return _completed(received)

    def recv_anysource(self, *args: Any) -> Any:
        raise NotImplementedError

    def monitored_barrier(self, *args: Any) -> Any:
        raise NotImplementedError

    def Options(self, *args: Any) -> Any:  # noqa: N802 - torch_xla's name
        raise NotImplementedError

    # Newer torch (2.10+) calls the single-tensor collectives by these names; they are the
    # ops torch 2.9's torch.distributed reaches torch_xla's group through.
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:  # noqa: A002
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002 - torch's name
        output_split_sizes: Any,
        input_split_sizes: Any,
        opts: Any,
    ) -> Any:
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)


def _infer_mesh(slice_ranks: list[int], world_size: int) -> list[list[int]]:
    """The rectangular mesh of ``world_size`` ranks that has ``slice_ranks`` as a row (ranks
    in a run: the world cut in consecutive runs) or a column (ranks a stride apart: every
    rank taken with that stride from each start)."""
    length = len(slice_ranks)
    if world_size % length:
        raise ValueError(
            "Given slice length doesn't equal to a side of a rectangle. "
            f"World size: {world_size}, slice length: {length}"
        )
    start, step = slice_ranks[0], slice_ranks[1] - slice_ranks[0]
    if slice_ranks != list(range(start, start + step * length, step)):
        raise ValueError(f"Given slice isn't a range with evenly distributed steps: {slice_ranks}")
    rows = world_size // length
    where = f"World size: {world_size}, slice length: {length}, slice: {slice_ranks}"
    if step == 1:
        if start % length or start >= world_size:
            raise ValueError(f"Given horizontal slice doesn't have a correct start: {where}")
        return [list(range(r * length, (r + 1) * length)) for r in range(rows)]
    if start >= rows:
        raise ValueError(f"Given vertical slice doesn't have a correct start: {where}")
    if step != rows:
        raise ValueError(f"Given vertical slice doesn't have a correct step: {where}")
    return [list(range(r, r + length * step, step)) for r in range(rows)]


def _set_mesh(pg: Any, ranks: Any, pg_options: Any) -> None:
    """Gives a new ``xla`` group of ``ranks`` its replica mesh (torch_xla's ``xla_pg_options``:
    ``mesh`` given outright, or ``spmd`` to infer it from the ranks)."""
    if not isinstance(pg, ProcessGroupXla) or ranks is None:
        return
    options = pg_options.get("xla_pg_options", {}) if isinstance(pg_options, dict) else {}
    given_mesh = options.get("mesh")
    infer = given_mesh is None and options.get("spmd", False)
    world = dist.group.WORLD
    if not isinstance(world, ProcessGroupXla):
        raise RuntimeError("xla backend requires the default ProcessGroup to be a ProcessGroupXla")
    ranks = list(ranks) if isinstance(ranks, range) else ranks
    size = world.size()
    if ranks == list(range(size)):
        pg._mesh = [ranks]
    elif len(ranks) == 1:
        if ranks[0] not in range(size):
            raise ValueError(f"Given ranks is out of range: World size: {size}, ranks: {ranks}")
        pg._mesh = [[r] for r in range(size)]
    elif 1 < len(ranks) < size:
        pg._mesh = given_mesh or (_infer_mesh(ranks, size) if infer else [ranks])
    else:
        logging.warning(
            f'Can\'t infer process group mesh from given ranks "{ranks!s}". '
            "The process group will use the entire world as its collective comm group."
        )


def new_xla_process_group(
    ranks: Any = None,
    timeout: Any = dist.default_pg_timeout,
    backend: Any = None,
    pg_options: Any = None,
) -> Any:
    pg = _torch_new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options)
    _set_mesh(pg, ranks, pg_options)
    return pg


def _register() -> None:
    # Registration is process-global in torch.distributed and survives leaving a simulation,
    # so what is registered looks up the module in use when it is called.
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _dispatch_create, devices="xla")
    rdzv_module = importlib.import_module("torch.distributed.rendezvous")
    if "xla" not in rdzv_module._rendezvous_handlers:
        dist.register_rendezvous_handler("xla", _dispatch_rendezvous)
    if not hasattr(dist.new_group, _TORCH_NEW_GROUP):
        setattr(_dispatch_new_group, _TORCH_NEW_GROUP, dist.new_group)
        dist.new_group = _dispatch_new_group


# Where the installed ``dist.new_group`` keeps torch's own.
_TORCH_NEW_GROUP = "_xlasim_torch_new_group"


def _loaded() -> Any:
    """This module as the simulation in use imported it (each imports its own copy), or None
    outside one."""
    return sys.modules.get(__name__)


def _dispatch_create(prefix_store: Any, rank: int, size: int, timeout: Any) -> Any:
    current = _loaded()
    if current is None:
        raise RuntimeError(
            "xlasim: the xla process group exists only inside a simulation (torch_xla is not "
            "imported in this one)"
        )
    return current._create_xla_process_group(prefix_store, rank, size, timeout)


def _dispatch_new_group(*args: Any, **kwargs: Any) -> Any:
    current = _loaded()
    if current is None:
        return _torch_new_group(*args, **kwargs)
    return current.new_xla_process_group(*args, **kwargs)


def _torch_new_group(*args: Any, **kwargs: Any) -> Any:
    torch_new_group: Callable[..., Any] = getattr(dist.new_group, _TORCH_NEW_GROUP)
    return torch_new_group(*args, **kwargs)


def _dispatch_rendezvous(
    url: str, timeout: Any = dist.constants.default_pg_timeout, **kwargs: Any
) -> Any:
    rendezvous = importlib.import_module("torch_xla._internal.rendezvous")
    return rendezvous.pjrt_rendezvous_handler(url, timeout=timeout, **kwargs)


_register()
