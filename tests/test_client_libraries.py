"""Training loops written for Hugging Face accelerate and Lightning, on the simulator.

Each loop runs twice in its own process (the libraries keep process-wide state): on the CPU,
and under ``xlasim run`` on a one-chip slice, where accelerate must pick
``DistributedType.XLA`` on ``xla:0``. The losses must be those of CPU eager.  On a four-chip
host the libraries start one process per chip (``xmp.spawn``): the replicas' mean loss at each
step must be the CPU loss of the whole batch.

Skipped where the library is not installed (none of the tox envs installs it yet; the
baseline venv with torch 2.13, accelerate 1.15 and lightning 2.6.6 has both).
"""

from __future__ import annotations

import json
import sys

import pytest
from docs_examples import env_for, run

# One regression loop for every accelerate program below: 8 samples, 2 epochs.
_ACCELERATE_TRAIN = """
def train(acc, batch_size):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(32.0).reshape(8, 4) / 32
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    for _ in range(2):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            acc.backward(loss)
            opt.step()
            losses.append(loss.item())
    return model, losses
"""

ACCELERATE_LOOP = (
    """
import json, sys, torch
from accelerate import Accelerator
"""
    + _ACCELERATE_TRAIN
    + """
acc = Accelerator(cpu=sys.argv[1] == "cpu")
model, losses = train(acc, batch_size=4)
print("RESULT " + json.dumps({
    "type": str(acc.distributed_type), "device": str(acc.device),
    "param_device": str(next(model.parameters()).device), "losses": losses,
}))
"""
)

LIGHTNING_LOOP = """
import json, sys, torch
import lightning as L

class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.losses, self.devices = [], set()

    def training_step(self, batch, index):
        xb, yb = batch
        loss = torch.nn.functional.mse_loss(self.lin(xb), yb)
        self.losses.append(loss.detach())
        self.devices.add(str(xb.device))
        self.devices.add(str(self.lin.weight.device))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
module = Regression()
x = torch.arange(32.0).reshape(8, 4) / 32
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
trainer = L.Trainer(
    accelerator="cpu" if sys.argv[1] == "cpu" else "tpu", devices=1, max_epochs=2,
    logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
print("RESULT " + json.dumps({
    "accelerator": type(trainer.accelerator).__name__,
    "devices": sorted(module.devices), "losses": [float(l.cpu()) for l in module.losses],
}))
"""

# The same loops on the four chips of a simulated v4-8 host, one process per chip: each replica
# takes a quarter of every batch and the gradients are averaged, so the mean of the replicas'
# losses at each step is the CPU loss of the whole batch.
ACCELERATE_ON_CHIPS = (
    """
import json, torch
import torch_xla.distributed.xla_multiprocessing as xmp
"""
    + _ACCELERATE_TRAIN
    + """
def main(index):
    from accelerate import Accelerator
    import torch_xla.core.xla_model as xm

    acc = Accelerator()
    _, losses = train(acc, batch_size=1)
    every = xm.mesh_reduce("losses", losses, lambda replicas: replicas)
    if acc.is_main_process:
        print("RESULT " + json.dumps({
            "type": str(acc.distributed_type), "processes": acc.num_processes,
            "device": str(acc.device), "losses": every,
        }), flush=True)

if __name__ == "__main__":
    # notebook_launcher's way on a TPU VM (a forked process per chip)
    xmp.spawn(main, start_method="fork")
"""
)

LIGHTNING_ON_CHIPS = """
import json, torch
import lightning as L

class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.losses = []

    def training_step(self, batch, index):
        xb, yb = batch
        loss = torch.nn.functional.mse_loss(self.lin(xb), yb)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        every = xm.mesh_reduce("losses", [float(l.cpu()) for l in self.losses], lambda r: r)
        if xr.global_ordinal() == 0:
            print("RESULT " + json.dumps({
                "accelerator": type(self.trainer.accelerator).__name__,
                "strategy": type(self.trainer.strategy).__name__,
                "world": self.trainer.world_size, "losses": every,
            }), flush=True)

if __name__ == "__main__":
    torch.manual_seed(0)
    module = Regression()
    x = torch.arange(32.0).reshape(8, 4) / 32
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    trainer = L.Trainer(
        accelerator="tpu", devices="auto", max_epochs=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=1))
"""

ACCELERATOR_TYPES = {"cpu": "DistributedType.NO", "xla": "DistributedType.XLA"}


def _result(script: str, target: str, tmp_path, slice_: tuple[str, str] = ("1x1", "v6e")) -> dict:
    path = tmp_path / "loop.py"
    path.write_text(script)
    command = [sys.executable, str(path), target]
    if target == "xla":
        topology, accelerator = slice_
        command = [sys.executable, "-m", "xlasim", "run", "--topology", topology]
        command += ["--accelerator", accelerator, sys.executable, str(path), target]
    result = run(command, tmp_path, env_for(tmp_path))
    assert result.returncode == 0, result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.mat_mul_precision("highest")  # compared with eager CPU
def test_accelerate_trains_on_xla_as_on_cpu(tmp_path):
    pytest.importorskip("accelerate")
    cpu = _result(ACCELERATE_LOOP, "cpu", tmp_path)
    xla = _result(ACCELERATE_LOOP, "xla", tmp_path)
    assert (cpu["type"], cpu["device"]) == (ACCELERATOR_TYPES["cpu"], "cpu")
    assert (xla["type"], xla["device"], xla["param_device"]) == (
        ACCELERATOR_TYPES["xla"],
        "xla:0",
        "xla:0",
    )
    assert len(xla["losses"]) == 4
    assert xla["losses"] == pytest.approx(cpu["losses"], rel=1e-6)


@pytest.mark.mat_mul_precision("highest")  # compared with eager CPU
def test_lightning_trains_on_tpu_as_on_cpu(tmp_path):
    pytest.importorskip("lightning")
    cpu = _result(LIGHTNING_LOOP, "cpu", tmp_path)
    xla = _result(LIGHTNING_LOOP, "xla", tmp_path)
    assert (cpu["accelerator"], cpu["devices"]) == ("CPUAccelerator", ["cpu"])
    assert (xla["accelerator"], xla["devices"]) == ("XLAAccelerator", ["xla:0"])
    assert len(xla["losses"]) == 4
    assert xla["losses"] == pytest.approx(cpu["losses"], rel=1e-6)


def _replica_means(losses: list[list[float]]) -> list[float]:
    return [sum(step) / len(step) for step in zip(*losses, strict=True)]


@pytest.mark.mat_mul_precision("highest")  # compared with eager CPU
def test_accelerate_trains_on_four_chips_as_on_cpu(tmp_path):
    pytest.importorskip("accelerate")
    cpu = _result(ACCELERATE_LOOP, "cpu", tmp_path)
    chips = _result(ACCELERATE_ON_CHIPS, "xla", tmp_path, ("2x2x1", "v4"))
    assert (chips["type"], chips["processes"], chips["device"]) == (
        ACCELERATOR_TYPES["xla"],
        4,
        "xla:0",
    )
    assert [len(replica) for replica in chips["losses"]] == [4] * 4
    assert _replica_means(chips["losses"]) == pytest.approx(cpu["losses"], rel=1e-5)


@pytest.mark.mat_mul_precision("highest")  # compared with eager CPU
def test_lightning_trains_on_every_chip_as_on_cpu(tmp_path):
    pytest.importorskip("lightning")
    chips = _result(LIGHTNING_ON_CHIPS, "xla", tmp_path, ("2x2x1", "v4"))
    assert (chips["accelerator"], chips["strategy"], chips["world"]) == (
        "XLAAccelerator",
        "XLAStrategy",
        4,
    )
    # The whole batch on the CPU, in the order Lightning's distributed sampler deals it out
    # (shuffled with seed 0 + epoch), four samples a step.
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(32.0).reshape(8, 4) / 32
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
    expected = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            expected.append(loss.item())
    assert [len(replica) for replica in chips["losses"]] == [2 * 2] * 4
    assert _replica_means(chips["losses"]) == pytest.approx(expected, rel=1e-5)
