"""FSDP on the simulator: the collective-based FSDP (``XlaFullyShardedDataParallel``) on four
replicas, which real torch_xla cannot run on CPU (its one-device behaviour is in
conformance/test_fsdp_v1.py); what is not simulated says so; a deep copy of a device model
stays on the slice (torch's default copy of a tensor subclass duplicated its runtime,
leaving a tensor no simulated slice would take), and checkpoint_module recomputes under the
forward's autocast (real torch_xla on CPU ignores autocast, so this is checked here)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn


def test_deepcopy_of_a_device_model_is_an_independent_clone(xlasim_sim):
    model = nn.Linear(4, 3).to("xla")
    model.weight.grad = torch.ones(3, 4, device="xla")
    twin = copy.deepcopy(model)
    assert twin.weight is not model.weight and twin.weight.requires_grad
    assert [name for name, _ in twin.named_parameters()] == ["weight", "bias"]
    torch.testing.assert_close(twin.weight.grad.cpu(), torch.ones(3, 4))
    x = torch.randn(2, 4, device="xla")
    torch.testing.assert_close(twin(x).cpu(), model(x).cpu())
    with torch.no_grad():
        twin.weight.add_(1.0)
    torch.testing.assert_close(twin.weight.cpu(), model.weight.cpu() + 1.0)
    # Two references to one tensor stay one tensor in the copy.
    pair = copy.deepcopy([model.bias, model.bias])
    assert pair[0] is pair[1]


def test_checkpointed_forward_is_recomputed_under_the_forward_autocast(xlasim_sim):
    import torch_xla
    import torch_xla.amp
    from torch_xla.distributed.fsdp import checkpoint_module

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    checkpointed = copy.deepcopy(plain)
    plain, checkpointed = plain.to("xla"), checkpoint_module(checkpointed.to("xla"))
    x = torch.randn(4, 8)
    results = []
    for model in (plain, checkpointed):
        xin = x.to("xla").requires_grad_()
        with torch_xla.amp.autocast(torch_xla.device(), dtype=torch.bfloat16):
            out = model(xin)
        # Backward runs outside the autocast region: the recomputation must re-enter it, or
        # the gradients would come from a float32 forward.
        out.float().sum().backward()
        results.append((out.dtype, xin.grad.cpu(), model[0].weight.grad.cpu()))
    assert results[0][0] == results[1][0] == torch.bfloat16
    torch.testing.assert_close(results[1][1], results[0][1], rtol=0, atol=0)
    torch.testing.assert_close(results[1][2], results[0][2], rtol=0, atol=0)


WORLD = 4


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4 * WORLD, 8, generator=g), torch.randn(4 * WORLD, 4, generator=g))] * 3


def _fsdp_replica(init: dict[str, torch.Tensor], ckpt_dir: str) -> dict[str, object]:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
    from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy

    dev, rank = torch_xla.device(), xr.global_ordinal()
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)

    def wrapped(**kwargs: object) -> FSDP:
        net = _Net()
        net.load_state_dict(init)
        return FSDP(net, auto_wrap_policy=policy, **kwargs)

    model = wrapped()
    out: dict[str, object] = {
        "params": [(n, tuple(p.shape)) for n, p in model.named_parameters()],
        "dim0": [tuple(p.shape) for p in wrapped(shard_param_on_dim_0=True).parameters()],
    }
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rows = slice(4 * rank, 4 * rank + 4)

    def train(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
        """This replica's losses over the batches (its quarter of each)."""
        losses = []
        for x, y in _batches():
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(module(x[rows].to(dev)), y[rows].to(dev))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    losses, norms = [], []
    for x, y in _batches():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[rows].to(dev)), y[rows].to(dev))
        loss.backward()
        norms.append(model.clip_grad_norm_(1e9).item())
        opt.step()
        losses.append(loss.item())
    out["losses"], out["norms"] = losses, norms
    # Two sharding groups of two: each pair trains on its own half of the batch.
    pair = wrapped(sharding_groups=[[0, 1], [2, 3]], sharding_rank=rank % 2, sharding_world_size=2)
    pair_opt = torch.optim.SGD(pair.parameters(), lr=0.1, momentum=0.9)
    out["pair_shapes"] = [tuple(p.shape) for p in pair.parameters()]
    out["pair_losses"] = train(pair, pair_opt)
    flat = wrapped(flatten_parameters=True)
    flat_opt = torch.optim.SGD(flat.parameters(), lr=0.1, momentum=0.9)
    out["flat_params"] = [(n, tuple(p.shape)) for n, p in flat.named_parameters()]
    out["flat_losses"] = train(flat, flat_opt)

    # Inside no_sync the full gradients wait; the next backward reduce-scatters them with its
    # own: twice the gradient of one backward.
    x, y = (t[rows].to(dev) for t in _batches()[0])
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    once = [p.grad.cpu() for p in model.parameters()]
    opt.zero_grad()
    with model.no_sync():
        nn.functional.mse_loss(model(x), y).backward()
    assert all(p.grad is None for p in model.parameters())
    nn.functional.mse_loss(model(x), y).backward()
    out["no_sync"] = (once, [p.grad.cpu() for p in model.parameters()])

    state = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save(
        {"model": state, "shard_metadata": model.get_shard_metadata()},
        f"{ckpt_dir}/rank-{rank}-of-{WORLD}.pth",
    )
    again = wrapped()
    again.load_state_dict(state)
    out["reloaded"] = [
        (a.cpu() == b).all().item() for a, b in zip(again.parameters(), state.values(), strict=True)
    ]
    xm.rendezvous("saved")
    return out


@pytest.mark.topology("2x2x1", accelerator="v4")
@pytest.mark.mat_mul_precision("highest")
def test_collective_fsdp_on_four_replicas_trains_as_on_the_global_batch(xlasim_sim, tmp_path):
    from torch_xla._internal import pjrt
    from torch_xla.distributed.fsdp import consolidate_sharded_model_checkpoints

    torch.manual_seed(0)
    init = _Net().state_dict()
    results = pjrt.run_multiprocess(_fsdp_replica, init, str(tmp_path))
    assert sorted(results) == list(range(WORLD))

    reference = _Net()
    reference.load_state_dict(init)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    losses, norms = [], []
    for x, y in _batches():
        opt.zero_grad()
        # Each replica's loss is the mean over its quarter of the batch.
        quarter = [
            nn.functional.mse_loss(reference(x[4 * r : 4 * r + 4]), y[4 * r : 4 * r + 4])
            for r in range(WORLD)
        ]
        (sum(quarter) / WORLD).backward()
        norms.append(torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]).item())
        opt.step()
        losses.append([q.item() for q in quarter])

    pair_losses = {}
    for group in ([0, 1], [2, 3]):
        reference_pair = _Net()
        reference_pair.load_state_dict(init)
        opt = torch.optim.SGD(reference_pair.parameters(), lr=0.1, momentum=0.9)
        for r in group:
            pair_losses[r] = []
        for x, y in _batches():
            opt.zero_grad()
            halves = {
                r: nn.functional.mse_loss(
                    reference_pair(x[4 * r : 4 * r + 4]), y[4 * r : 4 * r + 4]
                )
                for r in group
            }
            (sum(halves.values()) / 2).backward()
            opt.step()
            for r, value in halves.items():
                pair_losses[r].append(value.item())

    sep = "_FSDP_SHARD_SEPARATOR_"
    own = sep.join(["_fsdp_shard", "_fsdp_wrapped_module", "_fpw_module", "head"])
    inner = "_fsdp_wrapped_module._fpw_module.body.0." + sep.join(
        ["_fsdp_shard", "_fsdp_wrapped_module", "_fpw_module"]
    )
    for rank, got in results.items():
        # 64, 4, 128 and 16 elements, each padded to a multiple of 4 * 128 and split in four.
        assert got["params"] == [
            (f"{own}{sep}weight", (128,)),
            (f"{own}{sep}bias", (128,)),
            (f"{inner}{sep}weight", (128,)),
            (f"{inner}{sep}bias", (128,)),
        ]
        assert got["dim0"] == [(1, 16), (1,), (4, 8), (4,)]
        torch.testing.assert_close(got["losses"], [step[rank] for step in losses])
        # Flattened: 64 + 4 and 128 + 16 elements in one vector per wrapper, each within 512.
        assert got["flat_params"] == [
            (sep.join(["_fsdp_shard", "_fsdp_wrapped_module", "flat_param_0"]), (128,)),
            (
                "_fsdp_wrapped_module._fpw_module.body.0."
                + sep.join(["_fsdp_shard", "_fsdp_wrapped_module", "flat_param_0"]),
                (128,),
            ),
        ]
        torch.testing.assert_close(got["flat_losses"], [step[rank] for step in losses])
        torch.testing.assert_close(got["norms"], norms)
        # 64, 4, 128 and 16 elements padded to a multiple of 2 * 128, split in two.
        assert got["pair_shapes"] == [(128,), (128,), (128,), (128,)]
        torch.testing.assert_close(got["pair_losses"], pair_losses[rank])
        once, accumulated = got["no_sync"]
        for a, b in zip(once, accumulated, strict=True):
            torch.testing.assert_close(b, 2 * a)
        assert all(got["reloaded"])

    full, path = consolidate_sharded_model_checkpoints(f"{tmp_path}/rank-", save_model=True)
    assert path == f"{tmp_path}/rank-_consolidated.pth"
    assert list(full) == ["head.weight", "head.bias", "body.0.weight", "body.0.bias"]
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, msg=name)
    saved = torch.load(path)["model"]
    assert list(saved) == list(full)


def test_what_collective_fsdp_does_not_simulate_says_so(xlasim_sim):
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
    from torch_xla.distributed.fsdp.xla_flatten_params_wrapper import XlaFlattenParamsWrapper

    with pytest.raises(NotImplementedError, match=r"_debug_dummy_forward_pass=True"):
        FSDP(nn.Linear(2, 2), _debug_dummy_forward_pass=True)
    with pytest.raises(NotImplementedError, match=r"_debug_dummy_reduce_scatter_op=True"):
        FSDP(nn.Linear(2, 2), _debug_dummy_reduce_scatter_op=True)
    with pytest.raises(NotImplementedError, match=r"auto_unflatten_state_dict=True"):
        XlaFlattenParamsWrapper(nn.Linear(2, 2))
    with pytest.raises(NotImplementedError, match=r"coalesce_all_gather_ops=True with flattened"):
        FSDP(nn.Linear(2, 2), coalesce_all_gather_ops=True, pin_layout_in_collective_ops=False)
