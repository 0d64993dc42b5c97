"""torch_xla.experimental.distributed_checkpoint: sharded state_dicts through
torch.distributed.checkpoint, the SPMD planners' plans, and CheckpointManager.

Every expected value here was read from real torch_xla 2.9 on PJRT CPU (4 devices,
``xr.use_spmd()``).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch


def _mesh(xla_target, shape):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    return xs.Mesh(np.arange(4), shape)


def _linear(mesh, spec, seed):
    import torch_xla.distributed.spmd as xs

    torch.manual_seed(seed)
    layer = torch.nn.Linear(7, 6).to("xla")  # 6 rows over 4 devices: the last shard is padding
    xs.mark_sharding(layer.weight, mesh, spec)
    return layer


def test_reshards_on_load_and_updates_the_parameters(xla_target, tmp_path):
    import torch.distributed.checkpoint as dist_cp
    import torch_xla
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner

    rows = _linear(_mesh(xla_target, (4, 1)), (0, None), seed=1)
    cols = _linear(_mesh(xla_target, (1, 4)), (None, 1), seed=2)
    spec_before = torch_xla._XLAC._get_xla_sharding_spec(cols.weight)
    assert not torch.equal(rows.weight.cpu(), cols.weight.cpu())
    with pytest.warns(UserWarning, match="set_up_planner has been updated"):
        dist_cp.save(
            rows.state_dict(),
            storage_writer=dist_cp.FileSystemWriter(str(tmp_path)),
            planner=SPMDSavePlanner(),
        )
    dist_cp.load(
        cols.state_dict(),
        storage_reader=dist_cp.FileSystemReader(str(tmp_path)),
        planner=SPMDLoadPlanner(),
    )
    # loaded in place through the state_dict's detached entries: the parameters see it
    assert torch.equal(cols.weight.cpu(), rows.weight.cpu())
    assert torch.equal(cols.bias.cpu(), rows.bias.cpu())
    assert torch_xla._XLAC._get_xla_sharding_spec(cols.weight) == spec_before
    # what was written is the global tensor: a plain CPU load reads it back whole
    plain = {"weight": torch.zeros(6, 7), "bias": torch.zeros(6)}
    dist_cp.load(plain, storage_reader=dist_cp.FileSystemReader(str(tmp_path)))
    assert torch.equal(plain["weight"], rows.weight.cpu())


def test_save_plan_has_one_item_per_local_shard(xla_target):
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    layer = _linear(_mesh(xla_target, (4, 1)), (0, None), seed=3)
    planner = SPMDSavePlanner()
    planner.set_up_planner({"layer": layer.state_dict(), "step": 5}, True)
    assert sorted(planner.sharded_state_dict) == ["layer.weight"]
    assert sorted(planner.unsharded_state_dict) == ["layer.bias", "step"]
    assert planner.mappings["layer.weight"] == ("layer", "weight")
    plan = planner.create_local_plan()
    shards = [item for item in plan.items if item.index.fqn == "layer.weight"]
    # the padding device (rows 6..7 of 8) still has an (empty) item
    assert [tuple(i.index.offset) for i in shards] == [(0, 0), (2, 0), (4, 0), (6, 0)]
    assert [tuple(i.tensor_data.chunk.sizes) for i in shards] == [(2, 7), (2, 7), (2, 7), (0, 7)]
    assert {i.type for i in shards} == {WriteItemType.SHARD}
    assert {tuple(i.tensor_data.size) for i in shards} == {(6, 7)}
    step = next(item for item in plan.items if item.index.fqn == "step")
    assert step.type == WriteItemType.BYTE_IO

    data = planner.resolve_data(shards[1])
    assert torch.equal(data, layer.weight.cpu()[2:4])
    with pytest.raises(AssertionError, match="WriteItem has already been processed"):
        planner.resolve_data(shards[1])


def test_replicated_tensors_are_left_to_the_default_planner(xla_target):
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner

    layer = _linear(_mesh(xla_target, (1, 4)), (None, None), seed=4)
    planner = SPMDSavePlanner()
    planner.set_up_planner(layer.state_dict(), True)
    assert planner.sharded_state_dict == {}
    assert sorted(planner.unsharded_state_dict) == ["bias", "weight"]
    assert len(planner.create_local_plan().items) == 2
    assert SPMDLoadPlanner().metadata is None  # until set_up_planner is given one


def test_sharded_cpu_state_dict(xla_target):
    from torch_xla.experimental.distributed_checkpoint._helpers import (
        _CpuShards,
        _sharded_cpu_state_dict,
    )

    layer = _linear(_mesh(xla_target, (4, 1)), (0, None), seed=5)
    host = _sharded_cpu_state_dict({"model": layer.state_dict(), "note": "kept"})
    assert host["note"] == "kept"
    weight = host["model"]["weight"]
    assert isinstance(weight, _CpuShards) and weight.global_shape == torch.Size([6, 7])
    assert [s.data.device.type for s in weight.shards] == ["cpu"] * 4
    assert [s.indices for s in weight.shards][3] == [slice(6, 6, 1), slice(0, 7, 1)]
    assert torch.equal(weight.shards[0].unpadded_data, layer.weight.cpu()[:2])
    assert host["model"]["bias"].device == torch.device("cpu")


@pytest.fixture
def process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", world_size=1, rank=0)
    yield
    dist.destroy_process_group()


def test_manager_tracks_prunes_and_restores(xla_target, tmp_path, process_group):
    from torch_xla.experimental.distributed_checkpoint import CheckpointManager

    mesh = _mesh(xla_target, (4, 1))
    saved = _linear(mesh, (0, None), seed=6).state_dict()
    root = str(tmp_path / "ckpt")
    manager = CheckpointManager(root, save_interval=5, max_to_keep=2, chkpt_on_preemption=False)
    assert manager.all_steps() == []
    assert manager.save(3, saved) is False
    assert [manager.save(s, saved) for s in (5, 10)] == [True, True]
    assert manager.save(4, saved, force=True) is True
    # the oldest by creation time goes, whatever its step
    assert manager.all_steps() == [4, 10]
    assert sorted(os.listdir(root)) == ["10", "4"]
    assert ".manager_metadata" in os.listdir(os.path.join(root, "10"))

    target = _linear(mesh, (0, None), seed=7).state_dict()
    with pytest.raises(AssertionError, match=r"Cannot restore from untracked step 5\. Valid"):
        manager.restore(5, target)
    again = CheckpointManager(root, save_interval=5, chkpt_on_preemption=False)
    assert again.all_steps() == [4, 10]
    again.restore(10, target)
    assert all(torch.equal(v.cpu(), target[k].cpu()) for k, v in saved.items())

    assert again.save_async(15, saved) is True
    assert again.save_async(16, saved) is False
    again.join()
    assert again.all_steps() == [4, 10, 15]
    with pytest.raises(AssertionError, match="Preemption detection not enabled"):
        again.reached_preemption(15)


def test_background_save_runs_the_managers_save(xla_target, tmp_path, process_group):
    # save_async hands the instance's ``_save`` to its worker (torch_xla's name: pytorch/xla's
    # own tests hold a background save by replacing it on the instance).
    import threading

    from torch_xla.experimental.distributed_checkpoint import CheckpointManager

    saved = _linear(_mesh(xla_target, (4, 1)), (0, None), seed=8).state_dict()
    manager = CheckpointManager(str(tmp_path), save_interval=10, chkpt_on_preemption=False)
    release = threading.Event()
    original = manager._save

    def held(*args, **kwargs):
        release.wait(timeout=60)
        original(*args, **kwargs)

    manager._save = held
    assert manager.save_async(10, saved) is True
    del manager._save
    assert manager.all_steps() == []
    release.set()
    manager.join()
    assert manager.all_steps() == [10]


def test_manager_needs_a_process_group(xla_target, tmp_path):
    from torch_xla.experimental.distributed_checkpoint import CheckpointManager

    _mesh(xla_target, (4, 1))
    with pytest.raises(AssertionError, match="A process group is required."):
        CheckpointManager(str(tmp_path), save_interval=1)


def test_preemption_sync_point_is_one_step_after_sigterm(xla_target):
    import time

    import torch_xla

    xlac = torch_xla._XLAC
    _mesh(xla_target, (4, 1))
    xlac._ensure_xla_coordinator_initialized(global_rank=0, world_size=1, master_addr="localhost")
    xlac._activate_preemption_sync_manager()
    try:
        assert [xlac._sync_point_reached(step) for step in range(3)] == [False] * 3
        os.kill(os.getpid(), signal.SIGTERM)
        # torch_xla hears of the signal asynchronously: poll, bounded at 20 steps / ~10 s
        reached = []
        for step in range(10, 30):
            if xlac._sync_point_reached(step):
                reached.append(step)
                break
            time.sleep(0.5)
        assert len(reached) == 1, "no sync point within 20 steps (~10 s) of SIGTERM"
        # the sync point is a single step: the ones after it are not
        assert [xlac._sync_point_reached(s) for s in range(40, 43)] == [False] * 3
    finally:
        xlac._deactivate_preemption_sync_manager()
    with pytest.raises(RuntimeError, match="A PreemptionSyncManager has not been registered"):
        xlac._sync_point_reached(50)
