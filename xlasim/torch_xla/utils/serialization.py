"""Simulated ``torch_xla.utils.serialization``: saving data whose tensors live on XLA devices.

The file at ``path`` holds the data with each XLA tensor replaced by a ``TensorReference``; the
tensors' CPU values go to ``<path>.tensors/tensor_<id>.pt`` (torch_xla's layout, so files
written here load with real torch_xla and back).  ``load`` gives the tensors back on the CPU.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.utils.utils as xu


class TensorReference:
    """Stands for the saved tensor number ``tid`` in the data file."""

    def __init__(self, tid: int) -> None:
        self.tid = tid


def _get_tensors_folder(path: str) -> str:
    return path + ".tensors"


def _get_tensor_file(path: str, tid: int) -> str:
    return os.path.join(path, f"tensor_{tid}.pt")


def _is_xla_value(v: Any) -> bool:
    return (
        isinstance(v, torch.Tensor)
        and not isinstance(v, torch.nn.Parameter)
        and (xm.is_xla_tensor(v))
    )


def save(data: Any, path: str, master_only: bool = True, global_master: bool = False) -> None:
    """Saves ``data`` (any nesting of Python containers) with its XLA tensors moved to the CPU;
    with ``master_only`` only the (local, or with ``global_master`` the global) master writes."""
    writes = not master_only or xm.is_master_ordinal(local=not global_master)
    folder = _get_tensors_folder(path)
    tensors: list[torch.Tensor] = []
    xu.for_each_instance(data, _is_xla_value, tensors.append)
    # One sync computes every pending value, on every process (the non-writers too).
    torch_xla._XLAC._xla_sync_multi(tensors, devices=[], wait=True, sync_xla_data=False)
    if writes:
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.mkdir(folder)
        for tid, t in enumerate(tensors):
            torch.save(t.cpu(), _get_tensor_file(folder, tid))
    tids = {id(t): tid for tid, t in enumerate(tensors)}
    refs = xu.for_each_instance_rewrite(data, _is_xla_value, lambda t: TensorReference(tids[id(t)]))
    if writes:
        torch.save(refs, path)


def load(path: str) -> Any:
    """The data ``save`` wrote to ``path``, each tensor as its saved CPU value (torch_xla
    leaves moving them to a device to the caller)."""
    refs = torch.load(path, weights_only=False)
    folder = _get_tensors_folder(path)
    return xu.for_each_instance_rewrite(
        refs,
        lambda v: type(v) is TensorReference,
        lambda r: torch.load(_get_tensor_file(folder, r.tid)),
    )
