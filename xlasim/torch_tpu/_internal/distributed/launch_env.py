"""``torch.tpu.distributed.set_tpu_launch_env``: what every process of a TorchTPU job must agree
on, decided once in the parent before a launcher starts them.

As in TorchTPU, it only writes ``os.environ`` and never a variable already set (an operator
may pin any of them; a second call changes nothing), so any launcher runs the processes:
``torch.multiprocessing.spawn``, ``torchrun``. One host or several is read off
``TPU_WORKER_HOSTNAMES`` (more than one name, ``nnodes > 1`` or ``JOB_COMPLETION_INDEX``
make it several). A simulated TPU VM names its slice's hosts there as a TPU VM does: every
simulated host is this machine, ``localhost``, so hosts meet over loopback.

A host's ``NODE_RANK`` follows its place in the slice: TorchTPU ranks the hosts of a slice,
as blocks of 2x2x1 chips, z first, then y, then x, and finds this host's block from the
coordinates of its chip. Only a ``TORCH_TPU_TOPOLOGY`` given from outside describes the whole
slice; without one, ``JOB_COMPLETION_INDEX`` is the rank.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence

from torch_tpu._internal.utils import hardware

from xlasim.runtime import hosts, state
from xlasim.runtime.ports import free_loopback_port
from xlasim.sharding.device_layout import device_attributes

_PREFIX = "set_tpu_launch_env(): expected"
# The block of chips TorchTPU takes one host of a multi-host slice to hold.
_HOST_BLOCK = (2, 2, 1)
_BASE_PORT = 8070
_MASTER_PORT = "29500"


def _set_once(name: str, value: Callable[[], str]) -> str:
    """``name``'s value, set from ``value()`` only where it is unset."""
    if name not in os.environ:
        os.environ[name] = value()
    return os.environ[name]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _mesh_bounds(topology: str) -> tuple[int, int, int]:
    """(x, y, z) of ``topology`` ("4x4", "2,2,1"; past a third dimension, such as v7's
    cores per chip, dimensions are dropped, missing ones are 1)."""
    fields = [f for f in re.split(r"[,xX]", topology) if f]
    if not fields or not all(f.isdigit() for f in fields):
        raise ValueError(
            f"{_PREFIX} environment variable TORCH_TPU_TOPOLOGY to be integer mesh dimensions"
            f" separated by 'x' or ',', e.g. '4x4x4' or '2,2,1', got '{topology}'"
        )
    x, y, z = ([int(f) for f in fields] + [1, 1])[:3]
    return x, y, z


def node_rank(coords: Sequence[int] | None, topology: str | None, fallback: str | None) -> int:
    """This host's rank among the slice's hosts, from its chip's coordinates; ``fallback``
    (``JOB_COMPLETION_INDEX``) where they or the topology are missing or do not fit."""
    if not coords or not topology:
        if fallback is not None:
            return int(fallback)
        raise ValueError(
            f"{_PREFIX} either TPU device coordinates together with environment variable"
            " TORCH_TPU_TOPOLOGY, or environment variable JOB_COMPLETION_INDEX to be a 0-based"
            " index of this host (Kubernetes Indexed Jobs set this automatically), to determine"
            " NODE_RANK, got neither"
        )
    try:
        bounds = _mesh_bounds(topology)
    except ValueError:
        if fallback is not None:
            return int(fallback)
        raise
    blocks = [max(1, m // c) for m, c in zip(bounds, _HOST_BLOCK, strict=True)]
    padded = [*coords, 0, 0, 0][:3]
    block = [c // b for c, b in zip(padded, _HOST_BLOCK, strict=True)]
    if all(0 <= c < n for c, n in zip(block, blocks, strict=True)):
        bx, by, _ = blocks
        return block[0] + bx * (block[1] + by * block[2])
    if fallback is not None:
        return int(fallback)
    raise ValueError(
        f"{_PREFIX} TPU device coordinates within the slice described by environment variable"
        f' TORCH_TPU_TOPOLOGY ("{topology}"), got {list(coords)}'
    )


def local_device_coords() -> list[int] | None:
    """The slice coordinates of this process's chip on the simulated host; None without one."""
    runtime = state.active()
    if runtime is None:
        return None
    spec = runtime.spec
    chip = runtime.host_index * spec.chips_per_host + hardware.bound_chip()
    return list(device_attributes(spec)[chip * spec.devices_per_chip]["coords"])


def _worker_hostnames() -> str | None:
    """``TPU_WORKER_HOSTNAMES`` as this TPU VM has it: set, or the simulated host's."""
    if "TPU_WORKER_HOSTNAMES" in os.environ:
        return os.environ["TPU_WORKER_HOSTNAMES"]
    runtime = state.active()
    return ",".join(hosts.tpu_vm_worker_addresses(runtime)) if runtime is not None else None


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Sets ``TORCH_TPU_TOPOLOGY``, ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (one address per
    process of the job), ``TORCH_TPU_XPROF_SESSION_ID`` and, across hosts, ``NNODES``,
    ``NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, each only where it is unset."""
    _set_once("TORCH_TPU_XPROF_SESSION_ID", lambda: str(time.time_ns()))
    hostnames_env = _worker_hostnames()
    hostnames = [h for h in (hostnames_env or "").split(",") if h]
    if nnodes is not None and hostnames and nnodes != len(hostnames):
        raise ValueError(
            f"{_PREFIX} nnodes to match the number of hosts in environment variable "
            f'TPU_WORKER_HOSTNAMES ({len(hostnames)}: "{hostnames_env}"), got {nnodes}'
        )
    completion_index = os.environ.get("JOB_COMPLETION_INDEX")
    if (nnodes or 0) > 1 or len(hostnames) > 1 or completion_index is not None:
        _set_multi_host(hostnames, nnodes, nproc_per_node, completion_index)
        return
    topology = hardware.get_tpu_topology(nproc_per_node)
    count = nproc_per_node if nproc_per_node is not None else hardware.get_tpu_device_count()
    _set_once(
        "TORCH_TPU_SLICEBUILDER_ADDRESSES",
        lambda: ",".join(f"localhost:{free_loopback_port()}" for _ in range(count)),
    )

    def detected() -> str:
        if topology is None:
            raise ValueError(f"{_PREFIX} TPU devices, got none")
        return topology

    _set_once("TORCH_TPU_TOPOLOGY", detected)


def _set_multi_host(
    hostnames: list[str], nnodes: int | None, nproc_per_node: int | None, index: str | None
) -> None:
    def required() -> list[str]:
        if not hostnames:
            raise ValueError(
                f"{_PREFIX} environment variable TPU_WORKER_HOSTNAMES to be a comma-separated"
                " list of worker hostnames or IP addresses, got it as unset"
            )
        return hostnames

    # Read before this host's own topology fills it in: only one from outside spans the slice.
    slice_topology = os.environ.get("TORCH_TPU_TOPOLOGY")

    def addresses() -> str:
        base = _env_int("TORCH_TPU_BASE_PORT", _BASE_PORT)
        per_host = _env_int(
            "TORCH_TPU_DEVICES_PER_HOST", nproc_per_node or hardware.get_tpu_device_count() or 8
        )
        return ",".join(f"{h}:{base + i}" for h in required() for i in range(per_host))

    _set_once("TORCH_TPU_SLICEBUILDER_ADDRESSES", addresses)
    _set_once("NNODES", lambda: str(nnodes if nnodes is not None else len(required())))
    _set_once(
        "NODE_RANK",
        lambda: str(
            node_rank(local_device_coords() if slice_topology else None, slice_topology, index)
        ),
    )
    _set_once("MASTER_ADDR", lambda: required()[0])
    _set_once("MASTER_PORT", lambda: _MASTER_PORT)
    host_topology = hardware.get_tpu_topology()
    if host_topology is not None:
        _set_once("TORCH_TPU_TOPOLOGY", lambda: host_topology)
