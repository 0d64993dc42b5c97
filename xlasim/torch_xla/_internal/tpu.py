"""Simulated ``torch_xla._internal.tpu``: the TPU VM this process runs on.

The same environment variables decide every answer as in torch_xla 2.9 (``TPU_SKIP_MDS_QUERY``
and the ``TPU_*`` variables); where torch_xla would ask the VM's metadata server, the simulated
host answers for its slice.  The host has its slice's chips attached (torch_xla counts them on
PCI), so ``num_available_chips()`` is the slice's chips per host.
"""

from __future__ import annotations

import math
import os
import re
import socket
from typing import Any, NamedTuple, TypedDict

import torch_xla.core.xla_env_vars as xenv
import torch_xla.utils.utils as xu
import yaml

from xlasim.runtime import hosts, state


class TpuEnv(TypedDict):
    """The type torch_xla names for a ``tpu-env`` description (its keys as torch_xla has them)."""

    ACCELERATOR_TYPE: str
    TPU_PROCESS_BOUNDS: str
    TPU_CHIPS_PER_HOST_BOUNDS: str
    WORKER_ID: int


class MeshShape(NamedTuple):
    """A TPU mesh shape written 'x,y,z' (e.g. '2,2,1')."""

    x: int
    y: int
    z: int

    @classmethod
    def from_string(cls, mesh: str) -> MeshShape:
        dims = [int(part) for part in mesh.split(",")]
        if len(dims) != 3:
            raise ValueError(f"Mesh shape '{mesh}' should be length 3")
        return cls(*dims)

    @property
    def size(self) -> int:
        return math.prod(self)

    def __mul__(self, other: object) -> MeshShape:
        assert isinstance(other, tuple)
        return MeshShape(*(a * b for a, b in zip(self, other, strict=False)))


def _get_metadata(key: str) -> str:
    """The TPU VM metadata server's ``instance/attributes/<key>``, as text: the simulated host
    serves the two attributes torch_xla reads (``tpu-env``, YAML; ``worker-network-endpoints``,
    ``hostname:id:address`` per worker)."""
    rt = state.current()
    if key == "tpu-env":
        return "".join(f"{k}: '{v}'\n" for k, v in hosts.tpu_vm_metadata(rt).items())
    if key == "worker-network-endpoints":
        addresses = hosts.tpu_vm_worker_addresses(rt)
        return ",".join(f"xlasim-w-{i}:{i}:{ip}" for i, ip in enumerate(addresses))
    raise NotImplementedError(
        f"xlasim does not simulate the TPU VM metadata attribute {key!r} "
        "(served: 'tpu-env', 'worker-network-endpoints')"
    )


def task_id() -> int | None:
    return xu.getenv_as(xenv.CLOUD_TPU_TASK_ID, int)


def worker_id() -> int:
    return int(get_tpu_env()[xenv.WORKER_ID])


def _using_env_vars() -> bool:
    return xu.getenv_as(xenv.TPU_SKIP_MDS_QUERY, str, False)


def build_tpu_env_from_vars() -> dict[str, Any]:
    def first_set(*names: str) -> str | None:
        for name in names:
            value = xu.getenv_as(name, str)
            if value is not None:
                return value
        return None

    return {
        xenv.ACCELERATOR_TYPE: first_set(xenv.TPU_ACCELERATOR_TYPE),
        xenv.TPU_PROCESS_BOUNDS: first_set(xenv.TPU_PROCESS_BOUNDS, xenv.TPU_HOST_BOUNDS),
        xenv.TPU_CHIPS_PER_PROCESS_BOUNDS: first_set(
            xenv.TPU_CHIPS_PER_PROCESS_BOUNDS, xenv.TPU_CHIPS_PER_HOST_BOUNDS
        ),
        xenv.WORKER_ID: first_set(xenv.CLOUD_TPU_TASK_ID, xenv.TPU_WORKER_ID),
    }


def get_tpu_env() -> dict[str, Any]:
    """The ``tpu-env`` description of this host (from the variables, or the metadata)."""
    if _using_env_vars():
        return build_tpu_env_from_vars()
    return yaml.safe_load(_get_metadata("tpu-env"))


_VERSION = re.compile(r"^(?:v|tpu)(\d)[A-Za-z]{0,7}-\d+$")


def version() -> int:
    match = _VERSION.match(get_tpu_env()[xenv.ACCELERATOR_TYPE])
    if match is None:
        raise OSError("Failed to parse TPU version from metadata")
    return int(match.group(1))


def get_tpu_type() -> str:
    """The generation part of the accelerator type, e.g. 'v6e' for 'v6e-8'."""
    accelerator = get_tpu_env()[xenv.ACCELERATOR_TYPE]
    head, sep, _ = accelerator.partition("-")
    return head if sep else accelerator


def get_worker_ips() -> list[str]:
    if _using_env_vars():
        names = xu.getenv_as(xenv.TPU_WORKER_HOSTNAMES, str, "").split(",")
    else:  # 'hostname:id:address' per worker
        names = [w.split(":")[2] for w in _get_metadata("worker-network-endpoints").split(",")]
    return names if len(names) > 1 else ["localhost"]


def num_tpu_workers() -> int:
    return len(get_worker_ips())


def num_available_chips() -> int:
    """TPU chips attached to this host: the simulated slice's chips per host."""
    return state.current().spec.chips_per_host


def num_local_processes() -> int:
    """Processes to start on this host: one per chip, capped by ``TPU_PROCESS_BOUNDS``."""
    chips = num_available_chips()
    bounded = process_bounds_size()
    return min(chips, bounded) if bounded else chips


def process_bounds_size() -> int | None:
    """Processes across all TPU hosts (``TPU_PROCESS_BOUNDS``), or None if unset."""
    bounds = xu.getenv_as(xenv.TPU_PROCESS_BOUNDS, str)
    return MeshShape.from_string(bounds).size if bounds else None


def num_logical_cores_per_chip() -> int:
    """XLA devices per chip: each of a v2 or v3 chip's two TensorCores is one."""
    return 2 if version() <= 3 else 1


def num_expected_global_devices() -> int:
    """XLA devices the slice should have: this host's, times the hosts."""
    return num_available_devices() * num_tpu_workers()


def num_available_devices() -> int:
    """XLA devices on this host (known without starting the runtime)."""
    return num_available_chips() * num_logical_cores_per_chip()


def configure_one_chip_topology() -> None:
    """Environment for one process on one chip; must run before any XLA device is used."""
    for name, value in (
        (xenv.TPU_VISIBLE_CHIPS, "0"),
        (xenv.TPU_CHIPS_PER_PROCESS_BOUNDS, "1,1,1"),
        (xenv.TPU_PROCESS_BOUNDS, "1,1,1"),
    ):
        os.environ.setdefault(name, value)


def configure_topology(local_rank: int, local_world_size: int, base_port: int = 8476) -> None:
    """Environment for process ``local_rank`` of ``local_world_size`` on this host, one chip
    each; must run before any XLA device is used."""
    env = get_tpu_env()
    generation = version()
    if generation >= 4:
        hosts_bounds = MeshShape.from_string(env[xenv.TPU_PROCESS_BOUNDS])
        chips = MeshShape.from_string(env[xenv.TPU_CHIPS_PER_PROCESS_BOUNDS])
    else:
        # v2/v3 metadata carries no process bounds: torch_xla takes the host bounds of the
        # pod type from a table, which are the simulated slice's own.
        hosts_bounds = MeshShape(*state.current().spec.host_bounds)
        chips = MeshShape(2, 2, 1)
    bounds = ",".join(str(d) for d in hosts_bounds * chips)
    if generation == 7:
        bounds += ",2"
    worker = int(env[xenv.WORKER_ID])
    ports = [base_port + i for i in range(local_world_size)]
    addresses = ",".join(f"{ip}:{port}" for ip in get_worker_ips() for port in ports)
    for name, value in (
        (xenv.TPU_CHIPS_PER_PROCESS_BOUNDS, "1,1,1"),
        (xenv.TPU_PROCESS_BOUNDS, bounds),
        (xenv.CLOUD_TPU_TASK_ID, str(worker * local_world_size + local_rank)),
        (xenv.TPU_PROCESS_ADDRESSES, addresses),
        (xenv.TPU_VISIBLE_CHIPS, str(local_rank)),
        (xenv.TPU_PROCESS_PORT, str(ports[local_rank])),
    ):
        os.environ.setdefault(name, value)


def discover_master_worker_ip(use_localhost: bool = True) -> str:
    """The address of the host running process 0 ('localhost' on a one-host slice)."""
    ips = get_worker_ips()
    if len(ips) == 1:
        return "localhost"
    if not xu.check_env_flag("XLA_USE_SPMD"):
        raise NotImplementedError(
            "xlasim does not simulate master-IP discovery outside SPMD on a multi-host slice "
            "(torch_xla broadcasts it between the replicas of xmp.spawn)"
        )
    # Host 0 runs process 0 on a simulated slice; torch_xla reports its resolved address.
    return socket.gethostbyname(ips[0])
