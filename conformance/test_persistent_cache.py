"""torch_xla's persistent compilation cache (``xr.initialize_cache``) across processes.

Each program runs in a fresh process (the cache settings are read once per process).
Checked on real torch_xla 2.9.0 with PJRT_DEVICE=CPU: the first process counts
``PersistentCacheMiss`` 1 and writes one entry named by the graph hash in decimal; a second
process finds the entry, but the CPU client cannot deserialize executables ("Deserializing
serialized executable not supported"), so it counts ``PersistentCacheDeserializeFailure``
and compiles again.  On TPU (and the simulator, which simulates one) the second process
counts ``PersistentCacheHit`` and no ``PersistentCacheMiss`` — torch_xla's own
test_persistent_cache.py expectations, which it runs on TPU only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_PROGRAM = textwrap.dedent(
    """
    import contextlib, json, os, sys
    import torch

    target, topology, accelerator, cache_dir, readonly = sys.argv[1:6]
    if target == "sim":
        import xlasim
        ctx = xlasim.simulate(topology, accelerator)
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        import torch_xla
        import torch_xla.debug.metrics as met
        import torch_xla.runtime as xr

        if cache_dir != "-":
            xr.initialize_cache(cache_dir, readonly=readonly == "ro")
        t = torch.arange(16, dtype=torch.float32)
        xt = t.to(torch_xla.device())
        if os.environ.get("PCACHE_TEST_STRING_ARGS") == "1":
            # ops with str and Python float arguments (an SGD step has alpha=-lr)
            s = torch.div(xt, 3.0, rounding_mode="floor") + torch.nn.functional.gelu(
                xt, approximate="tanh")
            s = s.add(xt, alpha=-0.1)
            expected = torch.div(t, 3.0, rounding_mode="floor") + torch.nn.functional.gelu(
                t, approximate="tanh")
            expected = expected.add(t, alpha=-0.1)
        else:
            s = torch.nn.functional.gelu(xt + xt)
            expected = torch.nn.functional.gelu(t + t)
        torch_xla.sync()
        assert torch.allclose(s.cpu(), expected)
        names = ["PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure",
                 "UncachedCompile", "CachedCompile"]
        print("RESULT " + json.dumps({n: met.counter_value(n) for n in names}))
    """
)

_ALTERNATING = textwrap.dedent(
    """
    import contextlib, json, sys
    import torch

    target, topology, accelerator = sys.argv[1:4]
    if target == "sim":
        import xlasim
        ctx = xlasim.simulate(topology, accelerator)
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        import torch_xla
        import torch_xla.debug.metrics as met

        d = torch_xla.device()
        a = torch.ones(4).to(d)
        b = torch.ones(8).to(d)
        for _ in range(3):
            (a * 2).cpu()
            (b * 2).cpu()
        print("RESULT " + json.dumps([met.counter_value("UncachedCompile"),
                                      met.counter_value("CachedCompile")]))
    """
)


def _run(xla_target, program: str, *args: str, env: dict[str, str] | None = None):
    child_env = dict(os.environ)
    child_env.pop("XLA_PERSISTENT_CACHE_PATH", None)
    child_env.pop("XLA_PERSISTENT_CACHE_READ_ONLY", None)
    if env:
        child_env.update(env)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            program,
            xla_target.name,
            xla_target.spec.topology,
            xla_target.spec.accelerator,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=child_env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT ") :])


def test_second_process_reuses_the_first_ones_compile(xla_target, tmp_path):
    cache = tmp_path / "cache"
    first = _run(xla_target, _PROGRAM, str(cache), "rw")
    assert first["PersistentCacheMiss"] == 1
    assert first["PersistentCacheHit"] is None
    assert first["UncachedCompile"] == 1
    entries = os.listdir(cache)
    assert len(entries) == 1 and entries[0].isdigit(), entries

    second = _run(xla_target, _PROGRAM, str(cache), "rw")
    assert second["PersistentCacheMiss"] is None
    if xla_target.device_type == "TPU":
        assert second["PersistentCacheHit"] == 1
        assert second["UncachedCompile"] is None
        assert second["CachedCompile"] == 1
    else:
        # PJRT CPU cannot deserialize executables: the entry is found, rejected, recompiled.
        assert second["PersistentCacheHit"] is None
        assert second["PersistentCacheDeserializeFailure"] == 1
        assert second["UncachedCompile"] == 1
    assert os.listdir(cache) == entries


def test_graph_keys_are_the_same_in_every_process(xla_target, tmp_path):
    """A graph with str and float arguments is found by a second process: its key must not
    depend on the process (Python 3.11 salts str hashes and hashes None and types by
    address, so they differ from one process to the next)."""
    cache = tmp_path / "cache"
    env = {"PCACHE_TEST_STRING_ARGS": "1"}
    first = _run(xla_target, _PROGRAM, str(cache), "rw", env=env)
    assert first["PersistentCacheMiss"] == 1
    second = _run(xla_target, _PROGRAM, str(cache), "rw", env=env)
    assert second["PersistentCacheMiss"] is None
    found = (second["PersistentCacheHit"] or 0) + (second["PersistentCacheDeserializeFailure"] or 0)
    assert found == 1, second
    assert len(os.listdir(cache)) == 1


def test_readonly_cache_is_read_but_never_written(xla_target, tmp_path):
    cache = tmp_path / "ro-cache"
    result = _run(xla_target, _PROGRAM, str(cache), "ro")
    assert result["PersistentCacheMiss"] == 1
    assert result["UncachedCompile"] == 1
    assert os.path.isdir(cache) and os.listdir(cache) == []


def test_no_cache_without_initialize_cache(xla_target, tmp_path):
    result = _run(xla_target, _PROGRAM, "-", "rw")
    assert result["PersistentCacheMiss"] is None and result["PersistentCacheHit"] is None
    assert result["UncachedCompile"] == 1


def test_initialize_cache_after_a_computation_fails(xla_target, tmp_path):
    import torch
    import torch_xla
    import torch_xla.runtime as xr

    (torch.ones(2).to(torch_xla.device()) * 3).cpu()
    with pytest.raises(AssertionError, match="^Computation cache has already been initialized$"):
        xr.initialize_cache(str(tmp_path / "late"))


@pytest.mark.parametrize(("size", "expected"), [("1", [6, None]), ("2", [2, 4])])
def test_in_memory_cache_size_bounds_the_compiled_graphs(xla_target, size, expected):
    # Two graphs alternating: with room for one, every lookup misses (LRU eviction).
    result = _run(xla_target, _ALTERNATING, env={"XLA_COMPILATION_CACHE_SIZE": size})
    assert result == expected
