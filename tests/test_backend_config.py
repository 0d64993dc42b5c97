"""TPUTorchConfig / TorchTrainer selection and every config error, checked on the driver
(no Ray cluster is started here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray.train")

from ray.train import ScalingConfig  # noqa: E402
from ray.train.torch import TorchConfig  # noqa: E402
from ray.train.torch import TorchTrainer as RayTorchTrainer  # noqa: E402

import tpu_backend  # noqa: E402
from tpu_backend.config import TPUTorchConfig, TPUXLABackend  # noqa: E402
from tpu_backend.mesh import plan_mesh  # noqa: E402
from tpu_backend.topology import default_mesh, parse_slice  # noqa: E402


def tpu_scaling(topology: str, accel: str, workers: int, **kw) -> ScalingConfig:
    return ScalingConfig(
        use_tpu=True, topology=topology, accelerator_type=accel, num_workers=workers, **kw
    )


def noop() -> None:
    pass


# -- selection ------------------------------------------------------------------------------


def test_ray_trainer_rewrites_use_tpu_to_tpu_dist_and_ours_does_not():
    # The problem this backend exists for: Ray mutates the caller's config to torch_tpu.
    theirs = TorchConfig()
    RayTorchTrainer(noop, torch_config=theirs, scaling_config=tpu_scaling("2x2x2", "TPU-V4", 2))
    assert theirs.backend == "tpu_dist"

    mine = TorchConfig(timeout_s=77)
    trainer = tpu_backend.TorchTrainer(
        noop, torch_config=mine, scaling_config=tpu_scaling("2x2x2", "TPU-V4", 2)
    )
    assert mine.backend is None  # the caller's object is untouched
    cfg = trainer.backend_config
    assert isinstance(cfg, TPUTorchConfig)
    assert cfg.backend == "gloo" and cfg.spmd is True and cfg.timeout_s == 77
    assert cfg.backend_cls is TPUXLABackend


def test_no_torch_config_on_tpu_selects_xla_backend():
    trainer = tpu_backend.TorchTrainer(noop, scaling_config=tpu_scaling("4x4", "TPU-V6E", 4))
    assert isinstance(trainer.backend_config, TPUTorchConfig)
    assert trainer.backend_config.backend_cls is TPUXLABackend


def test_plain_ray_trainer_keeps_an_explicit_tpu_config():
    cfg = TPUTorchConfig()
    trainer = RayTorchTrainer(
        noop, torch_config=cfg, scaling_config=tpu_scaling("2x2x2", "TPU-V4", 2)
    )
    assert trainer.backend_config is cfg
    assert cfg.backend == "gloo"


def test_cpu_runs_are_left_alone():
    trainer = tpu_backend.TorchTrainer(noop, scaling_config=ScalingConfig(num_workers=2))
    assert type(trainer.backend_config) is TorchConfig
    assert trainer.backend_config.backend == "gloo"


def test_tpu_dist_is_refused_by_our_trainer():
    with pytest.raises(ValueError, match="'tpu_dist'.*torch_xla"):
        tpu_backend.TorchTrainer(
            noop,
            torch_config=TorchConfig(backend="tpu_dist"),
            scaling_config=tpu_scaling("2x2x2", "TPU-V4", 2),
        )


# -- defaults and mesh plans ------------------------------------------------------------------


@pytest.mark.parametrize(
    "topology, accel, workers, shape, axes",
    [
        ("2x2x2", "TPU-V4", 2, (2, 4), ("data", "model")),
        ("4x4", "TPU-V6E", 4, (4, 4), ("data", "model")),
        ("2x4", "TPU-V6E", 1, (8,), ("data",)),
        ("2x2x4", "TPU-V4", 4, (4, 4), ("data", "model")),
    ],
)
def test_default_mesh_per_slice(topology, accel, workers, shape, axes):
    resolved = TPUTorchConfig().resolve(tpu_scaling(topology, accel, workers))
    assert resolved.mesh.shape == shape
    assert resolved.mesh.axis_names == axes
    assert resolved.mesh.source == "default"
    assert resolved.spec.num_hosts == workers


def test_default_mesh_agrees_with_topology_model():
    for topology, accel in [
        ("2x2x2", "v4"),
        ("4x4", "v6e"),
        ("2x4", "v6e"),
        ("4x4", "v2"),
        ("2x2x1", "v5p"),
        ("8x8", "v5litepod"),
    ]:
        spec = parse_slice(topology, accel)
        plan = plan_mesh(spec.num_devices, spec.num_hosts)
        assert (plan.shape, plan.axis_names) == default_mesh(spec)


def test_mesh_override_and_seed_keys():
    sc = tpu_scaling("4x4", "TPU-V6E", 4)
    plan = TPUTorchConfig(mesh_shape=(2, 8), axis_names=("dp", "tp")).resolve(sc).mesh
    assert (plan.shape, plan.axis_names, plan.source) == ((2, 8), ("dp", "tp"), "mesh_shape")
    plan = TPUTorchConfig(mesh_shape=[16]).resolve(sc).mesh
    assert (plan.shape, plan.axis_names) == ((16,), ("data",))
    plan = (
        TPUTorchConfig(xla_spmd_config={"data_parallel_size": 8, "model_parallel_size": 2})
        .resolve(sc)
        .mesh
    )
    assert (plan.shape, plan.axis_names, plan.source) == (
        (8, 2),
        ("data", "model"),
        "xla_spmd_config",
    )
    plan = TPUTorchConfig(xla_spmd_config={"model_parallel_size": 4}).resolve(sc).mesh
    assert plan.shape == (4, 4)
    plan = (
        TPUTorchConfig(
            mesh_shape=(2, 8), xla_spmd_config={"mesh_shape": (2, 8), "partitioning_mode": "manual"}
        )
        .resolve(sc)
        .mesh
    )
    assert plan.shape == (2, 8)


def test_to_dict_carries_the_xla_settings():
    d = TPUTorchConfig(mesh_shape=(2, 4)).to_dict()
    assert d["backend"] == "gloo" and d["spmd"] is True and d["mesh_shape"] == (2, 4)


# -- every inconsistent combination fails on the driver -----------------------------------------


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"backend": "xla"}, "'xla' is not valid with spmd=True.*CPU process group"),
        ({"backend": "tpu_dist"}, "'tpu_dist' is not valid with spmd=True"),
        ({"backend": "nccl"}, "'nccl' is not valid"),
        ({"spmd": False, "backend": "gloo"}, "'gloo' is not valid with spmd=False"),
        ({"init_method": "xla"}, "init_method 'xla' is not valid with spmd=True"),
        ({"spmd": False, "init_method": "env"}, "init_method 'env' is not valid with spmd=False"),
        ({"spmd": False, "mesh_shape": (8,)}, "mesh_shape need.*SPMD"),
        ({"spmd": "yes"}, "spmd 'yes' is not valid"),
        ({"mesh_shape": (2, 0)}, r"mesh_shape \(2, 0\) is not valid"),
        ({"mesh_shape": "2x4"}, "mesh_shape '2x4' is not valid"),
        ({"mesh_shape": (2, 2, 2)}, "3 dimensions; name them with axis_names"),
        ({"mesh_shape": (2, 4), "axis_names": ("data",)}, "1 names but the mesh"),
        ({"mesh_shape": (2, 4), "axis_names": ("a", "a")}, "must be unique"),
        ({"xla_spmd_config": {"dp": 2}}, "unknown key.*'dp'.*valid keys: mesh_shape"),
        ({"xla_spmd_config": {"partitioning_mode": "magic"}}, "'magic' is not valid"),
        ({"xla_spmd_config": {"mesh_shape": (2, 4), "data_parallel_size": 4}}, "contradicts"),
        ({"mesh_shape": (2, 4), "xla_spmd_config": {"mesh_shape": (4, 2)}}, "contradicts"),
        (
            {"mesh_shape": (2, 4), "xla_spmd_config": {"partitioning_mode": "auto"}},
            "'auto'.*cannot be combined",
        ),
        ({"timeout_s": 0}, "timeout_s 0 is not valid"),
        ({"bootstrap_timeout_s": -1}, "bootstrap_timeout_s -1 is not valid"),
        ({"topology": "4x"}, "topology '4x' is not valid"),
        ({"topology": "2x2x2"}, "3-D.*no accelerator"),
        ({"accelerator": "v9"}, "unknown accelerator 'v9'"),
        ({"pjrt_device": "GPU"}, "pjrt_device 'GPU' is not valid"),
        ({"compilation_cache_readonly": "maybe"}, "compilation_cache_readonly 'maybe'"),
        ({"compilation_cache_readonly": 1}, "compilation_cache_readonly 1 is not valid"),
    ],
)
def test_bad_config_alone(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        TPUTorchConfig(**kwargs)


@pytest.mark.parametrize(
    "config, scaling, pattern",
    [
        # topology/accelerator mismatch between the config and the ScalingConfig
        (dict(topology="4x4", accelerator="v6e"), ("2x4", "TPU-V6E", 1), "contradicts"),
        (dict(accelerator="v5p"), ("2x2x2", "TPU-V4", 2), "accelerator 'v5p' contradicts"),
        # worker count vs hosts
        ({}, ("4x4", "TPU-V6E", 8), r"num_workers=8 does not match v6e-16.*4 host.*2 slices"),
        (dict(spmd=False), ("2x2x2", "TPU-V4", 2), "which has 8 chips.*one process per chip"),
        # mesh that does not cover the devices
        (
            dict(mesh_shape=(2, 2)),
            ("2x2x2", "TPU-V4", 2),
            r"mesh_shape \(2, 2\) covers 4 devices but the slice v4-16 \(2x2x2\) has 8",
        ),
        (
            dict(xla_spmd_config={"data_parallel_size": 3}),
            ("4x4", "TPU-V6E", 4),
            "data_parallel_size=3 does not divide the 16",
        ),
        (
            dict(xla_spmd_config={"data_parallel_size": 4, "model_parallel_size": 2}),
            ("4x4", "TPU-V6E", 4),
            r"covers 8 devices .* has 16",
        ),
        (dict(axis_names=("a", "b", "c")), ("2x2x2", "TPU-V4", 2), "3 names but the default mesh"),
    ],
)
def test_bad_config_against_slice(config, scaling, pattern):
    topology, accel, workers = scaling
    with pytest.raises(ValueError, match=pattern):
        tpu_backend.TorchTrainer(
            noop,
            torch_config=TPUTorchConfig(**config),
            scaling_config=tpu_scaling(topology, accel, workers),
        )


def test_tpu_resources_per_worker_must_be_whole_host():
    with pytest.raises(ValueError, match="TPU=1 does not match.*4 chips"):
        TPUTorchConfig().resolve(_Layout("2x2x2", "TPU-V4", 2, {"TPU": 1}))


def test_elastic_worker_count_is_refused():
    with pytest.raises(ValueError, match="elastic"):
        TPUTorchConfig().resolve(_Layout("2x2x2", "TPU-V4", (2, 4), {"TPU": 4}))


def test_multi_worker_without_slice_is_refused():
    with pytest.raises(ValueError, match="needs a slice"):
        TPUTorchConfig().resolve(ScalingConfig(num_workers=2))


class _Layout:
    def __init__(self, topology, accel, workers, resources):
        self.topology, self.accelerator_type = topology, accel
        self.num_workers, self.resources_per_worker, self.use_tpu = workers, resources, True


# -- training-function API outside a training function ----------------------------------------


@pytest.mark.parametrize("api", ["get_xla_mesh", "is_xla_backend", "get_xla_worker_state"])
def test_context_api_outside_training_function(api):
    with pytest.raises(RuntimeError, match=f"tpu_backend.{api}.*inside a Ray Train training"):
        getattr(tpu_backend, api)()


def test_import_is_light():
    code = textwrap.dedent(
        """
        import sys, tpu_backend
        heavy = [m for m in ("ray", "torch", "torch_xla", "xlasim") if m in sys.modules]
        print(",".join(heavy))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == ""


def _gloo_pair(timeout_s: float):
    import datetime
    import threading

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    master = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    other = dist.TCPStore("127.0.0.1", master.port, 2, is_master=False)
    groups = {}
    joiner = threading.Thread(
        target=lambda: groups.update({1: dist.ProcessGroupGloo(other, 1, 2, timeout)})
    )
    joiner.start()
    groups[0] = dist.ProcessGroupGloo(master, 0, 2, timeout)
    joiner.join(timeout=60)
    assert 1 in groups, "the second gloo rank did not join within 60 s"
    return groups


def test_a_collective_timeout_names_the_setting_that_bounds_it():
    import torch

    groups = _gloo_pair(timeout_s=1)
    context = TPUTorchConfig(timeout_s=1).train_func_context
    # rank 1 never joins the all-reduce: gloo gives up after the group's timeout
    with pytest.raises(RuntimeError) as info, context():
        groups[0].allreduce([torch.ones(1)]).wait()
    text = str(info.value)
    assert "Timed out waiting 1000ms for recv operation" in text  # gloo's own words first
    assert "waited TPUTorchConfig(timeout_s=1) seconds for a host that did not join" in text


def test_other_errors_of_the_training_function_pass_unchanged():
    with pytest.raises(ValueError, match=r"^bad batch$"), TPUTorchConfig().train_func_context():
        raise ValueError("bad batch")
    with pytest.raises(RuntimeError, match=r"^boom$"), TPUTorchConfig().train_func_context():
        raise RuntimeError("boom")
