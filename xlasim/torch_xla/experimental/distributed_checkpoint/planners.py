"""``SPMDSavePlanner`` / ``SPMDLoadPlanner``: torch.distributed.checkpoint planners for
state_dicts holding sharded ``xla`` tensors.

Tensors split over devices are saved as one chunk per local shard (padding excluded) and loaded
shard by shard into the devices' data; everything else (replicated tensors, plain values) goes
through torch's default planning.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch_xla.distributed.spmd as xs
from torch.distributed.checkpoint.default_planner import (
    create_default_global_load_plan,
    create_default_global_save_plan,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorProperties,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.utils import find_state_dict_object
from torch.utils._pytree import tree_map
from torch_xla import _XLAC as _xlac
from torch_xla.distributed.spmd import XLAShard, XLAShardedTensor

from ._helpers import (
    FLATTEN_MAPPING,
    _CpuShards,
    _is_sharded_tensor,
    _unwrap_xla_sharded_tensor,
    dedup_tensors,
    flatten_state_dict,
    narrow_tensor_by_index,
    set_element,
)


def _split_state_dict(
    state_dict: Any, keep_cpu_shards: bool
) -> tuple[FLATTEN_MAPPING, dict[str, Any], dict[str, Any]]:
    """(key paths, the sharded values by flat key, every other value by flat key)."""
    flat, mappings = flatten_state_dict(state_dict)
    flat = tree_map(xs.wrap_if_sharded, flat)
    sharded, other = {}, {}
    for key, value in flat.items():
        if _is_sharded_tensor(value) or (keep_cpu_shards and isinstance(value, _CpuShards)):
            sharded[key] = value
        else:
            other[key] = _unwrap_xla_sharded_tensor(value)
    return mappings, sharded, other


def _chunk(indices: Sequence[slice]) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(
        offsets=torch.Size(s.start for s in indices),
        sizes=torch.Size(s.stop - s.start for s in indices),
    )


def _local_shard_indices(tensor: torch.Tensor) -> list[Any]:
    # Where each local shard sits, read without copying the shards to the host.
    return [indices for _, indices in _xlac._get_local_shard_replica_and_indices([tensor])[0]]


def _shard_write_item(
    fqn: str, position: int, indices: Sequence[slice], size: torch.Size, props: TensorProperties
) -> WriteItem:
    chunk = _chunk(indices)
    return WriteItem(
        index=MetadataIndex(fqn, chunk.offsets, position),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(chunk=chunk, properties=props, size=size),
    )


def _write_items(fqn: str, value: Any) -> list[WriteItem]:
    if isinstance(value, XLAShardedTensor):
        props = TensorProperties.create_from_tensor(value)
        return [
            _shard_write_item(fqn, i, indices, value.size(), props)
            for i, indices in enumerate(_local_shard_indices(value.global_tensor))
        ]
    if isinstance(value, _CpuShards):
        return [
            _shard_write_item(
                fqn,
                i,
                shard.indices,
                value.global_shape,
                TensorProperties.create_from_tensor(shard.data),
            )
            for i, shard in enumerate(value.shards)
        ]
    raise TypeError(
        "_create_xla_write_items accepts either XLAShardedTensor or _CpuShards as value type."
    )


def _check_shard_matches(index: MetadataIndex, shard: XLAShard, what: str) -> None:
    assert index.offset == torch.Size(s.start for s in shard.indices), (
        f"{what} does not correspond to the correct shard"
    )


class SPMDSavePlanner(SavePlanner):
    """A SavePlanner for state_dicts holding ``XLAShardedTensor`` or sharded ``xla`` tensors.

    Each local shard of a tensor split over devices is one write item; other values are
    planned as torch's ``DefaultSavePlanner`` plans them.
    """

    def __init__(self) -> None:
        self.is_coordinator: bool = False
        self.mappings: FLATTEN_MAPPING | None = None
        self.sharded_state_dict: dict[str, Any] | None = None
        self.unsharded_state_dict: dict[str, Any] | None = None
        # Each sharded tensor's shards, copied to the host once at its first write item;
        # an entry becomes None once written, so a shard is neither kept nor written twice.
        self._local_shards: dict[str, list[XLAShard | None]] = {}

    # torch_xla 2.9's signature, without torch's newer `storage_meta`: torch then calls it the
    # old way, with its warning asking for the new parameter, as it does for torch_xla.
    def set_up_planner(self, state_dict: Any, is_coordinator: bool) -> None:  # type: ignore[override]
        self.is_coordinator = is_coordinator
        self.mappings, self.sharded_state_dict, self.unsharded_state_dict = _split_state_dict(
            state_dict, keep_cpu_shards=True
        )

    def create_local_plan(self) -> SavePlan:
        assert self.unsharded_state_dict is not None and self.sharded_state_dict is not None
        plan = create_default_local_save_plan(self.unsharded_state_dict, self.is_coordinator)
        plan = dataclasses.replace(plan, planner_data=self.mappings)
        for fqn, value in self.sharded_state_dict.items():
            plan.items.extend(_write_items(fqn, value))
        return plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, metadata = create_default_global_save_plan(
            dedup_tensors(all_plans), rewrite_index_hints=False
        )
        merged: dict[str, Any] = {}
        for plan in reversed(plans):  # the first plan naming a key wins
            merged.update(plan.planner_data or {})
        return plans, dataclasses.replace(metadata, planner_data=merged)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        return self.transform_object(write_item, self.lookup_object(write_item.index))

    def lookup_object(self, index: MetadataIndex) -> Any:
        assert self.unsharded_state_dict is not None and self.sharded_state_dict is not None
        if index.fqn in self.unsharded_state_dict:
            return self.unsharded_state_dict[index.fqn]
        if index.fqn not in self._local_shards:
            value = self.sharded_state_dict[index.fqn]
            shards = value.local_shards if isinstance(value, XLAShardedTensor) else value.shards
            self._local_shards[index.fqn] = list(shards)
        pending = self._local_shards[index.fqn]
        shard = pending[cast(int, index.index)]
        assert shard is not None, f"WriteItem has already been processed: {index}"
        _check_shard_matches(index, shard, "WriteItem")
        pending[cast(int, index.index)] = None
        return shard.unpadded_data

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            buffer = io.BytesIO()
            torch.save(object, buffer)
            return buffer
        return object


class SPMDLoadPlanner(LoadPlanner):
    """A LoadPlanner that loads into ``XLAShardedTensor`` / sharded ``xla`` tensors in place.

    The state_dict must already be on the device with its target sharding; each local shard
    reads the parts of the checkpoint it overlaps, and is written back to its device once all
    of them are read.
    """

    def __init__(self) -> None:
        self.metadata: Metadata | None = None
        self.is_coordinator: bool = False
        self.original_state_dict: Any = None
        self.mappings: FLATTEN_MAPPING | None = None
        self.sharded_state_dict: dict[str, Any] | None = None
        self.unsharded_state_dict: dict[str, Any] | None = None
        # A sharded tensor's host copies of its shards while reads fill them, and how many of
        # its elements are still to be read before they go back to the devices.
        self._local_shards: dict[str, list[XLAShard]] = {}
        self._pending_elements: dict[str, int] = {}

    def set_up_planner(  # type: ignore[override]
        self, state_dict: Any, metadata: Metadata, is_coordinator: bool
    ) -> None:
        self.metadata = metadata
        self.is_coordinator = is_coordinator
        self.original_state_dict = state_dict
        self.mappings, self.sharded_state_dict, self.unsharded_state_dict = _split_state_dict(
            state_dict, keep_cpu_shards=False
        )

    def create_local_plan(self) -> LoadPlan:
        assert self.unsharded_state_dict is not None and self.sharded_state_dict is not None
        assert self.metadata is not None
        plan = create_default_local_load_plan(self.unsharded_state_dict, self.metadata)
        for fqn, value in self.sharded_state_dict.items():
            assert isinstance(value, XLAShardedTensor), (
                "_create_xla_read_items only accepts XLAShardedTensor"
            )
            chunks = [_chunk(ind) for ind in _local_shard_indices(value.global_tensor)]
            # A tensor in the state_dict is a tensor in the checkpoint (else the read fails).
            stored = cast(TensorStorageMetadata, self.metadata.state_dict_metadata[fqn])
            plan.items.extend(create_read_items_for_chunk_list(fqn, stored, chunks))
        return plan

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return create_default_global_load_plan(global_plan)

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        assert self.mappings is not None
        set_element(
            self.original_state_dict, self.mappings[read_item.dest_index.fqn], torch.load(value)
        )

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self.transform_tensor(read_item, self.lookup_tensor(read_item.dest_index))

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        assert self.unsharded_state_dict is not None and self.sharded_state_dict is not None
        if index.fqn in self.unsharded_state_dict:
            return find_state_dict_object(self.unsharded_state_dict, index)
        if index.fqn not in self._local_shards:
            shards = self.sharded_state_dict[index.fqn].local_shards
            self._local_shards[index.fqn] = shards
            self._pending_elements[index.fqn] = sum(s.unpadded_data.numel() for s in shards)
        # The plan's items always carry their shard's position.
        shard = self._local_shards[index.fqn][cast(int, index.index)]
        _check_shard_matches(index, shard, "ReadItem")
        # The padded piece: transform_tensor narrows it to the read's region.
        return shard.data

    def transform_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> torch.Tensor:
        return narrow_tensor_by_index(tensor, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        assert self.sharded_state_dict is not None
        fqn = read_item.dest_index.fqn
        if fqn not in self.sharded_state_dict:
            return
        self._pending_elements[fqn] -= math.prod(read_item.lengths)
        assert self._pending_elements[fqn] >= 0, f"Too many writes for tensor {fqn}"
        if self._pending_elements[fqn] == 0:
            self.sharded_state_dict[fqn].load_local_shards_(self._local_shards.pop(fqn))
