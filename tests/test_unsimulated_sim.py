"""A torch_xla attribute or module the simulator does not have raises NotImplementedError
naming it, as every unsimulated behaviour does, while staying the AttributeError /
ModuleNotFoundError Python code tests for (``hasattr``, import fallbacks)."""

from __future__ import annotations

import importlib

import pytest

import xlasim


def test_missing_xlac_attribute_and_module_name_what_is_not_simulated():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        xlac = torch_xla._XLAC
        assert not hasattr(xlac, "_no_such_binding")
        with pytest.raises(NotImplementedError, match=r"does not simulate torch_xla\._XLAC\._no"):
            xlac._no_such_binding  # noqa: B018 - the lookup is the test
        with pytest.raises(AttributeError):
            xlac._no_such_binding  # noqa: B018
        with pytest.raises(NotImplementedError, match="xlasim does not simulate this part"):
            importlib.import_module("torch_xla.utils.keyd_queue")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("torch_xla.utils.keyd_queue")
        # the from-import form says the same, not just "cannot import name"
        with pytest.raises(NotImplementedError, match="'torch_xla.experimental.plugins'"):
            exec("from torch_xla.experimental import plugins")
