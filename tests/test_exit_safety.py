"""A simulated program exits cleanly right after a backward pass on ``xla`` tensors.

Backward passes on ``xla`` tensors run on PyTorch's autograd device thread, which drops its
reference to the finished graph task a moment after backward() has returned. If that is the last
reference and the task holds Python objects, the drop needs the GIL, and when the interpreter is
already shutting down CPython ends the thread inside a noexcept destructor: the process aborts
("terminate called without an active exception"). Normally this is a rare race; the
``exit_race_shim.cc`` preload library (built here with the system C++ compiler) makes the device
thread lose it on every run, so these tests fail on every run unless the simulator makes exit
safe.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

SHIM_SOURCE = Path(__file__).with_name("exit_race_shim.cc")
RELEASED_LATE = "exit-race shim: a device thread releases a finished graph task after backward()"

# The shim interposes CPython's GIL functions, which only works when they come from a shared
# libpython (a statically linked interpreter binds its own calls first).
pytestmark = pytest.mark.skipif(
    not sysconfig.get_config_var("Py_ENABLE_SHARED"),
    reason="this Python is linked statically; the preload shim cannot interpose its GIL calls",
)


@pytest.fixture(scope="module")
def race_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    assert compiler, "a C++ compiler (g++) is needed; the simulator itself needs one too"
    out = tmp_path_factory.mktemp("shim") / "exit_race_shim.so"
    build = subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-o", str(out), str(SHIM_SOURCE), "-ldl", "-pthread"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    return out


def _run(shim: Path, program: str, extra_env: dict[str, str] | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    env["LD_PRELOAD"] = str(shim)
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# Saved-tensor hooks are Python objects every torch version stores with the graph task, so the
# task needs the GIL to be released on torch 2.9 as well as on newer versions.
BACKWARD = """
    import torch
    import torch_xla

    w = torch.ones(3, device=torch_xla.device(), requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        (w * w).sum().backward()
    print(w.grad.cpu().tolist())
"""


def _assert_clean_exit(out: subprocess.CompletedProcess[str]) -> None:
    assert "terminate called" not in out.stderr, out.stderr
    assert "gave up" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr


def test_exit_right_after_activation(race_shim):
    # Entering a simulation runs a backward pass of its own (the autograd-engine check).
    out = _run(race_shim, 'import xlasim\nwith xlasim.simulate("2x2"):\n    import torch_xla\n')
    _assert_clean_exit(out)


def test_exit_right_after_a_backward_pass(race_shim):
    program = "import xlasim\nwith xlasim.simulate('2x2'):\n" + textwrap.indent(
        textwrap.dedent(BACKWARD), "    "
    )
    out = _run(race_shim, program)
    _assert_clean_exit(out)
    assert out.stdout.strip() == "[2.0, 2.0, 2.0]"
    assert RELEASED_LATE in out.stderr, "the shim did not set up the race: " + out.stderr


@pytest.mark.skipif(
    not os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "xlasim.pth")),
    reason="xlasim is not installed in this environment (no xlasim.pth in site-packages)",
)
def test_exit_after_a_backward_pass_under_env_activation(race_shim):
    # What `xlasim run` does: the simulation starts at `import torch_xla` and is never left.
    out = _run(race_shim, BACKWARD, {"XLASIM_TOPOLOGY": "2x2"})
    _assert_clean_exit(out)
    assert out.stdout.strip() == "[2.0, 2.0, 2.0]"
    assert RELEASED_LATE in out.stderr, "the shim did not set up the race: " + out.stderr


@pytest.mark.skipif(
    not os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "xlasim.pth")),
    reason="xlasim is not installed in this environment (no xlasim.pth in site-packages)",
)
def test_exit_with_grad_mode_off(race_shim):
    # Inference programs (and upstream's assume_pure tests) turn grad mode off for good; the
    # exit-time backward pass that drains the device threads still runs.
    program = BACKWARD + "    torch.set_grad_enabled(False)\n"
    out = _run(race_shim, program, {"XLASIM_TOPOLOGY": "2x2"})
    _assert_clean_exit(out)
    assert "could not wait" not in out.stderr, out.stderr
