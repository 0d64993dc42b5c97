"""The ``xla`` torch.distributed process group in one process, as real torch_xla 2.9 behaves.

torch_xla's group is a Python ``ProcessGroup`` whose collectives are ``xm`` collectives on the
tensors themselves: it uses no store (upstream's own backend tests build it with
``prefix_store=None``), its barrier waits for nothing, and some ops raise NotImplementedError.
Facts measured on real torch_xla 2.9 with ``PJRT_DEVICE=CPU`` (one replica). Several replicas
are in tests/test_process_group_sim.py.
"""

from __future__ import annotations

import datetime

import pytest
import torch

# One device: real torch_xla's CPU client runs several devices of one process as replicas
# whose collectives the process group does not describe.
pytestmark = pytest.mark.topology("1x1", accelerator="v6e")


def _group(rank: int = 0, size: int = 1):
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401 - registers the backend

    create = dist.Backend._plugins["XLA"].creator_fn
    return create(prefix_store=None, rank=rank, size=size, timeout=datetime.timedelta(minutes=1))


def test_a_group_needs_no_store(xla_target):
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend as xb

    pg = _group(rank=3, size=8)
    assert type(pg) is xb.ProcessGroupXla
    assert (pg.rank(), pg.size(), pg.getBackendName(), pg._mesh) == (3, 8, "xla", [])
    assert pg.prefix_store is None
    assert pg.timeout == datetime.timedelta(minutes=1)
    assert dist.Backend.XLA == "xla"
    # The barrier is a completed work: collectives meet when their graph runs.
    work = pg.barrier(dist.BarrierOptions())
    assert work.wait() and work.result() == []


@pytest.mark.parametrize("op", ["allreduce_coalesced", "recv_anysource", "monitored_barrier"])
def test_unsimulated_ops_raise(xla_target, op):
    with pytest.raises(NotImplementedError):
        getattr(_group(), op)(torch.zeros(2))
    with pytest.raises(NotImplementedError):
        _group().Options()


def test_reduce_ops(xla_target):
    import torch.distributed as dist
    import torch_xla

    pg = _group()
    t = torch.tensor([1.0, 2.0], device=torch_xla.device())
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.BXOR
    with pytest.raises(NotImplementedError, match=r"^reduce op "):
        pg.allreduce([t], opts)
    opts.reduceOp = dist.ReduceOp.AVG
    with pytest.raises(ValueError, match=r"^Invalid reduce op "):
        pg.allreduce([t], opts)
    for op in ("SUM", "PRODUCT", "MIN", "MAX"):
        opts.reduceOp = getattr(dist.ReduceOp, op)
        work = pg.allreduce([t], opts)
        assert work.result()[0] is t
    assert t.cpu().tolist() == [1.0, 2.0]


def test_one_replica_collectives(xla_target):
    import torch.distributed as dist
    import torch_xla
    from torch._C._distributed_c10d import AllgatherOptions

    dev = torch_xla.device()
    pg = _group()
    value = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev)

    out = [torch.zeros(2, 2, device=dev)]
    assert pg.allgather([out], [value]).result() == out
    assert out[0].cpu().tolist() == [[1.0, 2.0], [3.0, 4.0]]

    scalar_out = [torch.zeros((), device=dev)]
    pg.allgather([scalar_out], [torch.tensor(5.0, device=dev)])
    assert (scalar_out[0].shape, scalar_out[0].item()) == (torch.Size([]), 5.0)

    stacked = torch.zeros(1, 2, 2, device=dev)
    pg._allgather_base(stacked, value, AllgatherOptions())
    assert stacked.cpu().tolist() == [[[1.0, 2.0], [3.0, 4.0]]]
    with pytest.raises(ValueError, match=r"are not compatible for all_gather_into_tensor"):
        pg._allgather_base(torch.zeros(3, device=dev), value, AllgatherOptions())

    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    scattered = torch.zeros(2, 2, device=dev)
    pg.reduce_scatter([scattered], [[value]], opts)
    assert scattered.cpu().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(ValueError, match=r"^Input 1's shape is different from input 0: "):
        pg.reduce_scatter([scattered], [[value, torch.zeros(3, device=dev)]], opts)

    # The root's global rank comes from torch's registry of groups, which this one is not in.
    broadcast = dist.BroadcastOptions()
    broadcast.rootRank, broadcast.rootTensor = 0, 0
    with pytest.raises(ValueError, match=r"is not registered, please create group with"):
        pg.broadcast([value.clone()], broadcast)

    with pytest.raises(AssertionError, match=r"XLA doesn't support specifying non-empty"):
        pg.alltoall_base(torch.zeros(2, 2, device=dev), value, [1], [1], None)


def test_new_group_sets_the_replica_mesh(xla_target, tmp_path):
    import torch.distributed as dist
    import torch_xla
    import torch_xla.distributed.xla_backend as xb

    dist.init_process_group("xla", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert type(dist.group.WORLD) is xb.ProcessGroupXla
        whole = dist.new_group(ranks=[0])
        assert type(whole) is xb.ProcessGroupXla and whole._mesh == [[0]]
        assert dist.new_group()._mesh == []
        t = torch.tensor([1.0, 2.0], device=torch_xla.device())
        dist.all_reduce(t, group=whole)
        dist.broadcast(t, src=0, group=whole)
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        assert whole.broadcast([t], opts).result()[0] is t
        assert t.cpu().tolist() == [1.0, 2.0]
    finally:
        dist.destroy_process_group()


def test_infer_mesh(xla_target):
    from torch_xla.distributed.xla_backend import _infer_mesh

    assert _infer_mesh([4, 5, 6, 7], 12) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert _infer_mesh([1, 5, 9], 12) == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    cases = {
        (0, 1, 2, 3, 4): "Given slice length doesn't equal to a side of a rectangle. World "
        "size: 12, slice length: 5",
        (1, 5, 10): "Given slice isn't a range with evenly distributed steps: [1, 5, 10]",
        (1, 2): "Given horizontal slice doesn't have a correct start: World size: 12, slice "
        "length: 2, slice: [1, 2]",
        (4, 7, 10): "Given vertical slice doesn't have a correct start: World size: 12, slice "
        "length: 3, slice: [4, 7, 10]",
        (1, 5): "Given vertical slice doesn't have a correct step: World size: 12, slice "
        "length: 2, slice: [1, 5]",
    }
    for ranks, message in cases.items():
        with pytest.raises(ValueError) as raised:
            _infer_mesh(list(ranks), 12)
        assert str(raised.value) == message
