"""The SPMD logic behind the simulated ``torch_xla.distributed.spmd`` (no runtime needed).

Expected values come from torch_xla 2.9 itself: its docs (device attributes of a v4-8), its
own tests (``test_hybrid_mesh``'s two-slice mock and expected mesh), runs on PJRT CPU, and
XLA's HloSharding rules (partial tiles sort devices within a replication group).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tpu_backend.topology import parse_slice
from xlasim.runtime.memory import human_bytes, tensor_device_bytes
from xlasim.runtime.state import MemoryState
from xlasim.sharding.device_layout import device_attributes
from xlasim.sharding.device_mesh import create_device_mesh, create_hybrid_device_mesh
from xlasim.sharding.mesh import Mesh
from xlasim.sharding.op_sharding import (
    OpSharding,
    ProtoType,
    padded_shard,
    replica_and_indices,
    shard_shape,
)
from xlasim.sharding.tensor_sharding import TensorSharding


def test_v4_8_device_attributes_match_the_torch_xla_docs():
    # docs/source/perf/spmd_basic.md, a v4-8 (one host, 2x2x1 chips)
    assert device_attributes(parse_slice("2x2x1", "v4")) == [
        {"core_on_chip": 0, "num_cores": 1, "coords": [0, 0, 0], "name": "TPU:0"},
        {"core_on_chip": 0, "num_cores": 1, "coords": [1, 0, 0], "name": "TPU:1"},
        {"core_on_chip": 0, "num_cores": 1, "coords": [0, 1, 0], "name": "TPU:2"},
        {"core_on_chip": 0, "num_cores": 1, "coords": [1, 1, 0], "name": "TPU:3"},
    ]


def test_multislice_attributes_add_slice_index():
    attrs = device_attributes(parse_slice("2x2x1", "v4"), num_slices=2)
    assert [(a["name"], a["slice_index"], a["coords"]) for a in attrs] == [
        ("TPU:0", 0, [0, 0, 0]), ("TPU:1", 0, [1, 0, 0]), ("TPU:2", 0, [0, 1, 0]),
        ("TPU:3", 0, [1, 1, 0]), ("TPU:4", 1, [0, 0, 0]), ("TPU:5", 1, [1, 0, 0]),
        ("TPU:6", 1, [0, 1, 0]), ("TPU:7", 1, [1, 1, 0]),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="num_slices must be a positive int, got 0"):
        device_attributes(parse_slice("2x2x1", "v4"), num_slices=0)


@pytest.mark.parametrize(
    ("topology", "accelerator"),
    [("2x2x2", "v4"), ("4x4", "v6e"), ("4x4", "v3"), ("2x4", "v6e"), ("2x2x2", "v7x")],
)
def test_device_layout_follows_hosts(topology, accelerator):
    spec = parse_slice(topology, accelerator)
    attrs = device_attributes(spec)
    assert [a["name"] for a in attrs] == [f"TPU:{i}" for i in range(spec.num_devices)]
    # every chip of the grid exactly once, each with devices_per_chip consecutive cores
    chips = [tuple(a["coords"]) for a in attrs[:: spec.devices_per_chip]]
    dims = (*spec.dims, 1)[:3]
    assert sorted(chips) == sorted(np.ndindex(*dims))
    assert [a["core_on_chip"] for a in attrs] == list(range(spec.devices_per_chip)) * spec.num_chips
    # a host's devices (ids h*devices_per_host...) form its chips-per-host block
    cx, cy, cz = spec.chips_per_host_bounds
    for h in range(spec.num_hosts):
        block = attrs[h * spec.devices_per_host : (h + 1) * spec.devices_per_host]
        xs, ys, zs = zip(*(a["coords"] for a in block), strict=True)
        assert (max(xs) - min(xs) + 1, max(ys) - min(ys) + 1, max(zs) - min(zs) + 1) == (cx, cy, cz)


def test_hybrid_mesh_matches_torch_xla_own_test():
    # test/spmd/test_xla_sharding.py::test_hybrid_mesh: two v4-8 slices, shuffled names
    mock = [
        {"coords": [0, 0, 0], "core_on_chip": 0, "slice_index": 0, "name": "TPU:2"},
        {"core_on_chip": 0, "coords": [1, 0, 0], "slice_index": 0, "name": "TPU:1"},
        {"slice_index": 0, "core_on_chip": 0, "coords": [0, 1, 0], "name": "TPU:0"},
        {"coords": [1, 1, 0], "core_on_chip": 0, "slice_index": 0, "name": "TPU:3"},
        {"coords": [0, 0, 0], "slice_index": 1, "core_on_chip": 0, "name": "TPU:4"},
        {"coords": [1, 0, 0], "slice_index": 1, "core_on_chip": 0, "name": "TPU:7"},
        {"coords": [0, 1, 0], "slice_index": 1, "core_on_chip": 0, "name": "TPU:6"},
        {"core_on_chip": 0, "coords": [1, 1, 0], "slice_index": 1, "name": "TPU:5"},
    ]
    mock.sort(key=lambda a: int(a["name"].split(":")[1]))  # what HybridMesh does first
    mesh = create_hybrid_device_mesh(mock, (2, 2), (2, 1))
    assert mesh.tolist() == [[2, 1], [0, 3], [4, 7], [6, 5]]


# Expected meshes: torch_xla 2.9's own _create_device_mesh_for_nd_torus run (PJRT CPU) on the
# physical meshes these device attributes describe.
@pytest.mark.parametrize(
    ("topology", "accelerator", "mesh_shape", "expected"),
    [
        ("2x2x2", "v4", (2, 4), [[0, 2, 1, 3], [4, 6, 5, 7]]),
        ("2x2x2", "v4", (4, 2), [[0, 1], [4, 5], [2, 3], [6, 7]]),
        ("2x2x2", "v4", (8,), [0, 4, 2, 6, 1, 5, 3, 7]),
        ("2x2x2", "v4", (2, 2, 2), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
        ("4x4", "v6e", (4, 4), [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]),
        ("4x4", "v6e", (2, 8), [[0, 2, 1, 3, 4, 6, 5, 7], [8, 10, 9, 11, 12, 14, 13, 15]]),
        ("4x4", "v6e", (16,), [0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15]),
    ],
)
def test_device_mesh_on_the_slice_torus(topology, accelerator, mesh_shape, expected):
    spec = parse_slice(topology, accelerator)
    attrs = device_attributes(spec)
    mesh = create_device_mesh(attrs, mesh_shape, np.arange(spec.num_devices))
    assert mesh.tolist() == expected


def test_device_mesh_size_error():
    attrs = device_attributes(parse_slice("2x2x2", "v4"))
    with pytest.raises(
        ValueError,
        match=r"^Number of devices 8 must equal the product of "
        r"mesh_shape \(3, 3\)$",
    ):
        create_device_mesh(attrs, (3, 3), np.arange(8))


def test_op_sharding_normalisation():
    mesh = Mesh(np.array([3, 1, 0, 2]), (2, 2), ("x", "y"), num_devices=4)
    partial = mesh.get_op_sharding(("y", None))
    # groups [3, 0] and [1, 2] are sorted inside: replica ids follow the sorted order
    assert partial.to_string() == "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}"
    assert partial.sharding_type() == 5
    one_per_group = Mesh(np.arange(4), (4, 1), None, num_devices=4).get_op_sharding((0, None))
    assert one_per_group.to_string() == "{devices=[4,1]0,1,2,3}"  # trailing group of 1 dropped
    assert one_per_group.sharding_type() == 3
    all_in_one = Mesh(np.arange(4), (1, 4), None, num_devices=4).get_op_sharding((0, None))
    assert all_in_one.to_string() == "{replicated}" and all_in_one.sharding_type() == 0
    single = Mesh(np.arange(1), (1,), None, num_devices=1).get_op_sharding((0,))
    assert single.to_string() == "{replicated}"  # MAXIMAL on one device is Replicate()
    assert OpSharding([], [], [], 4).to_string() == "{manual}"
    assert OpSharding([], [], [], 6).proto_type == ProtoType.UNKNOWN
    assert OpSharding([], [], [], 2).to_string() == "{replicated}"  # TUPLE: logged, default
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        OpSharding((0, 1), [], [], 3)  # type: ignore[arg-type]
    with pytest.raises(
        RuntimeError,
        match=r"^Check failed: replication_groups\.size\(\) > 0: "
        r"ShardingType\.PARTIAL requires non-empty replication groups\.$",
    ):
        OpSharding([[0, 1]], [[0]], [], 5)
    debug = mesh.get_op_sharding(("y", "x")).debug_string()
    assert debug.splitlines()[1:] == [
        "type: OTHER",
        "tile_assignment_dimensions: 2",
        "tile_assignment_dimensions: 2",
        "tile_assignment_devices: 3",
        "tile_assignment_devices: 0",
        "tile_assignment_devices: 1",
        "tile_assignment_devices: 2",
    ]


def test_uneven_shards_are_clamped_and_zero_padded():
    op = Mesh(np.arange(4), (4,), ("d",), num_devices=4).get_op_sharding(("d",))
    assert shard_shape(op, (6,)) == [2]
    placed = replica_and_indices(op, (6,), [0, 1, 2, 3])
    assert [idx for _, idx in placed] == [
        [slice(0, 2, 1)],
        [slice(2, 4, 1)],
        [slice(4, 6, 1)],
        [slice(6, 6, 1)],
    ]
    value = torch.arange(1, 7)
    assert [padded_shard(value, idx, [2]).tolist() for _, idx in placed] == [
        [1, 2],
        [3, 4],
        [5, 6],
        [0, 0],
    ]
    # only the devices asked for, in the order asked
    assert replica_and_indices(op, (6,), [3, 1]) == [(0, [slice(6, 6, 1)]), (0, [slice(2, 4, 1)])]


def test_per_device_bytes():
    t = torch.zeros(6, 4, dtype=torch.float32)  # 96 bytes
    op = Mesh(np.arange(4), (4,), ("d",), num_devices=4).get_op_sharding(("d", None))
    tiled = TensorSharding(op, t.shape)
    # 6 rows over 4 devices: shards of 2 padded rows = 32 bytes on each device
    assert tensor_device_bytes(t, tiled, 4, spmd=True) == {0: 32, 1: 32, 2: 32, 3: 32}
    assert tensor_device_bytes(t, None, 4, spmd=True) == dict.fromkeys(range(4), 96)
    assert tensor_device_bytes(t, None, 4, spmd=False) == {0: 96}


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (512, "512B"),
        (4096, "4.0K"),
        (196 * 2**20, "196.00M"),
        (int(134.44 * 2**20), "134.44M"),
        (3 * 2**30 + 2**29, "3.50G"),
    ],
)
def test_human_bytes_like_tsl(num_bytes, text):
    assert human_bytes(num_bytes) == text


def _fake_runtime(topology: str, accelerator: str, hbm_bytes: int):
    import dataclasses
    from types import SimpleNamespace

    spec = dataclasses.replace(parse_slice(topology, accelerator), hbm_bytes_per_chip=hbm_bytes)
    return SimpleNamespace(spec=spec, memory=MemoryState(), spmd=True)


def test_chip_accounting_and_out_of_memory():
    from xlasim.runtime import memory

    rt = _fake_runtime("2x2", "v5e", hbm_bytes=1000)
    mesh = Mesh(np.arange(4), (4,), ("d",), num_devices=4)
    big = torch.zeros(10, 40)  # 1600 bytes: does not fit replicated
    sharded = TensorSharding(mesh.get_op_sharding(("d", None)), big.shape)
    rt.memory.enforce = True
    memory.check_fits(rt, big, sharded)  # 3 padded rows = 480 bytes per chip: fits
    big._sharding = sharded
    assert memory.chip_bytes(rt) == [480, 480, 480, 480]
    second = torch.zeros(10, 40)
    message = (
        "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting "
        "to allocate 1.6K. That was not possible. There are 520B free.; (0x0x0_HBM0)"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        memory.check_fits(rt, second, None)  # unsharded under SPMD: whole tensor per chip
    rows = memory.report(rt)
    assert [(r["chip"], r["coords"], r["bytes"]) for r in rows] == [
        (0, [0, 0, 0], 480),
        (1, [1, 0, 0], 480),
        (2, [0, 1, 0], 480),
        (3, [1, 1, 0], 480),
    ]
    rt.memory.enforce = False
    memory.check_fits(rt, second, None)  # accounting only
    assert memory.chip_bytes(rt) == [2080] * 4  # over capacity, counted, not refused
