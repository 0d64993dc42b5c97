"""The C++ source of the simulated TorchTPU device: a native PrivateUse1 backend over CPU memory.

TorchTPU renames PyTorch's PrivateUse1 device type to ``tpu``. The simulated one keeps a
tensor's bytes in host memory, so every op can run as the CPU kernel on a CPU tensor that
aliases the very same bytes (a "CPU view"): no copies in or out, in-place ops and views keep
working, and eager speed stays close to plain CPU. The pieces, each what PyTorch needs from an
out-of-tree device:

- an allocator over host memory that keeps PyTorch's device-allocator statistics
  (``torch.accelerator.memory_allocated()`` ...), reports the simulated chip's HBM as the
  device's total memory and, when the simulation enforces HBM, refuses what outgrows it;
- a device guard: one device per process (TorchTPU binds one chip to a process), its count set
  when a simulation starts and zero outside one, so a device index that does not exist fails;
- ``empty``/``empty_strided``/``_copy_from``/``_copy_from_and_resize``/``resize_`` kernels;
- a boxed fallback for every other op: tpu arguments become CPU views, the CPU kernel runs, and
  its results become tpu tensors again (a result aliasing an argument stays an alias, a fresh
  one takes over the CPU kernel's memory without a copy);
- a default random generator per device, separate from the CPU's, which random ops on tpu
  tensors draw from (the CPU kernel is handed the same generator object for the call);
- copies of tensors with the conjugate or negative bit handled by the tpu copy itself;
- the PrivateUse1 hooks (generators, device of a pointer), registered only when a TorchTPU
  simulation first starts, since they make PrivateUse1 the process's accelerator.

It is compiled into the device extension (:mod:`xlasim.runtime.device`), one build for both
simulated surfaces.
"""

SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/MathBitsFallback.h>
#include <ATen/native/Resize.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

namespace xlasim_tpu {
constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;
// Devices of this process: 1 inside a TorchTPU simulation, 0 outside one.
std::atomic<int> g_devices{0};
thread_local c10::DeviceIndex g_current = 0;
// HBM one device addresses (the simulated chip's), for torch.accelerator's memory queries.
std::atomic<int64_t> g_hbm{0};
// Refuse what outgrows it, as PJRT's allocator does (xlasim.enforce_hbm, XLASIM_ENFORCE_HBM=1).
std::atomic<bool> g_enforce{false};
// Every op result is counted in and out, so the statistics' lock is taken twice per op: a
// spin lock (held for a few additions, almost never contended) costs a fraction of a mutex.
struct SpinLock {
  std::atomic_flag held = ATOMIC_FLAG_INIT;
  void lock() {
    while (held.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  }
  void unlock() { held.clear(std::memory_order_release); }
};
SpinLock g_stats_lock;
c10::CachingDeviceAllocator::DeviceStats g_stats;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < g_devices.load(),
              "tpu:", static_cast<int>(index), " is not a TPU device of this process: ",
              g_devices.load() == 0
                  ? std::string("no simulated TPU is attached (outside a simulation)")
                  : "TorchTPU binds one TPU device to a process, tpu:0");
}

c10::Device here(c10::DeviceIndex index) { return c10::Device(kTpu, index); }

// Memory: host memory, counted while it is live.
struct Block {
  c10::DataPtr owned;  // a CPU kernel's memory taken over, or empty for our own
  void* data;
  int64_t bytes;
  // The CPU storage over these bytes that the fallback's CPU views share, made on first use
  // and kept while the bytes live: an op on tpu tensors then makes no storage per argument.
  std::atomic<c10::StorageImpl*> view{nullptr};
};

// What PyTorch's device allocators report, with nothing cached: every live block is both
// allocated and reserved, one segment each.
void count(int64_t bytes) {
  constexpr size_t all = 0;  // StatType::AGGREGATE
  std::lock_guard<SpinLock> hold(g_stats_lock);
  for (auto* stat : {&g_stats.allocated_bytes[all], &g_stats.reserved_bytes[all],
                     &g_stats.active_bytes[all], &g_stats.requested_bytes[all]}) {
    if (bytes >= 0) stat->increase(bytes);
    else stat->decrease(-bytes);
  }
  for (auto* stat : {&g_stats.allocation[all], &g_stats.segment[all], &g_stats.active[all]}) {
    if (bytes >= 0) stat->increase(1);
    else stat->decrease(1);
  }
}

// tsl's HumanReadableNumBytes, which PJRT's allocator messages print (as hbm.human_bytes).
std::string human_bytes(int64_t n) {
  if (n < 0) return "-" + human_bytes(-n);
  if (n < 1024) return std::to_string(n) + "B";
  const char* units = "KMGTPE";
  int unit = 0;
  while (n >= 1024 * 1024) {
    n /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), units[unit] == 'K' ? "%.1f%c" : "%.2f%c", n / 1024.0,
                units[unit]);
  return text;
}

// Fails like PJRT's allocator when n more bytes overflow the device's HBM.
void reserve(int64_t n) {
  int64_t capacity = g_hbm.load();
  if (!g_enforce.load() || capacity <= 0) return;
  int64_t used;
  {
    std::lock_guard<SpinLock> hold(g_stats_lock);
    used = g_stats.reserved_bytes[0].current;
  }
  TORCH_CHECK_WITH(OutOfMemoryError, used + n <= capacity,
                   "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate ",
                   human_bytes(n), ". That was not possible. There are ",
                   human_bytes(std::max<int64_t>(capacity - used, 0)), " free.");
}

void release(void* ctx) {
  Block* b = static_cast<Block*>(ctx);
  count(-b->bytes);
  if (c10::StorageImpl* view = b->view.load()) c10::raw::intrusive_ptr::decref(view);
  if (!b->owned) c10::free_cpu(b->data);
  delete b;
}

struct Allocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t n) override {
    reserve(static_cast<int64_t>(n));
    void* data = n ? c10::alloc_cpu(n) : nullptr;
    count(static_cast<int64_t>(n));
    return {data, new Block{c10::DataPtr(), data, static_cast<int64_t>(n)}, &release,
            here(g_current)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t n) const override {
    std::memcpy(dest, src, n);
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing cached
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    std::lock_guard<SpinLock> hold(g_stats_lock);
    return g_stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {
    std::lock_guard<SpinLock> hold(g_stats_lock);
    for (auto* a : {&g_stats.allocated_bytes, &g_stats.reserved_bytes, &g_stats.active_bytes,
                    &g_stats.requested_bytes, &g_stats.allocation, &g_stats.segment,
                    &g_stats.active}) {
      for (auto& stat : *a) stat.reset_accumulated();
    }
  }
  void resetPeakStats(c10::DeviceIndex) override {
    std::lock_guard<SpinLock> hold(g_stats_lock);
    for (auto* a : {&g_stats.allocated_bytes, &g_stats.reserved_bytes, &g_stats.active_bytes,
                    &g_stats.requested_bytes, &g_stats.allocation, &g_stats.segment,
                    &g_stats.active}) {
      for (auto& stat : *a) stat.reset_peak();
    }
  }
  // (free, total) HBM of the device, as torch.accelerator.get_memory_info() reports it. Not
  // marked override: torch 2.9's DeviceAllocator has no such virtual (later ones do, and this
  // overrides it there all the same).
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) {
    int64_t total = g_hbm.load();
    std::lock_guard<SpinLock> hold(g_stats_lock);
    int64_t used = g_stats.reserved_bytes[0].current;
    return {static_cast<size_t>(std::max<int64_t>(total - used, 0)), static_cast<size_t>(total)};
  }
};
Allocator g_allocator;

struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return here(g_current); }
  void setDevice(c10::Device d) const override {
    check_index(d.index());
    g_current = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { g_current = d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_devices.load());
  }
  // Eager on host memory: every op has finished when it returns, so an event completes when
  // it is recorded (its time is the host's then), and nothing ever waits.
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new std::chrono::steady_clock::time_point();
    *static_cast<std::chrono::steady_clock::time_point*>(*event) =
        std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override {}
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<std::chrono::steady_clock::time_point*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    auto* a = static_cast<std::chrono::steady_clock::time_point*>(start);
    auto* b = static_cast<std::chrono::steady_clock::time_point*>(end);
    return std::chrono::duration<double, std::milli>(*b - *a).count();
  }
};

// A generator per device, a CPU generator underneath: the CPU kernels draw from it (its device
// reads CPU for the duration of the call, see Borrowed below).
struct Generator final : at::CPUGeneratorImpl {
  explicit Generator(c10::DeviceIndex index) {
    device_ = here(index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
  void lend(bool to_cpu) {
    device_ = to_cpu ? c10::Device(c10::kCPU) : here(0);
    key_set_ = c10::DispatchKeySet(to_cpu ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1);
  }
};

std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> g;
    g.push_back(at::make_generator<Generator>(0));  // seeded as the CPU's and CUDA's start
    return g;
  }();
  return gens;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  c10::DeviceIndex i = index < 0 ? g_current : index;
  check_index(i);
  return default_generators().at(i);
}

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_devices.load() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return g_devices.load(); }
  c10::DeviceIndex getCurrentDevice() const override { return g_current; }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_index(d);
    g_current = d;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<Generator>(index < 0 ? g_current : index);
  }
  at::Device getDeviceFromPtr(void*) const override { return here(g_current); }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& s, size_t n) const override {
    at::native::resize_bytes_cpu(s.unsafeGetStorageImpl(), n);
  }
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// For a device without kernels of its own, torch computes a structured op (add, mul, ...) by
// allocating the result and calling the op's out= form: two trips through the dispatcher and
// the fallback. Sending those ops to the fallback directly runs the CPU's functional kernel,
// whose fresh result the fallback takes over without a copy. Done once every aten op is known,
// and not for ops the tpu device already has a kernel for (see route below).
void take_structured_ops() {
  static torch::Library* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    std::string impl = name.name.substr(6);
    if (!name.overload_name.empty()) impl += "." + name.overload_name;
    lib->impl(impl.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

void enforce(bool on) { g_enforce.store(on); }

// Matmul-class ops compute at the TPU's precision in Python kernels, which the device keeps
// under PrivateUse3 (a key no tensor of the process carries). With exact numerics they are
// plain CPU kernels: the fallback runs them, with no trip through Python for each call.
std::atomic<bool> g_emulate{true};

void emulate(bool on) { g_emulate.store(on); }

void matmul_class(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (g_emulate.load()) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), stack);
  } else {
    fallback(op, stack);
  }
}

// `emulated` ops get the router above; `functional` ones the fallback itself, which runs the
// CPU's functional kernel (torch's generic kernel for a device without one would allocate the
// result and call the out= form, whose CPU kernel warns that it resized the result).
void route(std::vector<std::string> emulated, std::vector<std::string> functional) {
  static torch::Library* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const std::string& name : emulated) {
    // mm has an unboxed router of its own (below): the most frequent of these ops.
    size_t dot = name.find('.');
    auto op = dispatcher.findOp(
        {"aten::" + name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1)});
    if (op && op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&matmul_class>());
  }
  for (const std::string& name : functional) {
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

void activate(int64_t devices, int64_t hbm_bytes) {
  static std::once_flag hooks;
  std::call_once(hooks, [] {
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    take_structured_ops();
  });
  g_devices.store(static_cast<int>(devices));
  g_hbm.store(hbm_bytes);
}

// A tpu tensor over `storage` with t's layout.
at::Tensor over(c10::Storage storage, const at::Tensor& like, const at::Tensor& layout) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes(), layout.strides(),
                                                 layout.storage_offset());
  if (layout.is_conj()) t._set_conj(true);
  if (layout.is_neg()) t._set_neg(true);
  return t;
}

// The CPU tensor over the same bytes as tpu tensor t (same sizes, strides and offset). Its
// storage is resizable with the CPU allocator: a CPU kernel that grows an out= tensor moves it
// to fresh CPU memory, which the fallback then hands back to t.
at::Tensor cpu_view(const at::Tensor& t) {
  const c10::Storage& s = t.storage();
  c10::StorageImpl* keep = s.unsafeGetStorageImpl();  // held by the view's bytes
  c10::raw::intrusive_ptr::incref(keep);
  void* data = keep->mutable_data();
  c10::DataPtr ptr(
      data, keep,
      [](void* k) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(k)); },
      c10::Device(c10::kCPU));
  c10::Storage cpu(c10::Storage::use_byte_size_t(), s.nbytes(), std::move(ptr),
                   c10::GetCPUAllocator(), /*resizable=*/true);
  at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
      std::move(cpu), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  v.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) v._set_conj(true);
  if (t.is_neg()) v._set_neg(true);
  return v;
}

// The fallback's CPU view of tpu tensor t, over the CPU storage its bytes' block keeps (see
// Block::view). Only for views that end with the op: the shared storage does not keep t's
// bytes alive. Bytes that are not the allocator's, or a shared storage a kernel moved to other
// memory (it then grew an out= argument), get a view of their own.
at::Tensor shared_cpu_view(const at::Tensor& t) {
  const c10::Storage& s = t.storage();
  const c10::DataPtr& bytes = s.data_ptr();
  if (bytes.get_deleter() != &release) return cpu_view(t);
  Block* b = static_cast<Block*>(bytes.get_context());
  c10::StorageImpl* view = b->view.load(std::memory_order_acquire);
  if (view == nullptr) {
    c10::StorageImpl* fresh =
        c10::make_intrusive<c10::StorageImpl>(
            c10::StorageImpl::use_byte_size_t(), s.nbytes(),
            c10::DataPtr(b->data, c10::Device(c10::kCPU)), c10::GetCPUAllocator(),
            /*resizable=*/true)
            .release();
    if (b->view.compare_exchange_strong(view, fresh, std::memory_order_acq_rel)) {
      view = fresh;
    } else {
      c10::raw::intrusive_ptr::decref(fresh);  // another thread's is there: use that one
    }
  }
  if (view->data_ptr().get() != b->data || view->nbytes() != s.nbytes()) return cpu_view(t);
  at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(view)),
      c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  v.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) v._set_conj(true);
  if (t.is_neg()) v._set_neg(true);
  return v;
}

// A tpu storage owning the memory of CPU storage s, which gives it up (s is the fallback's
// own: a fresh result, or a CPU view a kernel moved to new memory).
c10::Storage take(const c10::Storage& s, c10::DeviceIndex index) {
  c10::StorageImpl* impl = s.unsafeGetStorageImpl();
  size_t n = impl->nbytes();
  reserve(static_cast<int64_t>(n));
  c10::DataPtr old = impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  void* data = old.get();
  count(static_cast<int64_t>(n));
  Block* b = new Block{std::move(old), data, static_cast<int64_t>(n)};
  c10::DataPtr ptr(data, b, &release, here(index));
  return c10::Storage(c10::Storage::use_byte_size_t(), n, std::move(ptr), &g_allocator, true);
}

// A tpu tensor with cpu's values: its memory when nothing else holds it, else a copy.
at::Tensor adopt(const at::Tensor& cpu, c10::DeviceIndex index) {
  if (!cpu.defined()) return cpu;
  TORCH_CHECK(cpu.device().is_cpu(), "xlasim: expected a CPU tensor, got ", cpu.device());
  const c10::Storage& s = cpu.storage();
  c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
  if (cpu.use_count() == 1 && s.use_count() == 1 && s.data_ptr().get_deleter() != nullptr &&
      s.data_ptr().device().is_cpu() && impl->allow_tensor_metadata_change()) {
    // The result becomes the tpu tensor itself: its storage's bytes change hands to the
    // device's allocator and its dispatch keys move to the tpu (no new tensor or storage, the
    // cheapest an op's result can be).
    c10::StorageImpl* storage = s.unsafeGetStorageImpl();
    int64_t n = static_cast<int64_t>(storage->nbytes());
    reserve(n);
    c10::DataPtr old = storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
    void* data = old.get();
    count(n);
    Block* b = new Block{std::move(old), data, n};
    storage->set_data_ptr_noswap(c10::DataPtr(data, b, &release, here(index)));
    storage->set_allocator(&g_allocator);
    impl->set_storage_keep_dtype(s);
    impl->_change_backend_component_keys(here(index));
    return cpu;
  }
  c10::OptionalDeviceGuard guard(here(index));
  at::Tensor t = at::detail::empty_strided_generic(
      cpu.sizes(), cpu.strides(), &g_allocator,
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), cpu.scalar_type());
  cpu_view(t).copy_(cpu);
  return t;
}

// Kernels PyTorch needs from a device besides the fallback.
at::Tensor empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                 std::optional<at::Layout>, std::optional<at::Device> device,
                 std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  if (!device.has_value() || !device->has_index()) check_index(g_current);
  return at::detail::empty_generic(size, &g_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(at::get_default_dtype_as_scalartype()),
                                   memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  if (!device.has_value() || !device->has_index()) check_index(g_current);
  return at::detail::empty_strided_generic(
      size, stride, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      dtype.value_or(at::get_default_dtype_as_scalartype()));
}

at::Tensor host(const at::Tensor& t) {
  return t.device().type() == kTpu ? shared_cpu_view(t) : t;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  host(dst).copy_(host(self));
  return dst;
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, std::nullopt);
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve) {
    self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

// The fallback: any op on CPU views of its tpu arguments, results back on the tpu.
struct Arg {
  at::Tensor tpu;
  at::Tensor cpu;
  const void* data;  // where the CPU view's bytes were when the kernel started
  const c10::StorageImpl* origin;  // the CPU view's storage then
  bool written;
};

bool is_generator(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  if (t->kind() != c10::TypeKind::OptionalType) return false;
  return t->castRaw<c10::OptionalType>()->getElementType()->kind() ==
         c10::TypeKind::GeneratorType;
}

// Lends a tpu generator to a CPU kernel for one call.
struct Borrowed {
  std::vector<Generator*> lent;
  void lend(Generator* g) {
    g->lend(true);
    lent.push_back(g);
  }
  ~Borrowed() {
    for (Generator* g : lent) g->lend(false);
  }
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();
  c10::SmallVector<Arg, 4> args;
  std::optional<c10::DeviceIndex> index;
  Borrowed borrowed;

  auto to_cpu = [&](const at::Tensor& t, bool written) -> at::Tensor {
    if (!t.defined() || t.device().type() != kTpu) return t;
    if (!index) index = t.device().index();
    at::Tensor v = shared_cpu_view(t);
    args.push_back(Arg{t, v, v.storage().data(), v.storage().unsafeGetStorageImpl(), written});
    return v;
  };

  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& iv = (*stack)[first + i];
    const auto* alias = arguments[i].alias_info();
    bool written = alias != nullptr && alias->isWrite();
    if (iv.isTensor()) {
      iv = to_cpu(iv.toTensor(), written);
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> in = iv.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (const at::Tensor& t : in) out.push_back(to_cpu(t, false));
      iv = out;
    } else if (iv.isOptionalTensorList()) {
      auto in = iv.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(in.size());
      for (std::optional<at::Tensor> t : in) {
        out.push_back(t.has_value() ? std::optional<at::Tensor>(to_cpu(*t, false)) : t);
      }
      iv = out;
    } else if (iv.isDevice() && iv.toDevice().type() == kTpu) {
      c10::Device d = iv.toDevice();
      c10::DeviceIndex i2 = d.has_index() ? d.index() : g_current;
      check_index(i2);
      if (!index) index = i2;
      iv = c10::Device(c10::kCPU);
    }
  }
  // Random ops draw from the tpu device's generator, not the CPU's.
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!is_generator(arguments[i])) continue;
    c10::IValue& iv = (*stack)[first + i];
    at::Generator g = iv.isNone() ? default_generator(index.value_or(g_current))
                                  : iv.toGenerator();
    if (g.device().type() == kTpu) {
      borrowed.lend(static_cast<Generator*>(g.unsafeGetGeneratorImpl()));
      iv = g;
    }
  }
  c10::DeviceIndex device = index.value_or(g_current);

  op.callBoxed(stack);

  // Arguments a kernel resized or restrided: the tpu tensor follows its CPU view.
  for (Arg& a : args) {
    if (!a.written) continue;
    c10::TensorImpl* tpu = a.tpu.unsafeGetTensorImpl();
    if (a.cpu.storage().data() != a.data) {
      // An argument over other bytes whose storage the kernel set this one to (set_): the
      // tpu tensor takes that argument's tpu storage. Otherwise the kernel grew it into new
      // memory, which the tpu takes over.
      const c10::StorageImpl* now = a.cpu.storage().unsafeGetStorageImpl();
      const Arg* source = nullptr;
      for (const Arg& o : args) {
        if (o.origin == now && o.origin != a.origin) source = &o;
      }
      if (source != nullptr) {
        tpu->set_storage_keep_dtype(source->tpu.storage());
      } else {
        tpu->set_storage_keep_dtype(take(a.cpu.storage(), device));
      }
      // The CPU view's storage is empty now; results aliasing it map to a.tpu below.
    }
    if (tpu->sizes() != a.cpu.sizes() || tpu->strides() != a.cpu.strides() ||
        tpu->storage_offset() != a.cpu.storage_offset()) {
      tpu->set_sizes_and_strides(a.cpu.sizes(), a.cpu.strides(), a.cpu.storage_offset());
    }
  }

  auto to_tpu = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || r.device().type() == kTpu) return r;
    for (const Arg& a : args) {
      if (r.unsafeGetTensorImpl() == a.cpu.unsafeGetTensorImpl()) return a.tpu;
    }
    if (r.has_storage()) {
      for (const Arg& a : args) {
        if (r.storage().unsafeGetStorageImpl() == a.cpu.storage().unsafeGetStorageImpl()) {
          return over(a.tpu.storage(), r, r);  // a view of an argument
        }
      }
    }
    return adopt(r, device);
  };

  const size_t returns = schema.returns().size();
  const size_t rfirst = stack->size() - returns;
  for (size_t i = rfirst; i < stack->size(); ++i) {
    // Moved out of the stack, so that a fresh result is held once and can be taken over.
    c10::IValue& iv = (*stack)[i];
    if (iv.isTensor()) {
      at::Tensor r = std::move(iv).toTensor();
      iv = to_tpu(r);
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> in = std::move(iv).toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (size_t k = 0; k < in.size(); ++k) {
        at::Tensor r = in.extract(k);
        out.push_back(to_tpu(r));
      }
      iv = out;
    }
  }
}

// Unboxed kernels for the elementwise arithmetic a training step calls most, the same CPU
// kernels the fallback would run. A boxed call copies each tensor argument onto the
// dispatcher's stack, and from torch 2.13 on, a second C++ reference to a tensor that Python
// holds takes the GIL to keep its Python object alive: two round trips through the GIL per
// argument, the largest part of a tiny op's cost on the fallback.
// Checks the operands' devices as torch's TensorIterator does (a CPU scalar may join any
// device; any other pair must share one) and returns the tpu index the result goes to.
c10::DeviceIndex index_of(const at::Tensor& a, const at::Tensor& b) {
  auto placed = [](const at::Tensor& t) { return t.device().type() == kTpu || t.dim() > 0; };
  TORCH_CHECK(!placed(a) || !placed(b) || a.device() == b.device(),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              a.device(), " and ", b.device(), "!");
  return (a.device().type() == kTpu ? a : b).device().index();
}

template <at::Tensor (*Cpu)(const at::Tensor&, const at::Tensor&, const at::Scalar&)>
at::Tensor with_alpha(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return adopt(Cpu(host(a), host(b), alpha), index_of(a, b));
}

template <at::Tensor& (*Cpu)(at::Tensor&, const at::Tensor&, const at::Scalar&)>
at::Tensor& with_alpha_(at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  index_of(a, b);
  at::Tensor view = host(a);
  Cpu(view, host(b), alpha);
  return a;
}

template <at::Tensor (*Cpu)(const at::Tensor&, const at::Tensor&)>
at::Tensor plain(const at::Tensor& a, const at::Tensor& b) {
  return adopt(Cpu(host(a), host(b)), index_of(a, b));
}

template <at::Tensor& (*Cpu)(at::Tensor&, const at::Tensor&)>
at::Tensor& plain_(at::Tensor& a, const at::Tensor& b) {
  index_of(a, b);
  at::Tensor view = host(a);
  Cpu(view, host(b));
  return a;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  index_of(a, b);
  if (g_emulate.load()) {
    return at::_ops::mm::redispatch(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), a, b);
  }
  return plain<&at::_ops::mm::call>(a, b);
}

// Copies of tensors with the conjugate or negative bit. PyTorch resolves a bit by cloning,
// which copies, which for a device other than the CPU reaches _copy_from with the bit still
// set: without this, endless recursion. A tpu copy sees the bits itself (its CPU views keep
// them, and the CPU's copy_ resolves them); any other device gets PyTorch's own handling.
struct ConjugateBit final : at::native::MathOpFallback {
  ConjugateBit() : MathOpFallback(c10::DispatchKey::Conjugate, "conjugate") {}
  bool is_bit_set(const at::Tensor& t) override { return t.is_conj(); }
};

struct NegativeBit final : at::native::MathOpFallback {
  NegativeBit() : MathOpFallback(c10::DispatchKey::Negative, "negation") {}
  bool is_bit_set(const at::Tensor& t) override { return t.is_neg(); }
};

template <c10::DispatchKey K>
void copy_with_bit(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    const c10::IValue& iv = (*stack)[i];
    if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().device().type() == kTpu) {
      op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, K), stack);
      return;
    }
  }
  if constexpr (K == c10::DispatchKey::Conjugate) {
    ConjugateBit().fallback_impl(op, keys, stack);
  } else {
    NegativeBit().fallback_impl(op, keys, stack);
  }
}

at::Tensor cpu_view_op(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kTpu, "xlasim: expected a tpu tensor, got ", t.device());
  return cpu_view(t);
}

at::Tensor from_cpu_op(const at::Tensor& cpu, int64_t index) {
  // The fallback's own results: taken over when nothing else holds them.
  return adopt(cpu, static_cast<c10::DeviceIndex>(index));
}

at::Generator generator_op(int64_t index) {
  return default_generator(static_cast<c10::DeviceIndex>(index));
}
}  // namespace xlasim_tpu

C10_REGISTER_GUARD_IMPL(PrivateUse1, xlasim_tpu::Guard);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &xlasim_tpu::g_allocator);

TORCH_LIBRARY_FRAGMENT(xlasim, m) {
  m.def("tpu_activate(int devices, int hbm_bytes) -> ()", &xlasim_tpu::activate);
  m.def("tpu_enforce_hbm(bool on) -> ()", &xlasim_tpu::enforce);
  m.def("tpu_emulate_matmuls(bool on) -> ()", &xlasim_tpu::emulate);
  m.def("tpu_route(str[] emulated, str[] functional) -> ()", &xlasim_tpu::route);
  m.def("tpu_cpu_view(Tensor t) -> Tensor", &xlasim_tpu::cpu_view_op);
  m.def("tpu_from_cpu(Tensor cpu, int index) -> Tensor", &xlasim_tpu::from_cpu_op);
  m.def("tpu_generator(int index) -> Generator?", &xlasim_tpu::generator_op);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &xlasim_tpu::empty);
  m.impl("empty_strided", &xlasim_tpu::empty_strided);
  m.impl("_copy_from", &xlasim_tpu::copy_from);
  m.impl("_copy_from_and_resize", &xlasim_tpu::copy_from_and_resize);
  m.impl("resize_", &xlasim_tpu::resize_);
  m.impl("add.Tensor", &xlasim_tpu::with_alpha<&at::_ops::add_Tensor::call>);
  m.impl("sub.Tensor", &xlasim_tpu::with_alpha<&at::_ops::sub_Tensor::call>);
  m.impl("mul.Tensor", &xlasim_tpu::plain<&at::_ops::mul_Tensor::call>);
  m.impl("div.Tensor", &xlasim_tpu::plain<&at::_ops::div_Tensor::call>);
  m.impl("mm", &xlasim_tpu::mm);
  m.impl("add_.Tensor", &xlasim_tpu::with_alpha_<&at::_ops::add__Tensor::call>);
  m.impl("sub_.Tensor", &xlasim_tpu::with_alpha_<&at::_ops::sub__Tensor::call>);
  m.impl("mul_.Tensor", &xlasim_tpu::plain_<&at::_ops::mul__Tensor::call>);
  m.impl("div_.Tensor", &xlasim_tpu::plain_<&at::_ops::div__Tensor::call>);
}

TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<
                           &xlasim_tpu::copy_with_bit<c10::DispatchKey::Conjugate>>());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFromBoxedFunction<
                                      &xlasim_tpu::copy_with_bit<c10::DispatchKey::Conjugate>>());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<
                           &xlasim_tpu::copy_with_bit<c10::DispatchKey::Negative>>());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFromBoxedFunction<
                                      &xlasim_tpu::copy_with_bit<c10::DispatchKey::Negative>>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&xlasim_tpu::fallback>());
}
"""
