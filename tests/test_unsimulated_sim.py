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
            importlib.import_module("torch_xla.utils.checkpoint")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("torch_xla.utils.checkpoint")
        # the from-import form says the same, not just "cannot import name"
        with pytest.raises(NotImplementedError, match="'torch_xla.experimental.plugins'"):
            exec("from torch_xla.experimental import plugins")


def test_jax_import_guard_says_jax_on_the_tpu_is_not_simulated():
    # torch_xla 2.9's custom_kernel.jax_import_guard (its source: it initializes the runtime
    # before JAX is imported) comes right before JAX code runs on the TPU
    with xlasim.simulate("2x2x1", "v4"):
        from torch_xla.experimental.custom_kernel import jax_import_guard

        with pytest.raises(NotImplementedError, match=r"does not simulate JAX on the simulated"):
            jax_import_guard()
