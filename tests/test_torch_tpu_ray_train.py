"""Ray 2.60's own ``ray.train.torch.TorchTrainer`` with TPU workers, on simulated v6e slices:
one host of 8 chips (2x4) and four hosts of 4 (4x4).

Nothing of the project stands between Ray and the simulated TorchTPU: a ScalingConfig with
``use_tpu=True`` and ``{"TPU": 1}`` per worker makes Ray pick its ``tpu_dist`` backend
(``ray/train/torch/config.py``), load TorchTPU through ``torch_tpu._loader.load()`` and ask its
TPU device manager for ``torch.device("tpu")`` (``ray/air/_internal/device_manager/tpu.py``);
Ray gives each worker one chip through ``TPU_VISIBLE_CHIPS``. The workers' DDP losses are
compared with an eager CPU run of the same global batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("ray.train")

import torch_tpu_ddp  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402
from shared_clusters import CPUS_PER_HOST  # noqa: E402

from xlasim.ray.cluster import fit_with_deadline  # noqa: E402

FIT_TIMEOUT_S = 300
# One Ray cluster at a time on this machine: xdist runs the "ray" group on one worker.
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("ray"),
    pytest.mark.skipif(
        torch.__version__ < "2.11",
        reason=f"TorchTPU 0.2.0 needs torch >= 2.11, this is {torch.__version__}",
    ),
]


# (topology, hosts, chips per host) of the v6e slices Ray runs a worker per chip on.
# The v6e-16 first: tests/test_backend_ray_multi_host.py ends on it, and
# tests/test_backend_ray_single_host.py (next) starts on the v6e-8 (see conftest.RAY_MODULES).
SLICES = [
    pytest.param("4x4", 4, 4, id="v6e-16"),
    pytest.param("2x4", 1, 8, id="v6e-8"),
]


@pytest.mark.parametrize(("topology", "hosts", "chips"), SLICES)
def test_torch_trainer_trains_ddp_over_tpu_dist(
    tpu_clusters: Any, tmp_path: Path, topology: str, hosts: int, chips: int
) -> None:
    import ray.cloudpickle

    # Ray Train gives every worker a CPU beside its chip: each host has one per chip.
    assert CPUS_PER_HOST[topology] == chips
    tpu_clusters.get(topology, "v6e", num_cpus_per_host=chips, startup_timeout_s=120)
    # Workers cannot import the tests' modules: ship the loop by value.
    ray.cloudpickle.register_pickle_by_value(torch_tpu_ddp)
    trainer = TorchTrainer(
        torch_tpu_ddp.train_loop,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ScalingConfig(
            use_tpu=True,
            topology=topology,
            accelerator_type="TPU-V6E",
            num_workers=hosts * chips,
            resources_per_worker={"TPU": 1},
        ),
        run_config=RunConfig(storage_path=str(tmp_path / "ray_results")),
    )
    fit_with_deadline(trainer, FIT_TIMEOUT_S)
    torch_tpu_ddp.check_records(tmp_path, hosts, chips)


def test_multi_slice_worker_counts_are_refused_as_ray_does() -> None:
    # Ray 2.60 (ray/train/v2/api/config.py): TPU workers come in whole slices, 8 on a v6e 2x4.
    with pytest.raises(ValueError, match=r"must be a multiple of 8 for the specified topology"):
        ScalingConfig(
            use_tpu=True,
            topology="2x4",
            accelerator_type="TPU-V6E",
            num_workers=12,
            resources_per_worker={"TPU": 1},
        )
