"""``torch_xla.experimental.custom_kernel`` where it runs without a TPU kernel: the plain
tensor helper ``repeat_with_fixed_output_size``, and ``flash_attention``'s checks that come
before its Pallas kernel (on PJRT CPU the kernel itself cannot run: importing JAX fails).

Every expected value here was read from real torch_xla 2.9 on PJRT CPU (4 devices).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_repeat_with_fixed_output_size(xla_target):
    from torch_xla.experimental.custom_kernel import repeat_with_fixed_output_size

    values = torch.arange(10, 20).to("xla")
    repeats = torch.tensor([0, 1, 2, 0, 4, 0, 6, 7, 8, 9]).to("xla")
    # Cut short: the first 20 of the 37 repeated values.
    cut = repeat_with_fixed_output_size(values, repeats, 20)
    expected = [11, 12, 12] + [14] * 4 + [16] * 6 + [17] * 7
    assert cut.cpu().tolist() == expected
    # Filled up with the last element when the repeats give fewer values.
    few = torch.tensor([2, 1, 0]).to("xla")
    filled = repeat_with_fixed_output_size(torch.tensor([5, 6, 7]).to("xla"), few, 6)
    assert filled.cpu().tolist() == [5, 5, 6, 7, 7, 7]
    with pytest.raises(AssertionError):
        repeat_with_fixed_output_size(values.reshape(2, 5), repeats, 4)


def test_flash_attention_bias_is_keyword_only(xla_target):
    from torch_xla.experimental.custom_kernel import flash_attention

    q = torch.zeros(1, 1, 8, 4).to("xla")
    with pytest.raises(TypeError, match="takes from 3 to 7 positional arguments but 8 were given"):
        flash_attention(q, q, q, False, None, None, 1.0, q)


def test_flash_attention_partition_spec_checks(xla_target):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.experimental.custom_kernel import flash_attention

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    q = torch.zeros(4, 2, 8, 16).to("xla")
    # No mesh passed and no global mesh: torch_xla reaches for the missing mesh's method.
    with pytest.raises(
        AttributeError, match="'NoneType' object has no attribute 'get_op_sharding'"
    ):
        flash_attention(q, q, q, partition_spec=("x", None, None, None))
    mesh = xs.Mesh(np.arange(4), (4, 1), ("x", "y"))
    expected = r"0th input has wrong shape: torch.Size\(\[4, 2, 8, 16\]\) for \('x', None, None\)"
    with pytest.raises(AssertionError, match=expected):
        flash_attention(q, q, q, partition_spec=("x", None, None), mesh=mesh)
