"""``xmp.spawn`` on a simulated multi-chip host: one real process per chip, each the one-chip
process torch_xla's launcher configures, and the collectives between them.

Real torch_xla on CPU runs the replicas as threads of one process (and its collectives there
are not what a TPU host runs), so these run on the simulator only; the one-device case is in
conformance/test_spawn.py.  Starting processes that import torch costs seconds each, so one
spawn checks many things.  The functions run in the children: they live at module level.
"""

from __future__ import annotations

import concurrent.futures.process
import os

import pytest
import torch
from sockets import free_port

WORLD = 4
LR = 0.1


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(32.0).reshape(8, 4) / 32
    return x, x.sum(1, keepdim=True)


def _replica_value(ordinal: int) -> torch.Tensor:
    return torch.tensor([[ordinal + 1.0, 2.0], [-(ordinal + 1.0), 0.5 * ordinal]])


def _replica(shared_init: dict[str, torch.Tensor]) -> dict[str, object]:
    import torch.distributed as dist
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    from torch.nn.parallel import DistributedDataParallel

    dev = torch_xla.device()
    i = xr.global_ordinal()
    value = _replica_value(i).to(dev)
    out: dict[str, object] = {
        "ordinals": (
            xr.world_size(), i, xr.local_ordinal(), xr.process_index(), xr.process_count(),
            xr.addressable_device_count(), xr.global_runtime_device_count(), str(dev),
            xm.xla_real_devices([str(dev)]), os.environ["TPU_VISIBLE_CHIPS"],
            os.environ["CLOUD_TPU_TASK_ID"], os.environ["TPU_PROCESS_BOUNDS"],
        ),
    }  # fmt: skip
    out["sum_scaled"] = xm.all_reduce(xm.REDUCE_SUM, value, scale=0.25).cpu()
    in_place = [value.clone(), (value * 2).clone()]
    returned = xm.all_reduce(xm.REDUCE_MAX, in_place)
    out["max_in_place"] = (returned is in_place, [t.cpu() for t in in_place])
    out["min"] = xm.all_reduce(xm.REDUCE_MIN, value).cpu()
    out["mul"] = xm.all_reduce(xm.REDUCE_MUL, value).cpu()
    bits = torch.tensor([1 << i, 7], dtype=torch.int32, device=dev)
    out["or_and"] = (
        xm.all_reduce(xm.REDUCE_OR, bits).cpu(),
        xm.all_reduce(xm.REDUCE_AND, bits).cpu(),
    )
    out["sum_groups"] = xm.all_reduce(xm.REDUCE_SUM, value, groups=[[0, 1], [2, 3]]).cpu()
    out["gather_dim1"] = xm.all_gather(value, dim=1).cpu()
    target = torch.zeros(8, 2, device=dev)
    out["gather_out"] = (xm.all_gather(value, output=target) is target, target.cpu())
    out["reduce_scatter"] = xm.reduce_scatter(
        xm.REDUCE_SUM, torch.arange(8.0, device=dev) * (i + 1), 0.5, 0, WORLD
    ).cpu()
    out["all_to_all"] = xm.all_to_all(
        torch.arange(4, device=dev) + 10 * i, split_dimension=0, concat_dimension=0, split_count=4
    ).cpu()
    broadcast = [value.clone()]
    xm.collective_broadcast(broadcast, root_ordinal=2)
    out["broadcast"] = broadcast[0].cpu()
    out["rendezvous"] = xm.rendezvous("hello", f"replica-{i}".encode() * i)
    out["mesh_reduce"] = xm.mesh_reduce("ordinals", i, lambda xs: sorted(xs))

    # xm.optimizer_step averages the gradients: four replicas of a quarter batch each take
    # the step of the whole batch.
    x, y = _data()
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(shared_init)
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rows = slice(2 * i, 2 * i + 2)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows].to(dev)), y[rows].to(dev)).backward()
        xm.optimizer_step(opt)
        torch_xla.sync()
    out["optimizer_step"] = {k: v.cpu() for k, v in model.state_dict().items()}

    # The same through DDP on the xla process group.
    dist.init_process_group("xla", init_method="xla://")
    out["group"] = (dist.get_rank(), dist.get_world_size(), dist.get_backend())
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(shared_init)
    ddp = DistributedDataParallel(model.to(dev), gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[rows].to(dev)), y[rows].to(dev)).backward()
        opt.step()
        torch_xla.sync()
    out["ddp"] = {k: v.cpu() for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    return out


@pytest.mark.topology("2x2x1", accelerator="v4")
@pytest.mark.mat_mul_precision("highest")
def test_one_process_per_chip_and_their_collectives(xlasim_sim, monkeypatch):
    from torch_xla._internal import pjrt

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    torch.manual_seed(0)
    init = torch.nn.Linear(4, 1).state_dict()
    results = pjrt.run_multiprocess(_replica, init)
    assert sorted(results) == list(range(WORLD))

    values = [_replica_value(i) for i in range(WORLD)]
    stacked = torch.stack(values)
    for i, got in results.items():
        assert got["ordinals"] == (
            WORLD, i, i, i, WORLD, 1, WORLD, "xla:0", [f"TPU:{i}"], str(i), str(i), "2,2,1"
        )  # fmt: skip
        torch.testing.assert_close(got["sum_scaled"], stacked.sum(0) * 0.25)
        same, tensors = got["max_in_place"]
        assert same
        torch.testing.assert_close(tensors[0], stacked.amax(0))
        torch.testing.assert_close(tensors[1], (stacked * 2).amax(0))
        torch.testing.assert_close(got["min"], stacked.amin(0))
        torch.testing.assert_close(got["mul"], stacked.prod(0))
        ors, ands = got["or_and"]
        assert (ors.dtype, ors.tolist(), ands.tolist()) == (torch.int32, [15, 7], [0, 7])
        pair = [0, 1] if i < 2 else [2, 3]
        torch.testing.assert_close(got["sum_groups"], stacked[pair].sum(0))
        torch.testing.assert_close(got["gather_dim1"], torch.cat(values, dim=1))
        same, gathered = got["gather_out"]
        assert same
        torch.testing.assert_close(gathered, torch.cat(values, dim=0))
        total = sum(torch.arange(8.0) * (r + 1) for r in range(WORLD)) * 0.5
        torch.testing.assert_close(got["reduce_scatter"], total[2 * i : 2 * i + 2])
        assert got["all_to_all"].tolist() == [i + 10 * r for r in range(WORLD)]
        torch.testing.assert_close(got["broadcast"], values[2])
        assert got["rendezvous"] == [f"replica-{r}".encode() * r for r in range(WORLD)]
        assert got["mesh_reduce"] == list(range(WORLD))
        assert got["group"] == (i, WORLD, "xla")

    # What one process does with the whole batch on the CPU.
    x, y = _data()
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(init)
    opt = torch.optim.SGD(reference.parameters(), lr=LR)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
    for got in results.values():
        for key in ("optimizer_step", "ddp"):
            for name, tensor in reference.state_dict().items():
                torch.testing.assert_close(got[key][name], tensor)


def _exit_abruptly(index: int) -> None:
    os._exit(3)


@pytest.mark.topology("1x1", accelerator="v6e")
def test_a_process_that_dies_breaks_the_pool(xlasim_sim):
    import torch_xla.distributed.xla_multiprocessing as xmp

    with pytest.raises(concurrent.futures.process.BrokenProcessPool) as raised:
        xmp.spawn(_exit_abruptly)
    assert "replica process 0 exited with code 3" in str(raised.value.__cause__)


@pytest.mark.parametrize(
    ("topology", "accelerator", "cpu_devices", "words"),
    [
        ("2x2", "v3", None, "v3: each process owns a chip of 2 devices"),
        ("2x2x1", "v7x", None, "v7x: each process owns a chip of 2 devices"),
        ("4x4", "v6e", None, "multi-host slice (v6e-16, 4 hosts)"),
    ],
)
def test_what_is_not_simulated_says_so(topology, accelerator, cpu_devices, words, monkeypatch):
    import xlasim

    with xlasim.simulate(topology, accelerator):
        import torch_xla
        import torch_xla.runtime as xr

        if cpu_devices:
            monkeypatch.setenv("CPU_NUM_DEVICES", cpu_devices)
            xr.set_device_type("CPU")
        with pytest.raises(NotImplementedError, match="xlasim does not simulate xmp.spawn") as e:
            torch_xla.launch(_exit_abruptly)
        assert words in str(e.value)


def _client() -> tuple[object, ...]:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    return (
        xr.device_type(), xr.world_size(), xr.global_runtime_device_count(),
        xm.xla_real_devices([str(torch_xla.device())]),
    )  # fmt: skip


def test_on_the_cpu_client_one_process_runs_on_the_cpu_device(xlasim_sim, monkeypatch):
    import torch_xla.runtime as xr
    from torch_xla._internal import pjrt

    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    xr.set_device_type("CPU")
    assert pjrt.run_multiprocess(_client) == {0: ("CPU", 1, 1, ["CPU:0"])}


def _device_thread() -> tuple[object, ...]:
    import threading

    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    seen: dict[str, object] = {}

    def started_here() -> None:
        seen["device"], seen["ordinal"] = str(torch_xla.device()), xr.global_ordinal()

    thread = threading.Thread(target=started_here)
    thread.start()
    thread.join()
    try:
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(2, device="xla"))
        refused = ""
    except NotImplementedError as e:
        refused = str(e)
    return (
        str(torch_xla.device()), xr.global_ordinal(), xr.local_ordinal(), xr.world_size(),
        xr.addressable_device_count(), xr.local_process_count(),
        threading.current_thread() is threading.main_thread(), seen, "all_reduce" in refused,
    )  # fmt: skip


def test_on_the_cpu_client_each_device_runs_in_a_thread_of_one_process(xlasim_sim, monkeypatch):
    import torch_xla.runtime as xr
    from torch_xla._internal import pjrt

    monkeypatch.setenv("CPU_NUM_DEVICES", "4")
    xr.set_device_type("CPU")
    results = pjrt.run_multiprocess(_device_thread)
    # Real torch_xla 2.9 on CPU with CPU_NUM_DEVICES=4 (read with the same function, less the
    # collective): one worker thread per device with that device as its default, a world of
    # four in one process, and a thread started inside keeps xla:0 (the current device is
    # per thread). Collectives between the threads are not simulated.
    assert results == {
        i: (f"xla:{i}", i, i, 4, 4, 1, False, {"device": "xla:0", "ordinal": 0}, True)
        for i in range(4)
    }


def _backward_ordinal() -> int:
    import torch_xla.runtime as xr

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            xr.global_ordinal()  # autograd's thread for this device asks
            return grad

    x = torch.ones(1, requires_grad=True, device="xla")
    try:
        Probe.apply(x).backward()
    except NotImplementedError as e:
        return "autograd device thread" in str(e)
    return False


def test_autograd_threads_on_the_cpu_device_threads_are_not_simulated(xlasim_sim, monkeypatch):
    # torch_xla's device guard gives autograd's thread for xla:i the current device xla:i.
    import torch_xla.runtime as xr
    from torch_xla._internal import pjrt

    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    xr.set_device_type("CPU")
    assert pjrt.run_multiprocess(_backward_ordinal) == {0: True, 1: True}


def test_spawn_after_the_runtime_started_is_refused(xlasim_sim):
    import torch_xla
    import torch_xla.distributed.xla_multiprocessing as xmp

    torch_xla.device()
    with pytest.raises(
        RuntimeError,
        match=r"^Runtime is already initialized\. Do not use the XLA device before calling "
        r"xmp\.spawn\.$",
    ):
        xmp.spawn(_exit_abruptly)


def test_the_client_a_process_gets_from_the_chips_it_sees():
    from tpu_backend.topology import parse_slice
    from xlasim.runtime.client import client_from_env

    spec = parse_slice("2x2x2", "v4")  # 2 hosts of 4 chips
    env = {"PJRT_DEVICE": "TPU"}
    host = client_from_env(spec, 1, env)
    # Ray's TPU worker sees every chip of its host: the whole host.
    assert client_from_env(spec, 1, {**env, "TPU_VISIBLE_CHIPS": "0,1,2,3"}) == host
    assert (host.num_local, host.num_processes, host.process_index) == (4, 2, 1)
    chip = client_from_env(
        spec,
        1,
        {**env, "TPU_VISIBLE_CHIPS": "2", "TPU_PROCESS_BOUNDS": "2,2,2",
         "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "CLOUD_TPU_TASK_ID": "6"},
    )  # fmt: skip
    assert (chip.num_devices, chip.local_ids(), chip.num_processes, chip.process_index) == (
        8,
        [6],
        8,
        6,
    )
    with pytest.raises(NotImplementedError, match="TPU_VISIBLE_CHIPS='0,1'"):
        client_from_env(spec, 0, {**env, "TPU_VISIBLE_CHIPS": "0,1"})
    with pytest.raises(ValueError, match="TPU_VISIBLE_CHIPS='4': a host of v4-16 has chips 0..3"):
        client_from_env(spec, 0, {**env, "TPU_VISIBLE_CHIPS": "4"})
