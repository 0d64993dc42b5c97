"""The ``xla`` process group between the processes of a simulated 4-chip host: each op is the
``xm`` collective torch_xla's group runs, so every replica ends with the values a TPU slice
gives. (Real torch_xla on CPU runs its replicas as threads of one process, so this runs on the
simulator only; one replica is in conformance/test_process_group.py.) Starting processes costs
seconds each, so one spawn checks every op. The functions run in the children."""

from __future__ import annotations

import pytest
import torch
from sockets import free_port

WORLD = 4


def _ours(rank: int) -> torch.Tensor:
    return torch.tensor([rank + 1.0, 10.0 * rank])


def _replica() -> dict[str, object]:
    import torch.distributed as dist
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    dist.init_process_group("xla", init_method="xla://")
    dev = torch_xla.device()
    i = xr.global_ordinal()
    out: dict[str, object] = {}

    t = _ours(i).to(dev)
    dist.all_reduce(t)
    out["all_reduce"] = t.cpu()
    t = _ours(i).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.cpu()

    pieces = [torch.zeros(2, device=dev) for _ in range(WORLD)]
    dist.all_gather(pieces, _ours(i).to(dev))
    out["all_gather"] = [p.cpu() for p in pieces]
    scalars = [torch.zeros((), device=dev) for _ in range(WORLD)]
    dist.all_gather(scalars, torch.tensor(float(i), device=dev))
    out["all_gather_scalar"] = [s.cpu() for s in scalars]
    flat, stacked = torch.zeros(2 * WORLD, device=dev), torch.zeros(WORLD, 2, device=dev)
    dist.all_gather_into_tensor(flat, _ours(i).to(dev))
    dist.all_gather_into_tensor(stacked, _ours(i).to(dev))
    out["all_gather_into_tensor"] = (flat.cpu(), stacked.cpu())

    mine = torch.zeros(2, device=dev)
    dist.reduce_scatter(mine, [(_ours(i) + r).to(dev) for r in range(WORLD)])
    out["reduce_scatter"] = mine.cpu()
    mine = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(mine, torch.arange(8.0, device=dev) * (i + 1))
    out["reduce_scatter_tensor"] = mine.cpu()

    t = _ours(i).to(dev)
    dist.broadcast(t, src=2)
    out["broadcast"] = t.cpu()

    received = [torch.zeros(2, device=dev) for _ in range(WORLD)]
    dist.all_to_all(received, [(_ours(i) + 100 * r).to(dev) for r in range(WORLD)])
    out["all_to_all"] = [r.cpu() for r in received]
    single = torch.zeros(WORLD, device=dev)
    dist.all_to_all_single(single, torch.arange(4.0, device=dev) + 10 * i)
    out["all_to_all_single"] = single.cpu()

    t = _ours(i).to(dev)
    dist.reduce(t, dst=1)
    out["reduce"] = t.cpu()
    gathered = [torch.zeros(2, device=dev) for _ in range(WORLD)] if i == 0 else None
    dist.gather(_ours(i).to(dev), gathered, dst=0)
    out["gather"] = [g.cpu() for g in gathered] if gathered else None
    part = torch.zeros(2, device=dev)
    sent = [(_ours(0) * (r + 1)).to(dev) for r in range(WORLD)] if i == 0 else None
    dist.scatter(part, sent, src=0)
    out["scatter"] = part.cpu()
    dist.barrier()
    # Even ranks send to the next odd one: every replica runs one collective-permute.
    t = _ours(i).to(dev)
    if i % 2 == 0:
        dist.send(t, dst=i + 1)
    else:
        dist.recv(t, src=i - 1)
    out["send_recv"] = t.cpu()

    # Every process creates every group (torch.distributed's rule); the mesh is inferred.
    spmd = {"xla_pg_options": {"spmd": True}}
    pairs = [dist.new_group(ranks=r, pg_options=spmd) for r in ([0, 1], [2, 3])]
    group = pairs[i // 2]
    t = _ours(i).to(dev)
    dist.all_reduce(t, group=group)
    out["pair_mesh"] = group._mesh
    out["pair_all_reduce"] = t.cpu()

    values = [(_ours(i) * (k + 1)).to(dev) for k in range(3)]
    out["all_gather_bucketized"] = [
        g.cpu() for g in xm.all_gather_bucketized(values, bucket_cap_mb=0)
    ]
    big = [torch.arange(8.0, device=dev) * (i + 1), torch.ones(4, 2, device=dev)]
    outputs = [torch.zeros(2, device=dev), torch.zeros(1, 2, device=dev)]
    xm.reduce_scatter_bucketized(xm.REDUCE_SUM, big, 0.5, 0, WORLD, output=outputs)
    out["reduce_scatter_bucketized"] = [o.cpu() for o in outputs]
    full = torch.zeros(8, device=dev)  # takes the shard: torch_xla replaces an output's data
    xm.reduce_scatter(xm.REDUCE_SUM, torch.arange(8.0, device=dev), 1.0, 0, WORLD, output=full)
    out["reduce_scatter_full_output"] = full.cpu()
    ring = [[r, (r + 1) % WORLD] for r in range(WORLD)]
    out["collective_permute"] = xm.collective_permute(_ours(i).to(dev), ring).cpu()
    grads = [(_ours(i) * (k + 1)).to(dev) for k in range(3)]
    xm.all_reduce_bucketized_gradients(grads, 0.25, None, False, bucket_cap_mb=0)
    out["bucketized_gradients"] = [g.cpu() for g in grads]
    dist.destroy_process_group()
    return out


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_process_group_collectives_between_replicas(xlasim_sim, monkeypatch):
    from torch_xla._internal import pjrt

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    results = pjrt.run_multiprocess(_replica)
    assert sorted(results) == list(range(WORLD))

    ours = [_ours(r) for r in range(WORLD)]
    stacked = torch.stack(ours)
    close = torch.testing.assert_close
    for i, got in results.items():
        close(got["all_reduce"], stacked.sum(0))
        close(got["all_reduce_max"], stacked.amax(0))
        close(torch.stack(got["all_gather"]), stacked)
        close(torch.stack(got["all_gather_scalar"]), torch.arange(4.0))
        flat, two_d = got["all_gather_into_tensor"]
        close(flat, stacked.reshape(-1))
        close(two_d, stacked)
        close(got["reduce_scatter"], stacked.sum(0) + 4 * i)
        total = torch.arange(8.0) * sum(r + 1 for r in range(WORLD))
        close(got["reduce_scatter_tensor"], total[2 * i : 2 * i + 2])
        close(got["broadcast"], ours[2])
        close(torch.stack(got["all_to_all"]), stacked + 100 * i)
        close(got["all_to_all_single"], torch.tensor([i + 10.0 * r for r in range(WORLD)]))
        close(got["reduce"], stacked.sum(0) if i == 1 else ours[i])
        if i == 0:
            close(torch.stack(got["gather"]), stacked)
        else:
            assert got["gather"] is None
        close(got["scatter"], ours[0] * (i + 1))
        close(got["send_recv"], ours[i - i % 2])
        assert got["pair_mesh"] == [[0, 1], [2, 3]]
        pair = [0, 1] if i < 2 else [2, 3]
        close(got["pair_all_reduce"], stacked[pair].sum(0))
        for k, gathered in enumerate(got["all_gather_bucketized"]):
            close(gathered, (stacked * (k + 1)).reshape(-1))
        first, second = got["reduce_scatter_bucketized"]
        close(first, total[2 * i : 2 * i + 2] * 0.5)
        close(second, torch.full((1, 2), 2.0))
        close(got["reduce_scatter_full_output"], torch.arange(8.0)[2 * i : 2 * i + 2] * WORLD)
        close(got["collective_permute"], ours[(i - 1) % WORLD])
        for k, grad in enumerate(got["bucketized_gradients"]):
            close(grad, stacked.sum(0) * (k + 1) * 0.25)
