"""The simulator's small C++ extension: built once, then loaded without the build tools."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import torch, xlasim
    with xlasim.simulate("2x2"):
        import torch_xla
        print((torch.ones(2).to("xla") * 3).sum().item())
    """
)


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600
    )


def test_a_built_extension_loads_without_ninja_or_a_compiler_on_path():
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    first = _run(env)  # builds it if this machine has not yet
    assert first.returncode == 0, first.stderr[-3000:]
    # with no build tool reachable, a rebuild would fail: the finished build must just load
    second = _run(dict(env, PATH=os.devnull))
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.strip() == "6.0"
    # and a warm start says nothing on stderr (a CUDA build of torch without a GPU would log
    # "No CUDA runtime is found" on importing its extension builder)
    assert second.stderr == ""
