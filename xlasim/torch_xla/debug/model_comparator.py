"""Simulated ``torch_xla.debug.model_comparator``: save named intermediate tensors of two runs
(say CPU and XLA) and report where their values differ.

``save(name, t)`` writes ``t``'s CPU value to ``<save dir>/<name>.<n>`` (``n`` counts the saves
of that name; with ``step`` the file goes under ``step-<step>/``); ``compare`` pairs the files of
two save dirs by name.  Nothing is written until ``configure`` (or ``MODELCMP_SAVEDIR``) names
a directory.
"""

from __future__ import annotations

import os
import re
import traceback

import torch
import torch_xla.core.xla_model as xm

_SAVE_DIR: str | None = None
_TENSOR_IDS: dict[str, int] = {}
_STEP: int | None = None
_SAVED_FILE = re.compile(r"(.*)\.(\d+)$")


def _save_dir() -> str | None:
    return _SAVE_DIR if _SAVE_DIR is not None else os.environ.get("MODELCMP_SAVEDIR")


def _caller_name() -> str:
    """``<file>.l<line>`` of the nearest caller outside this module."""
    here = os.path.basename(__file__)
    for frame in traceback.extract_stack(limit=8):
        where = os.path.basename(frame.filename)
        if where != here:
            return f"{where}.l{frame.lineno}"
    return "noname"


def _index_of(sizes: list[int], flat: int) -> list[int]:
    index = []
    for size in reversed(sizes):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return index[::-1]


def compare_tensors(
    tensor1: torch.Tensor,
    tensor2: torch.Tensor,
    rtol: float = 1e-05,
    atol: float = 1e-08,
    max_diffs: int = 25,
) -> str:
    """One line per differing element (largest errors first, at most ``max_diffs``); '' when
    the tensors agree within ``max(rtol * max(|a|, |b|), atol)``."""
    sizes1, sizes2 = list(tensor1.size()), list(tensor2.size())
    if sizes1 != sizes2:
        return f"Tensors have different shape: {sizes1} vs. {sizes2}\n"
    diffs = []
    for i, (a, b) in enumerate(
        zip(tensor1.flatten().tolist(), tensor2.flatten().tolist(), strict=True)
    ):
        error = abs(a - b)
        if error > max(max(abs(a), abs(b)) * rtol, atol):
            diffs.append((error, i, a, b))
    diffs.sort(key=lambda d: d[0], reverse=True)
    lines = [
        f"{_index_of(sizes1, i)}: {a} vs. {b}\terror={e}\n" for e, i, a, b in diffs[:max_diffs]
    ]
    if len(diffs) > max_diffs:
        lines.append(f"... aborting after {max_diffs} differences\n")
    return "".join(lines)


def configure(save_dir: str | None) -> None:
    global _SAVE_DIR, _TENSOR_IDS, _STEP
    _SAVE_DIR, _TENSOR_IDS, _STEP = save_dir, {}, None


def save(name: str | None, tensor: torch.Tensor, step: int | None = None) -> torch.Tensor:
    """Saves ``tensor``'s value under ``name`` (None: the caller's file and line) on the master
    ordinal; returns ``tensor``. A no-op while no save dir is configured."""
    global _TENSOR_IDS, _STEP
    folder = _save_dir()
    if folder is None:
        return tensor
    value = tensor.cpu()
    if not xm.is_master_ordinal():
        return tensor
    name = _caller_name() if name is None else name
    if step is not None:
        folder = os.path.join(folder, f"step-{step}")
        os.makedirs(folder, exist_ok=True)
        if step != _STEP:
            _STEP, _TENSOR_IDS = step, {}
    count = _TENSOR_IDS.get(name, 0)
    _TENSOR_IDS[name] = count + 1
    torch.save(value, os.path.join(folder, f"{name}.{count}"))
    return tensor


def _parse_path(path: str) -> tuple[str, int, int | None, str]:
    """(name, save count, step or None, save dir) of a saved tensor's file."""
    folder = os.path.dirname(path)
    step = None
    stepped = re.match(r"step-(\d+)$", os.path.basename(folder))
    if stepped:
        step = int(stepped.group(1))
        folder = os.path.dirname(folder)
    m = _SAVED_FILE.match(os.path.basename(path))
    assert m, path
    return m.group(1), int(m.group(2)), step, folder


def tensor_file_compare(
    path1: str, path2: str, rtol: float = 1e-05, atol: float = 1e-08, max_diffs: int = 25
) -> str:
    report = compare_tensors(
        torch.load(path1), torch.load(path2), rtol=rtol, atol=atol, max_diffs=max_diffs
    )
    if not report:
        return ""
    name, count, step, _ = _parse_path(path1)
    at = f" at step={step}" if step else ""
    body = "".join(f"  {line}\n" for line in report.split("\n"))
    return f'Changes in saved tensor "{name}" with id={count}{at}\n{body}'


def _collect_saved_tensors(path: str) -> set[str]:
    return {f for _, _, files in os.walk(path) for f in files if _SAVED_FILE.match(f)}


def compare(
    save_dir1: str, save_dir2: str, rtol: float = 1e-05, atol: float = 1e-08, max_diffs: int = 25
) -> str:
    """The differences between two save dirs' tensors ('' when they match)."""
    files1, files2 = _collect_saved_tensors(save_dir1), _collect_saved_tensors(save_dir2)
    report = ""
    for f in files1:
        if f not in files2:
            report += f"Mismatch: {f} not in {save_dir2}\n"
        else:
            report += tensor_file_compare(
                os.path.join(save_dir1, f),
                os.path.join(save_dir2, f),
                rtol=rtol,
                atol=atol,
                max_diffs=max_diffs,
            )
    for f in files2 - files1:
        report += f"Mismatch: {f} not in {save_dir1}\n"
    return report
