"""Every bad input the project takes gets a clear error: the right type, a message that names
the bad value and what would be valid, raised before anything starts.

One table per kind of input.  A row is ``(input, error type, fragments)``: the call must raise
exactly that type (or a subclass) and its message must contain every fragment -- the bad value
as the user wrote it and the words saying what is valid.  Where real torch_xla 2.9 has its own
error for the same input (meshes, partition specs, devices) the row holds torch_xla's message,
as ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=4`` prints it: the simulator's message must equal it, and
the words saying what is valid are in the exception's note.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xlasim
from tpu_backend.compile_cache import (
    cache_dir_for,
    check_cache_base,
    decide_readonly,
    set_memory_cache_size,
)
from tpu_backend.config import TPUTorchConfig
from tpu_backend.precision import SeamlessConfig
from tpu_backend.topology import parse_slice, tpu_host_env
from xlasim._activation import config_from_env
from xlasim.cli import commands as cli
from xlasim.runtime.settings import EnvError, check_runtime_knobs, env_float, env_int
from xlasim.sharding.messages import NOTE_PREFIX


@dataclass(frozen=True)
class Bad:
    """One bad input: ``call()`` must raise ``error`` with every fragment in its message."""

    name: str
    call: Callable[[], Any]
    error: type[BaseException]
    fragments: tuple[str, ...]


def _check(case: Bad) -> BaseException:
    with pytest.raises(case.error) as info:
        case.call()
    # The hints the simulator adds to torch_xla's own errors are exception notes.
    message = "\n".join([str(info.value), *getattr(info.value, "__notes__", ())])
    missing = [f for f in case.fragments if f not in message]
    assert not missing, f"{case.name}: {missing} not in {message!r}"
    assert not xlasim.is_active(), "a refused input left a simulation active"
    return info.value


def _ids(cases: list[Bad]) -> list[str]:
    return [c.name for c in cases]


# -- topologies ----------------------------------------------------------------------------
_TOPOLOGY_FORMS = "positive integers joined by 'x', e.g. '2x2' or '2x2x2'"

TOPOLOGIES = [
    Bad(f"topology {t!r}", lambda t=t: parse_slice(t), ValueError, (repr(t), _TOPOLOGY_FORMS))
    for t in ["", "2x", "x2", "2x2x2x2", "2*2", "abc", "1", "+2x2", "2 x 2", "1e1x2", "2x-2"]
] + [
    # Digits of other scripts are digits to int(), not to a TPU topology.
    Bad(
        "topology with arabic-indic digits",
        lambda: parse_slice("\u0662x2"),
        ValueError,
        ("'\u0662x2'", _TOPOLOGY_FORMS),
    ),
    Bad(
        "zero dimension",
        lambda: parse_slice("0x2"),
        ValueError,
        ("'0x2'", "every dimension must be positive"),
    ),
    Bad("topology not a str", lambda: parse_slice(4), TypeError, ("must be a str", "int 4")),
    Bad("topology None", lambda: parse_slice(None), TypeError, ("must be a str", "None")),
    Bad(
        "3-D topology on a 2-D generation",
        lambda: parse_slice("2x2x2", "v6e"),
        ValueError,
        ("'2x2x2'", "v6e slices are 2-D", "'2x4'"),
    ),
    Bad(
        "2-D topology on a 3-D generation",
        lambda: parse_slice("2x2", "v4"),
        ValueError,
        ("'2x2'", "v4 slices are 3-D", "'2x2x2'"),
    ),
    Bad(
        "3-D topology with the default generation",
        lambda: parse_slice("16x16x16"),
        ValueError,
        ("'16x16x16'", "v4, v5p, v7x"),
    ),
    Bad(
        "odd single-host shape", lambda: parse_slice("2x3"), ValueError, ("'2x3'", "1x1, 2x2, 2x4")
    ),
    Bad(
        "more chips than a pod",
        lambda: parse_slice("64x64", "v5e"),
        ValueError,
        ("'64x64'", "4096 chips", "256 chips", "16x16"),
    ),
]

# -- accelerators ----------------------------------------------------------------------------
_GENERATIONS = "v2, v3, v4, v5litepod (alias v5e), v5p, v6e, v7x"

ACCELERATORS = [
    Bad(
        f"accelerator {a!r}",
        lambda a=a: parse_slice("2x2", a),
        ValueError,
        (f"unknown accelerator {a!r}", _GENERATIONS),
    )
    for a in ["v9", "", "tpu", "v5", "gpu", "v6", "v10", "a100"]
] + [
    Bad(
        "pod type given as accelerator",
        lambda: parse_slice("2x2x2", "v4-16"),
        ValueError,
        ("'v4-16'", "looks like a pod type", _GENERATIONS),
    ),
    Bad(
        "accelerator not a str",
        lambda: parse_slice("2x2", 5),
        TypeError,
        ("accelerator must be a str", "int 5"),
    ),
]

# -- host indexes ----------------------------------------------------------------------------
_V5E_16 = parse_slice("4x4", "v5e")  # 4 hosts
HOST_INDEXES = (
    [
        Bad(
            f"host index {h!r}",
            lambda h=h: tpu_host_env(_V5E_16, h),
            ValueError,
            (f"host_index {h}", "valid host indices are 0..3"),
        )
        for h in [-1, 4, 10**20]
    ]
    + [
        Bad(
            f"host index of type {type(h).__name__}",
            lambda h=h: tpu_host_env(_V5E_16, h),
            TypeError,
            ("host_index must be an int", repr(h)),
        )
        for h in [1.5, "0", True, None]
    ]
    + [
        Bad(
            "simulate() host index",
            lambda: xlasim.simulate("4x4", "v5e", host_index=4),
            ValueError,
            ("host_index 4", "valid host indices are 0..3"),
        ),
        Bad(
            "simulate() spmd not a bool",
            lambda: xlasim.simulate("2x2", spmd="yes"),
            TypeError,
            ("spmd must be True or False", "'yes'"),
        ),
        Bad(
            "simulate() single_process not a bool",
            lambda: xlasim.simulate("4x4", "v5e", single_process=1),
            TypeError,
            ("single_process must be True or False", "int 1"),
        ),
    ]
)


# -- environment knobs ---------------------------------------------------------------------
def _env(**variables: str) -> Callable[[], Any]:
    return lambda: config_from_env(variables)


_ON_OFF = "use one of 1, true, yes, on (on) or 0, false, no, off (off)"

ENV_KNOBS = [
    Bad(
        "XLASIM_SINGLE_PROCESS not 0 or 1",
        _env(XLASIM_TOPOLOGY="4x4", XLASIM_ACCELERATOR="v5e", XLASIM_SINGLE_PROCESS="yes"),
        EnvError,
        ("XLASIM_SINGLE_PROCESS='yes'", "expected 0 or 1"),
    ),
    Bad(
        "XLASIM_TOPOLOGY malformed",
        _env(XLASIM_TOPOLOGY="2x"),
        EnvError,
        ("XLASIM_TOPOLOGY", "'2x'", _TOPOLOGY_FORMS),
    ),
    Bad(
        "XLASIM_ACCELERATOR unknown",
        _env(XLASIM_TOPOLOGY="2x2", XLASIM_ACCELERATOR="v9"),
        EnvError,
        ("XLASIM_ACCELERATOR", "'v9'", _GENERATIONS),
    ),
    Bad(
        "XLASIM_HOST_INDEX not a number",
        _env(XLASIM_TOPOLOGY="2x2", XLASIM_HOST_INDEX="abc"),
        EnvError,
        ("XLASIM_HOST_INDEX='abc'", "whole number >= 0"),
    ),
    Bad(
        "XLASIM_HOST_INDEX negative",
        _env(XLASIM_TOPOLOGY="2x2", XLASIM_HOST_INDEX="-1"),
        EnvError,
        ("XLASIM_HOST_INDEX='-1'", "whole number >= 0"),
    ),
    Bad(
        "XLASIM_HOST_INDEX fractional",
        _env(XLASIM_TOPOLOGY="2x2", XLASIM_HOST_INDEX="1.0"),
        EnvError,
        ("XLASIM_HOST_INDEX='1.0'", "whole number >= 0"),
    ),
    Bad(
        "XLASIM_HOST_INDEX past the slice",
        _env(XLASIM_TOPOLOGY="4x4", XLASIM_HOST_INDEX="4", XLASIM_ACCELERATOR="v5e"),
        EnvError,
        ("XLASIM_HOST_INDEX='4'", "0..3"),
    ),
    Bad(
        "XLASIM_HOST_INDEX without a topology",
        _env(XLASIM_HOST_INDEX="1"),
        EnvError,
        ("XLASIM_HOST_INDEX='1'", "without XLASIM_TOPOLOGY", "e.g. '2x2x2'"),
    ),
    Bad(
        "XLASIM_ACCELERATOR without a topology",
        _env(XLASIM_ACCELERATOR="v4"),
        EnvError,
        ("XLASIM_ACCELERATOR='v4'", "without XLASIM_TOPOLOGY"),
    ),
    Bad(
        "XLASIM_ENFORCE_HBM not on/off",
        _env(XLASIM_TOPOLOGY="2x2", XLASIM_ENFORCE_HBM="maybe"),
        EnvError,
        ("XLASIM_ENFORCE_HBM='maybe'", _ON_OFF),
    ),
    Bad(
        "XLASIM_HOSTS_TIMEOUT_S not a number",
        lambda: check_runtime_knobs({"XLASIM_HOSTS_TIMEOUT_S": "soon"}),
        EnvError,
        ("XLASIM_HOSTS_TIMEOUT_S='soon'", "finite number > 0"),
    ),
    Bad(
        "XLASIM_HOSTS_TIMEOUT_S infinite (a wait that never trips)",
        lambda: check_runtime_knobs({"XLASIM_HOSTS_TIMEOUT_S": "inf"}),
        EnvError,
        ("XLASIM_HOSTS_TIMEOUT_S='inf'", "finite number > 0"),
    ),
    Bad(
        "XLASIM_HOSTS_TIMEOUT_S zero",
        lambda: check_runtime_knobs({"XLASIM_HOSTS_TIMEOUT_S": "0"}),
        EnvError,
        ("XLASIM_HOSTS_TIMEOUT_S='0'", "finite number > 0"),
    ),
    Bad(
        "env_int below its minimum",
        lambda: env_int("XLASIM_X", 1, minimum=1, environ={"XLASIM_X": "0"}),
        EnvError,
        ("XLASIM_X='0'", "whole number >= 1"),
    ),
    Bad(
        "env_float nan",
        lambda: env_float("XLASIM_X", 1.0, environ={"XLASIM_X": "nan"}),
        EnvError,
        ("XLASIM_X='nan'", "finite number > 0"),
    ),
]


# -- meshes (torch_xla's own errors) ---------------------------------------------------------
def _in_sim(body: Callable[[Any], Any], topology: str = "2x2") -> Callable[[], Any]:
    """Runs ``body(spmd module)`` in a 4-device SPMD simulation, like PJRT CPU with 4 devices."""

    def run() -> Any:
        with xlasim.simulate(topology, spmd=True):
            import torch_xla.distributed.spmd as xs

            return body(xs)

    return run


MESHES = [
    Bad(
        "mesh with too few device ids",
        _in_sim(lambda xs: xs.Mesh(np.arange(3), (3,))),
        AssertionError,
        ("Number of device IDs (3) must match the global number of devices (4)",),
    ),
    Bad(
        "mesh with too many device ids",
        _in_sim(lambda xs: xs.Mesh(np.arange(8), (8,))),
        AssertionError,
        ("Number of device IDs (8) must match the global number of devices (4)",),
    ),
    Bad(
        "mesh shape not the device count",
        _in_sim(lambda xs: xs.Mesh(np.arange(4), (2, 3))),
        AssertionError,
        ("Number of device IDs (4) must match mesh size (6)",),
    ),
    Bad(
        "mesh with a zero axis",
        _in_sim(lambda xs: xs.Mesh(np.arange(4), (0, 4))),
        AssertionError,
        ("Number of device IDs (4) must match mesh size (0)",),
    ),
    Bad(
        "mesh with a repeated device",
        _in_sim(lambda xs: xs.Mesh(np.array([0, 0, 1, 2]), (4,))),
        AssertionError,
        ("Device IDs must be unique, got: [0 0 1 2]",),
    ),
    Bad(
        "mesh with a device past the slice",
        _in_sim(lambda xs: xs.Mesh(np.array([0, 1, 2, 7]), (4,))),
        AssertionError,
        ("Device IDs must be less than mesh size (4), got: [0 1 2 7]",),
    ),
    Bad(
        "mesh with too few axis names",
        _in_sim(lambda xs: xs.Mesh(np.arange(4), (2, 2), ("a",))),
        AssertionError,
        ("Number of axis names (1) must match mesh dimensions (2)",),
    ),
    Bad(
        "mesh with a repeated axis name",
        _in_sim(lambda xs: xs.Mesh(np.arange(4), (2, 2), ("a", "a"))),
        AssertionError,
        ("Axis names must be unique, got: ('a', 'a')",),
    ),
]


# -- partition specs (torch_xla's own errors, then the simulator's hint) ---------------------
def _mark(spec: Any, rank: int = 2, mesh: Any = None) -> Callable[[], Any]:
    def body(xs: Any) -> Any:
        import torch

        grid = xs.Mesh(np.arange(4), (2, 2), ("x", "y")) if mesh is None else mesh(xs)
        t = torch.zeros(*([4] * rank), device="xla")
        return xs.mark_sharding(t, grid, spec)

    return _in_sim(body)


_AXES = "has axes 0='x', 1='y'"

PARTITION_SPECS = [
    Bad(
        "spec longer than the tensor",
        _mark(("x", "y", None)),
        AssertionError,
        ("Partition spec length (3) should be equal to the input rank (2).",),
    ),
    Bad(
        "spec shorter than the tensor",
        _mark(("x",)),
        AssertionError,
        ("Partition spec length (1) should be equal to the input rank (2).",),
    ),
    Bad(
        "spec names an unknown axis",
        _mark(("z", None)),
        ValueError,
        ("Axis name z is not defined in the given mesh", "'z' is not an axis name", _AXES),
    ),
    Bad(
        "spec axis index past the mesh",
        _mark((2, None)),
        AssertionError,
        ("partition_spec ((2, None)) contains out of bound index into mesh_shape.", _AXES),
    ),
    Bad(
        "spec negative axis index",
        _mark((-1, None)),
        AssertionError,
        ("partition_spec ((-1, None)) contains out of bound index into mesh_shape.", _AXES),
    ),
    Bad(
        "spec uses an axis twice",
        _mark(("x", "x")),
        AssertionError,
        (
            "Each device mesh dimension should appear at most once in partition_spec (0, 0).",
            "mesh axis 0 ('x') is used more than once",
        ),
    ),
    Bad(
        "spec uses an axis twice inside a tuple",
        _mark((("x", "x"), None)),
        AssertionError,
        (
            "Each device mesh dimension should appear at most once in partition_spec "
            "((0, 0), None).",
            "mesh axis 0 ('x') is used more than once",
        ),
    ),
    Bad(
        "spec entry a float",
        _mark((0.5, None)),
        ValueError,
        ("Spec type <class 'float'> is not supported in partition spec",),
    ),
    Bad(
        "spec entry a bool",
        _mark((True, None)),
        ValueError,
        ("Spec type <class 'bool'> is not supported in partition spec",),
    ),
    Bad("spec given as a list", _mark(["x", None]), TypeError, ("unhashable type: 'list'",)),
    Bad(
        "spec on an unnamed mesh names an axis",
        _mark(("data", None), mesh=lambda xs: xs.Mesh(np.arange(4), (4,))),
        TypeError,
        ("argument of type 'NoneType' is not iterable", "names axis 'data'", "unnamed axes 0..0"),
    ),
    Bad(
        "spec on a CPU tensor",
        _in_sim(
            lambda xs: xs.mark_sharding(
                __import__("torch").zeros(4, 4), xs.Mesh(np.arange(4), (4,)), (0, None)
            )
        ),
        RuntimeError,
        ("Expected XLA tensor. Got: torch.FloatTensor", "t.to(torch_xla.device())"),
    ),
]


# -- devices (torch_xla's own errors, the simulator's hint in a note) --------------------------
def _device(body: Callable[[Any], Any]) -> Callable[[], Any]:
    def run() -> Any:
        import torch

        with xlasim.simulate("2x2"):
            return body(torch)

    return run


DEVICES = [
    Bad(
        "factory on a device past the host's",
        _device(lambda torch: torch.zeros(2, device="xla:99")),
        RuntimeError,
        (
            "vector::_M_range_check: __n (which is 99) >= this->size() (which is 4)",
            "device xla:99 does not exist",
            "xla:0",
        ),
    ),
    Bad(
        "transfer to a device past the host's",
        _device(lambda torch: torch.zeros(2).to("xla:4")),
        RuntimeError,
        (
            "vector::_M_range_check: __n (which is 4) >= this->size() (which is 4)",
            "device xla:4 does not exist",
        ),
    ),
    Bad(
        "negative device index",
        _device(lambda torch: torch.zeros(2, device=torch.device("xla", -1))),
        RuntimeError,
        ("Device index must not be negative",),
    ),
    Bad(
        "device string not an index",
        _device(lambda torch: torch.zeros(2, device="xla:abc")),
        RuntimeError,
        ("Invalid device string: 'xla:abc'",),
    ),
    Bad(
        "under SPMD only xla:0 exists",
        _in_sim(lambda xs: __import__("torch").zeros(2, device="xla:1")),
        RuntimeError,
        (
            "vector::_M_range_check: __n (which is 1) >= this->size() (which is 1)",
            "one virtual device under SPMD",
        ),
    ),
    Bad(
        "CPU tensor where an xla one is needed",
        _in_sim(lambda xs: xs.clear_sharding(__import__("torch").zeros(2))),
        RuntimeError,
        ("Expected XLA tensor. Got: torch.FloatTensor", "a cpu tensor (shape [2])"),
    ),
]

# -- dtypes and precision settings -----------------------------------------------------------
DTYPES = (
    [
        Bad(
            f"precision {p!r}",
            lambda p=p: SeamlessConfig(precision=p),
            ValueError,
            (f"precision {p!r}", "'fp32' (default) or 'bf16'"),
        )
        for p in ["fp16", "bfloat16", "float32", "int8"]
    ]
    + [
        Bad(
            f"mixed_precision {m!r}",
            lambda m=m: SeamlessConfig(mixed_precision=m),
            ValueError,
            (f"mixed_precision {m!r}", "'no' (default) or 'bf16'"),
        )
        for m in ["fp16", "float16", "yes"]
    ]
    + [
        Bad(
            "bf16 twice",
            lambda: SeamlessConfig(precision="bf16", mixed_precision="bf16"),
            ValueError,
            ("precision='bf16'", "set one of them"),
        ),
    ]
)

# -- compile cache settings ------------------------------------------------------------------
_POLICIES = "True (no host writes), False (every host writes), 'followers' (host 0 writes)"

CACHE_DIRS = (
    [
        Bad(
            "cache dir is a file",
            lambda: check_cache_base(__file__, "compilation_cache_dir"),
            ValueError,
            (repr(__file__), "is a file, not a directory"),
        ),
        Bad(
            "cache dir empty",
            lambda: cache_dir_for("", None, "2.9.0"),
            ValueError,
            ("cache directory ''", "non-empty path"),
        ),
        Bad(
            "cache dir not a str",
            lambda: check_cache_base(5, "compile_cache_dir"),
            ValueError,
            ("compile_cache_dir 5", "directory path (str)"),
        ),
        Bad(
            "compile_cache without a dir",
            lambda: SeamlessConfig(compile_cache=True),
            ValueError,
            ("compile_cache=True needs compile_cache_dir",),
        ),
        Bad(
            "compile_cache dir is a file",
            lambda: SeamlessConfig(compile_cache=True, compile_cache_dir=__file__),
            ValueError,
            (repr(__file__), "is a file, not a directory"),
        ),
        Bad(
            "compile_cache_dir without compile_cache",
            lambda: SeamlessConfig(compile_cache_dir="/tmp/cache"),
            ValueError,
            ("'/tmp/cache'", "set compile_cache=True"),
        ),
        Bad(
            "compilation_timeout has no torch_xla mechanism",
            lambda: SeamlessConfig(compilation_timeout=60),
            ValueError,
            ("compilation_timeout=60 is not supported", "timeout_s"),
        ),
    ]
    + [
        Bad(
            f"memory cache size {s!r}",
            lambda s=s: set_memory_cache_size(s),
            ValueError,
            (f"compilation cache size {s!r}", "int >= 1"),
        )
        for s in [0, -1, True, "5", 2.0]
    ]
    + [
        Bad(
            f"readonly policy {p!r}",
            lambda p=p: decide_readonly(p, 0),
            ValueError,
            (f"readonly policy {p!r}", _POLICIES),
        )
        for p in ["yes", 1, None, "leader"]
    ]
    + [
        Bad(
            "readonly 'auto' without markers",
            lambda: decide_readonly("auto", 1),
            ValueError,
            ("'auto' needs every host's visible markers", "host 1"),
        ),
    ]
)


# -- Ray config: TPUTorchConfig and the trainer's arguments ----------------------------------
def _cfg(**kw: Any) -> Callable[[], Any]:
    return lambda: TPUTorchConfig(**kw)


_SECONDS = "expected a finite number of seconds > 0"
_INTS = "tuple of positive ints"

RAY_CONFIG = (
    [
        Bad("backend nccl", _cfg(backend="nccl"), ValueError, ("backend 'nccl'", "'gloo'")),
        Bad(
            "backend xla under SPMD",
            _cfg(backend="xla"),
            ValueError,
            ("backend 'xla'", "XLA backend is not supported with SPMD", "spmd=False"),
        ),
        Bad(
            "backend gloo without SPMD",
            _cfg(backend="gloo", spmd=False),
            ValueError,
            ("backend 'gloo'", "'xla'"),
        ),
        Bad(
            "init_method unknown",
            _cfg(init_method="foo"),
            ValueError,
            ("init_method 'foo'", "'env', 'tcp'"),
        ),
        Bad(
            "init_method env without SPMD",
            _cfg(init_method="env", spmd=False),
            ValueError,
            ("init_method 'env'", "'xla'"),
        ),
        Bad("spmd a str", _cfg(spmd="yes"), ValueError, ("spmd 'yes'", "True or False")),
        Bad("spmd an int", _cfg(spmd=1), ValueError, ("spmd 1", "True or False")),
        Bad("topology malformed", _cfg(topology="2x"), ValueError, ("'2x'", _TOPOLOGY_FORMS)),
        Bad("accelerator unknown", _cfg(accelerator="v9"), ValueError, ("'v9'", _GENERATIONS)),
        Bad(
            "topology against accelerator",
            _cfg(topology="2x2x2", accelerator="v6e"),
            ValueError,
            ("'2x2x2'", "v6e slices are 2-D"),
        ),
        Bad(
            "axis_names too few",
            _cfg(mesh_shape=(2, 2), axis_names=("a",)),
            ValueError,
            ("axis_names ('a',)", "one name per dimension"),
        ),
        Bad(
            "axis_names repeated",
            _cfg(mesh_shape=(2, 2), axis_names=("a", "a")),
            ValueError,
            ("axis_names ('a', 'a')", "must be unique"),
        ),
        Bad(
            "axis_names a str",
            _cfg(mesh_shape=(1, 2), axis_names="ab"),
            ValueError,
            ("axis_names 'ab'", "tuple of str"),
        ),
        Bad(
            "axis_names of ints",
            _cfg(mesh_shape=(1, 2), axis_names=(1, 2)),
            ValueError,
            ("axis_names (1, 2)", "tuple of non-empty str"),
        ),
        Bad(
            "mesh without SPMD",
            _cfg(spmd=False, mesh_shape=(2,)),
            ValueError,
            ("mesh_shape need(s) SPMD", "set spmd=True or drop mesh_shape"),
        ),
        Bad(
            "xla_spmd_config unknown key",
            _cfg(xla_spmd_config={"foo": 1}),
            ValueError,
            ("'foo'", "mesh_shape, data_parallel_size, model_parallel_size, partitioning_mode"),
        ),
        Bad(
            "xla_spmd_config bad mode",
            _cfg(xla_spmd_config={"partitioning_mode": "semi"}),
            ValueError,
            ("'semi'", "'manual', 'auto'"),
        ),
        Bad(
            "xla_spmd_config not a dict",
            _cfg(xla_spmd_config="x"),
            ValueError,
            ("xla_spmd_config 'x'", "a dict with keys"),
        ),
        Bad(
            "xla_spmd_config zero data parallel",
            _cfg(xla_spmd_config={"data_parallel_size": 0}),
            ValueError,
            ("data_parallel_size'] 0", "positive int"),
        ),
        Bad(
            "xla_spmd_config mesh against data parallel",
            _cfg(xla_spmd_config={"mesh_shape": (2, 4), "data_parallel_size": 4}),
            ValueError,
            ("(2, 4)", "data_parallel_size=4", "(data_parallel_size, model_parallel_size)"),
        ),
        Bad(
            "auto partitioning with a mesh",
            _cfg(mesh_shape=(2, 2), xla_spmd_config={"partitioning_mode": "auto"}),
            ValueError,
            ("partitioning_mode 'auto'", "drop one"),
        ),
        Bad(
            "cache readonly a str",
            _cfg(compilation_cache_readonly="yes"),
            ValueError,
            ("compilation_cache_readonly 'yes'", "True, False, 'followers', 'auto'"),
        ),
        Bad(
            "cache readonly an int",
            _cfg(compilation_cache_readonly=1),
            ValueError,
            ("compilation_cache_readonly 1", "True, False, 'followers', 'auto'"),
        ),
        Bad(
            "TPUTorchConfig cache dir empty",
            _cfg(compilation_cache_dir=""),
            ValueError,
            ("compilation_cache_dir ''", "directory path"),
        ),
        Bad(
            "TPUTorchConfig cache dir an int",
            _cfg(compilation_cache_dir=5),
            ValueError,
            ("compilation_cache_dir 5", "directory path"),
        ),
        Bad(
            "TPUTorchConfig cache dir is a file",
            _cfg(compilation_cache_dir=__file__),
            ValueError,
            (repr(__file__), "is a file, not a directory"),
        ),
        Bad(
            "pjrt_device GPU",
            _cfg(pjrt_device="GPU"),
            ValueError,
            ("pjrt_device 'GPU'", "'TPU', 'CPU' or None"),
        ),
        Bad(
            "pjrt_device lower case",
            _cfg(pjrt_device="tpu"),
            ValueError,
            ("pjrt_device 'tpu'", "'TPU', 'CPU' or None"),
        ),
    ]
    + [
        Bad(f"mesh_shape {m!r}", _cfg(mesh_shape=m), ValueError, (f"mesh_shape {m!r}", _INTS))
        for m in [(0, 2), ("a",), 2, "2x2", (2.0, 2), (True, 2)]
    ]
    + [
        Bad(
            f"{name}={value!r}",
            lambda name=name, value=value: TPUTorchConfig(**{name: value}),
            ValueError,
            (f"{name} {value!r}", _SECONDS),
        )
        for name in ("timeout_s", "bootstrap_timeout_s", "shutdown_timeout_s")
        # inf and nan would be bounds that never trip: a hang instead of an error.
        for value in (0, -1, True, "10", math.inf, math.nan)
    ]
)


def _scaling(**kw: Any) -> Any:
    from ray.train import ScalingConfig  # deferred: only the trainer rows need Ray's classes

    return ScalingConfig(use_tpu=True, **kw)


def _select(torch_config: Any, **scaling: Any) -> Callable[[], Any]:
    def run() -> Any:
        from tpu_backend.trainer import select_torch_config

        return select_torch_config(torch_config, _scaling(**scaling))

    return run


def _torch_config(**kw: Any) -> Any:
    from ray.train.torch import TorchConfig

    return TorchConfig(**kw)


_V4_16 = {"num_workers": 2, "topology": "2x2x2", "accelerator_type": "TPU-V4"}

TRAINER_ARGS = [
    Bad(
        "plain TorchConfig naming nccl",
        lambda: _select(_torch_config(backend="nccl"), **_V4_16)(),
        ValueError,
        ("TorchConfig(backend='nccl')", "tpu_backend.TPUTorchConfig"),
    ),
    Bad(
        "torch_config not a config",
        _select("gloo", **_V4_16),
        TypeError,
        ("torch_config must be a TorchConfig or TPUTorchConfig", "str"),
    ),
    Bad(
        "accelerator against ScalingConfig",
        _select(TPUTorchConfig(topology="2x2x2", accelerator="v5p"), **_V4_16),
        ValueError,
        ("accelerator 'v5p'", "'TPU-V4'", "give the same generation"),
    ),
    Bad(
        "mesh larger than the slice",
        _select(TPUTorchConfig(mesh_shape=(3, 3)), **_V4_16),
        ValueError,
        ("mesh_shape (3, 3)", "9 devices", "8 devices", "(2, 4)"),
    ),
    Bad(
        "one process per chip needs a worker per chip",
        _select(TPUTorchConfig(spmd=False), **_V4_16),
        ValueError,
        ("num_workers=2", "8 chips", "set num_workers=8"),
    ),
]


# -- the command line (in-process: argv in, one line on stderr, exit status 2) ---------------
CLI = [
    (
        ["run", "--topology", "4x4", "--single-process", "--host-index", "1", "--", "true"],
        ("--single-process and --host-index exclude each other",),
    ),
    (["run", "--topology", "2x", "--", "true"], ("xlasim run:", "'2x'", _TOPOLOGY_FORMS)),
    (["run", "--topology", "-1x2", "--", "true"], ("'-1x2'", _TOPOLOGY_FORMS)),
    (["run", "--topology", "2x2", "--accelerator", "v9", "--", "true"], ("'v9'", _GENERATIONS)),
    (
        ["run", "--topology", "2x2", "--host-index", "2", "--", "true"],
        ("host_index 2", "valid host indices are 0..0"),
    ),
    (
        ["run", "--topology", "2x2", "--host-index", "x", "--", "true"],
        ("--host-index", "invalid int value: 'x'"),
    ),
    (["run", "--topology", "2x2"], ("no command given", "xlasim run --topology T -- CMD")),
    (["run", "--", "true"], ("--topology",)),
    (
        ["run", "--topology", "2x2", "--", "/nonexistent/program"],
        ("command not found", "'/nonexistent/program'"),
    ),
    (["describe", "2x"], ("xlasim describe:", "'2x'", _TOPOLOGY_FORMS)),
    (["describe", "2x2", "--accelerator", "v4"], ("'2x2'", "v4 slices are 3-D")),
    (["frobnicate"], ("invalid choice: 'frobnicate'", "'run', 'describe', 'demo'")),
    (["demo", "--steps", "0"], ("--steps", "'0'", "whole number >= 1")),
    (["demo", "--batch", "-3"], ("--batch", "'-3'", "whole number >= 1")),
    (["demo", "--timeout", "inf"], ("--timeout", "'inf'", "number of seconds > 0")),
    (["demo", "--topology", "2x2x2", "--accelerator", "v6e"], ("'2x2x2'", "v6e slices are 2-D")),
    (["demo", "--topology", "16x16", "--accelerator", "v5e"], ("64 hosts", "2x2x2")),
]


def _cli_env_cases() -> list[tuple[list[str], tuple[str, ...], dict[str, str]]]:
    # A bad knob in the caller's environment fails in `xlasim run`, before the child starts.
    return [
        (
            ["run", "--topology", "2x2", "--", "true"],
            ("XLASIM_ENFORCE_HBM='maybe'", _ON_OFF),
            {"XLASIM_ENFORCE_HBM": "maybe"},
        ),
        (
            ["run", "--topology", "2x2", "--", "true"],
            ("XLASIM_HOSTS_TIMEOUT_S='-5'",),
            {"XLASIM_HOSTS_TIMEOUT_S": "-5"},
        ),
    ]


@pytest.mark.parametrize(("argv", "fragments"), CLI, ids=[" ".join(a) for a, _ in CLI])
def test_cli_bad_input_is_one_line(argv, fragments, capsys):
    _one_line_failure(argv, fragments, capsys)


@pytest.mark.parametrize(
    ("argv", "fragments", "env"),
    _cli_env_cases(),
    ids=lambda v: str(v) if isinstance(v, dict) else None,
)
def test_cli_bad_knob_in_the_environment(argv, fragments, env, capsys, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _one_line_failure(argv, fragments, capsys)


def _one_line_failure(argv: list[str], fragments: tuple[str, ...], capsys: Any) -> None:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == 2, (rc, captured.err)
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    missing = [f for f in fragments if f not in lines[0]]
    assert not missing, (missing, lines[0])


# A few end to end, as a user meets them: a fresh interpreter, one line, no traceback.
_SUBPROCESS = [
    (
        [sys.executable, "-m", "xlasim", "run", "--topology", "2x2x2x2", "--", "true"],
        {},
        "xlasim run: topology '2x2x2x2' is not valid",
    ),
    (
        [sys.executable, "-m", "xlasim", "describe", "4x4", "--accelerator", "tpu"],
        {},
        "xlasim describe: unknown accelerator 'tpu'",
    ),
    # Activation at interpreter start (what xlasim.pth runs when XLASIM_* is set).
    (
        [sys.executable, "-c", "import xlasim._autoactivate"],
        {"XLASIM_TOPOLOGY": "3x3x3x3"},
        "xlasim: XLASIM_TOPOLOGY: topology '3x3x3x3' is not valid",
    ),
]


@pytest.mark.parametrize(("argv", "env", "first"), _SUBPROCESS, ids=["run", "describe", "env"])
def test_bad_input_in_a_fresh_process_is_one_line_without_traceback(argv, env, first):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    environ.update(env)
    done = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(first), done.stderr


# -- nested and concurrent simulations -------------------------------------------------------
def _tensor_across_entries() -> Any:
    import torch

    with xlasim.simulate("2x2"):
        outer = torch.ones(2).to("xla")
        with xlasim.simulate("2x4"):
            return (outer + 1).cpu()


def _tensor_after_exit() -> Any:
    import torch

    with xlasim.simulate("2x2"):
        t = torch.ones(2).to("xla")
    return t + 1


def _exit_twice() -> None:
    sim = xlasim.simulate("2x2")
    with sim:
        pass
    sim.__exit__(None, None, None)


def _from_another_thread() -> None:
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with xlasim.simulate("2x4"):
                pass
        except BaseException as exc:  # handed to the main thread to check
            errors.append(exc)

    with xlasim.simulate("2x2"):
        thread = threading.Thread(target=other, name="second-sim")
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "the second simulation's thread did not finish in 60s"
        import torch_xla.runtime as xr

        # The refused entry changed nothing for the thread that holds the simulation.
        assert xr.global_runtime_device_count() == 4
    raise errors[0]


SIMULATIONS = [
    Bad(
        "tensor used in a nested simulation",
        _tensor_across_entries,
        RuntimeError,
        ("v6e-4 (2x2)", "not on the active one (v6e-8 (2x4)", "copy it to the CPU (t.cpu())"),
    ),
    Bad(
        "tensor used after its simulation ended",
        _tensor_after_exit,
        RuntimeError,
        ("no simulated TPU slice is active", "xlasim.simulate(topology=...)"),
    ),
    Bad(
        "simulation exited twice",
        _exit_twice,
        RuntimeError,
        ("xlasim.simulate('2x2') was exited without being entered (or exited twice)",),
    ),
    Bad(
        "simulation entered from a second thread",
        _from_another_thread,
        RuntimeError,
        (
            "xlasim.simulate('2x4') entered in thread 'second-sim'",
            "thread 'MainThread'",
            "xlasim.simulate('2x2')",
            "in a process of its own",
        ),
    ),
    Bad(
        "runtime asked for outside a simulation",
        lambda: xlasim.current_runtime(),
        RuntimeError,
        ("no simulated TPU slice is active", "xlasim run"),
    ),
    Bad(
        "enforce_hbm given a str",
        lambda: _in_sim(lambda xs: xlasim.enforce_hbm("yes"))(),
        TypeError,
        ("enabled must be True or False", "'yes'"),
    ),
]

CATEGORIES = {
    "topology": TOPOLOGIES,
    "accelerator": ACCELERATORS,
    "host index": HOST_INDEXES,
    "env knob": ENV_KNOBS,
    "mesh": MESHES,
    "partition spec": PARTITION_SPECS,
    "device": DEVICES,
    "dtype": DTYPES,
    "cache dir": CACHE_DIRS,
    "ray config": RAY_CONFIG + TRAINER_ARGS,
    "simulation": SIMULATIONS,
}
ALL = [case for cases in CATEGORIES.values() for case in cases]


@pytest.mark.parametrize("case", ALL, ids=_ids(ALL))
def test_bad_input_is_refused_with_a_clear_error(case):
    _check(case)


def test_the_matrix_covers_every_kind_of_input():
    # The matrix is the product's promise: a shrinking table must be a deliberate change.
    sizes = {name: len(cases) for name, cases in CATEGORIES.items()}
    assert all(size >= 5 for size in sizes.values()), sizes
    assert len(ALL) + len(CLI) + len(_cli_env_cases()) + len(_SUBPROCESS) >= 120
    assert len({c.name for c in ALL}) == len(ALL), "two rows share a name"


_TORCH_XLA_ROWS = MESHES + PARTITION_SPECS + DEVICES[:4]


@pytest.mark.parametrize("case", _TORCH_XLA_ROWS, ids=_ids(_TORCH_XLA_ROWS))
def test_torch_xla_errors_carry_exactly_torch_xla_text(case):
    # The first fragment is torch_xla's own message, which the simulator's equals; the other
    # fragments (what only the simulator can say) are in its one note.
    error = _check(case)
    assert str(error) == case.fragments[0] and error.args == (case.fragments[0],)
    notes = getattr(error, "__notes__", [])
    assert len(notes) == (1 if case.fragments[1:] else 0), notes
    assert all(n.startswith(NOTE_PREFIX) for n in notes), notes
    assert all(f in notes[0] for f in case.fragments[1:]), notes


# -- properties over whole input spaces ------------------------------------------------------
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=200, deadline=None)
@given(_text)
def test_any_topology_text_parses_or_names_itself(text):
    # Whatever the text, the parser either gives a slice or an error quoting the text.
    try:
        spec = parse_slice(text)
    except (ValueError, TypeError) as exc:
        assert repr(text) in str(exc) or repr(text.strip().lower()) in str(exc)
    else:
        assert spec.topology == "x".join(str(d) for d in spec.dims)
        assert spec.topology.isascii()


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(), st.text(max_size=6), st.floats(), st.booleans(), st.none()))
def test_any_timeout_is_a_finite_positive_bound_or_refused(value):
    try:
        config = TPUTorchConfig(bootstrap_timeout_s=value)
    except ValueError as exc:
        assert repr(value) in str(exc) and _SECONDS in str(exc)
    else:
        bound = config.bootstrap_timeout_s
        assert not isinstance(bound, bool) and math.isfinite(bound) and bound > 0


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=8))
def test_any_on_off_text_is_read_or_refused(text):
    try:
        check_runtime_knobs({"XLASIM_ENFORCE_HBM": text})
    except EnvError as exc:
        assert repr(text.strip()) in str(exc) and _ON_OFF in str(exc)
    else:
        assert text.strip().lower() in ("", "1", "true", "yes", "on", "0", "false", "no", "off")
