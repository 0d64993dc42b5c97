"""tpu_backend.compile_cache: cache paths, who writes, initialization order and statistics."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import xlasim
from tpu_backend import compile_cache as cc
from tpu_backend.topology import parse_slice


def test_cache_path_is_keyed_by_slice_and_torch_xla_version(tmp_path):
    v4_16 = parse_slice("2x2x2", "v4")
    v6e_16 = parse_slice("4x4", "v6e")
    a = cc.cache_dir_for(str(tmp_path), v4_16, "2.9.0")
    assert a == os.path.join(str(tmp_path), "v4-16-2x2x2", "torch_xla-2.9.0")
    assert cc.cache_dir_for(str(tmp_path), v6e_16, "2.9.0") != a
    assert cc.cache_dir_for(str(tmp_path), v4_16, "2.10.0") != a
    assert cc.cache_dir_for(str(tmp_path), None, "2.9.0").endswith(
        os.path.join("single-host", "torch_xla-2.9.0")
    )
    # a version label with path separators cannot escape the directory
    odd = cc.cache_dir_for(str(tmp_path), None, "2.9.0+../../x")
    assert os.path.dirname(os.path.dirname(odd)) == str(tmp_path)


@pytest.mark.parametrize("base", ["", None, 3])
def test_bad_cache_directory_is_rejected(base):
    with pytest.raises(ValueError, match="cache directory"):
        cc.cache_dir_for(base, None, "2.9.0")


@pytest.mark.parametrize(
    ("policy", "host", "expected"),
    [
        (True, 0, True),
        (True, 3, True),
        (False, 0, False),
        (False, 3, False),
        ("followers", 0, False),
        ("followers", 1, True),
    ],
)
def test_readonly_policies(policy, host, expected):
    assert cc.decide_readonly(policy, host) is expected


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "leader"])
def test_bad_policy_is_rejected_naming_the_valid_ones(bad):
    with pytest.raises(ValueError, match="'followers'"):
        cc.decide_readonly(bad, 0)


def test_auto_policy_one_writer_per_shared_directory(tmp_path):
    shared = str(tmp_path / "shared")
    for host in range(3):
        cc.mark_host(shared, "run1", host)
    visible = {h: cc.visible_hosts(shared, "run1") for h in range(3)}
    assert visible == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}
    assert [cc.decide_readonly("auto", h, visible) for h in range(3)] == [False, True, True]

    # host-local disks: each host sees only its own marker, so each host writes
    local = {h: str(tmp_path / f"host{h}") for h in range(3)}
    for h, base in local.items():
        cc.mark_host(base, "run2", h)
    visible = {h: cc.visible_hosts(local[h], "run2") for h in range(3)}
    assert visible == {0: [0], 1: [1], 2: [2]}
    assert [cc.decide_readonly("auto", h, visible) for h in range(3)] == [False, False, False]
    # a marker from another run does not count
    assert cc.visible_hosts(shared, "run2") == []


def test_auto_policy_needs_the_marker_exchange():
    with pytest.raises(ValueError, match="'auto' needs every host's visible markers"):
        cc.decide_readonly("auto", 1)


def test_initialize_cache_opens_the_keyed_directory_on_the_simulator(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_PERSISTENT_CACHE_PATH", raising=False)
    spec = parse_slice("2x2x2", "v4")
    with xlasim.simulate("2x2x2", "v4", host_index=1):
        import torch
        import torch_xla

        path, readonly = cc.initialize_cache(str(tmp_path), spec=spec, host_index=1)
        assert path == cc.cache_dir_for(str(tmp_path), spec, torch_xla.__version__)
        assert readonly is True  # 'followers': host 1 reads only
        assert os.environ["XLA_PERSISTENT_CACHE_PATH"] == path
        assert os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] == "1"
        (torch.ones(3).to(torch_xla.device()) * 2).cpu()
        stats = cc.compile_stats()
        assert stats.persistent_misses == 1 and stats.compiles == 1
        assert stats.persistent_cache_dir == path and stats.persistent_cache_readonly
        assert os.listdir(path) == []  # read-only: nothing written
    # leaving the simulation restores the caller's environment
    assert "XLA_PERSISTENT_CACHE_PATH" not in os.environ


def test_initialize_cache_after_computation_is_a_clear_error(tmp_path):
    with xlasim.simulate("2x2"):
        import torch
        import torch_xla

        (torch.ones(3).to(torch_xla.device()) + 1).cpu()
        with pytest.raises(RuntimeError, match="before the first XLA computation") as info:
            cc.initialize_cache(str(tmp_path))
        assert isinstance(info.value.__cause__, AssertionError)
        assert "Computation cache has already been initialized" in str(info.value)
        with pytest.raises(RuntimeError, match="in-memory compilation cache size"):
            cc.set_memory_cache_size(8)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_bad_memory_cache_size_is_rejected(bad):
    with pytest.raises(ValueError, match="compilation cache size"):
        cc.set_memory_cache_size(bad)


def test_stats_count_compiles_hits_executions_and_compile_time():
    with xlasim.simulate("2x2"):
        import torch
        import torch_xla

        d = torch_xla.device()
        w = torch.ones(4).to(d)
        for n in (4, 4, 4):
            (w * torch.arange(n, dtype=torch.float32).to(d)).cpu()
        stats = cc.compile_stats()
        assert (stats.compiles, stats.cache_hits, stats.executions) == (1, 2, 3)
        assert stats.persistent_hits == stats.persistent_misses == 0
        assert stats.compile_time_s > 0
        assert stats.as_dict()["compiles"] == 1


def test_second_process_hits_through_the_backend_helper(tmp_path):
    """The helper's own path keying, end to end: a second simulated host-0 process hits."""
    program = textwrap.dedent(
        f"""
        import torch, xlasim
        from tpu_backend import compile_cache as cc
        from tpu_backend.topology import parse_slice
        with xlasim.simulate("2x2x2", "v4"):
            import torch_xla
            cc.initialize_cache({str(tmp_path)!r}, spec=parse_slice("2x2x2", "v4"), host_index=0)
            x = torch.ones(8).to(torch_xla.device())
            (x * 3 + 1).cpu()
            s = cc.compile_stats()
            print("STATS", s.persistent_hits, s.persistent_misses, s.compiles)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "XLASIM_"))}
    outs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=240, env=env
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATS")))
    assert outs == ["STATS 0 1 1", "STATS 1 0 0"]
