"""The built wheel carries what an install needs: packages, py.typed, entry points and xlasim.pth.

xlasim.pth is how environment activation reaches every Python process of an environment (Ray
workers, spawned children): site.py runs its single `import` line at interpreter start-up. These
tests check the line from the *built wheel* in a scratch environment, and the line that the current
environment's install (wheel under tox, or editable) put into site-packages.
"""

from __future__ import annotations

import configparser
import email.parser
import importlib.util
import json
import os
import site
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300
CHILD_TIMEOUT_S = 120
# A child that starts the simulator may be the first process of the env to JIT-build its C++
# extension (about a minute on 2 idle cores, several on a loaded machine).
SIM_CHILD_TIMEOUT_S = 420


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("XLASIM_") and k not in {"PYTHONPATH", "PYTHONSTARTUP"}
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)]
    # hatchling in this env (the `test` extra) lets the build run offline and fast.
    if importlib.util.find_spec("hatchling") is not None:
        cmd.insert(cmd.index("--no-deps"), "--no-build-isolation")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=_clean_env()
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    wheels = list(out.glob("xlasim-*.whl"))
    assert len(wheels) == 1, f"expected one xlasim wheel in {out}, got {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel_path: Path) -> set[str]:
    with zipfile.ZipFile(wheel_path) as zf:
        return set(zf.namelist())


def _read_member(wheel_path: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel_path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(suffix)]
        return zf.read(name).decode()


def test_wheel_ships_both_packages_with_py_typed(wheel_names: set[str]) -> None:
    for member in (
        "xlasim/__init__.py",
        "xlasim/py.typed",
        "tpu_backend/__init__.py",
        "tpu_backend/py.typed",
    ):
        assert member in wheel_names, f"{member} missing from wheel: {sorted(wheel_names)}"


def test_wheel_ships_no_test_or_bench_code(wheel_names: set[str]) -> None:
    top_level = {name.split("/", 1)[0] for name in wheel_names}
    others = top_level - {"xlasim", "tpu_backend", "xlasim.pth"}
    assert len(others) == 1 and others.pop().endswith(".dist-info"), sorted(top_level)


def test_pth_sits_at_site_packages_root_as_one_import_line(
    wheel_path: Path, wheel_names: set[str]
) -> None:
    # Only files at the wheel's root land directly in site-packages, where site.py looks for .pth.
    assert "xlasim.pth" in wheel_names
    lines = [ln for ln in _read_member(wheel_path, "xlasim.pth").splitlines() if ln.strip()]
    assert len(lines) == 1, f"xlasim.pth must be one line, got {lines}"
    # site.py executes a .pth line only when it starts with "import" plus a space or tab.
    assert lines[0].startswith(("import ", "import\t")), lines[0]
    assert "XLASIM_TOPOLOGY" in lines[0] and "xlasim._autoactivate" in lines[0]
    compile(lines[0], "xlasim.pth", "exec")


def test_entry_points(wheel_path: Path) -> None:
    parser = configparser.ConfigParser()
    parser.read_string(_read_member(wheel_path, ".dist-info/entry_points.txt"))
    assert parser["console_scripts"]["xlasim"] == "xlasim.cli.commands:main"
    assert parser["pytest11"]["xlasim"] == "xlasim.pytest_plugin"


def test_metadata_requirements(wheel_path: Path) -> None:
    meta = email.parser.Parser().parsestr(_read_member(wheel_path, ".dist-info/METADATA"))
    assert meta["Name"] == "xlasim"
    assert meta["Requires-Python"] == ">=3.11"
    requires = meta.get_all("Requires-Dist") or []
    for req in ("torch>=2.9", "numpy", "rich", "filelock", "ninja"):
        assert req in requires, f"{req!r} not in {requires}"
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"ray", "test", "xla", "dev"} <= extras, extras
    assert "torch-xla==2.9.0; extra == 'xla'" in requires, requires
    assert "torch==2.9.0; extra == 'xla'" in requires, requires


def _scratch_site(tmp_path: Path) -> tuple[Path, Path]:
    """A bare venv (no pip) and its site-packages directory."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=CHILD_TIMEOUT_S,
        env=_clean_env(),
    ).stdout.strip()
    return python, Path(purelib)


PROBE = textwrap.dedent(
    """
    import json, sys
    print(json.dumps({m: m in sys.modules for m in ("xlasim", "xlasim._autoactivate", "torch")}))
    """
)


def _probe(python: Path | str, **env: str) -> dict[str, bool]:
    proc = subprocess.run(
        [str(python), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=SIM_CHILD_TIMEOUT_S,
        env=_clean_env(**env),
    )
    assert proc.returncode == 0, proc.stderr
    # site.py reports a failing .pth line on stderr and carries on; that must not go unnoticed.
    assert "Error processing line" not in proc.stderr, proc.stderr
    result: dict[str, bool] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_wheel_carries_the_apache_license(wheel_path: Path, wheel_names: set[str]) -> None:
    meta = email.parser.Parser().parsestr(_read_member(wheel_path, ".dist-info/METADATA"))
    # PEP 639: an SPDX expression plus the license file, shipped inside .dist-info/licenses/
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    shipped = [n for n in wheel_names if n.endswith(".dist-info/licenses/LICENSE")]
    assert len(shipped) == 1, sorted(wheel_names)
    text = _read_member(wheel_path, ".dist-info/licenses/LICENSE")
    assert text == (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "Copyright 2026 the xlasim authors" in text


def test_wheel_pth_runs_autoactivate_only_when_topology_is_set(
    wheel_path: Path, tmp_path: Path
) -> None:
    # The wheel's own xlasim.pth, next to a stand-in xlasim package whose _autoactivate leaves a
    # marker: this isolates the start-up hook from the simulator behind it.
    python, purelib = _scratch_site(tmp_path)
    (purelib / "xlasim.pth").write_text(_read_member(wheel_path, "xlasim.pth"))
    pkg = purelib / "xlasim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    marker = tmp_path / "activated"
    (pkg / "_autoactivate.py").write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text(os.environ['XLASIM_TOPOLOGY'])\n"
    )

    assert _probe(python) == {"xlasim": False, "xlasim._autoactivate": False, "torch": False}
    assert not marker.exists()
    # An empty value means "not set", as for most on/off variables.
    assert _probe(python, XLASIM_TOPOLOGY="")["xlasim._autoactivate"] is False
    assert not marker.exists()

    assert _probe(python, XLASIM_TOPOLOGY="2x2x1")["xlasim._autoactivate"] is True
    assert marker.read_text() == "2x2x1"


def _installed_pth() -> Path | None:
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    for d in dirs:
        candidate = Path(d) / "xlasim.pth"
        if candidate.is_file():
            return candidate
    return None


@pytest.fixture
def installed_pth() -> Path:
    pth = _installed_pth()
    if pth is None:
        pytest.skip(
            "xlasim is not installed in this interpreter's site-packages (running from a source "
            "tree); `pip install -e .` or `tox -e sim` installs it"
        )
    return pth


def test_installed_pth_matches_source(installed_pth: Path) -> None:
    assert installed_pth.read_text() == (ROOT / "xlasim.pth").read_text()


def test_installed_env_costs_nothing_without_topology(installed_pth: Path) -> None:
    assert _probe(sys.executable) == {
        "xlasim": False,
        "xlasim._autoactivate": False,
        "torch": False,
    }


def test_installed_env_activates_with_topology(installed_pth: Path) -> None:
    loaded = _probe(sys.executable, XLASIM_TOPOLOGY="2x2x1", XLASIM_ACCELERATOR="v4")
    assert loaded["xlasim._autoactivate"] is True, loaded


def test_installed_env_simulates_the_slice_named_in_the_environment(installed_pth: Path) -> None:
    # The acceptance program, started as a plain interpreter: a v4 2x2x1 slice is 4 chips,
    # one device per chip (torch_xla's rule for v4), so 4 devices.
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch_xla.runtime as xr; print(xr.global_runtime_device_count())",
        ],
        capture_output=True,
        text=True,
        timeout=SIM_CHILD_TIMEOUT_S,
        env=_clean_env(XLASIM_TOPOLOGY="2x2x1", XLASIM_ACCELERATOR="v4"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "4"
