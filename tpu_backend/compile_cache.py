"""torch_xla's persistent compilation cache on every worker of a slice, and its statistics.

torch_xla 2.9 keeps compiled programs in two layers: an in-memory LRU of
``XLA_COMPILATION_CACHE_SIZE`` graphs (default 2048) and, once
``torch_xla.runtime.initialize_cache(path, readonly)`` has run, a directory of serialized
executables named by graph hash.  A lookup that misses memory reads the directory:
``PersistentCacheHit`` (then ``CachedCompile``) or ``PersistentCacheMiss`` (then
``UncachedCompile``, a real compile, and a write unless read-only).  Both settings are read
once, when the first computation creates the cache, so everything here must run before the
first XLA computation of the process; afterwards ``initialize_cache`` fails with
``AssertionError('Computation cache has already been initialized')``.

Where the cache lives: ``<base>/<pod type>-<topology>/torch_xla-<version>``.  An executable
is only valid for the slice shape and compiler that produced it, so the path keys on both;
a stale entry is never even looked up.

Who writes (``readonly`` policy, decided per host):

* ``'followers'`` (default): host 0 writes, the other hosts only read.  Right for a shared
  directory (NFS, Filestore, a GCS FUSE mount): under SPMD every host compiles the same
  program, and torch_xla writes entries in place (no temp file + rename), so several
  writers to one file could leave a torn entry for a reader on another host.  On
  host-local disks followers then never gain entries; use ``'auto'`` there.
* ``'auto'``: each host writes a marker into ``<base>`` and the driver checks which
  markers each host sees (:func:`mark_host` / :func:`visible_hosts` /
  :func:`decide_readonly`): a directory all hosts share gets one writer (host 0), a
  host-local one gets a writer per host.
* ``True``: nobody writes (a cache prepared ahead of time); ``False``: everyone writes.

Real PJRT CPU cannot deserialize executables: a second process there counts
``PersistentCacheDeserializeFailure`` and compiles again (checked on torch_xla 2.9.0);
TPU deserializes and hits.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CompileCacheStats",
    "ReadonlyPolicy",
    "READONLY_POLICIES",
    "cache_dir_for",
    "compile_stats",
    "decide_readonly",
    "initialize_cache",
    "mark_host",
    "set_memory_cache_size",
    "visible_hosts",
]

ReadonlyPolicy = bool | Literal["followers", "auto"]
READONLY_POLICIES: tuple[ReadonlyPolicy, ...] = (True, False, "followers", "auto")
MEMORY_CACHE_ENV = "XLA_COMPILATION_CACHE_SIZE"
_MARKER_DIR = ".hosts"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(part: str) -> str:
    return _UNSAFE.sub("_", part)


def cache_dir_for(base: str, spec: Any | None, torch_xla_version: str) -> str:
    """``<base>/<pod type>-<topology>/torch_xla-<version>`` (``single-host`` without a spec).

    ``spec`` is a :class:`tpu_backend.topology.SliceSpec` (or None when the slice is unknown,
    e.g. one worker on PJRT CPU).
    """
    if not isinstance(base, str) or not base:
        raise ValueError(f"cache directory {base!r} is not valid: expected a non-empty path")
    if not isinstance(torch_xla_version, str) or not torch_xla_version:
        raise ValueError(f"torch_xla version {torch_xla_version!r} is not valid")
    slice_key = f"{spec.pod_type}-{spec.topology}" if spec is not None else "single-host"
    return os.path.join(base, _safe(slice_key), f"torch_xla-{_safe(torch_xla_version)}")


def _check_policy(policy: Any) -> None:
    if policy not in READONLY_POLICIES or (policy in (0, 1) and not isinstance(policy, bool)):
        raise ValueError(
            f"readonly policy {policy!r} is not valid; valid: True (no host writes), False "
            f"(every host writes), 'followers' (host 0 writes) or 'auto' (one writer per "
            f"shared directory)"
        )


# -- shared-storage detection (driver sequences: mark_host on all, then visible_hosts) ----


def mark_host(base: str, run_token: str, host_index: int) -> str:
    """Runs on each worker: leave a marker of this host under ``base`` for this run."""
    directory = os.path.join(base, _MARKER_DIR, _safe(run_token))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, str(int(host_index)))
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{socket.gethostname()} {os.getpid()} {time.time()}\n")
    return path


def visible_hosts(base: str, run_token: str) -> list[int]:
    """Runs on each worker after every host ran :func:`mark_host`: whose markers it sees."""
    directory = os.path.join(base, _MARKER_DIR, _safe(run_token))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def decide_readonly(
    policy: ReadonlyPolicy,
    host_index: int,
    visible: Mapping[int, Sequence[int]] | None = None,
) -> bool:
    """Whether ``host_index`` opens the cache read-only under ``policy``.

    ``visible`` (needed for ``'auto'`` only) maps each host to the hosts whose markers it
    saw.  Under ``'auto'`` a host writes unless a lower-numbered host shares its directory.
    """
    _check_policy(policy)
    if isinstance(policy, bool):
        return policy
    if policy == "followers":
        return host_index != 0
    if visible is None or host_index not in visible:
        raise ValueError(
            f"readonly policy 'auto' needs every host's visible markers (mark_host, then "
            f"visible_hosts); none given for host {host_index}"
        )
    return any(other < host_index for other in visible[host_index])


# -- worker side ---------------------------------------------------------------------


def set_memory_cache_size(size: int) -> None:
    """Bound torch_xla's in-memory compiled-graph cache (``XLA_COMPILATION_CACHE_SIZE``).

    Read when the first computation creates the cache, like :func:`initialize_cache`.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(
            f"compilation cache size {size!r} is not valid: expected an int >= 1 (graphs kept "
            f"in memory; torch_xla's default is 2048)"
        )
    _require_no_computation("the in-memory compilation cache size")
    os.environ[MEMORY_CACHE_ENV] = str(size)


def _computation_started() -> bool:
    import torch_xla  # deferred (here and below): importing torch_xla starts its runtime

    return bool(torch_xla._XLAC._xla_computation_cache_is_initialized())


def _require_no_computation(what: str) -> None:
    if _computation_started():
        raise RuntimeError(
            f"{what} must be set before the first XLA computation of this process, but "
            f"torch_xla has already created its computation cache; configure it first "
            f"(the backend does this at worker bootstrap)"
        )


def initialize_cache(
    base: str,
    *,
    spec: Any | None = None,
    host_index: int = 0,
    readonly: ReadonlyPolicy = "followers",
    visible: Mapping[int, Sequence[int]] | None = None,
) -> tuple[str, bool]:
    """Open torch_xla's persistent cache for this worker; returns ``(path, readonly)``.

    Must run before any XLA computation in the process (``RuntimeError`` otherwise, with
    torch_xla's ``AssertionError`` as its cause).
    """
    # Deferred: importing torch_xla starts its runtime.
    import torch_xla
    import torch_xla.runtime as xr

    ro = decide_readonly(readonly, host_index, visible)
    path = cache_dir_for(base, spec, torch_xla.__version__)
    os.makedirs(path, exist_ok=True)
    try:
        xr.initialize_cache(path, readonly=ro)
    except AssertionError as e:
        raise RuntimeError(
            f"the persistent compilation cache ({path}) must be initialized before the first "
            f"XLA computation of this process; torch_xla says: {e}"
        ) from e
    return path, ro


@dataclass(frozen=True)
class CompileCacheStats:
    """Compilation counters of this process, read from ``torch_xla.debug.metrics``."""

    compiles: int
    """``UncachedCompile``: graphs XLA actually compiled."""
    cache_hits: int
    """``CachedCompile``: graph lookups served by a cache (memory or persistent)."""
    persistent_hits: int
    persistent_misses: int
    persistent_deserialize_failures: int
    compile_time_s: float
    """Sum of ``CompileTime`` samples (seconds)."""
    executions: int
    """Compiled-graph executions (``ExecuteComputation`` + ``ExecuteReplicated``)."""
    persistent_cache_dir: str | None
    persistent_cache_readonly: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def compile_stats() -> CompileCacheStats:
    """Hits, misses and compile time of this process so far (torch_xla must be importable)."""
    import torch_xla.debug.metrics as met  # deferred: importing torch_xla starts its runtime

    def counter(name: str) -> int:
        return int(met.counter_value(name) or 0)

    data = met.metric_data("CompileTime")
    compile_ns = float(data[1]) if data else 0.0
    return CompileCacheStats(
        compiles=counter("UncachedCompile"),
        cache_hits=counter("CachedCompile"),
        persistent_hits=counter("PersistentCacheHit"),
        persistent_misses=counter("PersistentCacheMiss"),
        persistent_deserialize_failures=counter("PersistentCacheDeserializeFailure"),
        compile_time_s=compile_ns / 1e9,
        executions=counter("ExecuteComputation") + counter("ExecuteReplicated"),
        persistent_cache_dir=os.environ.get("XLA_PERSISTENT_CACHE_PATH") or None,
        persistent_cache_readonly=os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY") == "1",
    )
