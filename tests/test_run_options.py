"""How a simulation is asked for the real TPU compiler and for a dry run, and the errors a bad
value gets: from ``simulate(...)``, the environment and ``xlasim run`` (the pytest option's
error is in test_pytest_plugin).

These run in every environment: where the ``tpu-compiler`` extra is absent, asking for libtpu
is the missing-extra error; where it is installed, the same request is accepted.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from extras import tpu_compiler_missing

import xlasim
from xlasim.cli.commands import main
from xlasim.runtime.settings import resolve_compiler, resolve_dry_run


@pytest.mark.parametrize("value", ["none", "", "None", " NONE "])
def test_none_or_empty_turns_the_compiler_off(value):
    assert resolve_compiler(value, environ={}) is None
    assert resolve_compiler(None, environ={"XLASIM_COMPILER": value}) is None
    assert resolve_compiler(None, environ={}) is None


def test_an_unknown_compiler_names_itself_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"^unknown compiler 'gcc'; valid: libtpu, none$"):
        resolve_compiler("gcc", environ={})
    # From the environment, the message says where the value came from.
    with pytest.raises(
        ValueError, match=r"^unknown compiler 'xla' \(from XLASIM_COMPILER\); valid: libtpu, none$"
    ):
        resolve_compiler(None, environ={"XLASIM_COMPILER": "xla"})
    with pytest.raises(TypeError, match="compiler must be a str or None, got int 1"):
        resolve_compiler(1, environ={})  # type: ignore[arg-type]


def test_libtpu_needs_the_extra():
    missing = tpu_compiler_missing()
    if missing is None:
        assert resolve_compiler("LibTPU", environ={}) == "libtpu"
        return
    with pytest.raises(ModuleNotFoundError) as caught:
        resolve_compiler("libtpu", environ={})
    message = str(caught.value)
    assert "needs the tpu-compiler extra" in message
    assert "pip install 'xlasim[tpu-compiler]'" in message
    assert "\n" not in message


def test_simulate_rejects_a_bad_compiler_before_activating(monkeypatch):
    monkeypatch.delenv("XLASIM_COMPILER", raising=False)
    with pytest.raises(ValueError, match="unknown compiler 'tpu'"):
        xlasim.simulate(topology="2x2", compiler="tpu")
    monkeypatch.setenv("XLASIM_COMPILER", "tpu")
    with pytest.raises(ValueError, match=r"'tpu' \(from XLASIM_COMPILER\)"):
        xlasim.simulate(topology="2x2")
    assert not xlasim.is_active()
    # An explicit argument wins over the environment.
    with xlasim.simulate(topology="2x2", compiler="none") as runtime:
        assert runtime.graphs.compiler is None


def test_dry_run_flag_values():
    assert resolve_dry_run(True, environ={}) is True
    assert resolve_dry_run(None, environ={"XLASIM_DRY_RUN": "Yes"}) is True
    assert resolve_dry_run(None, environ={"XLASIM_DRY_RUN": "0"}) is False
    assert resolve_dry_run(None, environ={}) is False
    with pytest.raises(ValueError, match=r"XLASIM_DRY_RUN='maybe' is not a valid flag"):
        resolve_dry_run(None, environ={"XLASIM_DRY_RUN": "maybe"})
    with pytest.raises(TypeError, match="dry_run must be a bool or None, got str 'yes'"):
        resolve_dry_run("yes", environ={})  # type: ignore[arg-type]


def test_compiled_graphs_without_a_compiler_says_how_to_attach_one():
    attach = r"no TPU compiler is attached.*compiler='libtpu'"
    with xlasim.simulate(compiler="none"), pytest.raises(RuntimeError, match=attach):
        xlasim.compiled_graphs()


def test_cli_bad_compiler_is_one_line_and_exit_2(capsys):
    assert main(["run", "--topology", "2x2", "--compiler", "gcc", "--", sys.executable]) == 2
    err = capsys.readouterr().err
    assert err == "xlasim run: unknown compiler 'gcc'; valid: libtpu, none\n"


def test_cli_libtpu_without_the_extra_is_one_line(capsys):
    if tpu_compiler_missing() is None:
        pytest.skip("the tpu-compiler extra is installed: the request is valid here")
    assert main(["run", "--topology", "2x2", "--compiler", "libtpu", "--", sys.executable]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xlasim run: compiler 'libtpu' needs the tpu-compiler extra")
    assert err.count("\n") == 1


def test_dry_run_trains_a_model_larger_than_this_machine_and_refuses_values():
    # 10^10 float32 parameters are 40 GB: only shapes exist in a dry run.
    with xlasim.simulate(topology="2x2", accelerator="v5e", dry_run=True) as runtime:
        import torch_xla

        dev = torch_xla.device()
        layer = torch.nn.Linear(100_000, 100_000, bias=False).to(dev)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer(torch.randn(8, 100_000).to(dev)).square().mean().backward()
        opt.step()
        torch_xla.sync()
        assert layer.weight.shape == (100_000, 100_000)
        assert layer.weight.grad.shape == (100_000, 100_000)
        assert (runtime.metrics.counter_value("UncachedCompile") or 0) >= 1
        with pytest.raises(RuntimeError, match=r"xlasim dry run: reading a device tensor's value"):
            layer.weight.sum().item()
        with pytest.raises(RuntimeError, match=r"xlasim dry run: copying a device tensor to cpu"):
            layer.weight.cpu()
    # Factories make real tensors again once the dry run is over.
    assert torch.ones(2).device.type == "cpu"


def test_a_dry_run_program_exits_cleanly_after_backward(tmp_path):
    # The dry run stays active until the interpreter exits; the simulator's own work at exit
    # (releasing autograd's device threads on a scratch runtime) must get real CPU tensors.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    # Entered and never left, as `xlasim run --dry-run` activates it in the program.
    code = (
        "import torch, xlasim\n"
        "xlasim.simulate(topology='2x2', dry_run=True).__enter__()\n"
        "import torch_xla\n"
        "dev = torch_xla.device()\n"
        "layer = torch.nn.Linear(64, 64).to(dev)\n"
        "layer(torch.randn(4, 64).to(dev)).sum().backward()\n"
        "torch_xla.sync()\n"
        "print(torch.ones(1).device)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "meta"  # the dry run is still on
    assert result.stderr == ""


def test_xlasim_run_dry_runs_a_llama_step_built_on_cpu_larger_than_this_machine():
    # bench/dry_run_8b.py is plain torch_xla code: the model is built on the CPU in float32 and
    # moved with .to(device). With a 8M-token vocabulary it has 8.2B parameters, 33 GB of
    # float32 before the cast: more than this machine's RAM, so only shapes may exist.
    root = Path(__file__).resolve().parents[1]
    dim, hidden, vocab, layers, kv = 512, 1024, 8_000_000, 2, 128
    per_layer = 2 * dim * dim + 2 * kv * dim + 3 * dim * hidden + 2 * dim
    expected = 2 * vocab * dim + layers * per_layer + dim
    assert expected * 4 > 32 * 10**9
    model = ["--layers", str(layers), "--dim", str(dim), "--hidden", str(hidden)]
    model += ["--heads", "4", "--kv-heads", "1", "--vocab", str(vocab), "--seq", "32"]
    command = [sys.executable, "-m", "xlasim", "run", "--topology", "2x2x2", "--accelerator"]
    command += ["v5p", "--single-process", "--dry-run", "--", sys.executable]
    command += [str(root / "bench" / "dry_run_8b.py"), *model]
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{expected:,} parameters, 2 layers"), lines
    assert lines[0].endswith("8 devices, batch 8 x 32 tokens"), lines
    assert [line.split(":")[0] for line in lines[1:]] == ["step 0", "step 1"]
    # The largest child of this process (Linux: kilobytes) held nowhere near the values.
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 4 * 2**20
