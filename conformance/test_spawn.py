"""``xmp.spawn`` / ``torch_xla.launch`` on a one-device host, as real torch_xla 2.9 runs them.

On a one-chip TPU host (and on the PJRT CPU client with one device) torch_xla starts one
process for the function, with global ordinal 0 in a world of one; a process's exception is
raised in the launching process with the child's traceback as its cause.  (With several CPU
devices torch_xla runs one thread per device in one process, which the simulator does not
simulate; several chips, one process each, are tested in tests/test_spawn_sim.py.)

The functions run in the children, so they live at module level, where a child can import them.
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")


def _facts(index: int, launcher_pid: int, path: str) -> None:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    t = torch.tensor([1.0, 2.0], device=torch_xla.device())
    facts = {
        "index": index,
        "own_process": os.getpid() != launcher_pid,
        "world_size": xr.world_size(),
        "global_ordinal": xr.global_ordinal(),
        "local_ordinal": xr.local_ordinal(),
        "process_index": xr.process_index(),
        "addressable": xr.addressable_device_count(),
        "device": str(torch_xla.device()),
        "rendezvous": [p.decode() for p in xm.rendezvous("facts", b"abc")],
        # One replica: a clone, the scale not applied.
        "all_reduce": xm.all_reduce(xm.REDUCE_SUM, t, scale=0.5).cpu().tolist(),
        "local_process_count": os.environ.get("PJRT_LOCAL_PROCESS_COUNT"),
    }
    with open(path, "w") as f:
        json.dump(facts, f)


def _fail(index: int) -> None:
    raise ValueError(f"replica {index} failed")


def test_spawn_runs_one_process_per_device(xla_target, tmp_path):
    import concurrent.futures.process

    import torch_xla
    import torch_xla.distributed.xla_multiprocessing as xmp

    path = tmp_path / "facts.json"
    assert xmp.spawn(_facts, args=(os.getpid(), str(path))) is None
    assert json.loads(path.read_text()) == {
        "index": 0,
        "own_process": True,
        "world_size": 1,
        "global_ordinal": 0,
        "local_ordinal": 0,
        "process_index": 0,
        "addressable": 1,
        "device": "xla:0",
        "rendezvous": ["abc"],
        "all_reduce": [1.0, 2.0],
        "local_process_count": "1",
    }

    with pytest.raises(ValueError, match=r"^replica 0 failed$") as raised:
        torch_xla.launch(_fail)
    cause = raised.value.__cause__
    assert type(cause) is concurrent.futures.process._RemoteTraceback
    assert "_fail" in str(cause) and "ValueError: replica 0 failed" in str(cause)
    # The launching process never started its own runtime.
    assert not torch_xla._XLAC._xla_runtime_is_initialized()
