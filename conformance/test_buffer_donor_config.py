"""torch_xla's switch for aliasing user-marked donor buffers
(``_xla_set/_get_enable_alias_with_buffer_donor_config``, ``alias_with_buffer_donor_config``),
as real torch_xla 2.9 behaves on CPU: one process-wide setting, off at start, whatever device
string names an xla device of the process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")


def test_setting_and_reading(xla_target):
    import torch_xla

    get = torch_xla._XLAC._xla_get_enable_alias_with_buffer_donor_config
    put = torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config
    assert get() is False
    assert put(True) is None
    assert get() is True and get("xla:0") is True and get("xla") is True
    put()  # the default is False
    assert get() is False
    put(enable_user_config_alias=True, device="xla:0")
    assert get() is True
    # pybind11's bool: None and numbers convert.
    put(None)
    assert get() is False
    put(2)
    assert get() is True
    put(False)


def test_bad_arguments(xla_target):
    import torch_xla

    get = torch_xla._XLAC._xla_get_enable_alias_with_buffer_donor_config
    put = torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config
    with pytest.raises(TypeError, match=r"incompatible function arguments") as raised:
        put("yes")
    assert "(enable_user_config_alias: bool = False, device: str = '') -> None" in str(raised.value)
    with pytest.raises(RuntimeError, match=r"^Check failed: device.type\(\) == at::kXLA \(cpu "):
        get("cpu")
    with pytest.raises(RuntimeError, match=r"device type at start of device string: CPU"):
        get("CPU")
    with pytest.raises(IndexError, match=r"^vector::_M_range_check: __n \(which is 1\) >= "):
        get("xla:1")
    assert get() is False


def test_context_manager(xla_target):
    import torch_xla
    from torch_xla.utils.buffer_donor_context import alias_with_buffer_donor_config

    get = torch_xla._XLAC._xla_get_enable_alias_with_buffer_donor_config
    with alias_with_buffer_donor_config() as saved:
        assert (saved, get()) == (False, True)
        with alias_with_buffer_donor_config(should_alias=False) as inner:
            assert (inner, get()) == (True, False)
        assert get() is True
    assert get() is False
