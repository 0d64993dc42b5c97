"""torch.distributed on the simulated TorchTPU: the ``tpu_dist`` backend's collectives, DDP,
DeviceMesh, DTensor and FSDP2 on ``tpu`` tensors between real processes.

Two processes (``torch.multiprocessing`` spawn) on a simulated v6e 2x2 host, one chip each as
TorchTPU runs them, each with the ``tpu_dist`` default group and a CPU gloo group over the same
ranks. Every collective runs on both with the same values: PyTorch's gloo on CPU tensors is the
reference, as TorchTPU's backend is registered for these collectives under the same
``torch.distributed`` API (TorchTPU 0.2.0's ``_loader.py`` registers ``tpu_dist`` and ``tpu``
with ``devices=["tpu"]``). The processes are spawned once for the module; each writes what it
computed, and the tests compare.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import xlasim

pytestmark = [
    pytest.mark.xdist_group("torch_tpu"),
    pytest.mark.skipif(
        torch.__version__ < "2.11",
        reason=f"TorchTPU 0.2.0 needs torch >= 2.11, this is {torch.__version__} "
        "(test_torch_tpu_torch_version.py checks the refusal)",
    ),
]

WORLD = 2
SPAWN_TIMEOUT_S = 240
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
GLOBAL_BATCH = 16
STEPS = 3


def _values(rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.arange(6, dtype=dtype) * (rank + 1) - rank
    return torch.tensor([1, 3, 6, 12, 5, 9], dtype=dtype) * (rank + 1) + rank


def _collectives(rank: int, device: str, group: Any) -> dict[str, Any]:
    """Every collective once on ``device`` over ``group``; results as CPU tensors."""
    out: dict[str, Any] = {}

    def on(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    ops = {
        "SUM": torch.float32,
        "PRODUCT": torch.float32,
        "MIN": torch.float32,
        "MAX": torch.float32,
        "AVG": torch.float32,
        "BAND": torch.int64,
        "BOR": torch.int64,
        "BXOR": torch.int64,
    }
    for op, dtype in ops.items():
        t = on(_values(rank, dtype))
        before = t.data_ptr()
        dist.all_reduce(t, getattr(dist.ReduceOp, op), group=group)
        assert t.data_ptr() == before  # in place, in the tensor given
        out[f"all_reduce_{op}"] = t.cpu()

    gathered = [on(torch.empty(6)) for _ in range(WORLD)]
    dist.all_gather(gathered, on(_values(rank)), group=group)
    out["all_gather"] = torch.stack([g.cpu() for g in gathered])
    flat = on(torch.empty(WORLD * 6))
    dist.all_gather_into_tensor(flat, on(_values(rank)), group=group)
    out["all_gather_into_tensor"] = flat.cpu()

    chunks = [on(_values(rank) + i) for i in range(WORLD)]
    mine = on(torch.empty(6))
    dist.reduce_scatter(mine, chunks, group=group)
    out["reduce_scatter"] = mine.cpu()
    whole = on(torch.arange(WORLD * 3, dtype=torch.float32) * (rank + 1))
    part = on(torch.empty(3))
    dist.reduce_scatter_tensor(part, whole, group=group)
    out["reduce_scatter_tensor"] = part.cpu()

    b = on(_values(rank))
    dist.broadcast(b, src=1, group=group)
    out["broadcast"] = b.cpu()
    r = on(_values(rank))
    dist.reduce(r, dst=WORLD - 1, group=group)
    out["reduce"] = r.cpu()

    received = [on(torch.empty(2)) for _ in range(WORLD)]
    dist.all_to_all(received, [on(torch.full((2,), rank * 10.0 + i)) for i in range(WORLD)], group)
    out["all_to_all"] = torch.stack([t.cpu() for t in received])
    # Uneven splits: rank r sends i + 1 values to rank i, so receives r + 1 from each.
    send = on(torch.arange(sum(range(1, WORLD + 1)), dtype=torch.float32) + 100 * rank)
    recv = on(torch.empty(WORLD * (rank + 1)))
    dist.all_to_all_single(
        recv, send, [rank + 1] * WORLD, [i + 1 for i in range(WORLD)], group=group
    )
    out["all_to_all_single"] = recv.cpu()

    # A ring of sends and receives.
    got = on(torch.empty(6))
    works = [
        dist.isend(on(_values(rank)), group_dst=(rank + 1) % WORLD, group=group),
        dist.irecv(got, group_src=(rank - 1) % WORLD, group=group),
    ]
    for w in works:
        w.wait()
    out["send_recv"] = got.cpu()
    dist.barrier(group=group)
    return out


def _functional(rank: int, device: str, group: Any) -> dict[str, Any]:
    import torch.distributed._functional_collectives as funcol

    x = _values(rank).to(device)
    return {
        "funcol_all_reduce": funcol.all_reduce(x, "sum", group).wait().cpu(),
        "funcol_all_gather_tensor": funcol.all_gather_tensor(x, 0, group).wait().cpu(),
        "funcol_reduce_scatter_tensor": funcol.reduce_scatter_tensor(
            torch.arange(WORLD * 2.0, device=device) * (rank + 1), "sum", 0, group
        )
        .wait()
        .cpu(),
        "funcol_all_to_all_single": funcol.all_to_all_single(
            torch.arange(WORLD * 2.0, device=device) + 10 * rank, None, None, group
        )
        .wait()
        .cpu(),
    }


def _errors(rank: int, group: Any) -> dict[str, Any]:
    """What torch raises for a CPU tensor in a group of the tpu device."""
    messages: dict[str, Any] = {}
    try:  # a CPU tensor on a group whose one backend serves the tpu device
        dist.all_reduce(torch.ones(2))
    except RuntimeError as exc:
        messages["cpu_tensor_on_tpu_group"] = str(exc)
    return messages


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 1, generator=g)


def _train(rank: int, device: str, wrap: Callable[[torch.nn.Module], torch.nn.Module]) -> Any:
    """STEPS of SGD on this rank's shard of the global batch; the losses each step."""
    model = wrap(_model().to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    shard = GLOBAL_BATCH // WORLD
    x, y = x[rank * shard : (rank + 1) * shard].to(device), y[rank * shard : (rank + 1) * shard]
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


def _parallel(rank: int, cpu_group: Any) -> dict[str, Any]:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict[str, Any] = {
        "ddp_tpu": _train(rank, "tpu", lambda m: DDP(m)),
        "ddp_cpu": _train(rank, "cpu", lambda m: DDP(m, process_group=cpu_group)),
    }
    mesh = init_device_mesh("tpu", (WORLD,))  # over the default (tpu_dist) group
    cpu_mesh = DeviceMesh.from_group(cpu_group, "cpu")
    full = torch.arange(WORLD * 2 * 3, dtype=torch.float32).reshape(WORLD * 2, 3)
    sharded = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
    out["dtensor_local"] = sharded.to_local().cpu()
    out["dtensor_replicated"] = sharded.redistribute(mesh, [Replicate()]).to_local().cpu()
    out["dtensor_device"] = str(sharded.to_local().device)

    def shard_model(m: torch.nn.Module, on: Any) -> torch.nn.Module:
        fully_shard(m[0], mesh=on)
        fully_shard(m, mesh=on)
        return m

    out["fsdp2_tpu"] = _train(rank, "tpu", lambda m: shard_model(m, mesh))
    out["fsdp2_cpu"] = _train(rank, "cpu", lambda m: shard_model(m, cpu_mesh))
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["TPU_VISIBLE_CHIPS"] = str(rank)  # one chip per process, as launchers give it
    with xlasim.simulate("2x2"):  # a v6e host with 4 chips
        import torch_tpu  # noqa: F401

        torch.set_float32_matmul_precision("highest")
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
        dist.init_process_group(
            "tpu_dist",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=COLLECTIVE_TIMEOUT,
        )
        cpu_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
        # The other name TorchTPU registers, for a group beside the default one.
        tpu_group = dist.new_group(backend="tpu", timeout=COLLECTIVE_TIMEOUT)
        ones = torch.ones(2, device="tpu")
        dist.all_reduce(ones, group=tpu_group)
        results: dict[str, Any] = {
            "backend": dist.get_backend(),
            "tpu_group": (dist.get_backend(tpu_group), ones.cpu()),
            "tpu": {
                **_collectives(rank, "tpu", None),
                **_functional(rank, "tpu", dist.group.WORLD),
            },
            "cpu": {**_collectives(rank, "cpu", cpu_group), **_functional(rank, "cpu", cpu_group)},
            "errors": _errors(rank, cpu_group),
            **_parallel(rank, cpu_group),
        }
        torch.save(results, Path(out_dir) / f"{rank}.pt")
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each of the processes computed."""
    out_dir = tmp_path_factory.mktemp("tpu_dist")
    context = mp.start_processes(
        _worker, args=(_free_port(), str(out_dir)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} processes did not finish in {SPAWN_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
    return [torch.load(out_dir / f"{r}.pt", weights_only=False) for r in range(WORLD)]


def test_the_default_group_is_tpu_dist_and_tpu_names_one_too(ranks: list[dict[str, Any]]) -> None:
    assert {r["backend"] for r in ranks} == {"tpu_dist"}
    for r in ranks:
        name, summed = r["tpu_group"]
        assert name == "tpu"
        torch.testing.assert_close(summed, torch.full((2,), float(WORLD)))


@pytest.mark.parametrize(
    "name",
    [
        *(
            f"all_reduce_{op}"
            for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")
        ),
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "reduce",
        "all_to_all",
        "all_to_all_single",
        "send_recv",
        "funcol_all_reduce",
        "funcol_all_gather_tensor",
        "funcol_reduce_scatter_tensor",
        "funcol_all_to_all_single",
    ],
)
def test_collective_equals_gloo_on_cpu(ranks: list[dict[str, Any]], name: str) -> None:
    for rank, r in enumerate(ranks):
        torch.testing.assert_close(r["tpu"][name], r["cpu"][name], rtol=0, atol=0, msg=name)
        # The values really went between processes (to all but a broadcast's source, to a
        # reduction's destination).
        if not (name == "broadcast" and rank == 1 or name == "reduce" and rank != WORLD - 1):
            assert not torch.equal(r["tpu"][name], _values(rank, r["tpu"][name].dtype)), name


def test_a_known_value(ranks: list[dict[str, Any]]) -> None:
    # 0..5 times (r + 1) minus r, summed over ranks 0 and 1: 3 * i - 1.
    expected = torch.arange(6, dtype=torch.float32) * 3 - 1
    for r in ranks:
        torch.testing.assert_close(r["tpu"]["all_reduce_SUM"], expected)


def test_a_cpu_tensor_has_no_backend_in_a_tpu_group(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        errors = r["errors"]
        assert (
            errors["cpu_tensor_on_tpu_group"] == "No backend type associated with device type cpu"
        )


def test_ddp_losses_equal_gloo_ddp_and_eager_cpu(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        torch.testing.assert_close(r["ddp_tpu"], r["ddp_cpu"])
    # The ranks' mean loss is the loss of the global batch trained in one eager CPU process.
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    eager = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        eager.append(loss.item())
    torch.testing.assert_close(
        torch.stack([r["ddp_tpu"] for r in ranks]).mean(0), torch.tensor(eager)
    )


def test_dtensor_on_a_tpu_mesh(ranks: list[dict[str, Any]]) -> None:
    full = torch.arange(WORLD * 2 * 3, dtype=torch.float32).reshape(WORLD * 2, 3)
    for rank, r in enumerate(ranks):
        assert r["dtensor_device"] == "tpu:0"
        torch.testing.assert_close(r["dtensor_local"], full[2 * rank : 2 * rank + 2])
        torch.testing.assert_close(r["dtensor_replicated"], full)


def test_fsdp2_losses_equal_fsdp2_on_cpu(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        torch.testing.assert_close(r["fsdp2_tpu"], r["fsdp2_cpu"])
        torch.testing.assert_close(r["fsdp2_tpu"], r["ddp_tpu"])
