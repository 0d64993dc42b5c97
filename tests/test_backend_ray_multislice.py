"""tpu_backend.TorchTrainer across two simulated slices (2 x v4-8, one host each) on a fake-TPU
Ray cluster: each worker gets Ray's MEGASCALE_* variables for its slice, the default mesh is a
HybridMesh data parallel across the slices, and the losses are those of one slice with the
same global batch (here one 8-device v4-16 simulated in this process, the demo's own loop)."""

from __future__ import annotations

import pytest
from global_batch import check_two_slice_records

pytest.importorskip("ray.train")

from xlasim.cli import demo  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]

STEPS, BATCH = 2, 32


def test_two_slices_train_as_one_slice_of_the_same_global_batch(tpu_clusters, tmp_path):
    cluster = tpu_clusters.get("2x2x1", "v4", num_slices=2, startup_timeout_s=180)
    assert cluster.num_hosts == 2
    _, records = demo.run(
        "2x2x1",
        "v4",
        steps=STEPS,
        batch=BATCH,
        num_slices=2,
        out_dir=str(tmp_path / "records"),
        storage_path=str(tmp_path / "ray_results"),
        fit_timeout_s=600,
    )
    check_two_slice_records(records, STEPS, BATCH)
