"""Consolidating the per-rank checkpoints of ``XlaFullyShardedDataParallel`` into the state
dict of the unwrapped module: shards of one parameter are concatenated in rank order, the
padding is cut off, the original shape restored, and the wrapper levels
(``_fsdp_wrapped_module.``, ``_fpw_module.``) drop out of the names."""

from __future__ import annotations

import glob
import math
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["consolidate_sharded_model_checkpoints", "consolidate_sharded_state_dicts"]

_SHARD_MARK = "_fsdp_shard"


def _split_shard_key(key: str) -> tuple[str, str] | None:
    """``"<wrapper path>.<shard name>"`` -> (wrapper path, shard name); None for a buffer."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.startswith(_SHARD_MARK):
            return ".".join(parts[:i]), ".".join(parts[i:])
    return None


def _plain_name(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_fpw_module.", "")


def consolidate_sharded_state_dicts(
    state_dict_list: list[dict[str, Any]], shard_metadata: dict[str, Any]
) -> OrderedDict[str, Any]:
    """The full state dict of the unwrapped module from every rank's ``model.state_dict()``
    (listed in rank order) and any rank's ``model.get_shard_metadata()``; buffers come from
    rank 0, in their original dtype."""
    assert len(state_dict_list) == shard_metadata["world_size"]
    buffer_info = shard_metadata.get("buffer_info", {})
    # Names keep the wrapper levels until the end: flatten_info is keyed by them.
    full: OrderedDict[str, Any] = OrderedDict()
    for key, value in state_dict_list[0].items():
        where = _split_shard_key(key)
        if where is None:
            if key in buffer_info:
                value = value.to(buffer_info[key]["_orig_dtype"])
            full[key] = value
            continue
        wrapper_path, shard_name = where
        info = shard_metadata["shard_info"][wrapper_path][shard_name]
        orig_size = torch.Size(info["_orig_size"])
        joined = torch.cat([sd[key] for sd in state_dict_list], dim=0)
        if joined.dim() == 1:
            joined = joined[: math.prod(orig_size)].view(orig_size)
        else:
            # Shards cut along dim 0 only (shard_param_on_dim_0=True).
            joined = joined[: orig_size[0]]
        full[f"{wrapper_path}.{info['_orig_name']}" if wrapper_path else info["_orig_name"]] = (
            joined
        )
    # Flattened vectors (flatten_parameters=True) are split back into their parameters, which
    # then come after everything else, as in torch_xla.
    flatten_info = shard_metadata.get("flatten_info", {})
    for key in [k for k in full if k in flatten_info]:
        vector = full.pop(key)
        names, shapes, numels = flatten_info[key]
        prefix = key.rpartition(".")[0]
        for name, shape, part in zip(names, shapes, vector.split(list(numels)), strict=True):
            full[f"{prefix}.{name}" if prefix else name] = part.view(shape)
    return OrderedDict((_plain_name(k), v) for k, v in full.items())


def consolidate_sharded_model_checkpoints(
    ckpt_prefix: str,
    ckpt_suffix: str = "*.pth",
    save_path: str = "",
    save_model: bool = True,
) -> tuple[OrderedDict[str, Any], str | None]:
    """Load every file matching ``ckpt_prefix + ckpt_suffix`` (each a dict with ``"model"``:
    the rank's ``state_dict()`` and ``"shard_metadata"``: its ``get_shard_metadata()``),
    consolidate them, and unless ``save_model`` is False save ``{"model": full}`` to
    ``save_path`` (default ``ckpt_prefix + "_consolidated.pth"``). Returns the full state
    dict and the path written (None when not saved)."""
    pattern = ckpt_prefix + ckpt_suffix
    paths = glob.glob(pattern)
    assert len(paths) > 0, f"Cannot find any files matching {pattern}."
    print(f"found {len(paths)} checkpoint files in {pattern}")
    loaded = sorted(
        ((torch.load(path, map_location="cpu"), path) for path in paths),
        key=lambda item: item[0]["shard_metadata"]["rank"],
    )
    for rank, (ckpt, path) in enumerate(loaded):
        meta = ckpt["shard_metadata"]
        assert meta["world_size"] == len(loaded), (
            f"Expecting {meta['world_size']} files (based on metadata in {path}) but got "
            f"{len(loaded)} files. Please check if you have missing or unexpected files in "
            f"{pattern}."
        )
        assert meta["rank"] == rank, (
            f"Expecting rank {meta['rank']} for {path} but it is ranked {rank} (out of "
            f"{len(loaded)} files). Please check if you have missing or unexpected files in "
            f"{pattern}."
        )
    full = consolidate_sharded_state_dicts(
        [ckpt["model"] for ckpt, _ in loaded], loaded[0][0]["shard_metadata"]
    )
    written = None
    if save_model:
        written = save_path or ckpt_prefix + "_consolidated.pth"
        torch.save({"model": full}, written)
        print(f"saved consolidated model to {written}")
    return full, written
