"""Several slices joined over DCN (multislice) on the simulator: what every host of every slice
sees, the hybrid mesh's device order, sharded computation across slices, and the errors.

Facts and where they come from:
* device ids and attributes: torch_xla 2.9 ``docs/source/perf/spmd_basic.md`` (2 slices of
  v4-8: ``TPU:0..3`` in slice 0, ``TPU:4..7`` in slice 1, each with ``slice_index``) and its PJRT
  client, which numbers global ordinals by increasing device id;
* ``HybridMesh`` orders: measured on real torch_xla 2.9 (CPU wheel) by building
  ``xs.HybridMesh`` over the device attributes the simulator reports (its device-hardware query
  answered 'TPU', as pytorch/xla's own hybrid-mesh test does);
* the ``MEGASCALE_*`` variables: Ray 2.60's ``ray.util.tpu.get_tpu_coordinator_env_vars``,
  which Ray Train's multislice setup gives every worker.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from global_batch import eager_sgd

import xlasim
from tpu_backend.topology import (
    DEFAULT_MEGASCALE_PORT,
    check_same_generation,
    megascale_env,
    parse_slice,
)
from xlasim._activation import config_from_env
from xlasim.cli import commands
from xlasim.runtime.settings import EnvError

pytest_plugins = ["pytester"]

V4_8_TWICE = {"topology": "2x2x1", "accelerator": "v4", "num_slices": 2, "single_process": True}

# (topology, accelerator, slices, ici, dcn) -> HybridMesh.get_logical_mesh() on real
# torch_xla 2.9 (see the module docstring).
REAL_HYBRID_MESHES = [
    # the example of HybridMesh's docstring: 2 slices of v4-8, (data, fsdp, tensor)
    ("2x2x1", "v4", 2, (1, 4, 1), (2, 1, 1), [[[0], [2], [1], [3]], [[4], [6], [5], [7]]]),
    ("2x2x1", "v5p", 2, (2, 2), (1, 2), [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ("2x2x1", "v4", 2, (1, 4), (2, 1), [[0, 2, 1, 3], [4, 6, 5, 7]]),
    ("2x2x1", "v4", 2, (2, 2), (2, 1), [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("2x2x1", "v4", 2, (4, 1), (1, 2), [[0, 4], [2, 6], [1, 5], [3, 7]]),
    ("2x2x2", "v4", 2, (1, 8), (2, 1), [[0, 4, 2, 6, 1, 5, 3, 7], [8, 12, 10, 14, 9, 13, 11, 15]]),
    (
        "2x2x1",
        "v4",
        4,
        (1, 4),
        (2, 2),
        [[0, 2, 1, 3, 4, 6, 5, 7], [8, 10, 9, 11, 12, 14, 13, 15]],
    ),
    (
        "2x4",
        "v6e",
        3,
        (1, 8),
        (3, 1),
        [
            [0, 2, 4, 6, 1, 3, 5, 7],
            [8, 10, 12, 14, 9, 11, 13, 15],
            [16, 18, 20, 22, 17, 19, 21, 23],
        ],
    ),
]


def test_every_host_of_every_slice_sees_the_whole_job():
    with xlasim.simulate("2x2x2", "v4", host_index=1, num_slices=2, slice_index=1):
        import torch_xla._internal.tpu as tpu
        import torch_xla.runtime as xr

        assert xr.global_runtime_device_count() == 16
        assert xr.addressable_runtime_device_count() == 4
        # 2 hosts per slice: host 1 of slice 1 is the job's 4th process, devices 12..15
        assert (xr.process_count(), xr.process_index()) == (4, 3)
        assert xr.host_index() == tpu.worker_id() == 1  # TPU_WORKER_ID is per slice
        assert xr.global_ordinal() == 12
        attrs = xr.global_runtime_device_attributes()
        assert [a["slice_index"] for a in attrs] == [0] * 8 + [1] * 8
        assert [a["name"] for a in attrs] == [f"TPU:{i}" for i in range(16)]
        # coords repeat per slice: each slice is its own torus
        assert [a["coords"] for a in attrs[8:]] == [a["coords"] for a in attrs[:8]]
        # a device's own attributes: the global entry less its name (torch_xla 2.9's
        # pjrt/test_runtime_tpu.py asserts the key sets of both)
        own = {k: v for k, v in attrs[13].items() if k != "name"}
        assert xr.runtime_device_attributes("TPU:13") == own


def test_device_attributes_match_the_documented_two_v4_8_slices():
    with xlasim.simulate(**V4_8_TWICE):
        import torch_xla.runtime as xr

        documented = [
            {"slice_index": s, "coords": [x, y, 0], "name": f"TPU:{4 * s + 2 * y + x}"}
            for s in range(2)
            for y in range(2)
            for x in range(2)
        ]
        got = xr.global_runtime_device_attributes()
        assert [{k: a[k] for k in ("slice_index", "coords", "name")} for a in got] == documented
        assert all(a["core_on_chip"] == 0 and a["num_cores"] == 1 for a in got)
        # printed in the documented key order
        assert list(got[0]) == ["num_cores", "core_on_chip", "slice_index", "coords", "name"]


def test_one_slice_reports_no_slice_index_and_no_megascale_variables():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla.runtime as xr

        assert "slice_index" not in xr.global_runtime_device_attributes()[0]
        assert not [k for k in os.environ if k.startswith("MEGASCALE_")]


def _megascale() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")}


def test_megascale_variables_are_rays_and_leave_with_the_simulation(monkeypatch):
    from ray.util.tpu import get_tpu_coordinator_env_vars

    rays = get_tpu_coordinator_env_vars(
        coordinator_address=f"localhost:{DEFAULT_MEGASCALE_PORT}", num_slices=3, slice_id=2
    )
    assert megascale_env(3, 2) == rays
    for key in _megascale():
        monkeypatch.delenv(key)
    with xlasim.simulate("2x2x1", "v4", num_slices=3, slice_index=2):
        assert _megascale() == rays
    assert _megascale() == {}
    # A coordinator the job was given (by Ray, by `xlasim run`) is kept; the slice is the
    # simulation's.
    monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "10.0.0.2:8081")
    monkeypatch.setenv("MEGASCALE_SLICE_ID", "0")
    with xlasim.simulate("2x2x1", "v4", num_slices=3, slice_index=2):
        assert _megascale() == {**rays, "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8081"}


@pytest.mark.parametrize(
    ("topology", "accelerator", "slices", "ici", "dcn", "expected"), REAL_HYBRID_MESHES
)
def test_hybrid_mesh_orders_devices_as_real_torch_xla(
    topology, accelerator, slices, ici, dcn, expected
):
    with xlasim.simulate(topology, accelerator, num_slices=slices, single_process=True):
        import torch_xla.distributed.spmd as xs

        mesh = xs.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn)
        assert mesh.get_logical_mesh().tolist() == expected


def test_hybrid_mesh_lays_out_chips_not_devices_as_real_torch_xla():
    # v7x chips hold 2 devices at one coordinate: real torch_xla 2.9 refuses this mesh so.
    with xlasim.simulate("2x2x1", "v7x", num_slices=2, single_process=True):
        import torch_xla.distributed.spmd as xs

        with pytest.raises(
            ValueError, match=r"physical mesh \(2, 2, 1\) does not match .* \(1, 8\)"
        ):
            xs.HybridMesh(ici_mesh_shape=(1, 8), dcn_mesh_shape=(2, 1))


def test_hybrid_mesh_needs_a_dcn_shape_across_slices():
    # torch_xla 2.9 xla_sharding.py: a multislice runtime without a dcn shape is refused.
    with xlasim.simulate(**V4_8_TWICE):
        import torch_xla.distributed.spmd as xs

        with pytest.raises(
            ValueError, match="Provide dcn_mesh_shape to create a mesh for multislice"
        ):
            xs.HybridMesh(ici_mesh_shape=(2, 4))
        with pytest.raises(ValueError, match="Number of slices 2 must equal the product"):
            xs.HybridMesh(ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1))


@pytest.mark.mat_mul_precision("highest")
def test_data_parallel_training_across_slices_gives_the_global_batch_losses():
    # 2 slices x 4 devices, data parallel over both: the same losses as one process on the
    # whole global batch (32 rows), which is what one 8-device slice gives too.
    with xlasim.simulate(**V4_8_TWICE):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.HybridMesh(
            ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "data")
        )
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1).to(torch_xla.device())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(2):
            xb, yb = x.to(torch_xla.device()), y.to(torch_xla.device())
            xs.mark_sharding(xb, mesh, (("dcn", "data"), None))
            xs.mark_sharding(yb, mesh, (("dcn", "data"), None))
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            torch_xla.sync()
            losses.append(loss.item())
        spec = torch_xla._XLAC._get_xla_sharding_spec(xb)
    assert losses == pytest.approx(eager_sgd(8)[0], rel=1e-6)
    assert spec == "{devices=[8,1]0,2,1,3,4,6,5,7}"


def test_a_shard_per_slice_sits_on_that_slices_chips_hbm():
    with xlasim.simulate(**V4_8_TWICE):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("s", "d"))
        t = torch.zeros(2, 1024, device=torch_xla.device())  # 8 KiB, one row per slice
        xs.mark_sharding(t, mesh, ("s", None))
        torch_xla.sync()
        rows = xlasim.chip_memory()
        assert [r["slice_index"] for r in rows] == [0] * 4 + [1] * 4
        assert {r["hbm_bytes"] for r in rows} == {parse_slice("2x2x1", "v4").hbm_bytes_per_chip}
        assert [r["bytes"] for r in rows] == [4096] * 8
        assert (t.sum() * 0 + (t + 1).sum()).item() == 2048.0  # a reduction across the slices


@pytest.mark.topology("2x2x1", "v4", num_slices=2)
def test_the_pytest_topology_mark_takes_a_slice_count(xlasim_sim):
    import torch_xla.runtime as xr

    assert (xlasim_sim.num_slices, xlasim_sim.num_devices, xlasim_sim.num_hosts) == (2, 8, 2)
    assert xr.global_runtime_device_count() == 8
    assert xr.global_runtime_device_attributes()[-1]["slice_index"] == 1


# -- bad input: one error each, naming the value and what is valid ------------------------------


def test_a_bad_slice_count_or_index_is_refused_before_anything_loads():
    with pytest.raises(
        ValueError, match=r"num_slices 0 is not valid: expected a whole number >= 1"
    ):
        xlasim.simulate("2x2x1", "v4", num_slices=0)
    with pytest.raises(TypeError, match=r"num_slices must be an int .* got str '2'"):
        xlasim.simulate("2x2x1", "v4", num_slices="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got float 2.0"):
        xlasim.simulate("2x2x1", "v4", num_slices=2.0)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"slice_index 2 is out of range for 2 slice\(s\): valid slice indices are 0..1",
    ):
        xlasim.simulate("2x2x1", "v4", num_slices=2, slice_index=2)


def test_slices_from_the_environment_xlasim_first_then_megascale():
    base = {"XLASIM_TOPOLOGY": "2x2x1", "XLASIM_ACCELERATOR": "v4"}
    got = config_from_env({**base, "XLASIM_NUM_SLICES": "2", "XLASIM_SLICE_INDEX": "1"})
    assert got is not None and (got["num_slices"], got["slice_index"]) == (2, 1)
    got = config_from_env({**base, "MEGASCALE_NUM_SLICES": "4", "MEGASCALE_SLICE_ID": "3"})
    assert got is not None and (got["num_slices"], got["slice_index"]) == (4, 3)
    with pytest.raises(
        EnvError, match=r"XLASIM_NUM_SLICES='0' is not valid: expected a whole number >= 1"
    ):
        config_from_env({**base, "XLASIM_NUM_SLICES": "0"})
    with pytest.raises(EnvError, match=r"XLASIM_NUM_SLICES='2' set without XLASIM_TOPOLOGY"):
        config_from_env({"XLASIM_NUM_SLICES": "2"})
    with pytest.raises(EnvError, match=r"XLASIM_NUM_SLICES='two' is not valid"):
        config_from_env({**base, "XLASIM_NUM_SLICES": "two"})
    with pytest.raises(
        EnvError,
        match=r"slice_index 2 is out of range for 2 slice\(s\): valid slice indices are 0..1",
    ):
        config_from_env({**base, "XLASIM_NUM_SLICES": "2", "XLASIM_SLICE_INDEX": "2"})


def test_mixed_generations_are_refused_naming_them():
    v4, v5p = parse_slice("2x2x1", "v4"), parse_slice("2x2x1", "v5p")
    assert check_same_generation([v4, v4]) == v4
    with pytest.raises(ValueError, match=r"the slices mix TPU generations \(v4 2x2x1, v5p 2x2x1\)"):
        check_same_generation([v4, v5p])
    with pytest.raises(ValueError, match=r"different topologies \(v4 2x2x1, v4 2x2x2\)"):
        check_same_generation([v4, parse_slice("2x2x2", "v4")])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--num-slices", "0"],
            "argument --num-slices: '0' is not valid: expected a whole number >= 1",
        ),
        (
            ["--num-slices", "x"],
            "argument --num-slices: 'x' is not valid: expected a whole number >= 1",
        ),
        (
            ["--num-slices", "2", "--slice-index", "2"],
            "slice_index 2 is out of range for 2 slice(s): valid slice indices are 0..1",
        ),
    ],
)
def test_the_cli_says_a_bad_slice_count_or_index_in_one_line(capsys, args, expected):
    argv = ["run", "--topology", "2x2x1", "--accelerator", "v4", *args, "--", "true"]
    try:
        code = commands.main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err


def test_describe_draws_every_slice_and_its_hosts_variables(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert commands.main(["describe", "2x2x1", "--accelerator", "v4", "--num-slices", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 x v4-8 (2x2x1)" in out
    assert "slice 0, z=0" in out and "slice 1, z=0" in out
    assert "TPU:7 (1,3)" in out  # global ids; the default mesh (data=2, model=4) spans slices
    assert "MEGASCALE_SLICE_ID=1" in out and "MEGASCALE_NUM_SLICES=2" in out


def test_describe_without_slices_is_unchanged(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert commands.main(["describe", "2x2x1", "--accelerator", "v4"]) == 0
    out = capsys.readouterr().out
    assert "slice 0" not in out and "MEGASCALE" not in out and "(data=4)" in out


# -- `xlasim run --num-slices`: one process per host of every slice -----------------------------

HYBRID_TRAIN = textwrap.dedent(
    """
    import os, torch, torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    n, count, me = xr.global_runtime_device_count(), xr.process_count(), xr.process_index()
    slices = int(os.environ["MEGASCALE_NUM_SLICES"])
    mesh = xs.HybridMesh(
        ici_mesh_shape=(1, n // slices), dcn_mesh_shape=(slices, 1), axis_names=("dcn", "data")
    )
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4 * n, 8, generator=g), torch.randn(4 * n, 1, generator=g)
    part = slice(me * x.shape[0] // count, (me + 1) * x.shape[0] // count)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(torch_xla.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spec = xs.ShardingSpec(mesh, (("dcn", "data"), None), minibatch=True)
    for step in range(2):
        xb, yb = xm.send_cpu_data_to_device([x[part], y[part]], torch_xla.device(), spec)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        torch_xla.sync()
        print(f"slice {os.environ['MEGASCALE_SLICE_ID']} process {me} of {count} loss "
              f"{loss.item()!r}", flush=True)
    """
)


@pytest.mark.mat_mul_precision("highest")
def test_xlasim_run_starts_every_host_of_every_slice_and_trains_on_the_global_batch():
    # The one host of each slice feeds its half of the global batch; the losses are those of
    # one slice (or eager CPU) on the whole global batch.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "MEGASCALE_"))}
    env["XLASIM_MAT_MUL_PRECISION"] = "highest"
    out = subprocess.run(
        [sys.executable, "-m", "xlasim", "run", "--topology", "2x2x1", "--accelerator", "v4",
         "--num-slices", "2", "--all-output", "--", sys.executable, "-c", HYBRID_TRAIN],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    by_process = {
        p: [float(x.rsplit(" ", 1)[1]) for x in lines if f"] slice {p} process {p} of 2" in x]
        for p in (0, 1)
    }
    assert by_process[0] == by_process[1]
    assert by_process[0] == pytest.approx(eager_sgd(8)[0], rel=1e-6)


# -- the pytest plugin's option -------------------------------------------------------------------


def _inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    installed = any(
        ep.value == "xlasim.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    load = [] if installed else ["-p", "xlasim.pytest_plugin"]
    return pytester.runpytest(*load, "-p", "no:cacheprovider", "-p", "no:randomly", "-rA", *args)


def test_the_num_slices_option_is_checked_and_reaches_the_targets(pytester):
    pytester.makepyfile(
        """
        def test_a(xla_target):
            assert xla_target.num_slices == 2 and xla_target.num_hosts == 2
        """
    )
    # The real targets run one slice: they skip, saying why (no subprocess is started).
    result = _inner(pytester, "--topology", "2x2x1", "--accelerator", "v4", "--num-slices",
                    "2", "--xla-targets", "xla_cpu,tpu")  # fmt: skip
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*it runs on one slice, and this test asks for 2 slices*"])
    bad = _inner(pytester, "--num-slices", "0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--num-slices '0' is not valid: expected a whole number >= 1*"])
