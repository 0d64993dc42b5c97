"""torch_xla.backends' mat-mul precision, and what float32 matmuls compute at each level.

Sources: torch_xla 2.9's ``torch_xla/backends/__init__.py`` (names, validation, the warning on
every set, the default 'default' from ``XlaHelpers::s_mat_mul_precision``); pytorch/xla's
precision tutorial and the Cloud TPU bfloat16 page (what a TPU computes at each level); real
torch_xla 2.9 on CPU (XLA:CPU ignores the setting: every level gives the exact float32 product).

The expected TPU values come from the definitions, written here independently of the
simulator: bfloat16 rounding to nearest even by bit arithmetic, the splitting x = x0 + x1 (+ x2),
and the kept products summed in float64.
"""

from __future__ import annotations

import logging

import pytest
import torch

_U = 2.0**-24  # float32's unit roundoff


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> the nearest bfloat16 (ties to even), kept in float32, by bit arithmetic."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded)
    return rounded.to(torch.int32).view(torch.float32)


def _cut(x: torch.Tensor) -> torch.Tensor:
    """float32 -> its upper 16 bits (a bfloat16 value, kept in float32)."""
    return (x.contiguous().view(torch.int32) & -65536).view(torch.float32)


def _split(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    # 'high' (two parts) as XLA splits operands for BF16_BF16_F32_X3
    # (xla/hlo/transforms/dot_algorithm_rewriter): the leading part cut, the other rounded; a
    # TPU errs that much at 'high' (pytorch/xla's test_mat_mul_precision.py requires it), and
    # within its 22-bit bound at 'highest', which rounding all three parts keeps.
    out, rest = [], x
    for k in range(n):
        out.append(_cut(rest) if n == 2 and k == 0 else _bf16(rest))
        rest = rest - out[-1]
    return out


# The products each level keeps, (i, j) for x_i * y_j.
_KEPT = {
    "default": (1, [(0, 0)]),
    "high": (2, [(0, 0), (0, 1), (1, 0)]),
    "highest": (3, [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0)]),
}


def _definition(a: torch.Tensor, b: torch.Tensor, level: str) -> torch.Tensor:
    n, kept = _KEPT[level]
    xs, ys = _split(a, n), _split(b, n)
    return sum(torch.matmul(xs[i].double(), ys[j].double()) for i, j in kept)


def _is_tpu_numerics(xla_target) -> bool:
    # XLA:CPU computes float32 matmuls exactly whatever the precision (measured on real
    # torch_xla 2.9 CPU); the simulator and a TPU compute at the precision.
    return xla_target.name != "xla_cpu"


def _normals(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_default_precision_and_its_setter(xla_target, caplog):
    import torch_xla
    import torch_xla.backends as backends

    assert backends.__all__ == ["set_mat_mul_precision", "get_mat_mul_precision"]
    # The plugin set 'highest' for this suite and put it back: torch_xla's default shows.
    torch_xla._XLAC._xla_set_mat_mul_precision("default")
    assert backends.get_mat_mul_precision() == "default"
    with caplog.at_level(logging.WARNING, logger="torch_xla.backends"):
        for level in ("high", "highest", "default", "high"):
            backends.set_mat_mul_precision(level)
            assert backends.get_mat_mul_precision() == level
            assert torch_xla._XLAC._xla_get_mat_mul_precision() == level
    warnings = [r for r in caplog.records if r.name == "torch_xla.backends"]
    assert len(warnings) == 4  # one on every set
    assert warnings[0].getMessage() == (
        "Setting mat mul precision multiple times is not recommended. If you need to do so, "
        "please empirically verify that the precision setting is behaving as expected."
    )
    assert warnings[0].getMessage() == backends._WARNING_MESSAGE  # a name upstream's tests read
    for bad in ("bogus", "HIGH", None):
        with pytest.raises(ValueError) as info:
            backends.set_mat_mul_precision(bad)
        assert (
            str(info.value) == f"Invalid precision: {bad}. Must be one of default, high, highest."
        )
    assert backends.get_mat_mul_precision() == "high"
    # The binding under it is XLA's StringToPrecision: any case, no other names.
    torch_xla._XLAC._xla_set_mat_mul_precision("HIGHEST")
    assert backends.get_mat_mul_precision() == "highest"
    for bad in ("bogus", "packed_nibble", "", " high"):
        with pytest.raises(RuntimeError) as info:
            torch_xla._XLAC._xla_set_mat_mul_precision(bad)
        assert str(info.value) == "Unknown precision"
    with pytest.raises(TypeError) as info:
        torch_xla._XLAC._xla_set_mat_mul_precision(3)
    assert str(info.value) == (
        "_xla_set_mat_mul_precision(): incompatible function arguments. The following argument "
        "types are supported:\n    1. (arg0: str) -> None\n\nInvoked with: 3"
    )
    assert backends.get_mat_mul_precision() == "highest"


@pytest.mark.parametrize("level", ["default", "high", "highest"])
def test_float32_matmul_computes_at_the_precision(xla_target, level):
    import torch_xla
    import torch_xla.backends as backends

    torch_xla._XLAC._xla_set_mat_mul_precision(level)
    assert backends.get_mat_mul_precision() == level
    dev = torch_xla.device()
    a, b = _normals(64, 256, seed=1), _normals(256, 64, seed=2)
    got = (a.to(dev) @ b.to(dev)).cpu().double()
    scale = a.double().abs() @ b.double().abs()  # the sum of |products| of each output
    if not _is_tpu_numerics(xla_target):
        # float32 at every level (XLA:CPU sums in its own order: not bit-equal to torch's).
        assert ((got - a.double() @ b.double()).abs() <= 256 * _U * scale).all()
        return
    expected = _definition(a, b, level)
    # The device sums the kept products in float32: within 256 roundings of each output's scale.
    assert ((got - expected).abs() <= 256 * _U * scale).all()
    exact_error = (got - a.double() @ b.double()).abs().max().item()
    if level == "default":
        # The TPU's default is about 4000x further from the exact product than float32 is.
        assert exact_error > 1e-2
    else:
        assert exact_error < 1e-3


# Each aten matmul op a program reaches, as (call, left operand, right operand, added term):
# the TPU computes the product at the precision and adds the term in float32 afterwards.
_OPS = {
    "bmm": (torch.bmm, (4, 16, 32), (4, 32, 8), None),
    "mv": (torch.mv, (16, 64), (64,), None),
    "dot": (torch.dot, (128,), (128,), None),
    "matmul 3d@2d": (torch.matmul, (4, 16, 32), (32, 8), None),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b), (16, 32), (32, 8), (16, 8)),
    "addmv": (lambda c, a, b: torch.addmv(c, a, b), (16, 64), (64,), (16,)),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b), (4, 16, 32), (4, 32, 8), (4, 16, 8)),
    "linear": (lambda c, a, b: torch.nn.functional.linear(a, b.T, c), (16, 32), (32, 8), (8,)),
}


@pytest.mark.parametrize("level", ["default", "high", "highest"])
@pytest.mark.parametrize("name", list(_OPS))
def test_every_matmul_op_computes_at_the_precision(xla_target, name, level):
    import torch_xla

    torch_xla._XLAC._xla_set_mat_mul_precision(level)
    dev = torch_xla.device()
    call, left, right, term = _OPS[name]
    a, b = _normals(*left, seed=11), _normals(*right, seed=12)
    args = (a, b) if term is None else (_normals(*term, seed=13), a, b)
    got = call(*(t.to(dev) for t in args)).cpu().double()
    added = 0.0 if term is None else args[0].double()
    exact = torch.matmul(a.double(), b.double()) + added
    scale = torch.matmul(a.double().abs(), b.double().abs()) + abs(added)
    if not _is_tpu_numerics(xla_target):
        assert ((got - exact).abs() <= 64 * _U * scale).all()
        return
    expected = _definition(a, b, level) + added
    assert ((got - expected).abs() <= 64 * _U * scale).all()
    if level == "default":
        assert (got - exact).abs().max().item() > 1e-3


# Relative error bounds of one product at each level. With an operand exact in bfloat16 only
# the other's representation counts: one rounding (default, 2^-8), what a cut part and a
# rounded one leave (high, 2^-16), float32's own roundoff (highest). With two random operands,
# pytorch/xla's TPU test (test/test_mat_mul_precision.py) allows (1 + 2^-bits)^2 - 1 for 8, 14
# and 22 bits and requires a TPU to err by more than a quarter of that somewhere.
def _tpu_test_bound(bits: int) -> float:
    return (1 + 2.0**-bits) ** 2 - 1


_BOUNDS = {
    "default": (2.0**-8, _tpu_test_bound(8)),
    "high": (2.0**-16, _tpu_test_bound(14)),
    "highest": (2.0**-23, _tpu_test_bound(22)),
}


@pytest.mark.parametrize("level", ["default", "high", "highest"])
def test_error_bounds_of_each_level(xla_target, level):
    """Outer products (one product per output) show each level's relative error."""
    import torch_xla

    torch_xla._XLAC._xla_set_mat_mul_precision(level)
    dev = torch_xla.device()
    a = _normals(256, 1, seed=3)
    # Small integers are exact in bfloat16: these products carry only a's representation error.
    exact_operand = torch.randint(1, 9, (1, 256), generator=torch.Generator().manual_seed(4))
    for b, bound in zip(
        (exact_operand.float(), _normals(1, 256, seed=4)),
        _BOUNDS[level],
        strict=True,
    ):
        got = (a.to(dev) @ b.to(dev)).cpu().double()
        exact = a.double() @ b.double()
        relative = ((got - exact).abs() / exact.abs()).max().item()
        if not _is_tpu_numerics(xla_target):
            assert relative <= _U
        elif level == "highest":
            assert relative <= bound
        else:
            assert bound / 4 <= relative <= bound


@pytest.mark.parametrize(("level", "bits"), [("default", 8), ("high", 14), ("highest", 22)])
def test_near_identity_products_err_as_pytorch_xla_requires_of_a_tpu(xla_target, level, bits):
    """pytorch/xla's TPU precision test: diagonal matrices with entries near 1 (one product per
    output), float64 reference; a TPU stays within the bound for the level's bits and exceeds a
    quarter of it somewhere. A cut leading part (as XLA splits operands) is what makes 'high'
    err that much; rounding every part would stay under the quarter."""
    import torch_xla

    torch_xla._XLAC._xla_set_mat_mul_precision(level)
    dev = torch_xla.device()
    g = torch.Generator().manual_seed(5)
    x, y = (
        torch.diag(0.99 + 0.02 * torch.rand(1024, generator=g, dtype=torch.float64)) for _ in "xy"
    )
    got = (x.float().to(dev) @ y.float().to(dev)).cpu().double()
    error = (got - x @ y).abs().max().item()
    if not _is_tpu_numerics(xla_target):
        # float32 at every level, within a few ulps of 1 (real torch_xla 2.9 CPU: 1.5e-7).
        assert error <= 4 * 2.0**-23
        return
    assert _tpu_test_bound(bits) / 4 < error <= _tpu_test_bound(bits)


@pytest.mark.parametrize("level", ["high", "highest"])
def test_an_infinite_operand_gives_an_infinite_product(xla_target, level):
    """Its smaller parts are zero, and 0 * inf is nan: XLA sums the smaller parts' products
    first and lets a nan there give way to the leading product (dot_algorithm_rewriter's
    ReplaceNaNWithZeros), so 1 * inf stays inf, as in float32."""
    import torch_xla

    torch_xla._XLAC._xla_set_mat_mul_precision(level)
    dev = torch_xla.device()
    a = torch.tensor([[1.0, 2.0]])
    b = torch.tensor([[float("inf"), 1.0], [0.5, 3.0]])
    got = (a.to(dev) @ b.to(dev)).cpu()
    assert torch.equal(got, torch.tensor([[float("inf"), 7.0]]))
    conv = torch.nn.functional.conv1d(
        torch.tensor([[[1.0, 2.0]]]).to(dev), torch.tensor([[[float("inf"), 1.0]]]).to(dev)
    ).cpu()
    assert torch.equal(conv, torch.tensor([[[float("inf")]]]))


def test_bfloat16_matmul_sums_in_float32_and_rounds_once(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a = _normals(32, 512, seed=5).to(torch.bfloat16)
    b = _normals(512, 32, seed=6).to(torch.bfloat16)
    got = (a.to(dev) @ b.to(dev)).cpu()
    assert got.dtype == torch.bfloat16
    expected = (a.double() @ b.double()).float().to(torch.bfloat16)
    # Float32 sums of exact products, rounded once: at most one bfloat16 ulp from the exact
    # sum's rounding (a bfloat16 accumulator would drift by many).
    ulp = expected.float().abs() * 2.0**-7
    assert ((got.float() - expected.float()).abs() <= ulp + 1e-6).all()


def test_gradients_and_convolutions_follow_the_precision(xla_target):
    import torch_xla

    torch_xla._XLAC._xla_set_mat_mul_precision("default")
    dev = torch_xla.device()
    x = _normals(8, 64, seed=7)
    w = _normals(64, 16, seed=8)
    xd = x.to(dev).requires_grad_()
    (xd @ w.to(dev)).sum().backward()
    got = xd.grad.cpu().double()
    # d/dx sum(x @ w) = ones @ w.T: the gradient of ones (exact in bfloat16) times w's rounding.
    on_tpu = w.double().sum(1) if not _is_tpu_numerics(xla_target) else _bf16(w).double().sum(1)
    torch.testing.assert_close(got, on_tpu.expand(8, 64), rtol=0, atol=64 * _U * 64)
    assert (got - w.double().sum(1)).abs().max().item() > (
        1e-3 if _is_tpu_numerics(xla_target) else -1
    )

    image, kernel = _normals(2, 3, 10, 10, seed=9), _normals(4, 3, 3, 3, seed=10)
    conv = torch.nn.functional.conv2d(image.to(dev), kernel.to(dev)).cpu().double()
    rounded = (_bf16(image), _bf16(kernel)) if _is_tpu_numerics(xla_target) else (image, kernel)
    expected = torch.nn.functional.conv2d(rounded[0].double(), rounded[1].double())
    torch.testing.assert_close(conv, expected, rtol=0, atol=27 * _U * 30)


def test_einsum_linear_computes_as_linear_does(xla_target):
    """XLAPatchedLinear (the einsum-backed linear of SPMD code) lowers to the same dots as
    ``F.linear``: on any target both give the same values and gradients at the precision in
    force (pytorch/xla's spmd/test_xla_sharding.py compares them on a TPU at its default)."""
    import torch_xla
    from torch_xla.distributed.spmd.xla_sharding import XLAPatchedLinear

    torch_xla._XLAC._xla_set_mat_mul_precision("default")
    dev = torch_xla.device()
    x, w, b = _normals(8, 32, seed=14), _normals(16, 32, seed=15), _normals(16, seed=16)
    results = []
    for linear in (XLAPatchedLinear.apply, torch.nn.functional.linear):
        leaves = [t.to(dev).requires_grad_() for t in (x, w, b)]
        out = linear(*leaves)
        out.sum().backward()
        results.append([out.cpu(), *(t.grad.cpu() for t in leaves)])
    for patched, plain in zip(*results, strict=True):
        torch.testing.assert_close(patched, plain, rtol=1e-6, atol=1e-6)
    exact = x.double() @ w.double().T + b.double()
    error = (results[0][0].double() - exact).abs().max().item()
    assert error > 1e-3 if _is_tpu_numerics(xla_target) else error < 1e-4
