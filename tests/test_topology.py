"""Tests of the TPU slice model, checked against Ray 2.60's and torch_xla 2.9's own code.

Expected numbers come from Ray's helpers (called here), torch_xla's sources, real TPU VM
metadata and the Google Cloud TPU pages -- never from ``tpu_backend.topology`` itself.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_backend.machine import real_torch_xla_unavailable
from tpu_backend.topology import (
    ACCELERATORS,
    DEFAULT_ACCELERATOR,
    STANDARD_TOPOLOGIES,
    SliceSpec,
    default_mesh,
    nearest_topologies,
    normalize_accelerator,
    parse_slice,
    tpu_host_env,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def _ray_tpu():
    return pytest.importorskip(
        "ray._private.accelerators.tpu",
        reason="ray is not importable here; install the 'ray' extra to check Ray's TPU helpers",
    )


def _ray_valid_pairs() -> list[tuple[str, str]]:
    tpu = _ray_tpu()
    return sorted((gen, topo) for gen, topos in tpu.VALID_TPU_TOPOLOGY.items() for topo in topos)


# --- agreement with Ray 2.60 -------------------------------------------------------------


def test_every_ray_valid_pair_agrees_with_rays_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    tpu = _ray_tpu()
    from ray.util.tpu import get_tpu_version_from_type, get_tpu_worker_resources

    pairs = _ray_valid_pairs()
    assert len(pairs) > 100  # the table really was read (v4 and v5p add dozens of shapes)
    assert set(tpu.VALID_TPU_TYPES) == set(ACCELERATORS)
    mismatches: list[tuple[str, str, str, object, object]] = []
    for gen, topo in pairs:
        spec = parse_slice(topo, gen)
        ray_chips = tpu.get_num_chips_from_topology(topo)
        ray_cph = tpu.get_chips_per_host(topo, gen)
        workers, worker_resources = get_tpu_worker_resources(
            topology=topo,
            accelerator_type=spec.ray_accelerator_type,
            num_slices=1,
            tpu_resource_per_chip=1,
        )
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", spec.pod_type)
        got = {
            "accelerator": spec.accelerator,
            "num_chips": spec.num_chips,
            "chips_per_host": spec.chips_per_host,
            "num_hosts": spec.num_hosts,
            "pod_type": spec.pod_type,
            "ray_accelerator_type": spec.ray_accelerator_type,
            "worker TPU resource": spec.chips_per_host,
            "version from Ray accelerator type": spec.accelerator,
            "valid for Ray": True,
        }
        want = {
            "accelerator": gen,
            "num_chips": ray_chips,
            "chips_per_host": ray_cph,
            "num_hosts": ray_chips // ray_cph,
            "pod_type": tpu.infer_tpu_pod_type_from_topology(topo, f"TPU-{gen.upper()}"),
            # What a Ray node reports as its accelerator type given this pod type.
            "ray_accelerator_type": tpu.TPUAcceleratorManager.get_current_node_accelerator_type(),
            "worker TPU resource": worker_resources["TPU"],
            "version from Ray accelerator type": get_tpu_version_from_type(
                spec.ray_accelerator_type
            ),
            "valid for Ray": tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_topology(
                spec.ray_accelerator_type, spec.topology
            ),
        }
        if workers != spec.num_hosts:
            mismatches.append((gen, topo, "workers", workers, spec.num_hosts))
        mismatches += [(gen, topo, k, want[k], got[k]) for k in want if want[k] != got[k]]
    assert not mismatches, mismatches


def test_host_bounds_match_rays_worker_grid() -> None:
    """Ray's (private) worker-grid table gives hosts per dimension for 4-chip hosts."""
    tpu = _ray_tpu()
    grids: dict[str, tuple[int, ...]] = {
        **getattr(tpu, "_VALID_TOPOLOGY_WORKER_DIMS_2D", {}),
        **getattr(tpu, "_VALID_TOPOLOGY_WORKER_DIMS_3D", {}),
    }
    if not grids:
        pytest.skip("this Ray has no _VALID_TOPOLOGY_WORKER_DIMS_* tables")
    checked = 0
    for gen, topo in _ray_valid_pairs():
        spec = parse_slice(topo, gen)
        if topo not in grids or spec.chips_per_host != 4:
            continue
        assert spec.host_bounds[: len(spec.dims)] == tuple(grids[topo]), (gen, topo)
        checked += 1
    assert checked > 50


@settings(max_examples=150, deadline=None)
@given(
    gen=st.sampled_from(ACCELERATORS),
    dims=st.lists(st.integers(1, 24), min_size=2, max_size=3),
)
def test_any_accepted_topology_agrees_with_rays_counting(gen: str, dims: list[int]) -> None:
    """Beyond Ray's table: whatever parse_slice accepts, Ray counts the same way."""
    tpu = _ray_tpu()
    topo = "x".join(map(str, dims))
    try:
        spec = parse_slice(topo, gen)
    except ValueError as err:
        assert repr(topo) in str(err)
        return
    assert spec.chips_per_host == tpu.get_chips_per_host(topo, gen)
    assert spec.chips_per_host == tpu._get_default_chips_per_vm(topo, gen)
    assert spec.pod_type == tpu.infer_tpu_pod_type_from_topology(topo, spec.ray_accelerator_type)
    assert spec.num_chips == tpu.get_num_chips_from_topology(topo) == math.prod(dims)
    assert spec.num_hosts * spec.chips_per_host == spec.num_chips
    assert spec.num_devices == spec.num_hosts * spec.devices_per_host
    assert math.prod(spec.host_bounds) == spec.num_hosts
    assert math.prod(spec.chips_per_host_bounds) == spec.chips_per_host


def test_tpu_host_env_is_what_ray_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    tpu = _ray_tpu()
    spec = parse_slice("2x2x2", "v4")
    env = tpu_host_env(spec, 1, ["tpu-w-0", "tpu-w-1"], slice_name="my-slice")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    mgr = tpu.TPUAcceleratorManager
    assert mgr.get_current_node_tpu_pod_type() == "v4-16"
    assert mgr.get_current_node_tpu_worker_id() == 1
    assert mgr.get_current_node_tpu_topology() == "2x2x2"
    assert mgr.get_current_node_tpu_name() == "my-slice"
    assert mgr.get_current_node_accelerator_type() == "TPU-V4"


# --- agreement with torch_xla 2.9 ----------------------------------------------------------

# torch_xla v2.9.0 torch_xla/_internal/tpu.py _ACCELERATOR_TYPE_TO_HOST_BOUNDS (v2/v3 only).
TORCH_XLA_HOST_BOUNDS = {
    "v2-8": "1,1,1",
    "v2-32": "2,2,1",
    "v2-128": "4,4,1",
    "v2-256": "4,8,1",
    "v2-512": "8,8,1",
    "v3-8": "1,1,1",
    "v3-32": "2,2,1",
    "v3-64": "2,4,1",
    "v3-128": "4,4,1",
    "v3-256": "4,8,1",
    "v3-512": "8,8,1",
    "v3-1024": "8,16,1",
    "v3-2048": "16,16,1",
}
# Topologies of those pod types (Google Cloud v2/v3 configuration tables).
V2_V3_TOPOLOGIES = {
    "v2-8": "2x2", "v2-32": "4x4", "v2-128": "8x8", "v2-256": "8x16", "v2-512": "16x16",
    "v3-8": "2x2", "v3-32": "4x4", "v3-64": "4x8", "v3-128": "8x8", "v3-256": "8x16",
    "v3-512": "16x16", "v3-1024": "16x32", "v3-2048": "32x32",
}  # fmt: skip


def _installed_torch_xla_host_bounds() -> dict[str, str] | None:
    if real_torch_xla_unavailable() is not None:
        return None
    spec = importlib.machinery.PathFinder.find_spec("torch_xla")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations)), "_internal", "tpu.py")
    if not source.exists():
        return None
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_ACCELERATOR_TYPE_TO_HOST_BOUNDS"
            for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def test_v2_v3_host_bounds_match_torch_xla_table() -> None:
    installed = _installed_torch_xla_host_bounds()
    if installed is not None:  # the copy above is still what torch_xla ships
        assert installed == TORCH_XLA_HOST_BOUNDS
    for pod_type, bounds in TORCH_XLA_HOST_BOUNDS.items():
        gen = pod_type.split("-")[0]
        spec = parse_slice(V2_V3_TOPOLOGIES[pod_type], gen)
        assert spec.pod_type == pod_type
        assert ",".join(map(str, spec.host_bounds)) == bounds, pod_type
        # torch_xla's configure_topology assumes 2,2,1 chips per v2/v3 host.
        assert spec.chips_per_host_bounds == (2, 2, 1)


def test_real_v4_256_metadata_bounds() -> None:
    # tpu-env metadata of a real v4-256: TOPOLOGY '4x4x8', HOST_BOUNDS '2,2,8',
    # CHIPS_PER_HOST_BOUNDS '2,2,1'.
    spec = parse_slice("4x4x8", "v4")
    assert spec.pod_type == "v4-256"
    assert spec.host_bounds == (2, 2, 8)
    assert spec.chips_per_host_bounds == (2, 2, 1)


def _reference_python() -> str | None:
    """An interpreter with real torch_xla: this one, or $XLASIM_REFERENCE_PYTHON."""
    if real_torch_xla_unavailable() is None:
        return sys.executable
    return os.environ.get("XLASIM_REFERENCE_PYTHON") or None


_TORCH_XLA_PROBE = """
import json, os
from torch_xla._internal import tpu
out = {
    "env": dict(tpu.get_tpu_env()),
    "version": tpu.version(),
    "type": tpu.get_tpu_type(),
    "workers": tpu.get_worker_ips(),
    "num_workers": tpu.num_tpu_workers(),
    "worker_id": tpu.worker_id(),
}
tpu.configure_topology(local_rank=0, local_world_size=int(os.environ["PROBE_LOCAL_WORLD"]))
out["process_bounds"] = os.environ["TPU_PROCESS_BOUNDS"]
out["task_id"] = os.environ["CLOUD_TPU_TASK_ID"]
print("PROBE" + json.dumps(out))
"""


@pytest.mark.parametrize(
    ("topology", "accelerator", "host", "hostnames"),
    [
        ("2x2x2", "v4", 1, ["h0", "h1"]),
        ("4x4", "v6e", 2, ["a", "b", "c", "d"]),
        ("2x4", "v5e", 0, None),
    ],
)
def test_tpu_host_env_is_what_torch_xla_reads(
    topology: str, accelerator: str, host: int, hostnames: list[str] | None
) -> None:
    python = _reference_python()
    if python is None:
        pytest.skip(
            "real torch_xla is not importable here; set XLASIM_REFERENCE_PYTHON to an "
            "interpreter that has it"
        )
    spec = parse_slice(topology, accelerator)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "TPU_"))}
    env.update(tpu_host_env(spec, host, hostnames))
    env.update(PJRT_DEVICE="CPU", PROBE_LOCAL_WORLD=str(spec.chips_per_host))
    env.pop("CLOUD_TPU_TASK_ID", None)
    proc = subprocess.run(
        [python, "-c", _TORCH_XLA_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("PROBE") :])
    assert out["env"] == {
        "ACCELERATOR_TYPE": spec.pod_type,
        "TPU_PROCESS_BOUNDS": ",".join(map(str, spec.host_bounds)),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": ",".join(map(str, spec.chips_per_host_bounds)),
        "WORKER_ID": str(host),
    }
    assert out["version"] == spec.generation
    assert out["type"] == spec.accelerator
    assert out["num_workers"] == spec.num_hosts
    assert out["worker_id"] == host
    assert out["workers"] == (hostnames if spec.num_hosts > 1 else ["localhost"])
    # One process per chip: torch_xla multiplies the bounds back into the chip grid.
    dims3 = (*spec.dims, 1) if len(spec.dims) == 2 else spec.dims
    assert out["process_bounds"] == ",".join(map(str, dims3))
    assert out["task_id"] == str(host * spec.chips_per_host)


# --- worked examples -----------------------------------------------------------------------


def test_v4_16_example() -> None:
    spec = parse_slice("2x2x2", "v4")
    assert (spec.accelerator, spec.topology, spec.dims) == ("v4", "2x2x2", (2, 2, 2))
    assert (spec.num_hosts, spec.chips_per_host, spec.num_chips) == (2, 4, 8)
    assert (spec.devices_per_chip, spec.devices_per_host, spec.num_devices) == (1, 4, 8)
    assert spec.pod_type == "v4-16"
    assert spec.ray_accelerator_type == "TPU-V4"
    assert spec.host_bounds == (1, 1, 2)
    assert spec.chips_per_host_bounds == (2, 2, 1)
    assert spec.hbm_bytes_per_chip == 32 * GIB
    assert spec.device_kind == "TPU v4"
    assert spec.is_multi_host


def test_default_accelerator_4x4_is_4_hosts_of_4_chips() -> None:
    assert DEFAULT_ACCELERATOR == "v6e"
    spec = parse_slice("4x4")
    assert spec.accelerator == "v6e"
    assert (spec.num_hosts, spec.chips_per_host, spec.num_devices) == (4, 4, 16)
    assert spec.pod_type == "v6e-16"
    assert spec == parse_slice("4x4", "v6e")


def test_v6e_2x4_is_one_host_of_8_chips() -> None:
    spec = parse_slice("2x4", "v6e")
    assert (spec.num_hosts, spec.chips_per_host, spec.num_devices) == (1, 8, 8)
    assert spec.pod_type == "v6e-8"
    assert spec.host_bounds == (1, 1, 1)
    assert spec.chips_per_host_bounds == (2, 4, 1)
    assert not spec.is_multi_host


def test_v5e_2x2_is_one_host_of_4_chips() -> None:
    spec = parse_slice("2x2", "v5e")
    assert spec.accelerator == "v5litepod"
    assert (spec.num_hosts, spec.chips_per_host, spec.num_devices) == (1, 4, 4)
    assert spec.pod_type == "v5litepod-4"
    assert spec.ray_accelerator_type == "TPU-V5LITEPOD"


def test_v3_4x4_has_two_devices_per_chip() -> None:
    spec = parse_slice("4x4", "v3")
    assert (spec.num_hosts, spec.chips_per_host, spec.devices_per_chip) == (4, 4, 2)
    assert (spec.devices_per_host, spec.num_devices) == (8, 32)
    assert spec.pod_type == "v3-32"


def test_v7x_has_two_devices_per_chip() -> None:
    # Google Cloud TPU7x page: two TensorCores per chip, exposed as two devices.
    spec = parse_slice("2x2x1", "v7x")
    assert (spec.num_hosts, spec.chips_per_host, spec.num_devices) == (1, 4, 8)
    assert spec.pod_type == "v7x-8"
    assert spec.device_kind == "TPU7x"


@pytest.mark.parametrize(
    ("accelerator", "topology", "hbm_gib", "device_kind", "devices_per_chip"),
    [
        # HBM: Google Cloud TPU pages. Device kinds: JAX tpu_info / torch_xla pallas code.
        ("v2", "2x2", 16, "TPU v2", 2),
        ("v3", "2x2", 32, "TPU v3", 2),
        ("v4", "2x2x1", 32, "TPU v4", 1),
        ("v5litepod", "2x2", 16, "TPU v5 lite", 1),
        ("v5p", "2x2x1", 95, "TPU v5", 1),
        ("v6e", "2x2", 32, "TPU v6 lite", 1),
        ("v7x", "2x2x1", 192, "TPU7x", 2),
    ],
)
def test_generation_facts(
    accelerator: str, topology: str, hbm_gib: int, device_kind: str, devices_per_chip: int
) -> None:
    spec = parse_slice(topology, accelerator)
    assert spec.hbm_bytes_per_chip == hbm_gib * GIB
    assert spec.device_kind == device_kind
    assert spec.devices_per_chip == devices_per_chip


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("v5e", "v5litepod"),
        ("V5E", "v5litepod"),
        ("TPU-V5LITEPOD", "v5litepod"),
        ("TPU-V4", "v4"),
        ("v4", "v4"),
        ("tpu-v6e", "v6e"),
        ("tpu7x", "v7x"),
        (" v5p ", "v5p"),
    ],
)
def test_accelerator_aliases(given: str, canonical: str) -> None:
    assert normalize_accelerator(given) == canonical
    topology = "2x2x1" if canonical in {"v4", "v5p", "v7x"} else "2x2"
    assert parse_slice(topology, given).accelerator == canonical


def test_topology_is_normalised() -> None:
    assert parse_slice(" 2X2x2 ", "v4").topology == "2x2x2"


# --- errors --------------------------------------------------------------------------------

TOPOLOGY_FORMS = "expected 2 (AxB) or 3 (AxBxC) positive integers joined by 'x'"
VALID_ACCELERATORS = "valid: v2, v3, v4, v5litepod (alias v5e), v5p, v6e, v7x"


@pytest.mark.parametrize(
    ("topology", "accelerator", "needles"),
    [
        ("4x", None, ["'4x'", TOPOLOGY_FORMS]),
        ("0x4", None, ["'0x4'", TOPOLOGY_FORMS, "positive"]),
        ("abc", None, ["'abc'", TOPOLOGY_FORMS]),
        ("", "v4", ["''", TOPOLOGY_FORMS]),
        ("2x2x2x2", "v4", ["'2x2x2x2'", TOPOLOGY_FORMS]),
        ("-2x2", None, ["'-2x2'", TOPOLOGY_FORMS]),
        ("2x2", "v4", ["'2x2'", "v4", "3-D (AxBxC)", "'2x2x1'"]),
        ("2x2x2", "v6e", ["'2x2x2'", "v6e", "2-D (AxB)"]),
        ("2x2x2", None, ["'2x2x2'", "default accelerator v6e", "v4, v5p, v7x"]),
        ("2x2", "v9", ["unknown accelerator 'v9'", VALID_ACCELERATORS]),
        ("2x2", "v4-16", ["'v4-16'", "pod type", VALID_ACCELERATORS]),
        ("1x1x1", "v4", ["'1x1x1'", "not a multiple of the 4 chips per host"]),
        ("1x2", "v3", ["'1x2'", "not a multiple of the 4 chips per host"]),
        ("1x4x2", "v4", ["'1x4x2'", "2x2"]),
        ("4x2", "v6e", ["'4x2'", "1x1, 2x2, 2x4"]),
        ("1x2", "v5e", ["'1x2'", "1x1, 2x2, 2x4"]),
    ],
)
def test_bad_input_raises_value_error_naming_value_and_forms(
    topology: str, accelerator: str | None, needles: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        parse_slice(topology, accelerator)
    for needle in needles:
        assert needle in str(info.value)


def test_standard_topologies_are_rays_table_plus_single_host_v2_v3() -> None:
    # Ray 2.60's VALID_TPU_TOPOLOGY, plus the one-host v2-8 / v3-8 (2x2) Google Cloud offers.
    expected = {(gen, topo) for gen, topo in _ray_valid_pairs()} | {("v2", "2x2"), ("v3", "2x2")}
    ours = {(gen, topo) for gen, topos in STANDARD_TOPOLOGIES.items() for topo in topos}
    assert ours == expected
    for gen, topos in STANDARD_TOPOLOGIES.items():
        chips = [parse_slice(t, gen).num_chips for t in topos]
        assert chips == sorted(chips), f"{gen} is not listed smallest first"


@pytest.mark.parametrize(
    ("topology", "accelerator", "suggestion"),
    [
        # 6 chips do not fill whole hosts; no standard v4 slice has 6: both neighbours.
        (
            "2x3x1",
            "v4",
            "nearest valid v4 topologies: '2x2x1' (4 chips, 1 host), '2x2x2' (8 chips, 2 hosts)",
        ),
        # 16 chips in a shape hosts cannot tile: the 16-chip shape Google Cloud offers.
        ("1x4x4", "v4", "nearest valid v4 topologies: '2x2x4' (16 chips, 4 hosts)"),
        ("1x1x1", "v5p", "nearest valid v5p topologies: '2x2x1' (4 chips, 1 host)"),
        # 12 chips, but an odd first dimension: hosts of 2x2 cannot tile it.
        (
            "3x4",
            "v3",
            "nearest valid v3 topologies: '2x2' (4 chips, 1 host), '4x4' (16 chips, 4 hosts)",
        ),
    ],
)
def test_bad_topology_suggests_the_nearest_standard_ones(
    topology: str, accelerator: str, suggestion: str
) -> None:
    with pytest.raises(ValueError) as info:
        parse_slice(topology, accelerator)
    assert str(info.value).endswith(suggestion)


def test_nearest_topologies_prefers_an_exact_chip_count() -> None:
    assert nearest_topologies("v6e", 16) == ["2x8", "4x4"]
    assert nearest_topologies("TPU-V4", 64) == ["4x4x4"]
    assert nearest_topologies("v7x", 100_000) == ["8x16x16"]


def test_exact_messages_for_the_documented_examples() -> None:
    with pytest.raises(ValueError) as info:
        parse_slice("4x")
    assert str(info.value) == (
        "topology '4x' is not valid: expected 2 (AxB) or 3 (AxBxC) positive integers "
        "joined by 'x', e.g. '2x2' or '2x2x2'"
    )
    with pytest.raises(ValueError) as info:
        parse_slice("2x2", "v9")
    assert str(info.value) == (
        "unknown accelerator 'v9'; valid: v2, v3, v4, v5litepod (alias v5e), v5p, v6e, v7x"
    )


def test_non_string_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="topology must be a str"):
        parse_slice(4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="accelerator must be a str"):
        parse_slice("2x2", 4)  # type: ignore[arg-type]


# --- tpu_host_env --------------------------------------------------------------------------


def test_tpu_host_env_v4_16_host_1() -> None:
    env = tpu_host_env(parse_slice("2x2x2", "v4"), 1, ["host-0", "host-1"])
    assert env == {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v4-16",
        "TPU_TOPOLOGY": "2x2x2",
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "host-0,host-1",
        "TPU_HOST_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
    }


def test_tpu_host_env_defaults_to_localhost_per_host_and_optional_name() -> None:
    spec = parse_slice("4x4")
    env = tpu_host_env(spec, 3, slice_name="s")
    assert env["TPU_WORKER_HOSTNAMES"] == "localhost,localhost,localhost,localhost"
    assert env["TPU_WORKER_ID"] == "3"
    assert env["TPU_NAME"] == "s"
    assert "TPU_NAME" not in tpu_host_env(spec, 0)


@pytest.mark.parametrize("host_index", [-1, 2, 5])
def test_tpu_host_env_rejects_out_of_range_host(host_index: int) -> None:
    with pytest.raises(ValueError) as info:
        tpu_host_env(parse_slice("2x2x2", "v4"), host_index)
    assert f"host_index {host_index}" in str(info.value)
    assert "0..1" in str(info.value)


def test_tpu_host_env_rejects_bad_hostnames_and_index_types() -> None:
    spec = parse_slice("2x2x2", "v4")
    with pytest.raises(ValueError, match="one name per host"):
        tpu_host_env(spec, 0, ["only-one"])
    with pytest.raises(ValueError, match="commas"):
        tpu_host_env(spec, 0, ["a,b", "c"])
    with pytest.raises(TypeError, match="sequence of str"):
        tpu_host_env(spec, 0, "h0,h1")
    with pytest.raises(TypeError, match="host_index must be an int"):
        tpu_host_env(spec, True)


# --- mesh, table rows, value semantics -----------------------------------------------------


def test_default_mesh() -> None:
    assert default_mesh(parse_slice("2x2x2", "v4")) == ((2, 4), ("data", "model"))
    assert default_mesh(parse_slice("4x4")) == ((4, 4), ("data", "model"))
    assert default_mesh(parse_slice("4x4", "v3")) == ((4, 8), ("data", "model"))
    assert default_mesh(parse_slice("2x4", "v6e")) == ((8,), ("data",))
    assert default_mesh(parse_slice("2x2x1", "v4")) == ((4,), ("data",))


def test_describe_rows_v4_16() -> None:
    rows = dict(parse_slice("2x2x2", "v4").describe_rows())
    assert rows["pod type"] == "v4-16"
    assert rows["hosts"] == "2"
    assert rows["chips per host"] == "4"
    assert rows["devices"] == "8"
    assert rows["HBM per chip"] == "32 GiB"
    assert rows["host bounds"] == "1,1,2"
    assert rows["default mesh"] == "(data=2, model=4)"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in rows.items())


def test_slice_spec_is_a_frozen_hashable_picklable_value() -> None:
    spec = parse_slice("2x2x2", "v4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_hosts = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert len({spec, parse_slice("2x2x2", "TPU-V4")}) == 1


def test_inconsistent_hand_built_spec_is_rejected() -> None:
    spec = parse_slice("2x2x2", "v4")
    with pytest.raises(ValueError, match="num_hosts \\* chips_per_host == num_chips"):
        dataclasses.replace(spec, num_hosts=3)
    assert isinstance(dataclasses.replace(spec), SliceSpec)


def test_importing_tpu_backend_stays_light() -> None:
    code = (
        "import sys, tpu_backend, tpu_backend.topology;"
        "heavy = [m for m in ('torch', 'torch_xla', 'ray') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
