"""Training loops written for Hugging Face accelerate and Lightning, on the simulator.

Each loop runs twice in its own process (the libraries keep process-wide state): on the CPU,
and under ``xlasim run`` on a one-chip slice, where accelerate must pick
``DistributedType.XLA`` on ``xla:0``. The losses must be those of CPU eager.

Skipped where the library is not installed (none of the tox envs installs it yet; the
baseline venv with torch 2.13, accelerate 1.15 and lightning 2.6.6 has both).
"""

from __future__ import annotations

import json
import sys

import pytest
from docs_examples import env_for, run

ACCELERATE_LOOP = """
import json, sys, torch
from accelerate import Accelerator

torch.manual_seed(0)
acc = Accelerator(cpu=sys.argv[1] == "cpu")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.arange(32.0).reshape(8, 4) / 32
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=4))
losses = []
for _ in range(2):
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        losses.append(loss.item())
print("RESULT " + json.dumps({
    "type": str(acc.distributed_type), "device": str(acc.device),
    "param_device": str(next(model.parameters()).device), "losses": losses,
}))
"""

ACCELERATOR_TYPES = {"cpu": "DistributedType.NO", "xla": "DistributedType.XLA"}


def _result(script: str, target: str, tmp_path) -> dict:
    path = tmp_path / "loop.py"
    path.write_text(script)
    command = [sys.executable, str(path), target]
    if target == "xla":
        command = [sys.executable, "-m", "xlasim", "run", "--topology", "1x1"]
        command += ["--accelerator", "v6e", sys.executable, str(path), target]
    result = run(command, tmp_path, env_for(tmp_path))
    assert result.returncode == 0, result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


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
