"""``torch.ops.xla.quantized_matmul`` and ``XlaQuantizedLinear``
(``torch_xla.experimental.xla_quantized_matmul``), and the mixed-dtype products under them.

Facts measured on real torch_xla 2.9 with ``PJRT_DEVICE=CPU``: a mm or bmm of two dtypes gives
the first operand's dtype (s8 @ f32 -> s8, truncated: 1 x 1.5 summed over 3 is 4; bf16 @ f32
-> bf16; f32 @ s8 -> f32); the op's device kernel gives the host kernel's values, blockwise
weights included; a weight that is not int8 fails torch_xla's assertion with the message
below; after ``import torch_xla`` the ``quantized_decomposed`` ops exist (upstream's
quantized_ops/test_quantized_matmul.py calls them). Inputs here are small integers so that
the values are exact at the simulated TPU's default mat-mul precision too.
"""

from __future__ import annotations

import pytest
import torch

import xlasim


def _ints(*shape: int, low: int = -4, high: int = 4) -> torch.Tensor:
    return torch.randint(low, high, shape).float()


def test_a_product_of_two_dtypes_takes_the_first_operands():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        dev = torch_xla.device()
        cases = [
            (torch.int8, torch.float32, torch.int8, 4.0),
            (torch.bfloat16, torch.float32, torch.bfloat16, 6.75),
            (torch.float32, torch.int8, torch.float32, 4.5),
        ]
        for first, second, result, value in cases:
            a = torch.full((2, 3), 1.5).to(first).to(dev)
            b = torch.full((3, 4), 1.5).to(second).to(dev)
            for out in (torch.mm(a, b), torch.bmm(a[None], b[None])[0]):
                assert out.dtype == result
                assert out.cpu()[0, 0].item() == value


def test_device_kernel_gives_the_host_kernels_values():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.experimental.xla_quantized_matmul  # noqa: F401 - defines the kernels

        dev = torch_xla.device()
        torch.manual_seed(0)
        x = _ints(3, 6)
        w = torch.randint(-8, 8, (8, 6), dtype=torch.int8)
        scaler = torch.tensor([1.0, 2.0, 0.5, 1.0, 4.0, 1.0, 0.25, 2.0])
        zero_point = _ints(8)
        for kwargs in ({}, {"int4_weight": True}, {"quantize_activation": True}):
            host = torch.ops.xla.quantized_matmul(x, w, scaler, zero_point, **kwargs)
            device = torch.ops.xla.quantized_matmul(
                x.to(dev), w.to(dev), scaler.to(dev), zero_point.to(dev), **kwargs
            )
            assert torch.equal(device.cpu(), host), kwargs

        blocks = torch.randint(-8, 8, (3, 2, 8), dtype=torch.int8)  # [in / 2, 2, out]
        block_scaler = torch.ones(3, 8)
        block_zero = _ints(3, 8)
        host = torch.ops.xla.quantized_matmul(x, blocks, block_scaler, block_zero, block_size=2)
        device = torch.ops.xla.quantized_matmul(
            x.to(dev), blocks.to(dev), block_scaler.to(dev), block_zero.to(dev), block_size=2
        )
        assert device.dtype == torch.float32
        assert torch.equal(device.cpu(), host)


def test_linear_module_eager_and_compiled_and_its_checks():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        from torch_xla.experimental.xla_quantized_matmul import XlaQuantizedLinear

        dev = torch_xla.device()
        assert hasattr(torch.ops.quantized_decomposed, "quantize_per_channel")
        layer = XlaQuantizedLinear(6, 8, is_symmetric=True)
        assert layer.zero_point is None and layer.weight.dtype == torch.int8
        layer.load_quantized_weight(torch.randint(-8, 8, (8, 6), dtype=torch.int8), torch.ones(8))
        x = _ints(3, 6)
        with torch.no_grad():
            host = layer(x)
            layer = layer.to(dev)
            eager = layer(x.to(dev))
            compiled = torch.compile(layer, backend="openxla")(x.to(dev))
        assert torch.equal(eager.cpu(), host) and torch.equal(compiled.cpu(), host)

        with pytest.raises(AssertionError) as info:
            layer.load_quantized_weight(torch.zeros(8, 6), torch.ones(8))
        assert str(info.value) == "Weight dtype is expected to be torch.int8, got torch.float32."
