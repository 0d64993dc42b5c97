"""Buffers user code marks for donation (``_set_buffer_donation``, ``_get_buffer_donation``,
``_is_placecholder``), as real torch_xla 2.9 behaves on CPU (measured there): the mark belongs
to device data, a graph donates the marked buffers it reads at a step barrier or while the
buffer-donor config is on, and a donated buffer is gone."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")


def _alias_count(met):
    data = met.metric_data("InputOutputAliasCount")
    return None if data is None else data[1]


def test_mark_belongs_to_device_data(xla_target):
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    met.clear_all()
    device = torch_xla.device()
    t0 = torch.ones(4, 2).to(device)
    pending = t0 + 1
    # A pending op's result takes no mark; data does (counted).
    assert torch_xla._XLAC._set_buffer_donation(pending, True) is False
    assert torch_xla._XLAC._get_buffer_donation(pending) is False
    assert torch_xla._XLAC._set_buffer_donation(t0, True) is True
    assert torch_xla._XLAC._get_buffer_donation(t0) is True
    assert met.counter_value("XlaSetBufferDonation") == 1
    # A sync with nothing to run keeps it.
    del pending
    torch_xla.sync()
    assert torch_xla._XLAC._get_buffer_donation(t0) is True
    assert torch_xla._XLAC._set_buffer_donation(t0, False) is True
    assert torch_xla._XLAC._get_buffer_donation(t0) is False


def test_step_barrier_donates_marked_and_updated_buffers(xla_target):
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    met.clear_all()
    device = torch_xla.device()
    t0 = torch.ones(4, 2, 2).to(device)
    t1 = torch.ones(4, 2, 2).to(device)
    torch_xla._XLAC._set_buffer_donation(t0, True)
    t2 = t0 + t1
    t1 += 2
    torch_xla.sync(wait=True)
    # t1's buffer (updated in place) and t0's (marked): two aliases; t0's buffer is gone but
    # keeps its mark.
    assert _alias_count(met) == 2.0
    assert torch_xla._XLAC._is_placecholder(t0) is True
    assert torch_xla._XLAC._is_placecholder(t1) is False
    assert torch_xla._XLAC._get_buffer_donation(t0) is True
    assert t2.cpu().tolist() == torch.full((4, 2, 2), 2.0).tolist()
    deleted = r"^Check failed: !buffer->IsDeleted\(\): buffer with shape f32\[4,2,2\] on device "
    with pytest.raises(RuntimeError, match=deleted):
        (t0 + 1).cpu()


def test_marked_and_updated_buffer_counts_once(xla_target):
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    met.clear_all()
    t0 = torch.ones(3, 5).to(torch_xla.device())
    torch_xla._XLAC._set_buffer_donation(t0, True)
    t0 *= 3
    # Updated in place, the tensor holds a pending op: no mark until its new data, unmarked.
    assert torch_xla._XLAC._get_buffer_donation(t0) is False
    torch_xla.sync(wait=True)
    assert _alias_count(met) == 1.0
    assert torch_xla._XLAC._is_placecholder(t0) is False
    assert torch_xla._XLAC._get_buffer_donation(t0) is False
    assert t0.cpu().tolist() == torch.full((3, 5), 3.0).tolist()


@pytest.mark.parametrize("config", [True, False])
def test_sync_without_barrier_donates_only_with_config(xla_target, config):
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch_xla.utils.buffer_donor_context import alias_with_buffer_donor_config

    with alias_with_buffer_donor_config(config):
        met.clear_all()
        device = torch_xla.device()
        t0 = torch.ones(6).to(device)
        torch_xla._XLAC._set_buffer_donation(t0, True)
        t1 = t0 * 2
        torch_xla._XLAC._xla_sync_multi([t0, t1], [str(device)], True, False)
        assert _alias_count(met) == (1.0 if config else 0.0)
        assert torch_xla._XLAC._is_placecholder(t0) is config
