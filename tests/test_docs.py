"""The documentation cannot drift: every Python example runs, every name it gives exists.

Each fenced ``python`` block of README.md and docs/*.md runs in a fresh interpreter (this
one's), as a reader would paste it (see tests/docs_examples.py for the marks that say how).
Blocks that need a TPU Ray cluster run in tests/test_backend_ray_single_host.py, on the
simulated cluster that module keeps up; everything here and there runs in the sim tox env.
Blocks that are deliberately not programs use another fence (``bash``, ``text``).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch
from docs_examples import DOCS, ROOT, Example, env_for, python_examples, run

EXAMPLES = python_examples()
# TorchTPU runs on torch 2.11 and newer, as the real package installs; on an older torch its
# refusal is what tests/test_torch_tpu_torch_version.py checks.
_NEEDS_TORCH_2_11 = {"docs/torch-tpu.md"}
# The slice of the cluster tests/test_backend_ray_single_host.py runs ray-cluster examples on.
CLUSTER_SLICE = ("2x4", "v6e")


def _command(example: Example, tmp_path: Path) -> list[str]:
    if example.mode == ("script",):
        return [sys.executable, "-c", example.code]
    if example.mode == ("pytest",):
        (tmp_path / "test_docs_example.py").write_text(example.code)
        # Only the xlasim plugin (see test_python_example_runs): other installed plugins
        # would only slow the run down.
        args = ["-q", "-p", "no:cacheprovider", "-p", "xlasim.pytest_plugin"]
        return [sys.executable, "-m", "pytest", *args, "--xla-targets", "sim"]
    if example.mode[0] == "xlasim-run":
        # The block is the program a reader saves and starts under `xlasim run` with the
        # mark's options (`python -m xlasim` is the `xlasim` command of this interpreter).
        (tmp_path / "train.py").write_text(example.code)
        xlasim = [sys.executable, "-m", "xlasim", "run", *example.mode[1:]]
        return [*xlasim, "--", sys.executable, str(tmp_path / "train.py")]
    raise ValueError(f"{example.name}: unknown docs-test mode {example.mode!r}")


def _text_before(example: Example) -> str:
    """The paragraph that introduces ``example``'s block (above its docs-test mark)."""
    above = "\n".join(example.path.read_text().splitlines()[: example.line - 1]).rstrip()
    above = re.sub(r"\n<!--\s*docs-test:[^\n]*-->$", "", above).rstrip()
    return above.rsplit("\n\n", 1)[-1]


@pytest.mark.parametrize(
    "example", [e for e in EXAMPLES if e.mode[0] != "ray-cluster"], ids=lambda e: e.name
)
def test_python_example_runs(example: Example, tmp_path: Path) -> None:
    page = example.name.rsplit(":", 1)[0]
    if page in _NEEDS_TORCH_2_11 and torch.__version__ < "2.11":
        pytest.skip(f"{page} needs torch >= 2.11 (as TorchTPU does), this is {torch.__version__}")
    env = env_for(tmp_path)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    result = run(_command(example, tmp_path), tmp_path, env)
    assert result.returncode == 0, f"{example.name} failed:\n{result.stdout}"
    if example.mode[0] == "xlasim-run":
        # The paragraph above such a block says what host 0 prints: it must be what it prints.
        claim = re.findall(r"prints `([^`]+)`", _text_before(example))
        assert claim, f"{example.name}: the text above does not say what the program prints"
        assert claim[-1] in result.stdout, result.stdout
    if example.mode == ("pytest",):
        assert re.search(r"\b[1-9]\d* passed\b", result.stdout), result.stdout
        assert not re.search(r"\b(failed|errors?|skipped)\b", result.stdout), result.stdout


def test_examples_are_found() -> None:
    # Guards the extraction itself: a changed fence syntax must not silently test nothing.
    assert {"README.md", "backend.md", "seamless.md", "testing.md"} <= {
        e.path.name for e in EXAMPLES
    }
    assert {e.mode[0] for e in EXAMPLES} == {"script", "pytest", "xlasim-run", "ray-cluster"}
    # Cluster examples run only where a cluster of this slice is up.
    assert {e.mode[1:] for e in EXAMPLES if e.mode[0] == "ray-cluster"} == {CLUSTER_SLICE}


# -- names ---------------------------------------------------------------------------------------
_NAME = re.compile(r"`((?:xlasim|tpu_backend)(?:\.[A-Za-z_]\w*)+)")


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module of the repository or an attribute of one."""
    parts = name.split(".")
    if parts[:2] == ["xlasim", "torch_xla"] or parts[-1] == "pth":
        # Files: the simulated surface is imported only as `torch_xla` inside a simulation.
        path = ROOT / "/".join(parts)
        return path.exists() or path.with_suffix(".py").exists() or (ROOT / name).exists()
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module.startswith(exc.name):
                # The module is there but needs an optional extra this environment lacks (jax
                # for the TPU-compiler layer): its file is what can be checked.
                return (ROOT / "/".join(parts[:cut])).with_suffix(".py").exists()
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_named_module_and_function_exists() -> None:
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: {name}"
            for path in DOCS
            for name in _NAME.findall(path.read_text())
            if not _resolves(name)
        }
    )
    assert not missing, "the docs name things that do not exist:\n" + "\n".join(missing)
