"""``torch._higher_order_ops.while_loop`` on XLA tensors once ``torch_xla.experimental.fori_loop``
is imported, and ``fori_loop``. Every expected value is real torch_xla 2.9's on PJRT CPU (read
with the same loops)."""

from __future__ import annotations

import pytest
import torch


def _while_loop(*args):
    import torch_xla.experimental.fori_loop  # noqa: F401 - registers the XLA rule
    from torch._higher_order_ops.while_loop import while_loop

    return while_loop(*args)


def test_a_counted_loop_returns_the_spent_counter_and_the_values(xlasim_sim):
    counter = torch.tensor(10, device="xla")
    value = torch.tensor(3, dtype=torch.int32, device="xla")
    out = _while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, x + 1), (counter, value))
    assert isinstance(out, tuple)
    assert [(t.device.type, t.dtype, t.item()) for t in out] == [
        ("xla", torch.int64, 0),
        ("xla", torch.int32, 13),
    ]


def test_the_body_may_use_a_modules_parameters(xlasim_sim):
    torch.manual_seed(0)
    linear = torch.nn.Linear(2, 2).to("xla")
    x = torch.randn(2, 2).to("xla")
    with torch.no_grad():
        out = _while_loop(
            lambda i, v: i > 0, lambda i, v: (i - 1, linear(v)), (torch.tensor(3).to("xla"), x)
        )
        expected = linear(linear(linear(x)))
    assert out[0].item() == 0
    # The simulated TPU's default matmul precision rounds operands to bfloat16, so the step
    # graphs and the unrolled graph round differently.
    torch.testing.assert_close(out[1].cpu(), expected.cpu(), rtol=2e-2, atol=2e-2)


def test_the_condition_may_read_any_carried_value_and_may_stop_at_once(xlasim_sim):
    ones = torch.ones(2).to("xla")
    out = _while_loop(
        lambda i, x: x.sum() < 10, lambda i, x: (i - 1, x + 1), (torch.tensor(3).to("xla"), ones)
    )
    assert out[0].item() == -1 and out[1].cpu().tolist() == [5.0, 5.0]
    out = _while_loop(
        lambda i, x: i > 0, lambda i, x: (i - 1, x + 1), (torch.tensor(0).to("xla"), ones)
    )
    assert out[0].item() == 0 and out[1].cpu().tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "carried",
    [
        lambda: (torch.tensor(3.0).to("xla"), torch.ones(2).to("xla")),  # a float counter
        lambda: (torch.ones(2).to("xla"), torch.tensor(3).to("xla")),  # the counter last
        lambda: (torch.tensor(3).to("xla"),),  # the counter alone
    ],
    ids=["float-counter", "counter-last", "counter-alone"],
)
def test_forms_torch_xla_cannot_lower_are_not_simulated(xlasim_sim, carried):
    # torch_xla 2.9 fails these in its While shape check (a RuntimeError naming the shapes).
    def cond(*values):
        return values[0].sum() > 0

    def body(*values):
        return tuple(v - 1 for v in values)

    with pytest.raises(NotImplementedError, match="integer scalar counter first"):
        _while_loop(cond, body, carried())


def test_fori_loop_counts_upper_minus_lower_steps(xlasim_sim):
    from torch_xla.experimental.fori_loop import fori_loop

    lower, upper = torch.tensor(0).to("xla"), torch.tensor(5).to("xla")
    out = fori_loop(lower, upper, lambda x: x + 1, torch.tensor(1, dtype=torch.int32).to("xla"))
    assert isinstance(out, list)
    assert [t.item() for t in out] == [0, 6]
