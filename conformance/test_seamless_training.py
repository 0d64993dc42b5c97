"""The seamless trainer on every target: same losses as eager CPU, one graph per step.

Checked on real torch_xla 2.9 (PJRT_DEVICE=CPU) under SPMD: with parameters left
unsharded a plain SGD loop compiles twice (step 2's parameters come back ``{replicated}``);
the trainer replicates them up front, so the step compiles once and every later step is one
``ExecuteReplicated``.  Batches are sharded along the mesh's data axis, labels of rank 1
included.
"""

from __future__ import annotations

import pytest
import torch


def _loop(trainer_kwargs, steps_per_epoch=4, epochs=2, record_sharding=None):
    from tpu_backend.seamless import SeamlessTPUTrainer

    trainer = SeamlessTPUTrainer(**trainer_kwargs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16 * steps_per_epoch, 8, generator=gen)
    y = torch.tanh(x @ torch.randn(8, 1, generator=gen)).squeeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, optimizer, loader = trainer.prepare(model, optimizer, loader)
    losses, stats = [], []
    for _ in range(epochs):
        for xb, yb in loader:
            if record_sharding is not None and not record_sharding:
                import torch_xla

                record_sharding.extend(torch_xla._XLAC._get_xla_sharding_spec(t) for t in (xb, yb))
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
            losses.append(trainer.reduce_mean(loss))
            s = trainer.compile_stats()
            stats.append(None if s is None else (s.compiles, s.executions))
    return trainer, losses, stats


@pytest.mark.parametrize("spmd", [False, True], ids=["single-device", "spmd"])
def test_seamless_loop_matches_cpu_and_compiles_once(xla_target, spmd):
    import torch_xla.debug.metrics as met
    import torch_xla.runtime as xr

    # Start the XLA runtime first: the autograd engine sizes its per-device queues on the
    # first backward of the process, and real torch_xla reports its devices only once its
    # client exists, so a CPU backward before that breaks every later XLA backward.
    assert xr.global_runtime_device_count() == xla_target.num_devices
    _, cpu_losses, cpu_stats = _loop({"device": "cpu"})
    assert cpu_stats == [None] * 8
    if spmd:
        xr.use_spmd()
    shardings: list[str] = []
    trainer, losses, stats = _loop({}, record_sharding=shardings)
    assert trainer.is_xla and trainer.spmd is spmd
    assert losses == pytest.approx(cpu_losses, rel=1e-5)
    assert stats == [(1, i) for i in range(1, 9)]
    execute = "ExecuteReplicated" if spmd else "ExecuteComputation"
    other = "ExecuteComputation" if spmd else "ExecuteReplicated"
    assert met.counter_value(execute) == 8
    assert met.counter_value(other) is None
    n = xla_target.num_devices
    ids = ",".join(map(str, range(n)))
    if spmd:
        assert shardings == [f"{{devices=[{n},1]{ids}}}", f"{{devices=[{n}]{ids}}}"]
        for p in trainer.model.parameters():
            import torch_xla

            assert torch_xla._XLAC._get_xla_sharding_spec(p) == "{replicated}"
    else:
        assert shardings == ["", ""]


def test_unsharded_parameters_recompile_once_under_spmd(xla_target):
    """Why the trainer replicates parameters: real torch_xla's behaviour without it."""
    import numpy as np
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    device = torch_xla.device()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        xb = torch.randn(16, 8).to(device)
        xs.mark_sharding(xb, mesh, ("data", None))
        optimizer.zero_grad()
        model(xb).pow(2).mean().backward()
        optimizer.step()
        torch_xla.sync()
    assert met.counter_value("UncachedCompile") == 2
    assert met.counter_value("CachedCompile") == 2
    assert torch_xla._XLAC._get_xla_sharding_spec(model.weight) == "{replicated}"


def test_bf16_mixed_precision_autocasts_on_xla(xla_target):
    """``mixed_precision='bf16'`` is ``torch.autocast('xla', dtype=torch.bfloat16)``: a Linear
    in the region computes in bf16 (real torch_xla 2.9 CPU: ``torch.bfloat16``)."""
    from tpu_backend.seamless import SeamlessTPUTrainer

    trainer = SeamlessTPUTrainer(torch.nn.Linear(4, 2), mixed_precision="bf16")
    x = trainer.to_device(torch.ones(3, 4))
    with trainer.autocast():
        out = trainer.model(x)
    assert out.dtype == torch.bfloat16 and out.device.type == "xla"
    assert trainer.model.weight.dtype == torch.float32
