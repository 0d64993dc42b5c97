"""torch_xla's device RNG seed as ``xm.get_rng_state()`` and ``_get_base_seed_as_tensor`` read
it: every value below was measured on real torch_xla 2.9 on CPU (``PJRT_DEVICE=CPU``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(params=[False, True], ids=["lazy", "eager"])
def eager(request, xlasim_sim):
    import torch_xla

    torch_xla.experimental.eager_mode(request.param)
    yield request.param
    torch_xla.experimental.eager_mode(False)


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_running_seed_moves_on_per_random_op_and_per_step(eager):
    import torch_xla
    import torch_xla.core.xla_model as xm

    d = torch_xla.device()
    xm.set_rng_state(1234)
    torch_xla.sync()
    assert xm.get_rng_state() == 8653897773  # a step barrier moves it on, random op or not
    xm.set_rng_state(1234)
    torch.nn.functional.dropout(torch.ones(4, device=d), 0.5)
    assert xm.get_rng_state() == 266623053
    torch.rand(2, device=d)
    assert xm.get_rng_state() == 57060801972700
    torch_xla.sync()
    torch.rand(2, device=d)
    # Lazy: the step restarts from the base seed last set; eager: from the running seed.
    assert xm.get_rng_state() == (1193525398592158490 if eager else 1852046626624060)


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_setting_a_seed_read_before_a_draw_repeats_it(eager):
    import torch_xla
    import torch_xla.core.xla_model as xm

    d = torch_xla.device()
    xm.set_rng_state(1234)
    torch.rand(2, device=d)
    seed = xm.get_rng_state()
    first = torch.rand(2, device=d).cpu()
    xm.set_rng_state(seed)
    assert torch.equal(torch.rand(2, device=d).cpu(), first)
    assert xm.get_rng_state() == 57060801972700


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_base_seed_moves_on_per_step_only_in_lazy_mode(xlasim_sim):
    import torch_xla
    import torch_xla.core.xla_model as xm

    d = torch_xla.device()
    xm.set_rng_state(1234)
    torch.rand(2, device=d)
    assert xm.get_rng_state() == 266623053
    assert torch_xla._XLAC._get_base_seed_as_tensor(str(d)).item() == 1234
    torch_xla.sync()
    torch.rand(2, device=d)
    assert xm.get_rng_state() == 1852046626624060
    assert torch_xla._XLAC._get_base_seed_as_tensor(str(d)).item() == 8653897773
