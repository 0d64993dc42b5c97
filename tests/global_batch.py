"""References for the multi-host training tests: the eager CPU SGD run of the global batch the
hosts feed, and the demo's loop on one slice for the multislice runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xlasim


def eager_sgd(num_devices: int, rows: slice = slice(None)) -> tuple[list[float], list[float]]:
    """(losses, final weight) of two SGD steps on ``rows`` of the global batch."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * num_devices, 8, generator=g)
    y = torch.randn(4 * num_devices, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.weight.detach().flatten().tolist()


def demo_losses_on_one_slice(steps: int, batch: int) -> list[float]:
    """The losses of ``xlasim demo``'s training loop on one 8-device v4-16 slice (mesh (2, 4),
    batch sharded on 'data'), simulated in this process: what a multislice run of the same
    global batch must give."""
    with xlasim.simulate("2x2x2", "v4", spmd=True, single_process=True):
        import torch_xla
        import torch_xla.distributed.spmd as xs

        mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
        device = torch_xla.device()
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        ).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(batch, 16, generator=gen)
        y = torch.tanh(x @ torch.randn(16, 1, generator=gen))
        xd, yd = x.to(device), y.to(device)
        xs.mark_sharding(xd, mesh, ("data", None))
        xs.mark_sharding(yd, mesh, ("data", None))
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xd), yd)
            loss.backward()
            optimizer.step()
            torch_xla.sync()
            losses.append(loss.item())
        return losses


def check_two_slice_records(records: list[dict], steps: int, batch: int) -> None:
    """The demo's records of a run on 2 x v4-8 (one host each): slice by slice, each host with
    its slice's MEGASCALE_SLICE_ID, the default hybrid mesh, one program with one slice's losses."""
    assert [(r["slice_index"], r["host_index"], r["process_index"]) for r in records] == [
        (0, 0, 0),
        (1, 0, 1),
    ]
    for r in records:
        assert r["megascale_slice_id"] == str(r["slice_index"])
        assert (r["process_count"], r["global_devices"], r["addressable_devices"]) == (2, 8, 4)
        assert r["mesh_shape"] == [2, 4] and r["axis_names"] == ["data", "model"]
        # HybridMesh(ici (1, 4), dcn (2, 1)): real torch_xla 2.9's order (tests/test_multislice.py)
        assert r["mesh_device_ids"] == [0, 2, 1, 3, 4, 6, 5, 7]
    assert records[0]["losses"] == records[1]["losses"]
    assert records[0]["losses"] == pytest.approx(demo_losses_on_one_slice(steps, batch), rel=1e-5)
