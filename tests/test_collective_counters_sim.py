"""Which collective ran, as torch_xla's ``xla::`` counters tell it, and torch's traceable
collectives (``torch.ops._c10d_functional``) on xla tensors, eager and under
``torch.compile(backend="openxla")``.

Expected counter names: real torch_xla 2.9 on CPU (one replica, ``PJRT_DEVICE=CPU``) reports
``xla::AllGather`` for ``dist.all_gather_into_tensor``/``dist.all_gather``,
``xla::ReduceScatterOut`` for ``dist.reduce_scatter_tensor``, ``xla::AllToAll`` for
``dist.all_to_all_single``, nothing for ``dist.all_reduce`` with one replica, and
``xla::all_gather_into_tensor`` for a compiled ``dist.all_gather_into_tensor``. The four-replica
values and names are the ones pytorch/xla's TPU CI (test/pjrt/test_collective_ops_tpu.py)
expects on a v4-8."""

from __future__ import annotations

import pytest
import torch
from sockets import free_port

WORLD = 4


def _collective_names() -> list[str]:
    import torch_xla.debug.metrics as met

    names = {"AllGather", "AllGatherOut", "AllReduce", "AllReduceInPlace", "AllToAll"}
    names |= {"ReduceScatter", "ReduceScatterOut", "all_reduce", "all_gather_into_tensor"}
    names |= {"reduce_scatter_tensor", "all_to_all_single"}
    return sorted(n for n in met.counter_names() if n.removeprefix("xla::") in names)


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_one_replica_counts_what_torch_xla_counts(xlasim_sim):
    import torch.distributed as dist
    import torch_xla
    import torch_xla.debug.metrics as met

    dist.init_process_group("xla", init_method="xla://")
    try:
        dev = torch_xla.device()
        x = torch.tensor([1.0], device=dev)
        seen = {}
        for name, run in {
            "all_reduce": lambda: dist.all_reduce(x),
            "into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(1, device=dev), x),
            "all_gather": lambda: dist.all_gather([torch.zeros(1, device=dev)], x),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(
                torch.zeros(2, device=dev), torch.arange(2.0, device=dev)
            ),
            "all_to_all": lambda: dist.all_to_all_single(
                torch.zeros(2, device=dev), torch.arange(2.0, device=dev)
            ),
        }.items():
            met.clear_all()
            run()
            torch_xla.sync()
            seen[name] = _collective_names()
        assert seen == {
            "all_reduce": [],
            "into_tensor": ["xla::AllGather"],
            "all_gather": ["xla::AllGather"],
            "reduce_scatter": ["xla::ReduceScatterOut"],
            "all_to_all": ["xla::AllToAll"],
        }
        met.clear_all()
        out = torch.empty(1, device=dev)
        torch.compile(lambda o, i: dist.all_gather_into_tensor(o, i), backend="openxla")(out, x)
        torch_xla.sync()
        assert _collective_names() == ["xla::all_gather_into_tensor"]
        assert out.cpu().tolist() == [1.0]
    finally:
        dist.destroy_process_group()


def _replica() -> dict[str, object]:
    import torch.distributed as dist
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.runtime as xr

    dist.init_process_group("xla", init_method="xla://")
    dev = torch_xla.device()
    i = xr.global_ordinal()
    out: dict[str, object] = {}

    def compiled(name, fn, *args):
        met.clear_all()
        result = torch.compile(fn, backend="openxla")(*args)
        torch_xla.sync()
        out[name] = (result.cpu(), _collective_names())

    def all_reduce(t):
        dist.all_reduce(t, dist.ReduceOp.SUM)
        return t

    def into_tensor(o, t):
        dist.all_gather_into_tensor(o, t, None)
        return o

    def reduce_scatter(o, t):
        dist.reduce_scatter_tensor(o, t)
        return o

    def all_to_all(o, t):
        dist.all_to_all_single(o, t)
        return o

    compiled("all_reduce", all_reduce, torch.tensor([float(i)], device=dev))
    compiled(
        "into_tensor",
        into_tensor,
        torch.empty(WORLD, device=dev),
        torch.tensor([i + 0.0], device=dev),
    )
    compiled(
        "reduce_scatter", reduce_scatter, torch.zeros(2, device=dev), torch.arange(8.0, device=dev)
    )
    compiled(
        "all_to_all", all_to_all, torch.zeros(8, device=dev), torch.full((8,), float(i), device=dev)
    )

    met.clear_all()
    t = torch.tensor([float(i)], device=dev)
    pinned = xm.all_gather(t)  # pinned: torch_xla gathers through an all-reduce
    torch_xla.sync()
    out["pinned_all_gather"] = (pinned.cpu(), _collective_names())
    met.clear_all()
    scaled = xm.all_reduce(xm.REDUCE_SUM, t, scale=0.5)
    torch_xla.sync()
    out["scaled_all_reduce"] = (scaled.cpu(), _collective_names())
    dist.destroy_process_group()
    return out


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_compiled_collectives_between_replicas(xlasim_sim, monkeypatch):
    from torch_xla._internal import pjrt

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    results = pjrt.run_multiprocess(_replica)
    assert sorted(results) == list(range(WORLD))
    close = torch.testing.assert_close
    for i, got in results.items():
        close(got["all_reduce"][0], torch.tensor([6.0]))
        assert got["all_reduce"][1] == ["xla::all_reduce"]
        close(got["into_tensor"][0], torch.arange(4.0))
        assert got["into_tensor"][1] == ["xla::all_gather_into_tensor"]
        close(got["reduce_scatter"][0], torch.tensor([2.0 * i, 2.0 * i + 1]) * WORLD)
        assert got["reduce_scatter"][1] == ["xla::reduce_scatter_tensor"]
        # every replica's dim 0 is split in 4: replica i gets every replica's i-th piece
        close(got["all_to_all"][0], torch.arange(4.0).repeat_interleave(2))
        assert got["all_to_all"][1] == ["xla::all_to_all_single"]
        close(got["pinned_all_gather"][0], torch.arange(4.0))
        assert got["pinned_all_gather"][1] == ["xla::all_reduce"]
        close(got["scaled_all_reduce"][0], torch.tensor([3.0]))
        assert got["scaled_all_reduce"][1] == ["xla::AllReduce"]
