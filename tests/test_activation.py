"""simulate(): import redirection, nesting, fresh state, environment restored, env activation."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest
import torch

import xlasim


def test_import_resolves_to_simulator_and_is_restored():
    assert "torch_xla" not in sys.modules
    with xlasim.simulate("2x2"):
        import torch_xla

        assert torch_xla.__file__.startswith(os.path.dirname(xlasim.__file__))
        assert torch_xla.__version__ == "2.9.0"
        import torch_xla.runtime as xr

        assert xr.global_runtime_device_count() == 4
    assert not any(n == "torch_xla" or n.startswith("torch_xla.") for n in sys.modules)


def test_previous_torch_xla_modules_are_put_back(monkeypatch):
    import types

    sentinel = types.ModuleType("torch_xla")
    monkeypatch.setitem(sys.modules, "torch_xla", sentinel)
    with xlasim.simulate("2x2"):
        import torch_xla

        assert torch_xla is not sentinel
    assert sys.modules["torch_xla"] is sentinel


def test_nested_simulations_stack_and_unwind():
    with xlasim.simulate("2x2") as outer:
        import torch_xla.runtime as xr

        assert xr.global_runtime_device_count() == 4
        with xlasim.simulate("4x4") as inner:
            assert inner is not outer
            assert xr.global_runtime_device_count() == 16
            assert xr.process_count() == 4
        assert xr.global_runtime_device_count() == 4
        assert xlasim.current_runtime() is outer
    assert not xlasim.is_active()


def test_each_entry_gets_fresh_state():
    sim = xlasim.simulate("2x2")
    with sim:
        import torch_xla
        import torch_xla.debug.metrics as met

        t = torch.ones(2, device="xla").add_(1)  # kept alive: sync compiles live tensors only
        torch_xla.sync()
        del t
        assert met.counter_value("UncachedCompile") == 1
    with sim:
        import torch_xla.debug.metrics as met

        assert met.counter_value("UncachedCompile") is None


def test_decorator_form():
    @xlasim.simulate("2x2x1", accelerator="v4")
    def count() -> int:
        import torch_xla.runtime as xr

        return xr.global_runtime_device_count()

    assert count() == 4
    assert not xlasim.is_active()


def test_spmd_flag_does_not_leak_out_of_a_simulation():
    before = os.environ.get("XLA_USE_SPMD")
    with xlasim.simulate("2x2"):
        import torch_xla.runtime as xr

        xr.use_spmd()
        assert os.environ["XLA_USE_SPMD"] == "1"
    assert os.environ.get("XLA_USE_SPMD") == before


def test_using_a_tensor_after_the_simulation_ended_is_a_clear_error():
    with xlasim.simulate("2x2"):
        t = torch.ones(2, device="xla")
    with pytest.raises(RuntimeError, match="no simulated TPU slice is active"):
        t + 1


def test_bad_topology_is_rejected_before_activation():
    with pytest.raises(ValueError, match="'4x'"):
        xlasim.simulate("4x")
    with pytest.raises(ValueError, match="host_index 5 is out of range"):
        xlasim.simulate("4x4", host_index=5)
    assert not xlasim.is_active()


def test_unsimulated_submodule_is_a_clear_import_error():
    with xlasim.simulate("2x2"), pytest.raises(ModuleNotFoundError, match="does not simulate"):
        import torch_xla.experimental.nonexistent_module  # noqa: F401


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300
    )


pth_installed = pytest.mark.skipif(
    not os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "xlasim.pth")),
    reason="xlasim is not installed in this environment (no xlasim.pth in site-packages)",
)


@pth_installed
def test_environment_activation_in_a_child_process():
    code = (
        "import sys; assert 'torch' not in sys.modules, 'startup imported torch';"
        "import torch_xla.runtime as xr;"
        "print(xr.global_runtime_device_count(), xr.process_index(), xr.process_count())"
    )
    out = _run_python(code, XLASIM_TOPOLOGY="4x4", XLASIM_HOST_INDEX="2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["16", "2", "4"]


@pth_installed
def test_without_the_variable_nothing_is_activated():
    out = _run_python("import sys; import xlasim; print('torch_xla' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_an_empty_topology_turns_the_simulation_off_whatever_else_is_set():
    # A simulated Ray node sets XLASIM_ACCELERATOR and XLASIM_HOST_INDEX; a job that runs its
    # workers as plain hosts sets XLASIM_TOPOLOGY='' in its runtime_env.
    from xlasim._activation import config_from_env

    env = {"XLASIM_TOPOLOGY": "", "XLASIM_ACCELERATOR": "v6e", "XLASIM_HOST_INDEX": "0"}
    assert config_from_env(env) is None
