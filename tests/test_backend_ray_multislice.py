"""tpu_backend.TorchTrainer across two simulated slices (2 x v4-8, one host each) on a fake-TPU
Ray cluster: each worker gets Ray's MEGASCALE_* variables for its slice, the default mesh is a
HybridMesh data parallel across the slices, and the losses are those of one slice with the
same global batch (here one 8-device v4-16 simulated in this process, the demo's own loop)."""

from __future__ import annotations

import pytest
from global_batch import demo_losses_on_one_slice

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
    assert [(r["slice_index"], r["host_index"], r["process_index"]) for r in records] == [
        (0, 0, 0),
        (1, 0, 1),
    ]
    for r in records:
        assert r["megascale_slice_id"] == str(r["slice_index"])
        assert (r["process_count"], r["global_devices"], r["addressable_devices"]) == (2, 8, 4)
        assert r["mesh_shape"] == [2, 4] and r["axis_names"] == ["data", "model"]
        # HybridMesh(ici (1, 4), dcn (2, 1)): real torch_xla 2.9's order (tests/test_multislice.py)
        assert r["mesh_device_ids"] == [0, 2, 1, 3, 4, 6, 5, 7]
    assert records[0]["losses"] == records[1]["losses"]
    assert records[0]["losses"] == pytest.approx(demo_losses_on_one_slice(STEPS, BATCH), rel=1e-5)
