"""The ``xla://`` init method on the simulated host's PJRT CPU client (``PJRT_DEVICE=CPU``, as
pytorch/xla's CPU CI runs ``test/pjrt/test_ddp.py``): with no ``MASTER_ADDR`` the group meets on
``localhost``. Only a TPU runtime discovers a master worker's IP; torch_xla 2.9's rendezvous
handler (``torch_xla/_internal/rendezvous.py``) asks for it only when the device type is TPU,
and ``torch_xla.runtime.get_master_ip()`` itself still raises for CPU (its source)."""

from __future__ import annotations

import pytest
from sockets import free_port

import xlasim


def test_xla_init_method_on_the_cpu_client_meets_on_localhost(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla.runtime as xr
        from torch_xla._internal import rendezvous

        xr.set_device_type("CPU")  # the simulation starts in TPU mode
        with pytest.raises(RuntimeError, match="^IP discovery not supported for device: CPU$"):
            xr.get_master_ip()
        store, rank, world = next(rendezvous.pjrt_rendezvous_handler("xla://"))
        # the CPU client is one process; its replicas are its devices
        assert (rank, world) == (xr.global_ordinal(), xr.world_size())
        store.set("key", "value")
        assert store.get("key") == b"value"


def _count_call(ordinal: int, calls: list[int]) -> None:
    calls.append(ordinal)


def test_spawn_threads_on_a_one_device_cpu_client(monkeypatch):
    # torch_xla 2.9's pjrt.spawn_threads: fn(ordinal, *args) once per addressable device of
    # this process, returning None (its source); upstream's test_ddp.py calls it on the CPU CI.
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla.runtime as xr
        from torch_xla._internal import pjrt

        xr.set_device_type("CPU")
        calls: list[int] = []
        assert pjrt.spawn_threads(_count_call, args=(calls,)) is None
        assert calls == [0]


def test_spawn_threads_on_a_tpu_host_runs_one_thread_per_chip():
    # a v4 host's process addresses its 4 chips: torch_xla 2.9's spawn_threads calls
    # fn(ordinal, *args) in one thread per chip, each with that chip as its default device
    # (its source: _run_thread_per_device)
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        from torch_xla._internal import pjrt

        seen: list[tuple[int, str]] = []

        def record(ordinal: int, out: list[tuple[int, str]]) -> None:
            out.append((ordinal, str(torch_xla.device())))

        assert pjrt.spawn_threads(record, args=(seen,)) is None
        assert sorted(seen) == [(i, f"xla:{i}") for i in range(4)]
