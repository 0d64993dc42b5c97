"""xlasim.register_xla_device(): eager CPU training first, then a simulated slice, one process.

PyTorch's autograd engine fixes its set of devices at the first backward pass of a process, so
each case runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD_TIMEOUT_S = 300

# One SGD step of a bias-free Linear with weights [1, -2, 3] on an input of ones: the loss is
# the sum of the weights, its gradient the input, so lr 0.5 gives [0.5, -2.5, 2.5].
_TRAIN = textwrap.dedent(
    """
    import torch

    def step(device):
        model = torch.nn.Linear(3, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[1.0, -2.0, 3.0]]))
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loss = model(torch.ones(1, 3, device=device)).sum()
        loss.backward()
        opt.step()
        return loss.item(), model.weight.detach().cpu().tolist()
    """
)


def _run(body: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    return subprocess.run(
        [sys.executable, "-c", _TRAIN + textwrap.dedent(body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def test_registered_first_then_cpu_and_simulated_training_in_one_process():
    proc = _run(
        """
        import xlasim
        xlasim.register_xla_device()
        print("cpu", step("cpu"))
        with xlasim.simulate("2x2"):
            import torch_xla
            print("xla", step(torch_xla.device()))
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = "(2.0, [[0.5, -2.5, 2.5]])"
    assert proc.stdout.splitlines() == [f"cpu {expected}", f"xla {expected}"]


def test_without_it_a_clear_error_names_the_fix():
    proc = _run(
        """
        import xlasim
        step("cpu")  # autograd starts without the xla device
        try:
            with xlasim.simulate("2x2"):
                import torch_xla
                torch_xla.device()  # the first device use checks autograd
        except RuntimeError as exc:
            print("ERROR", exc)
        print("active", xlasim.is_active())
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    error, active = proc.stdout.splitlines()
    assert error.startswith("ERROR xlasim: this process ran a backward pass before")
    assert "Call xlasim.register_xla_device() (or enter xlasim.simulate) before any" in error
    assert active == "active False"  # the failed simulation left nothing behind
