"""What this machine has for torch_xla: TPU chips on its PCI bus, and the real torch_xla.

Everything here is read without importing torch, torch_xla (importing it starts its
runtime) or ray, so the pytest plugin, the simulator and the seamless wrappers may ask at
any time, in any process.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import sys
from pathlib import Path

__all__ = [
    "GOOGLE_PCI_VENDOR_ID",
    "PCI_DEVICES_ROOT",
    "TPU_PCI_DEVICE_IDS",
    "count_tpu_chips",
    "real_torch_xla_loaded",
    "real_torch_xla_unavailable",
]

PCI_DEVICES_ROOT = "/sys/bus/pci/devices"
GOOGLE_PCI_VENDOR_ID = "0x1ae0"
# The PCI device ids torch_xla 2.9's _internal/tpu.py counts as TPU chips.
TPU_PCI_DEVICE_IDS = frozenset(
    {"0x0027", "0x005e", "0x0063", "0x006f", "0x0056", "0x0062", "0x0076"}
)


def count_tpu_chips(root: str | os.PathLike[str] | None = None) -> int:
    """TPU chips attached through PCI, as torch_xla's ``tpu.num_available_chips`` counts them
    (``root`` defaults to :data:`PCI_DEVICES_ROOT`)."""
    base = Path(root if root is not None else PCI_DEVICES_ROOT)
    chips = 0
    for vendor_path in base.glob("*/vendor"):
        try:
            if vendor_path.read_text().strip() != GOOGLE_PCI_VENDOR_ID:
                continue
            device_id = (vendor_path.parent / "device").read_text().strip()
        except OSError:
            continue
        if device_id in TPU_PCI_DEVICE_IDS:
            chips += 1
    return chips


# Real torch_xla ships its C++ bindings as the top-level extension module `_XLAC`, which its
# `__init__` imports; a Python package named torch_xla without it (the simulator's) is not it.
_EXTENSION = "_XLAC"


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def real_torch_xla_unavailable() -> str | None:
    """Why this interpreter (or a child with the same ``sys.path``) cannot import the real
    torch_xla, or None when it can.

    ``PathFinder`` searches ``sys.path`` only, so an import hook (the simulator's, active or
    not) cannot answer for the real package.
    """
    finder = importlib.machinery.PathFinder
    found = finder.find_spec("torch_xla")
    if found is None or found.origin is None:
        return f"real torch_xla is not installed for {sys.executable}"
    extension = finder.find_spec(_EXTENSION)
    if extension is None or not isinstance(
        extension.loader, importlib.machinery.ExtensionFileLoader
    ):
        return (
            f"the torch_xla found on sys.path ({found.origin}) is not real torch_xla: its "
            f"compiled {_EXTENSION} extension is missing"
        )
    try:
        xla_version = importlib.metadata.version("torch_xla")
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None  # a source checkout without metadata: let the importer try
    if _major_minor(xla_version) != _major_minor(torch_version):
        return (
            f"real torch_xla {xla_version} needs torch {'.'.join(_major_minor(xla_version))}.*, "
            f"but this environment has torch {torch_version}"
        )
    return None


def real_torch_xla_loaded() -> bool:
    """Whether this process has imported the real torch_xla (its runtime is then started)."""
    module = sys.modules.get(_EXTENSION)
    return module is not None and isinstance(
        getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader
    )


# TorchTPU 0.2.0's wheel requires torch>=2.11.0,<=2.15.0.
TORCH_TPU_TORCH_RANGE = ((2, 11), (2, 15))


def _torch_major_minor() -> tuple[int, int] | None:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def torch_tpu_torch_unsupported() -> str | None:
    """Why this environment's torch cannot run TorchTPU 0.2.0 (real or simulated), or None."""
    low, high = TORCH_TPU_TORCH_RANGE
    have = _torch_major_minor()
    if have is not None and low <= have <= high:
        return None
    shown = "?" if have is None else ".".join(map(str, have))
    return f"TorchTPU 0.2.0 needs torch 2.11 to 2.15, this environment has torch {shown}"


def real_torch_tpu_unavailable() -> str | None:
    """Why this interpreter (or a child with the same ``sys.path``) cannot import the real
    TorchTPU (``torch_tpu``), or None when it can; an import hook cannot answer for it."""
    found = importlib.machinery.PathFinder.find_spec("torch_tpu")
    if found is None or found.origin is None:
        return f"real torch_tpu is not installed for {sys.executable}"
    return torch_tpu_torch_unsupported()
