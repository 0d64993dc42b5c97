"""xlasim.chip_memory() and xlasim.enforce_hbm() as the README promises them.

Every expected byte count below is worked out by hand from the tensor's shape, dtype and
sharding: a device holds one (padded) shard of a tiled tensor, the whole of a replicated one,
and a chip adds up its devices.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import xlasim

GIB = 2**30


def _bytes_per_chip() -> list[int]:
    return [row["bytes"] for row in xlasim.chip_memory()]


def test_sharded_tensors_are_counted_per_chip():
    with xlasim.simulate("2x2", "v5e"):  # 4 chips, one device each, 16 GiB of HBM per chip
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        rows = xlasim.chip_memory()
        assert [row["chip"] for row in rows] == [0, 1, 2, 3]
        assert {tuple(row["coords"]) for row in rows} == {
            (0, 0, 0),
            (1, 0, 0),
            (0, 1, 0),
            (1, 1, 0),
        }
        assert all(row["hbm_bytes"] == 16 * GIB for row in rows)
        assert _bytes_per_chip() == [0, 0, 0, 0]

        a = torch.zeros(10, 6).to("xla")
        # not annotated, under SPMD: replicated, 10 * 6 * 4 bytes on every chip
        assert _bytes_per_chip() == [240] * 4
        mesh = xs.Mesh(np.arange(4), (4,), ("data",))
        xs.mark_sharding(a, mesh, ("data", None))
        # 10 rows over 4 devices: shards of ceil(10 / 4) = 3 rows (the last one padded)
        assert _bytes_per_chip() == [3 * 6 * 4] * 4

        b = torch.zeros(8, dtype=torch.bfloat16).to("xla")  # replicated, 8 * 2 bytes
        assert _bytes_per_chip() == [72 + 16] * 4
        rows = xlasim.chip_memory()
        assert rows[0]["fraction"] == pytest.approx(88 / (16 * GIB))

        two_d = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
        c = torch.zeros(4, 4).to("xla")
        xs.mark_sharding(c, two_d, ("x", None))
        # split in 2 along rows, each half replicated over a pair: a 2 x 4 shard per device
        assert _bytes_per_chip() == [88 + 2 * 4 * 4] * 4

        del a  # only live tensors hold device memory
        gc.collect()
        assert _bytes_per_chip() == [16 + 32] * 4
        assert b.shape == (8,) and c.shape == (4, 4)


def test_a_chip_adds_up_its_devices():
    with xlasim.simulate("2x2", "v3"):  # 4 chips with two devices (cores) each: 8 devices
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        t = torch.zeros(16, 2).to("xla")
        xs.mark_sharding(t, xs.Mesh(np.arange(8), (8,), ("data",)), ("data", None))
        # 2 rows of 2 float32 per device, two devices per chip
        assert _bytes_per_chip() == [2 * (2 * 2 * 4)] * 4
        assert all(row["hbm_bytes"] == 32 * GIB for row in xlasim.chip_memory())


def test_without_spmd_a_tensor_lives_on_its_own_device():
    with xlasim.simulate("2x2", "v5e"):
        t = torch.ones(5, dtype=torch.float64).to("xla:2")
        assert _bytes_per_chip() == [0, 0, 5 * 8, 0]
        assert t.device == torch.device("xla:2")


def _small_chips(hbm_bytes: int) -> xlasim.simulate:
    # A real chip has 16 GiB or more, which a test cannot fill on a CI runner; the same slice
    # with less HBM per chip overflows with a few kilobytes.
    sim = xlasim.simulate("2x2", "v5e")
    sim.spec = dataclasses.replace(sim.spec, hbm_bytes_per_chip=hbm_bytes)
    return sim


def _exhausted(attempt: str, free: str, where: str) -> str:
    return "^" + re.escape(
        "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: "
        f"Attempting to allocate {attempt}. That was not possible. There are {free} free.; "
        f"({where})"
    )


def test_enforce_hbm_fails_the_transfer_that_overflows():
    with _small_chips(4096):
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        first = torch.zeros(768).to("xla")  # 3072 bytes, replicated on every chip: fits
        xlasim.enforce_hbm()
        with pytest.raises(RuntimeError, match=_exhausted("2.0K", "1.0K", "0x0x0_HBM0")):
            torch.zeros(512).to("xla")  # 2048 bytes do not fit in the 1024 left
        assert _bytes_per_chip() == [3072] * 4  # the refused tensor holds nothing

        # transferred with a 4-way sharding, 2048 bytes need only 512 per chip: fits
        import torch_xla.core.xla_model as xm

        spec = xs.ShardingSpec(xs.Mesh(np.arange(4), (4,), ("data",)), ("data", None))
        (sharded,) = xm.send_cpu_data_to_device(torch.zeros(128, 4), "xla:0", spec)
        assert sharded.shape == (128, 4)
        assert _bytes_per_chip() == [3072 + 512] * 4

        xlasim.enforce_hbm(False)
        over = torch.zeros(512).to("xla")  # over capacity: counted, not refused
        assert _bytes_per_chip() == [3072 + 512 + 2048] * 4
        assert xlasim.chip_memory()[0]["fraction"] == pytest.approx(5632 / 4096)
        assert (first.shape, over.shape) == ((768,), (512,))


def test_enforce_hbm_from_the_environment(monkeypatch):
    monkeypatch.setenv("XLASIM_ENFORCE_HBM", "1")
    with _small_chips(1000):
        t = torch.zeros(200).to("xla")  # 800 bytes on device 0 (no SPMD)
        assert _bytes_per_chip() == [800, 0, 0, 0]
        with pytest.raises(RuntimeError, match=_exhausted("400B", "200B", "0x0x0_HBM0")):
            torch.zeros(100).to("xla")
        # another chip has room
        elsewhere = torch.zeros(100).to("xla:1")
        assert _bytes_per_chip() == [800, 400, 0, 0]
        assert (t.device, elsewhere.device) == (torch.device("xla:0"), torch.device("xla:1"))


def test_a_pjrt_cpu_client_is_host_memory_never_refused(monkeypatch):
    # 8 CPU devices, twice the devices of the 2x2 slice's one host; enforcement on, 1000-byte
    # chips: CPU devices are host memory, so nothing is refused and there are no chips to report.
    monkeypatch.setenv("CPU_NUM_DEVICES", "8")
    monkeypatch.setenv("XLASIM_ENFORCE_HBM", "1")
    with _small_chips(1000):
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        xr.set_device_type("CPU")
        t = torch.ones(1000).to("xla:6")  # 4000 bytes on the seventh CPU device
        w = torch.ones(3, device="xla:7", requires_grad=True)
        (w * 2).sum().backward()
        assert (t.device, w.grad.cpu().tolist()) == (torch.device("xla:6"), [2.0, 2.0, 2.0])
        with pytest.raises(RuntimeError, match="PJRT CPU client .* no per-chip HBM"):
            xlasim.chip_memory()
        with pytest.raises(RuntimeError, match="UNIMPLEMENTED: GetAllocatorStats"):
            xm.get_memory_info(t.device)
        with pytest.raises(
            RuntimeError, match=r"has 8 xla device\(s\), xla:0\.\.xla:7, on the PJRT CPU"
        ):
            torch.zeros(1, device="xla:8")


def test_exit_after_backward_on_a_cpu_device_beyond_a_tpu_host():
    # At exit the simulator waits for autograd's device threads on every device a backward
    # pass used: xla:6 exists on the 8-device CPU client, not on the slice's 4-device host.
    code = (
        "import os, torch, xlasim\n"
        "with xlasim.simulate('2x2', 'v5e'):\n"
        "    import torch_xla.runtime as xr\n"
        "    xr.set_device_type('CPU')\n"
        "    w = torch.ones(3, device='xla:6', requires_grad=True)\n"
        "    (w * 2).sum().backward()\n"
        "    print(w.grad.cpu().tolist())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    env["CPU_NUM_DEVICES"] = "8"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "[2.0, 2.0, 2.0]\n", "")
