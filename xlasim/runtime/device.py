"""The ``xla`` device type on stock PyTorch.

Stock torch knows the XLA device type and dispatch key but ships no device guard and no kernels
for it. Autograd needs a guard for every device a tensor lives on, and nothing exposes one to
Python on every torch version we support, so we JIT-build a one-line C++ extension that registers
c10's ``FakeGuardImpl`` for XLA (built once per torch version, then cached by torch). The same
extension carries torch_xla's autocast policy (:mod:`xlasim.runtime.autocast`). Factory
kernels for the XLA key are registered from Python while a simulation is active, so that
``torch.empty(..., device='xla')`` and ``cpu_tensor.to('xla')`` produce simulated tensors.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.autograd.variable import Variable
from torch.utils._mode_utils import no_dispatch

from xlasim.runtime import autocast, op_checks, privateuse1
from xlasim.runtime.dynamic_dims import concrete

# Besides the guard, one op: resizing a wrapper tensor's own metadata, which out= ops and
# in-place view ops (arange(out=), t_()) change on the wrapped CPU tensor.
_GUARD_SOURCE = r"""
#include <c10/core/impl/FakeGuardImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
C10_REGISTER_GUARD_IMPL(XLA, c10::impl::FakeGuardImpl<c10::DeviceType::XLA>);

static void set_meta(const at::Tensor& t, c10::IntArrayRef size, c10::IntArrayRef stride,
                     int64_t offset) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
}
TORCH_LIBRARY(xlasim, m) {
  m.def("set_meta(Tensor t, int[] size, int[] stride, int offset) -> ()");
  m.def("bf16_parts(Tensor x, int n, bool cumulative) -> Tensor[]");
  m.def("bf16_product(Tensor a, Tensor b, int n) -> Tensor");
}
TORCH_LIBRARY_IMPL(xlasim, CompositeImplicitAutograd, m) { m.impl("set_meta", set_meta); }
"""

# The simulated TPU's operand splitting (xlasim.runtime.numerics) in one pass over memory,
# optimized further on its own (O3 where the rest is built at _CFLAGS' level):
# float32 x as n bfloat16 parts (rounded to nearest even, held in float32), each the rounding of
# what the parts before it left; or, cumulative, the running sums x0, x0 + x1, ... (exact in
# float32). Parts keep x's strides when it is dense, so a matmul on them sees x's layout.
_PARTS_SOURCE = r"""
#pragma GCC push_options
#pragma GCC optimize("O3")
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

// Branch-free, so that the loops below vectorize: masks stand for the comparisons.
static inline __attribute__((always_inline)) uint32_t xlasim_bits(float v) {
  uint32_t u;
  __builtin_memcpy(&u, &v, 4);  // inlined even where the rest of the build is unoptimized
  return u;
}

static inline __attribute__((always_inline)) float xlasim_float(uint32_t u) {
  float v;
  __builtin_memcpy(&v, &u, 4);
  return v;
}

static inline __attribute__((always_inline)) uint32_t xlasim_not_finite(uint32_t u) {
  return 0u - (uint32_t)((u & 0x7f800000u) == 0x7f800000u);  // all ones for inf and nan
}

static inline __attribute__((always_inline)) float xlasim_bf16(float v) {
  uint32_t u = xlasim_bits(v);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  // inf stays inf; a nan stays a nan (its payload may sit in the dropped bits).
  uint32_t special = (u | ((uint32_t)((u & 0xffffu) != 0u) << 22)) & 0xffff0000u;
  uint32_t mask = xlasim_not_finite(u);
  return xlasim_float((special & mask) | (rounded & ~mask));
}

// The leading part of a two-way split keeps x's upper 16 bits (truncation, as XLA splits an
// operand for its BF16_BF16_F32_X3 algorithm): what it leaves is then exact in float32.
static inline __attribute__((always_inline)) float xlasim_bf16_cut(float v) {
  uint32_t u = xlasim_bits(v);
  uint32_t special = (u | ((uint32_t)((u & 0xffffu) != 0u) << 22)) & 0xffff0000u;  // nan, inf
  uint32_t mask = xlasim_not_finite(u);
  return xlasim_float((special & mask) | (u & 0xffff0000u & ~mask));
}

#if defined(__x86_64__)
#define XLASIM_WIDE_VECTORS __attribute__((target_clones("avx2", "default")))
#else
#define XLASIM_WIDE_VECTORS
#endif

template <int N, bool CUMULATIVE>
XLASIM_WIDE_VECTORS static void xlasim_parts(const float* __restrict s, float* __restrict d0,
                                             float* __restrict d1, float* __restrict d2,
                                             int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float rest = s[i];
    float sum = 0.0f;
#pragma GCC unroll 3
    for (int k = 0; k < N; ++k) {
      // 'high' cuts its leading part and rounds the rest; 'highest' and 'default' round
      // every part (see xlasim.runtime.numerics for the evidence behind each).
      float part = (N == 2 && k == 0) ? xlasim_bf16_cut(rest) : xlasim_bf16(rest);
      uint32_t left = xlasim_bits(rest - part);
      rest = xlasim_float(left & ~xlasim_not_finite(left));  // inf - inf leaves nothing
      sum = sum + part;
      float value = CUMULATIVE ? sum : part;
      if (k == 0) d0[i] = value;
      else if (k == 1) d1[i] = value;
      else d2[i] = value;
    }
  }
}

template <int N>
static void xlasim_parts_of(const float* s, float** d, bool cumulative, int64_t b, int64_t e) {
  if (cumulative) xlasim_parts<N, true>(s, d[0], d[1], d[2], b, e);
  else xlasim_parts<N, false>(s, d[0], d[1], d[2], b, e);
}

// The parts of x, written into the tensors of x's layout that make(k, src) gives for part k.
template <typename Make>
static std::vector<at::Tensor> xlasim_split(const at::Tensor& x, int64_t n, bool cumulative,
                                            Make make) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "bf16_parts: float32 only, got ", x.scalar_type());
  TORCH_CHECK(n >= 1 && n <= 3, "bf16_parts: 1 to 3 parts, got ", n);
  at::Tensor src = x.is_non_overlapping_and_dense() ? x : x.contiguous();
  std::vector<at::Tensor> out;
  float* dst[3] = {nullptr, nullptr, nullptr};
  for (int64_t k = 0; k < n; ++k) {
    out.push_back(make(k, src));
    dst[k] = out.back().data_ptr<float>();
  }
  const float* s = src.data_ptr<float>();
  at::parallel_for(0, src.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    if (n == 1) xlasim_parts_of<1>(s, dst, cumulative, begin, end);
    else if (n == 2) xlasim_parts_of<2>(s, dst, cumulative, begin, end);
    else xlasim_parts_of<3>(s, dst, cumulative, begin, end);
  });
  return out;
}

static std::vector<at::Tensor> bf16_parts(const at::Tensor& x, int64_t n, bool cumulative) {
  return xlasim_split(x, n, cumulative,
                      [](int64_t, const at::Tensor& src) { return at::empty_like(src); });
}

// Memory for parts that never leave bf16_product: a fresh buffer of a few MB costs as much in
// page faults as the split itself, so each thread keeps its six (three parts of each operand),
// grown to the largest operand seen up to kScratchFloats; larger operands, whose product
// dwarfs the allocation, get fresh memory.
static constexpr int64_t kScratchFloats = 1 << 20;

static at::Tensor xlasim_scratch(int64_t slot, const at::Tensor& src) {
  thread_local at::Tensor buffers[6];
  int64_t numel = src.numel();
  if (numel > kScratchFloats) return at::empty_like(src);
  at::Tensor& buffer = buffers[slot];
  if (!buffer.defined() || buffer.numel() < numel) buffer = at::empty({numel}, src.options());
  // Dense and non-overlapping: src's strides address exactly numel elements from offset 0.
  return buffer.as_strided(src.sizes(), src.strides(), 0);
}

// mm, bmm, mv or dot, told apart by the operands' ranks as the aten ops take them.
static at::Tensor xlasim_dot(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() == 3) return at::bmm(a, b);
  if (a.dim() == 2) return b.dim() == 2 ? at::mm(a, b) : at::mv(a, b);
  return at::dot(a, b);
}

// The sum of the n-part products sum(a_i * b_j, i + j < n), grouped as
// sum(a_i * (b_0 + ... + b_(n-1-i))): one call where Python would make 2 + n, which is most
// of the cost of a small matmul.
static at::Tensor bf16_product(const at::Tensor& a, const at::Tensor& b, int64_t n) {
  std::vector<at::Tensor> left =
      xlasim_split(a, n, false, [](int64_t k, const at::Tensor& src) {
        return xlasim_scratch(k, src);
      });
  std::vector<at::Tensor> right =
      xlasim_split(b, n, true, [](int64_t k, const at::Tensor& src) {
        return xlasim_scratch(3 + k, src);
      });
  at::Tensor out = xlasim_dot(left[0], right[n - 1]);
  for (int64_t i = 1; i < n; ++i) out.add_(xlasim_dot(left[i], right[n - 1 - i]));
  // One reduction, no mask: a nan anywhere makes the sum nan (so may infinities of both signs,
  // and the term-by-term sum then gives the same result).
  if (n > 1 && std::isnan(out.sum().item<double>())) {
    // An infinite operand: its smaller parts are zero, and 0 * inf in a grouped product is
    // nan. XLA sums the products of the smaller parts first and lets a nan there give way to
    // the leading product (x0 * y0), which alone carries an infinity: so here, term by term.
    std::vector<at::Tensor> x = bf16_parts(a, n, false);
    std::vector<at::Tensor> y = bf16_parts(b, n, false);
    at::Tensor small = at::zeros_like(out);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; i + j < n; ++j)
        if (i + j > 0) small.add_(xlasim_dot(x[i], y[j]));
    out = at::where(small.isnan(), at::zeros_like(small), small).add_(xlasim_dot(x[0], y[0]));
  }
  return out;
}
#pragma GCC pop_options
TORCH_LIBRARY_IMPL(xlasim, CPU, m) {
  m.impl("bf16_parts", bf16_parts);
  m.impl("bf16_product", bf16_product);
}
"""


def _source() -> str:
    # The autocast kernels depend on the installed torch's ops, so the source is made per process.
    # The simulated TorchTPU device rides in the same extension: one build, one load.
    return _GUARD_SOURCE + _PARTS_SOURCE + privateuse1.SOURCE + autocast.cpp_source()


# In the engine's error for a device index no queue (and no device thread) serves; a process
# whose first backward pass ran before the XLA guard existed gets it for every xla index.
_NO_DEVICE_QUEUE = "device_ready_queues_"

_lock = threading.Lock()
_guard_ready = False
# How long a process waits for another one building the extension (a cold build takes about
# 30 s on 2 idle cores, minutes on a loaded machine).
BUILD_WAIT_S = 900.0


def _extension_name(source: str) -> str:
    # Keyed by torch version, torch install and source: the build files name the install's
    # paths, and processes running different sources must not rebuild over each other.
    digest = zlib.crc32((source + " ".join(_CFLAGS) + os.path.dirname(torch.__file__)).encode())
    version = re.sub(r"\W", "_", torch.__version__)
    return f"xlasim_xla_{version}_{digest:08x}"


def _cpp_extension() -> Any:
    """``torch.utils.cpp_extension``, imported quietly.

    On a CUDA build of torch (what ``pip install torch`` gives) on a machine without a GPU,
    importing it logs "No CUDA runtime is found" at WARNING; the extension built here is
    CPU-only, so that line would only be noise on every simulated program's stderr.
    """
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        # Deferred: only the first simulation of a process needs it, and it is slow to import.
        from torch.utils import cpp_extension
    finally:
        log.setLevel(level)
    return cpp_extension


# Optimized: the simulated TorchTPU device's fallback runs for nearly every op on a tpu tensor,
# and unoptimized its C++ (mostly inlined header code) costs several times the CPU kernel of a
# small op; it makes a cold build take about twice as long (tens of seconds, once).
_CFLAGS = ("-O2",)


def _build(name: str, source: str, build_dir: str) -> None:
    cpp_extension = _cpp_extension()

    # torch's own build lock is a plain file that outlives a process killed mid-build and then
    # blocks every later one; the caller holds an OS lock, which dies with its holder, so any
    # torch lock left in the directory now is stale.
    stale = os.path.join(build_dir, "lock")
    if os.path.exists(stale):
        os.remove(stale)
    try:
        cpp_extension.load_inline(
            name=name,
            cpp_sources=[source],
            is_python_module=False,
            verbose=False,
            extra_cflags=list(_CFLAGS),
        )
    except (RuntimeError, OSError) as exc:  # compiler or ninja missing
        raise RuntimeError(
            "xlasim could not build its XLA device-guard extension (it needs a C++ "
            "compiler such as g++ and the `ninja` package): " + str(exc)
        ) from exc


def _build_directory(name: str) -> str:
    """Where torch's extension cache keeps the extension ``name`` (created if missing)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        # torch's default root is named after the Python and the torch build, by a rule that
        # changes between torch versions: ask torch.
        return str(_cpp_extension()._get_build_directory(name, verbose=False))
    # Under TORCH_EXTENSIONS_DIR (the tox envs set it) every supported torch keeps an
    # extension in a folder of its name. Found here, a process that loads an extension built
    # before never imports torch.utils.cpp_extension, and setuptools with it: tenths of a
    # second of CPU in every simulated process's start.
    build_dir = os.path.join(root, name)
    os.makedirs(build_dir, exist_ok=True)
    return build_dir


def ensure_device_guard() -> None:
    """Registers a device guard for the XLA device type (once per process)."""
    global _guard_ready
    if _guard_ready:
        return
    with _lock:
        if _guard_ready:
            return
        # Deferred: only the first simulation of a process builds the extension.
        from filelock import FileLock, Timeout

        # Built under torch's extension cache (TORCH_EXTENSIONS_DIR to move it).
        source = _source()
        name = _extension_name(source)
        build_dir = _build_directory(name)
        built = os.path.join(build_dir, "xlasim-built")
        lock = FileLock(os.path.join(build_dir, "xlasim-build.lock"), timeout=BUILD_WAIT_S)
        try:
            lock.acquire()
        except Timeout:
            raise TimeoutError(
                f"xlasim waited {BUILD_WAIT_S:g} s for another process to finish building its "
                f"device-guard extension in {build_dir}; if no such process is running, "
                "delete that directory"
            ) from None
        try:
            if os.path.exists(built):
                # Built before from this very source (the directory name says so): load it
                # without asking ninja, whose verdict changes with whichever ninja is first on
                # PATH (two versions hash a command differently and rebuild each other's work).
                torch.ops.load_library(os.path.join(build_dir, f"{name}.so"))
            else:
                # A first use compiles for tens of seconds: say so, since nothing else would
                # (a library left by an older xlasim without the marker only relinks).
                compiles = not os.path.exists(os.path.join(build_dir, f"{name}.so"))
                if compiles:
                    _note(
                        f"building the simulator's C++ device extension for torch "
                        f"{torch.__version__} (first use only; tens of seconds)..."
                    )
                start = time.monotonic()
                _build(name, source, build_dir)
                with open(built, "w") as marker:
                    marker.write(torch.__version__)
                if compiles:
                    _note(
                        f"built in {time.monotonic() - start:.0f} s; cached in {build_dir} "
                        "(TORCH_EXTENSIONS_DIR moves it), so later runs skip this"
                    )
        finally:
            lock.release()
        _guard_ready = True


def _note(line: str) -> None:
    # stderr, one line: a program's own stdout stays exactly what it prints.
    print(f"xlasim: {line}", file=sys.stderr, flush=True)


def xla_strides(shape: Sequence[int]) -> list[int]:
    """The strides an ``xla`` tensor of ``shape`` reports: row-major over the logical shape,
    whatever view it is, as torch_xla derives them from the XLA shape alone (a size-0 dim
    zeroes the strides before it, where torch's own contiguous strides would not)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 1, 0, -1):
        strides[i - 1] = strides[i] * shape[i]
    return strides


def set_wrapper_shape(wrapper: torch.Tensor, shape: Sequence[int]) -> None:
    """Gives a wrapper tensor a new shape (with its ``xla`` strides and offset 0), as out= ops
    and in-place view ops (arange(out=), t_()) change it."""
    with no_dispatch():
        torch.ops.xlasim.set_meta(wrapper, list(shape), xla_strides(shape), 0)


def backward_on_device(leaf: torch.Tensor) -> None:
    """Runs ``leaf.sum().backward()`` through the autograd engine directly.

    ``Tensor.backward()`` on torch >= 2.13 stores a ``contextvars.Context`` with the graph task.
    For an ``xla`` tensor the task runs on the engine's device thread, which can drop the last
    reference to it just after backward() has returned; releasing the context then needs the
    GIL, and once interpreter shutdown has begun CPython ends a thread that asks for it, inside
    a noexcept destructor: the process aborts. A task started here holds no Python object, so
    releasing it never needs the GIL.
    """
    out = leaf.sum()
    # (tensors, grad_tensors, keep_graph, create_graph, inputs, allow_unreachable,
    # accumulate_grad): what torch.autograd.backward passes, minus the stored context.
    Variable._execution_engine.run_backward(
        (out,), (torch.ones_like(out),), False, False, (), True, True
    )


def check_autograd_engine(make_tensor: Callable[[], torch.Tensor]) -> None:
    """Fails clearly if autograd started before the XLA guard existed.

    The autograd engine sizes its per-device queues once, on the first backward pass in the
    process, from the device guards registered then; a process that ran a backward pass before
    the guard was registered can never run one on an ``xla`` tensor.
    """
    try:
        backward_on_device(make_tensor().requires_grad_())
    except RuntimeError as exc:
        if _NO_DEVICE_QUEUE not in str(exc):
            raise
        raise RuntimeError(
            "xlasim: this process ran a backward pass before the simulated XLA device was "
            "registered, and PyTorch's autograd engine cannot add a device afterwards. Call "
            "xlasim.register_xla_device() (or enter xlasim.simulate) before any backward pass, "
            "or run the simulated program in a fresh process (`xlasim run -- python ...`)."
        ) from None


def release_graph_tasks(make_tensor: Callable[[int], torch.Tensor], indices: Iterable[int]) -> None:
    """Returns once the autograd device threads of ``indices`` hold no earlier graph task.

    Run at interpreter exit, before shutdown begins, so that no device thread asks for the GIL
    after it has (see :func:`backward_on_device`), whatever backward passes the program ran. A
    device thread takes its tasks one at a time and drops each finished task before it takes
    the next, so once a backward pass of ours on that device has returned, every earlier task
    has been released there; ours holds no Python object.
    """
    for index in indices:
        try:
            # The program may have turned gradients off for good (torch.set_grad_enabled).
            with torch.enable_grad():
                backward_on_device(make_tensor(index).requires_grad_())
        except RuntimeError as exc:
            if _NO_DEVICE_QUEUE not in str(exc):
                raise
            # No device thread serves this index, so it holds no task either.


class FactoryKernels:
    """XLA-key kernels for the factory ops stock torch routes to a device without inputs.

    Registered on activation and removed on deactivation, so that a process where the real
    torch_xla is loaded later is left as it was.
    """

    def __init__(
        self,
        wrap_new: Callable[[torch.Tensor, torch.device, Any], torch.Tensor],
        copy_into: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        reserve: Callable[[Any, torch.dtype | None, torch.device | None], None],
        storage: Callable[[], torch.device],
        count: Callable[[bool], None],
    ) -> None:
        self._wrap_new = wrap_new
        self._copy_into = copy_into
        # Runs before the CPU tensor behind a new device tensor is allocated: a tensor that
        # does not fit (or a device that does not exist) must fail before taking host memory.
        self._reserve = reserve
        # Where a new device tensor's values live: the CPU, or meta in a dry run.
        self._storage = storage
        # Counts a call of torch_xla's empty kernel (strided or not) among its op counters.
        self._count = count
        self._lib: torch.library.Library | None = None

    def register(self) -> None:
        if self._lib is not None:
            return
        wrap_new, reserve, storage = self._wrap_new, self._reserve, self._storage
        count = self._count
        lib = torch.library.Library("aten", "IMPL", "XLA")

        def empty_memory_format(
            size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
        ):
            reserve(size, dtype, device)
            count(False)
            values = torch.empty(
                concrete(size),
                dtype=dtype,
                layout=layout,
                memory_format=memory_format,
                device=storage(),
            )
            return wrap_new(values, device, size)

        def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
            reserve(size, dtype, device)
            count(True)
            values = torch.empty_strided(
                concrete(size), concrete(stride), dtype=dtype, layout=layout, device=storage()
            )
            return wrap_new(values, device, size)

        # Reached instead of the Python key where torch excludes it (torch.tensor(..., device=)).
        def copy_from(src, dst, non_blocking=False):
            return copy_into(src, dst)

        def copy_from_and_resize(src, dst):
            dst.resize_(src.shape)
            return copy_into(src, dst)

        # torch's own full() makes an empty tensor and fills it; torch_xla checks the sizes
        # first, with its own message.
        def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
            op_checks.check(torch.ops.aten.full.default, (size, fill_value), {})
            if dtype is None:  # full()'s inference from the fill value
                dtype = torch.full((), fill_value).dtype
            new = torch.empty(size, dtype=dtype, layout=layout, device=device)
            return new.fill_(fill_value)

        copy_into = self._copy_into
        lib.impl("full", full)
        lib.impl("empty.memory_format", empty_memory_format)
        lib.impl("empty_strided", empty_strided)
        lib.impl("_copy_from", copy_from)
        lib.impl("_copy_from_and_resize", copy_from_and_resize)
        self._lib = lib

    def unregister(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
