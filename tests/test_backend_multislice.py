"""The backend across slices (``TPUTorchConfig(num_slices=N)``), checked on the driver: the
config against the slice, and which worker is which host of which slice.  No Ray cluster.

Where the facts come from: Ray 2.60 numbers a multislice run's slices by worker rank over
workers sorted by slice (``ray.train.torch.config._setup_tpu_multislice``) and gives each worker
``ray.util.tpu.get_tpu_coordinator_env_vars``; PJRT numbers the job's processes slice by slice
(torch_xla 2.9 ``docs/source/perf/spmd_basic.md``: slice 1 of 2 v4-8 holds devices 4..7).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray.train")

from ray.train import ScalingConfig  # noqa: E402

import tpu_backend  # noqa: E402
from tpu_backend.bootstrap import BootstrapError, HostProbe, assign_slices  # noqa: E402
from tpu_backend.config import TPUTorchConfig  # noqa: E402
from tpu_backend.topology import parse_slice  # noqa: E402

V4_16 = parse_slice("2x2x2", "v4")


def _scaling(workers: int, topology: str = "2x2x2") -> ScalingConfig:
    return ScalingConfig(
        use_tpu=True, topology=topology, accelerator_type="TPU-V4", num_workers=workers
    )


def _probe(slice_name: str | None, worker: str, accel: str | None = None) -> HostProbe:
    return HostProbe(
        worker_id_env=worker,
        worker_id_label=None,
        worker_id_metadata=None,
        slice_name=slice_name,
        node_ip=f"10.0.{slice_name or 'x'}.{worker}",
        hostname=f"{slice_name}-{worker}",
        tpu_ids=("0", "1", "2", "3"),
        env_accelerator_type=accel,
        env_topology="2x2x2" if accel else None,
        pid=1,
    )


def test_workers_are_hosts_times_slices_and_the_default_mesh_is_data_parallel_across():
    resolved = TPUTorchConfig(num_slices=2).resolve(_scaling(4))
    assert resolved.num_workers == 4
    assert resolved.mesh is not None
    assert (resolved.mesh.shape, resolved.mesh.axis_names) == ((4, 4), ("data", "model"))
    override = TPUTorchConfig(num_slices=2, mesh_shape=(16,), axis_names=("fsdp",))
    assert override.resolve(_scaling(4)).mesh.shape == (16,)  # type: ignore[union-attr]
    assert TPUTorchConfig(num_slices=3).to_dict()["num_slices"] == 3
    # the trainer takes it (Ray's own TorchTrainer would rewrite use_tpu to tpu_dist)
    tpu_backend.TorchTrainer(
        lambda: None, torch_config=TPUTorchConfig(num_slices=2), scaling_config=_scaling(4)
    )


@pytest.mark.parametrize(
    ("kwargs", "workers", "error", "pattern"),
    [
        (
            dict(num_slices=0),
            4,
            ValueError,
            r"num_slices 0 is not valid: expected a whole number >= 1",
        ),
        (dict(num_slices="2"), 4, TypeError, r"num_slices must be an int .* got str '2'"),
        (dict(num_slices=2, spmd=False), 16, ValueError, r"num_slices=2 needs spmd=True"),
        (
            dict(num_slices=2),
            2,
            ValueError,
            r"num_workers=2 does not match 2 x v4-16 \(2x2x2\), which has 4 host\(s\).*"
            r"num_workers=4",
        ),
        (
            dict(num_slices=2, mesh_shape=(2, 4)),
            4,
            ValueError,
            r"mesh_shape \(2, 4\) covers 8 devices but the slice 2 x v4-16 \(2x2x2\) has 16",
        ),
    ],
)
def test_bad_multislice_configs_fail_on_the_driver(kwargs, workers, error, pattern):
    with pytest.raises(error, match=pattern):
        TPUTorchConfig(**kwargs).resolve(_scaling(workers))


def test_one_slice_worth_of_extra_workers_points_at_num_slices():
    with pytest.raises(ValueError, match=r"set TPUTorchConfig\(num_slices=2\)"):
        TPUTorchConfig().resolve(_scaling(4))


def test_slices_by_name_then_hosts_by_worker_id():
    # Ray ranks in any order: slice 'b' sorts after 'a', so its hosts are processes 2 and 3.
    probes = [_probe("b", "1"), _probe("a", "0"), _probe("b", "0"), _probe("a", "1")]
    got = assign_slices(probes, V4_16, 2)
    assert [(a.slice_index, a.host_index, a.process_index) for a in got] == [
        (1, 1, 3),
        (0, 0, 0),
        (1, 0, 2),
        (0, 1, 1),
    ]
    assert {a.process_count for a in got} == {4}
    # the compilation cache tells hosts apart by their number in the whole run
    assert [a.job_host for a in got] == [3, 0, 2, 1]


def test_slice_assignment_errors_name_what_is_wrong():
    with pytest.raises(BootstrapError, match=r"has no TPU slice name"):
        assign_slices([_probe(None, "0"), _probe("a", "0")], V4_16, 2)
    with pytest.raises(BootstrapError, match=r"run on 1 TPU slice\(s\) \(a\) .* num_slices=2"):
        assign_slices([_probe("a", "0"), _probe("a", "1")], V4_16, 2)
    with pytest.raises(BootstrapError, match=r"expected each of 0..1 exactly once"):
        assign_slices(
            [_probe("a", "0"), _probe("a", "0"), _probe("b", "0"), _probe("b", "1")], V4_16, 2
        )
    with pytest.raises(ValueError, match=r"the slices mix TPU generations \(v4 2x2x2, v5p 2x2x2\)"):
        assign_slices(
            [_probe("a", "0", "v4-16"), _probe("a", "1", "v4-16"), _probe("b", "0", "v5p-16"),
             _probe("b", "1", "v5p-16")],
            V4_16,
            2,
        )  # fmt: skip
