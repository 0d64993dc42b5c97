"""`xla` device tensors: placement, transfers, and numerics against eager CPU torch.

Tolerances were measured on real torch_xla 2.9 CPU against eager CPU torch 2.9 (64x64 inputs):
float32 add/mul/div/pow/sum are bit-exact; exp, tanh, sigmoid, sqrt, softmax, log_softmax,
mean and gelu differ by at most 3.8e-6 absolute / 3.3e-7 relative to the value, so they are
compared with rtol=1e-6, atol=1e-6.  A float32 matmul is bit-exact on XLA:CPU, which ignores
the mat-mul precision; on a TPU, at the 'highest' precision this suite runs at (six bfloat16
passes, about 22 bits), it is within MATMUL_TOL.  bfloat16 elementwise ops and matmul are
bit-exact; bfloat16 reductions (sum, mean, softmax) are not compared: XLA accumulates them
differently from eager CPU (up to 4% apart), so neither result is "the" answer.
"""

from __future__ import annotations

import torch

F32_TOL = {"rtol": 1e-6, "atol": 1e-6}
# 'highest' drops the products below 2**-22 of each term: for these 64-term sums of standard
# normals (|a||b| summed over a row: about 40) that is at most 1e-5 absolute.
MATMUL_TOL = {"rtol": 1e-5, "atol": 1e-5}

EXACT_OPS = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / (y.abs() + 1),
    "pow": lambda x, y: x**2,
    "sum": lambda x, y: x.sum(),
}
CLOSE_OPS = {
    "exp": lambda x, y: torch.exp(x),
    "tanh": lambda x, y: torch.tanh(x),
    "sigmoid": lambda x, y: torch.sigmoid(x),
    "sqrt": lambda x, y: x.abs().sqrt(),
    "softmax": lambda x, y: torch.softmax(x, -1),
    "log_softmax": lambda x, y: torch.log_softmax(x, -1),
    "mean": lambda x, y: x.mean(0),
    "gelu": lambda x, y: torch.nn.functional.gelu(x),
}
BF16_EXACT_OPS = ["add", "mul", "div", "pow", "matmul", "exp", "tanh", "sigmoid", "sqrt"]


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)


def test_device_placement_and_transfers(xla_target):
    import torch_xla

    dev = torch_xla.device()
    assert dev == torch.device("xla:0")
    assert dev.type == "xla" and dev.index == 0
    cpu = torch.tensor([1.5, 2.5, -3.0])
    placed = (cpu.to(dev), cpu.to("xla"), cpu.to("xla:0"), torch.tensor(cpu.tolist(), device=dev))
    for t in placed:
        assert t.device == torch.device("xla:0")
        assert t.device.type == "xla"
        assert t.is_xla
        assert t.dtype == torch.float32
        assert t.cpu().device == torch.device("cpu")
        assert torch.equal(t.cpu(), cpu)
        assert t.tolist() == [1.5, 2.5, -3.0]
    r = torch.randn(3, 4, device="xla")
    assert r.device == torch.device("xla:0") and r.shape == (3, 4) and r.dtype == torch.float32
    z = torch.zeros(2, 2, dtype=torch.int64, device=dev)
    assert z.dtype == torch.int64 and z.tolist() == [[0, 0], [0, 0]]
    s = cpu.to(dev).sum()
    item = s.item()
    assert type(item) is float and item == 1.0
    assert type(torch.tensor(3, device=dev).item()) is int
    assert torch.tensor(True, device=dev).item() is True
    module = torch.nn.Linear(3, 2).to(dev)
    assert all(p.device == torch.device("xla:0") for p in module.parameters())
    # a CPU tensor operand is accepted and the result stays on the device
    mixed = cpu.to(dev) + torch.ones(3)
    assert mixed.device == torch.device("xla:0")
    assert mixed.cpu().tolist() == [2.5, 3.5, -2.0]


def test_float32_numerics_match_eager_cpu(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a, b = _inputs()
    xa, xb = a.to(dev), b.to(dev)
    for name, op in EXACT_OPS.items():
        got = op(xa, xb)
        assert got.device == dev, name
        assert torch.equal(got.cpu(), op(a, b)), name
    for name, op in CLOSE_OPS.items():
        torch.testing.assert_close(op(xa, xb).cpu(), op(a, b), **F32_TOL, msg=name)
    torch.testing.assert_close((xa @ xb).cpu(), a @ b, **MATMUL_TOL)


def test_bfloat16(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a, b = (t.to(torch.bfloat16) for t in _inputs())
    xa, xb = a.to(dev), b.to(dev)
    assert xa.dtype == torch.bfloat16
    ops = {**EXACT_OPS, **CLOSE_OPS, "matmul": lambda x, y: x @ y}
    for name in BF16_EXACT_OPS:
        got = ops[name](xa, xb)
        assert got.dtype == torch.bfloat16, name
        assert torch.equal(got.cpu(), ops[name](a, b)), name
    assert torch.ones(2, dtype=torch.bfloat16, device=dev).dtype == torch.bfloat16
    assert xa.float().dtype == torch.float32
    assert torch.equal(xa.float().cpu(), a.float())


def test_autograd_and_optimizer_step(xla_target):
    import torch_xla

    dev = torch_xla.device()
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 5, generator=g), torch.randn(5, 3, generator=g)

    def run(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weight = w.clone().to(device).requires_grad_()
        opt = torch.optim.SGD([weight], lr=0.1)
        loss = torch.tanh(x.to(device) @ weight).pow(2).mean()
        loss.backward()
        grad = weight.grad.detach().clone()
        opt.step()
        return loss.detach().cpu(), grad.cpu(), weight.detach().cpu()

    xla_loss, xla_grad, xla_weight = run(dev)
    cpu_loss, cpu_grad, cpu_weight = run(torch.device("cpu"))
    torch.testing.assert_close(xla_loss, cpu_loss, **F32_TOL)
    torch.testing.assert_close(xla_grad, cpu_grad, **F32_TOL)
    torch.testing.assert_close(xla_weight, cpu_weight, **F32_TOL)

    leaf = torch.tensor([2.0, 3.0], device=dev, requires_grad=True)
    (leaf * leaf).sum().backward()
    assert leaf.grad.device == dev
    assert leaf.grad.cpu().tolist() == [4.0, 6.0]
