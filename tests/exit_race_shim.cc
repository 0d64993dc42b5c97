// LD_PRELOAD library for tests/test_exit_safety.py: makes the exit race of PyTorch's autograd
// device threads happen on every run instead of now and then.
//
// The race: a backward pass on `xla` tensors runs on the engine's device thread
// (pt_autograd_N). The device thread finishes the graph task, wakes the thread that called
// backward(), and only then drops its own reference to the task. When that reference is the last
// one and the task holds Python objects (torch >= 2.13 stores a contextvars.Context with every
// task; saved-tensor hooks and dispatch modes are stored on every version), the drop needs the
// GIL; once the main thread has begun interpreter shutdown, CPython ends a thread that asks for
// the GIL, inside a noexcept destructor, and the process aborts.
//
// The shim widens both windows:
//  1. after a device thread has handed a finished task back (the condition-variable signal that
//     wakes the caller), it waits until the main thread has come back from backward() (its next
//     PyEval_RestoreThread), so the device thread holds the last reference;
//  2. a GIL request of a device thread made while the main thread is not waiting inside the
//     autograd engine waits until the main thread waits there again (a later backward) or the
//     interpreter is finalizing.
// Every wait is bounded (kBoundS) and says so on stderr when the bound trips. The shim writes
// kReleased when a device thread, after window 1, releases a task that holds Python objects, so
// a test can tell that the race was really set up.
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace {

constexpr double kBoundS = 30.0;

std::atomic<long> g_main_restores{0};
std::atomic<bool> g_main_waits_in_engine{false};
thread_local bool t_handed_back = false;

void say(const char* msg) {
  ssize_t ignored = write(2, msg, strlen(msg));
  (void)ignored;
}

bool is_main_thread() { return syscall(SYS_gettid) == getpid(); }

bool is_device_thread() {
  thread_local bool known = false;
  if (known) return true;
  char name[16] = {0};
  pthread_getname_np(pthread_self(), name, sizeof name);
  known = strncmp(name, "pt_autograd_", 12) == 0;
  return known;
}

// The current stack, as the dynamic symbols (mangled names) of its frames.
struct Stack {
  const char* names[64];
  int n = 0;
  Stack() {
    void* frames[64];
    int depth = backtrace(frames, 64);
    for (int i = 0; i < depth; ++i) {
      Dl_info info;
      if (dladdr(frames[i], &info) && info.dli_sname) names[n++] = info.dli_sname;
    }
  }
  // The function that called the hooked one (frame 0 is the hook itself).
  bool called_from(const char* part) const { return n > 1 && strstr(names[1], part); }
  bool has(const char* part) const {
    for (int i = 0; i < n; ++i)
      if (strstr(names[i], part)) return true;
    return false;
  }
};

const char kThreadMain[] = "Engine11thread_main";
const char kReleased[] =
    "exit-race shim: a device thread releases a finished graph task after backward()";
const char kEvaluate[] = "Engine17evaluate_function";

template <typename F>
F next_symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

bool finalizing() {
  using Fn = int (*)();
  static std::atomic<Fn> fn{nullptr};
  Fn f = fn.load();
  if (!f) {
    f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "Py_IsFinalizing"));  // 3.13+
    if (!f) f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "_Py_IsFinalizing"));
    if (!f) return false;
    fn.store(f);
  }
  return f() != 0;
}

template <typename Pred>
void wait_until(Pred done, const char* what) {
  timespec start, now, nap = {0, 100 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (!done()) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) * 1e-9 > kBoundS) {
      say("exit-race shim: gave up after 30 s waiting for ");
      say(what);
      say("\n");
      return;
    }
    nanosleep(&nap, nullptr);
  }
}

// Window 2, for both ways pybind11 takes the GIL.
void hold_device_thread_gil_request() {
  if (!is_device_thread()) return;
  Stack stack;
  if (stack.has(kEvaluate)) return;  // running a node of a backward pass
  // The engine loop itself wanting the GIL after handing a task back: it is releasing the
  // task's Python objects, after backward() has returned.
  bool release = t_handed_back && stack.has(kThreadMain);
  if (release) {
    t_handed_back = false;
    say(kReleased);
    say("\n");
  }
  if (g_main_waits_in_engine.load() || finalizing()) return;
  wait_until([] { return g_main_waits_in_engine.load() || finalizing(); },
             "the main thread to run backward or to shut down");
  if (release && finalizing()) say("exit-race shim: held that release until shutdown\n");
}

__attribute__((constructor)) void load_unwinder() {
  void* frames[1];
  backtrace(frames, 1);  // dlopens libgcc_s now rather than inside a hook
}

}  // namespace

extern "C" {

void PyEval_AcquireThread(void* tstate) {
  static auto real = next_symbol<void (*)(void*)>("PyEval_AcquireThread");
  hold_device_thread_gil_request();
  real(tstate);
}

int PyGILState_Ensure() {
  static auto real = next_symbol<int (*)()>("PyGILState_Ensure");
  hold_device_thread_gil_request();
  return real();
}

void PyEval_RestoreThread(void* tstate) {
  static auto real = next_symbol<void (*)(void*)>("PyEval_RestoreThread");
  real(tstate);
  if (is_main_thread()) g_main_restores.fetch_add(1);
}

int pthread_cond_wait(pthread_cond_t* cond, pthread_mutex_t* mutex) {
  static auto real = next_symbol<int (*)(pthread_cond_t*, pthread_mutex_t*)>("pthread_cond_wait");
  if (is_device_thread()) t_handed_back = false;  // idle: it has let go of its last task
  if (!is_main_thread() || !Stack().has(kThreadMain)) return real(cond, mutex);
  g_main_waits_in_engine.store(true);
  int rc = real(cond, mutex);
  g_main_waits_in_engine.store(false);
  return rc;
}

// Window 1.
int pthread_cond_signal(pthread_cond_t* cond) {
  static auto real = next_symbol<int (*)(pthread_cond_t*)>("pthread_cond_signal");
  long restores = g_main_restores.load();
  int rc = real(cond);
  if (is_device_thread()) {
    Stack stack;
    // Only the hand-back of a finished task signals from the engine loop itself (node pushes
    // signal from evaluate_function, GIL hand-overs from CPython).
    if (stack.called_from(kThreadMain)) {
      wait_until([restores] { return g_main_restores.load() != restores; },
                 "the main thread to return from backward");
      t_handed_back = true;
    }
  }
  return rc;
}

}  // extern "C"
