"""Differential check of the simulator's SPMD layer against real torch_xla 2.9 on CPU PJRT.

Hypothesis generates meshes (shapes, device orders, axis names -- valid and invalid) and
partition specs (ints, names, tuples, ``None``, bad entries) for tensors of random shapes.
Each batch of cases runs once through real torch_xla (a subprocess with
``PJRT_DEVICE=CPU CPU_NUM_DEVICES=n`` and ``xr.use_spmd()``, because SPMD mode is
process-global) and once through the simulator; the outcomes must be identical:

* ``Mesh`` construction: the error (type and message) or ``str``, ``shape()``,
  ``get_logical_mesh()``, ``size()``;
* ``mark_sharding``: the error, or the sharding spec string, ``sharding_type`` and every
  local shard's device, indices, replica id and padded data.

Only device names are normalised ('TPU:3' on the simulator is 'CPU:3' on CPU PJRT).

The real runtime comes from this interpreter when it has torch_xla (the ``xla-cpu`` tox env)
or from ``XLASIM_REAL_PYTHON`` (a python with torch_xla 2.9); otherwise the test skips.
The simulator side uses the simulated ``torch_xla`` when the simulator core is importable,
else the SPMD logic (``xlasim.sharding``) directly.

Run this file as ``python test_spmd_differential.py --real`` to get the real runner: cases
as JSON on stdin, outcomes as JSON on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from tpu_backend.machine import real_torch_xla_unavailable

RUNNER_TIMEOUT_S = 300
DEVICE_COUNTS = (1, 4, 8)
# The simulated slices with exactly these device counts on one host.
SIM_TOPOLOGY = {1: ("1x1", "v6e"), 4: ("2x2", "v6e"), 8: ("2x4", "v6e")}
AXIS_NAME_POOL = ("x", "y", "z", "data", "model", "fsdp")


# -- cases: JSON encoding of partition specs -----------------------------------------------
# A spec entry is None, an int, a str, {"tuple": [...]} or {"float": x} (an invalid entry).
def decode_entry(e: Any) -> Any:
    if isinstance(e, dict):
        if "tuple" in e:
            return tuple(decode_entry(x) for x in e["tuple"])
        return float(e["float"])
    return e


def decode_spec(spec: list[Any]) -> tuple[Any, ...]:
    return tuple(decode_entry(e) for e in spec)


# -- the driver both sides run -----------------------------------------------------------------
def _err(e: BaseException) -> list[str]:
    # The simulator's message is real torch_xla's, exactly (its hints are exception notes).
    return [type(e).__name__, str(e)]


def _indices(indices: Any) -> Any:
    if indices is Ellipsis:
        return "..."
    return [[s.start, s.stop, s.step] for s in indices]


def drive(case: dict[str, Any], xs: Any, to_device: Any, spec_of: Any) -> dict[str, Any]:
    """One case through an ``xs`` (``torch_xla.distributed.spmd``-like) module."""
    import torch

    axis_names = tuple(case["axis_names"]) if case["axis_names"] is not None else None
    try:
        mesh = xs.Mesh(np.array(case["device_ids"]), tuple(case["mesh_shape"]), axis_names)
    except Exception as e:  # noqa: BLE001 - the error itself is the outcome compared
        return {"mesh_error": _err(e)}
    out: dict[str, Any] = {
        "mesh": [
            str(mesh),
            [[k, int(v)] for k, v in mesh.shape().items()],
            mesh.get_logical_mesh().tolist(),
            int(mesh.size()),
        ]
    }
    shape = tuple(case["shape"])
    numel = int(np.prod(shape)) if shape else 1
    t = to_device(torch.arange(numel, dtype=torch.float32).reshape(shape) + 1)
    try:
        st = xs.mark_sharding(t, mesh, decode_spec(case["spec"]))
    except Exception as e:  # noqa: BLE001
        out["error"] = _err(e)
        return out
    out["spec"] = spec_of(t)
    out["type"] = int(st.sharding_type)
    out["shards"] = [
        [
            s.shard_device.replace("TPU:", "CPU:"),
            _indices(s.indices),
            s.replica_id,
            list(s.data.shape),
            s.data.tolist(),
        ]
        for s in st.local_shards
    ]
    return out


def _real_main() -> None:
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    cases = json.load(sys.stdin)
    outcomes = [
        drive(c, xs, lambda t: t.to("xla"), torch_xla._XLAC._get_xla_sharding_spec) for c in cases
    ]
    json.dump(outcomes, sys.stdout)


# -- the simulator side ------------------------------------------------------------------------
def _sim_surface_available() -> bool:
    try:
        import xlasim

        return hasattr(xlasim, "simulate")
    except Exception:  # noqa: BLE001
        return False


def sim_outcomes(n: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if _sim_surface_available():
        import xlasim

        topology, accelerator = SIM_TOPOLOGY[n]
        with xlasim.simulate(topology, accelerator=accelerator):
            import torch_xla
            import torch_xla.distributed.spmd as xs
            import torch_xla.runtime as xr

            xr.use_spmd()
            return [
                drive(c, xs, lambda t: t.to("xla"), torch_xla._XLAC._get_xla_sharding_spec)
                for c in cases
            ]
    return [drive(c, _PureSpmd(n), lambda t: t, _PureSpmd.spec_of) for c in cases]


class _PureSpmd:
    """The SPMD logic without the simulator core: meshes, OpShardings and shards on CPU
    tensors, in ``mark_sharding``'s order (rank check, spec translation, annotation)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def Mesh(self, device_ids: Any, mesh_shape: Any, axis_names: Any = None) -> Any:  # noqa: N802
        from xlasim.sharding.mesh import Mesh

        return Mesh(device_ids, mesh_shape, axis_names, num_devices=self.n)

    def mark_sharding(self, t: Any, mesh: Any, partition_spec: Any) -> Any:
        from xlasim.sharding.op_sharding import padded_shard, replica_and_indices, shard_shape

        assert len(t.shape) == len(partition_spec), (
            f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
            f"({len(t.shape)})."
        )
        op = mesh.get_op_sharding(partition_spec)
        t._pure_op = op  # the tensor here is a plain CPU tensor standing in for a device one
        devices = list(range(self.n))
        padded = shard_shape(op, tuple(t.shape))
        shards = [
            _PureShard(padded_shard(t, idx, padded), idx, f"CPU:{d}", replica)
            for d, (replica, idx) in zip(
                devices, replica_and_indices(op, tuple(t.shape), devices), strict=True
            )
        ]
        return _PureSharded(op.sharding_type(), shards)

    @staticmethod
    def spec_of(t: Any) -> str:
        return t._pure_op.to_string()


class _PureShard:
    def __init__(self, data: Any, indices: Any, shard_device: str, replica_id: int) -> None:
        self.data, self.indices, self.shard_device, self.replica_id = (
            data,
            indices,
            shard_device,
            replica_id,
        )


class _PureSharded:
    def __init__(self, sharding_type: int, shards: list[_PureShard]) -> None:
        self.sharding_type = sharding_type
        self.local_shards = shards


# -- the real side -----------------------------------------------------------------------------
def real_python() -> str | None:
    if real_torch_xla_unavailable() is None:
        return sys.executable
    return os.environ.get("XLASIM_REAL_PYTHON") or None


def real_outcomes(python: str, n: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(n))
    for key in ("XLA_USE_SPMD", "XLASIM_TOPOLOGY", "XLASIM_ACCELERATOR", "XLASIM_HOST_INDEX"):
        env.pop(key, None)
    proc = subprocess.run(
        [python, __file__, "--real"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=RUNNER_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"real runner failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


if __name__ == "__main__" and "--real" in sys.argv:
    _real_main()
    sys.exit(0)


# -- hypothesis strategies ---------------------------------------------------------------------
import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)]
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out += [(d, *rest) for rest in _factorizations(n // d, parts - 1)]
    return out


def _pick(draw: Any, options: list[str]) -> str:
    """One of ``options``; hypothesis leans to index 0, so put the valid choice first."""
    return draw(st.sampled_from(options))


@st.composite
def cases(draw: Any, n: int) -> dict[str, Any]:
    mesh_rank = draw(st.integers(1, 4))
    mesh_shape = list(draw(st.sampled_from(_factorizations(n, mesh_rank))))
    device_ids = draw(st.permutations(list(range(n))))
    names: list[str] | None = draw(
        st.lists(
            st.sampled_from(AXIS_NAME_POOL), min_size=mesh_rank, max_size=mesh_rank, unique=True
        )
    )
    if _pick(draw, ["named", "named", "unnamed"]) == "unnamed":
        names = None

    # Occasionally break the mesh: every Mesh assertion, in its place in the order.
    mesh_fault = _pick(
        draw, ["none"] * 12 + ["size", "dup_id", "big_id", "few_ids", "dup_name", "name_count"]
    )
    if mesh_fault == "size":
        mesh_shape = [*mesh_shape, 2]
    elif mesh_fault == "dup_id" and n > 1:
        device_ids = [device_ids[0], *device_ids[:-1]]
    elif mesh_fault == "big_id":
        device_ids = [*device_ids[:-1], n + draw(st.integers(0, 3))]
    elif mesh_fault == "few_ids":
        device_ids = device_ids[:-1]
    elif mesh_fault == "dup_name" and names is not None and mesh_rank > 1:
        names[-1] = names[0]
    elif mesh_fault == "name_count" and names is not None:
        names = names[:-1] if mesh_rank > 1 else ["x", "y"]

    t_rank = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(1, 7), min_size=t_rank, max_size=t_rank))

    # A valid spec: each mesh axis used at most once, by index or by name, alone or in a
    # tuple; then maybe one fault.
    axes = draw(st.permutations(list(range(mesh_rank))))

    def ref(axis: int) -> Any:
        if names is not None and len(names) == mesh_rank and draw(st.booleans()):
            return names[axis]
        return axis

    spec: list[Any] = []
    for _ in range(t_rank):
        kind = _pick(draw, ["axis", "none", "tuple"])
        if kind == "axis" and axes:
            spec.append(ref(axes.pop()))
        elif kind == "tuple" and len(axes) >= 2:
            size = draw(st.integers(2, min(3, len(axes))))
            spec.append({"tuple": [ref(axes.pop()) for _ in range(size)]})
        else:
            spec.append(None)
    spec_fault = _pick(
        draw,
        ["none"] * 10
        + ["rank", "dup", "bad_int", "neg", "bad_name", "float", "nested", "none_in_tuple"],
    )
    if spec and spec_fault != "none":
        i = draw(st.integers(0, len(spec) - 1))
        if spec_fault == "dup":
            spec[i] = 0
            spec.append(0)
            shape.append(2)
        elif spec_fault == "bad_int":
            spec[i] = mesh_rank
        elif spec_fault == "neg":
            spec[i] = -1
        elif spec_fault == "bad_name":
            spec[i] = "nope"
        elif spec_fault == "float":
            spec[i] = {"float": 0.0}
        elif spec_fault == "nested":
            spec[i] = {"tuple": [0, {"tuple": [1]}]}
        elif spec_fault == "none_in_tuple":
            spec[i] = {"tuple": [None, 0]}
    if spec_fault == "rank":
        spec = spec[:-1] if spec else [None]
    return {
        "device_ids": [int(d) for d in device_ids],
        "mesh_shape": mesh_shape,
        "axis_names": names,
        "shape": shape,
        "spec": spec,
    }


def _compare(n: int, batch: list[dict[str, Any]], python: str) -> None:
    real = real_outcomes(python, n, batch)
    sim = sim_outcomes(n, batch)
    mismatches = [(case, r, s) for case, r, s in zip(batch, real, sim, strict=True) if r != s]
    if mismatches:
        case, r, s = mismatches[0]
        pytest.fail(
            f"{len(mismatches)}/{len(batch)} cases differ from torch_xla (n={n}); first:\n"
            f"case={json.dumps(case)}\nreal={json.dumps(r)[:3000]}\nsim ={json.dumps(s)[:3000]}"
        )


EXAMPLES = 150


def generated_cases(n: int) -> list[dict[str, Any]]:
    """Hypothesis' examples for ``n`` devices, collected first so that one real runtime
    process checks all of them (a runtime start costs seconds; SPMD is process-global)."""
    collected: list[dict[str, Any]] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(n))
    def collect(case: dict[str, Any]) -> None:
        collected.append(case)

    collect()
    return collected


@pytest.mark.parametrize("n", DEVICE_COUNTS)
def test_sim_matches_real_torch_xla(n: int) -> None:
    python = real_python()
    if python is None:
        pytest.skip(
            "real torch_xla is not installed here (run in the xla-cpu tox env, or set "
            "XLASIM_REAL_PYTHON to a python with torch_xla 2.9)"
        )
    batch = generated_cases(n)
    assert len(batch) >= EXAMPLES // 2  # the generator itself must not collapse
    _compare(n, batch, python)


# Hand-picked cases that random generation reaches rarely: uneven and tiny dims (padding,
# empty clamped slices), tuples over several axes, partial replication on higher-rank meshes.
EDGE_CASES = {
    4: [
        {
            "device_ids": [3, 1, 0, 2],
            "mesh_shape": [2, 2],
            "axis_names": ["x", "y"],
            "shape": [5, 3],
            "spec": ["y", "x"],
        },
        {
            "device_ids": [3, 1, 0, 2],
            "mesh_shape": [2, 2],
            "axis_names": ["x", "y"],
            "shape": [5, 3],
            "spec": ["y", None],
        },
        {
            "device_ids": [0, 1, 2, 3],
            "mesh_shape": [4],
            "axis_names": ["d"],
            "shape": [2],
            "spec": ["d"],
        },
        {
            "device_ids": [0, 1, 2, 3],
            "mesh_shape": [1, 4],
            "axis_names": None,
            "shape": [3, 3],
            "spec": [0, None],
        },
        {
            "device_ids": [0, 1, 2, 3],
            "mesh_shape": [4, 1],
            "axis_names": None,
            "shape": [3, 3],
            "spec": [0, None],
        },
        {
            "device_ids": [2, 0, 3, 1],
            "mesh_shape": [2, 1, 2],
            "axis_names": ["a", "b", "c"],
            "shape": [6, 6],
            "spec": ["c", "b"],
        },
        {
            "device_ids": [2, 0, 3, 1],
            "mesh_shape": [2, 2],
            "axis_names": ["a", "b"],
            "shape": [7, 2],
            "spec": [{"tuple": ["b", "a"]}, None],
        },
        {
            "device_ids": [0, 1, 2, 3],
            "mesh_shape": [2, 2],
            "axis_names": ["a", "b"],
            "shape": [],
            "spec": [],
        },
        {
            "device_ids": [0, 1, 2, 3],
            "mesh_shape": [2, 2],
            "axis_names": ["a", "b"],
            "shape": [4, 4],
            "spec": [None, None],
        },
    ],
    8: [
        {
            "device_ids": [7, 6, 5, 4, 3, 2, 1, 0],
            "mesh_shape": [2, 2, 2],
            "axis_names": ["x", "y", "z"],
            "shape": [3, 5],
            "spec": [{"tuple": ["z", "x"]}, None],
        },
        {
            "device_ids": [0, 2, 4, 6, 1, 3, 5, 7],
            "mesh_shape": [2, 4],
            "axis_names": None,
            "shape": [9, 1, 2],
            "spec": [None, 1, 0],
        },
    ],
}


@pytest.mark.parametrize("n", sorted(EDGE_CASES))
def test_edge_cases_match_real_torch_xla(n: int) -> None:
    python = real_python()
    if python is None:
        pytest.skip("real torch_xla is not installed here (see module docstring)")
    _compare(n, EDGE_CASES[n], python)
