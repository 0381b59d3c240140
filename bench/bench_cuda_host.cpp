// What one CUDA capture costs the training thread's host side, counted
// without a GPU: heap allocations, mutex acquisitions, condition
// variable signals, CUDA runtime calls, per steady-state capture, through
// the capture path's runtime-only core (capture_on_engine,
// sdk/src/cuda/capture_core.h) and the engine, against the fake CUDA
// runtime (tests/cuda/fake_cudart.cpp). The runtime's own costs are not
// counted (the fake's are not the real one's; a GPU run measures those);
// the LibTorch glue in front of the core (a device guard, the current
// stream, ATen's copy for strided and bfloat16 tensors) needs CUDA LibTorch
// and is not counted here either.
//
//   bench_cuda_host [--captures N] [--bytes B] [--per-step K] [--batch on|off]
//
// --batch on: one event a step (TENSORTAP_CUDA_BATCH=on): the step's end
// (`CudaEngine::end_step()`, which `Recorder::step()` calls) is counted as
// the training thread's.
//
// Futex system calls and instructions come from outside the process:
// bench/cuda_host_counts.sh runs this under strace (the training thread's
// futex calls between two marker writes) and callgrind (instructions in
// measured_capture, the measured window's captures only).
//
// The counters check themselves before the window: a std::mutex locked, a
// vector allocated and a runtime call made in front of them must each count
// one, or the program fails rather than print zeros it did not see.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "sdk/src/cuda/batch.h"
#include "sdk/src/cuda/capture_core.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/cuda/pinned.h"
#include "sdk/src/core/staging.h"

extern "C" unsigned long long tensortap_fake_cudart_calls(void);
extern "C" int tensortap_fake_cudart_inside(void);
extern "C" void tensortap_fake_cudart_each_call(void (*fn)(long tid, const char* call, unsigned long long n,
                                                           void* ctx),
                                                void* ctx);

namespace {

// Counting, on the thread that turned it on, outside the runtime.
thread_local bool t_counting = false;
thread_local unsigned long long t_allocations = 0, t_locks = 0, t_signals = 0;

bool counted() { return t_counting && tensortap_fake_cudart_inside() == 0; }

template <class F>
F next(const char* name) {
  static_assert(sizeof(F) == sizeof(void*), "a function pointer");
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "bench_cuda_host: dlsym(%s) failed\n", name);
    std::abort();
  }
  F out;
  std::memcpy(&out, &f, sizeof out);
  return out;
}

}  // namespace

// Every C++ allocation of the process goes through these.
void* operator new(std::size_t n) {
  if (counted()) ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (counted()) ++t_allocations;
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

// std::mutex and std::condition_variable reach these (libstdc++'s gthreads).
extern "C" int pthread_mutex_lock(pthread_mutex_t* m) {
  static const auto real = next<int (*)(pthread_mutex_t*)>("pthread_mutex_lock");
  if (counted()) ++t_locks;
  return real(m);
}
extern "C" int pthread_cond_signal(pthread_cond_t* c) {
  static const auto real = next<int (*)(pthread_cond_t*)>("pthread_cond_signal");
  if (counted()) ++t_signals;
  return real(c);
}
extern "C" int pthread_cond_broadcast(pthread_cond_t* c) {
  static const auto real = next<int (*)(pthread_cond_t*)>("pthread_cond_broadcast");
  if (counted()) ++t_signals;
  return real(c);
}

namespace {

using tensortap::detail::CudaEngine;
using tensortap::detail::CudaEngineOptions;
using tensortap::detail::RecordSpec;
using tensortap::detail::Staging;

// A contiguous float32 tensor's bytes in device memory: what most captures
// are, and the path that makes no ATen call.
struct RawSource {
  const void* data;
  bool byte_copy() const { return true; }
  const void* bytes() const { return data; }
  void copy_into(void*, cudaStream_t) { std::abort(); }
  void* own_snapshot(std::function<void()>&) {
    std::fprintf(stderr, "bench_cuda_host: a snapshot larger than the arena\n");
    std::abort();
  }
  std::string describe() const { return "'bench' (float32)"; }
};

struct Counts {
  unsigned long long allocations = 0, locks = 0, signals = 0, calls = 0;
};

Counts now() { return {t_allocations, t_locks, t_signals, tensortap_fake_cudart_calls()}; }

// Every thread's runtime calls so far, by (thread id, call).
using CallCounts = std::map<std::pair<long, std::string>, unsigned long long>;
CallCounts calls_now() {
  CallCounts out;
  tensortap_fake_cudart_each_call(
      [](long tid, const char* call, unsigned long long n, void* ctx) {
        (*static_cast<CallCounts*>(ctx))[{tid, call}] = n;
      },
      &out);
  return out;
}

// The calls of each thread role between `a` and `b`, by call: the training
// thread's (its flushes' left out: `flushing`), the writer's, and the
// engine's own threads' (the copier).
void print_by_thread(const CallCounts& a, const CallCounts& b, const CallCounts& flushing, const CallCounts& ending,
                     long training, long writer, double captures, double steps) {
  std::map<std::string, std::map<std::string, double>> roles;
  for (const auto& [key, n] : b) {
    const auto was = a.find(key);
    double d = static_cast<double>(n - (was == a.end() ? 0 : was->second));
    const std::string role = key.first == training ? "training" : key.first == writer ? "writer" : "copier";
    if (role == "training") {
      if (const auto f = flushing.find(key); f != flushing.end()) d -= static_cast<double>(f->second);
      if (const auto e = ending.find(key); e != ending.end()) d -= static_cast<double>(e->second);
    }
    if (d > 0) roles[role][key.second] += d;
  }
  std::printf("CUDA runtime calls by thread and call:\n");
  for (const char* role : {"training", "copier", "writer"}) {
    const bool per_capture = std::string(role) == "training";
    std::printf("  %s thread, %s:%s\n", role, per_capture ? "per capture (its flushes left out)" : "per step",
                roles[role].empty() ? " none" : "");
    for (const auto& [call, n] : roles[role])
      std::printf("    %-28s %.3f\n", call.c_str(), n / (per_capture ? captures : steps));
  }
  std::printf("  training thread, at a step's end (CudaEngine::end_step), per step:%s\n", ending.empty() ? " none" : "");
  for (const auto& [key, n] : ending) std::printf("    %-28s %.3f\n", key.second.c_str(), static_cast<double>(n) / steps);
  std::printf("  not counted: LibTorch's glue in front of the core (a device guard: cudaGetDevice, and cudaSetDevice "
              "when the device differs; the current stream), which needs CUDA LibTorch\n");
}

// Where the strace run cuts the window: a write each side of it, to a
// descriptor it can tell apart.
void mark(int fd, const char* what) {
  if (::write(fd, what, std::strlen(what)) < 0) std::perror("bench_cuda_host: marker");
}

bool capture(CudaEngine& engine, const RecordSpec& spec, cudaStream_t stream, RawSource& source) {
  return tensortap::detail::capture_on_engine(engine, spec, 0, stream, source, /*may_drop=*/false);
}

// The measured window's captures, apart from the warm-up's, for callgrind's
// --toggle-collect.
__attribute__((noinline)) bool measured_capture(CudaEngine& engine, const RecordSpec& spec, cudaStream_t stream,
                                                RawSource& source) {
  return capture(engine, spec, stream, source);
}

// --batch on: `per_step` float32 gradients of `bytes` each at `device`,
// gathered at the backward pass's end into their accumulators in one
// launch (launch_copies, as hooks/src/params.cpp's final callback does on
// autograd's thread), then a step's in one batch with their statistics
// (capture_batch_on_engine), through 200 steps after 10 of warm-up, the
// copier drained between steps (not counted). Prints what a step costs the
// training thread, the step's end included, and the gather apart; returns
// the training thread's runtime calls (-1: the records did not all arrive).
double batched_gradients(CudaEngine& engine, cudaStream_t stream, void* device, long long bytes, long long per_step) {
  using tensortap::detail::BatchItem;
  const tensortap::detail::DtypeInfo& f32 = *tensortap::detail::dtype_info(c10::ScalarType::Float);
  const tensortap::detail::DtypeInfo& f64 = *tensortap::detail::dtype_info(c10::ScalarType::Double);
  const std::vector<std::int64_t> shape{bytes / 4}, ten{tensortap::detail::kStatsFields};
  std::vector<std::string> names;
  for (long long i = 0; i < per_step; ++i) names.push_back("model.layers." + std::to_string(i) + ".weight");
  std::vector<RecordSpec> specs;
  specs.reserve(static_cast<std::size_t>(2 * per_step));
  std::vector<BatchItem> items(static_cast<std::size_t>(per_step));
  // The accumulators the gather fills, one after another.
  void* acc = nullptr;
  if (cudaMalloc(&acc, static_cast<std::size_t>(bytes * per_step)) != cudaSuccess) return -1;
  std::vector<tensortap::detail::CopyTensor> copies(static_cast<std::size_t>(per_step));
  for (std::size_t i = 0; i < copies.size(); ++i)
    copies[i] = {device, static_cast<char*>(acc) + i * static_cast<std::size_t>(bytes), bytes};
  const auto gather = [&] {
    for (std::size_t i = 0; i < copies.size(); i += tensortap::detail::kBatchTensors)
      tensortap::detail::launch_copies(
          copies.data() + i, static_cast<int>(std::min<std::size_t>(copies.size() - i, tensortap::detail::kBatchTensors)),
          stream);
  };
  std::uint64_t id = 1u << 30;
  const auto step_of = [&](std::int64_t step) {
    specs.clear();
    for (std::size_t i = 0; i < items.size(); ++i) {
      specs.push_back(RecordSpec{tensortap::Kind::Grad, names[i], step, f32, shape, static_cast<std::uint64_t>(bytes),
                                 tensortap::detail::Op::Store, false, false, ++id, true});
      specs.push_back(RecordSpec{tensortap::Kind::Grad, names[i], step, f64, ten,
                                 tensortap::detail::kStatsFields * sizeof(double), tensortap::detail::Op::StatsVector,
                                 true, false, ++id, true});
      items[i].tensor.data = copies[i].into;
      items[i].tensor.n = bytes / 4;
      items[i].full = &specs[2 * i];
      items[i].stats = &specs[2 * i + 1];
    }
    tensortap::detail::capture_batch_on_engine(engine, 0, stream, items.data(), items.size(), false);
    engine.end_step();
  };
  const std::uint64_t records0 = engine.counters().records;
  for (int step = 0; step < 10; ++step) {
    gather();
    step_of(1000 + step);
    engine.flush();
  }
  constexpr int kSteps = 200;
  const std::uint64_t copies0 = engine.counters().copies;
  Counts total, gathers;
  for (int step = 0; step < kSteps; ++step) {  // kSteps: the caller's count of records
    t_counting = true;
    const Counts g = now();
    gather();
    const Counts a = now();
    gathers.allocations += a.allocations - g.allocations;
    gathers.locks += a.locks - g.locks;
    gathers.calls += a.calls - g.calls;
    step_of(2000 + step);
    const Counts b = now();
    t_counting = false;
    total.allocations += b.allocations - a.allocations;
    total.locks += b.locks - a.locks;
    total.signals += b.signals - a.signals;
    total.calls += b.calls - a.calls;
    engine.flush();
  }
  const tensortap::detail::CudaEngineCounters c = engine.counters();
  const auto want = static_cast<std::uint64_t>((10 + kSteps) * 2 * per_step);
  if (c.records - records0 != want) {
    std::fprintf(stderr, "bench_cuda_host: %llu batched records reached staging, not %llu\n",
                 static_cast<unsigned long long>(c.records - records0), static_cast<unsigned long long>(want));
    return -1;
  }
  const double steps = kSteps;
  std::printf("a step's %lld gradients of %lld bytes in one batch with their statistics (TENSORTAP_CUDA_BATCH=on, "
              "%d steps), training thread, a step's end included: %.3f runtime calls, %.3f heap allocations, %.3f "
              "mutex acquisitions, %.3f condition signals; copier: %.3f device-to-host copies a step\n",
              per_step, bytes, kSteps, static_cast<double>(total.calls) / steps,
              static_cast<double>(total.allocations) / steps, static_cast<double>(total.locks) / steps,
              static_cast<double>(total.signals) / steps, static_cast<double>(c.copies - copies0) / steps);
  std::printf("the backward pass's end (autograd's thread), the %lld gradients gathered into their accumulators: "
              "%.3f runtime calls, %.3f heap allocations, %.3f mutex acquisitions a pass (the hooks: none)\n",
              per_step, static_cast<double>(gathers.calls) / steps, static_cast<double>(gathers.allocations) / steps,
              static_cast<double>(gathers.locks) / steps);
  cudaFree(acc);
  return static_cast<double>(total.calls) / steps;
}

long long arg(int argc, char** argv, const char* name, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const long long captures = arg(argc, argv, "--captures", 20000);
  const long long bytes = arg(argc, argv, "--bytes", 4096);
  const long long per_step = arg(argc, argv, "--per-step", 64);
  bool batch = false;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--batch") == 0) {
      if (std::strcmp(argv[i + 1], "on") != 0 && std::strcmp(argv[i + 1], "off") != 0) {
        std::fprintf(stderr, "bench_cuda_host: --batch %s: expected on or off\n", argv[i + 1]);
        return 2;
      }
      batch = std::strcmp(argv[i + 1], "on") == 0;
    }
  if (captures < 1 || bytes < 4 || bytes > (16 << 20) || per_step < 1) {
    std::fprintf(stderr, "usage: bench_cuda_host [--captures N] [--bytes 4..16M] [--per-step K] [--batch on|off]\n");
    return 2;
  }
  // Its operations without the fake's random delays, on one device.
  ::setenv("TENSORTAP_FAKE_CUDA_JITTER", "0", 1);
  ::setenv("TENSORTAP_FAKE_CUDA_DEVICES", "1", 1);

  // As make_cuda_engine (sdk/src/cuda/capture.cpp) sets it up, but the arena
  // from cudaMalloc rather than LibTorch's allocator.
  Staging staging(std::size_t{64} << 20, tensortap::Overflow::Block);
  CudaEngineOptions options;
  options.staging_memory = tensortap::detail::pinned_host_memory();
  options.batch_events = batch;
  CudaEngine engine(staging, options, [](const std::string& what) { std::fprintf(stderr, "%s\n", what.c_str()); });
  std::atomic<long long> drained{0};
  std::atomic<long> writer_tid{0};
  std::thread writer([&] {
    writer_tid = static_cast<long>(::syscall(SYS_gettid));
    while (Staging::Buffer* b = staging.take()) {
      for (const auto& slot : b->slots) drained += slot.last ? 1 : 0;
      staging.release(b);
    }
  });

  void* device = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMalloc(&device, static_cast<std::size_t>(bytes)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_host: the (fake) CUDA runtime failed\n");
    return 1;
  }
  RawSource source{device};
  const std::string name = "model.layers.3.mlp.weight";
  const tensortap::detail::DtypeInfo& f32 = *tensortap::detail::dtype_info(c10::ScalarType::Float);
  std::vector<std::int64_t> shape{bytes / 4};
  std::uint64_t id = 0;
  const auto spec_of = [&](std::int64_t step) {
    return RecordSpec{tensortap::Kind::Grad, name, step, f32, shape, static_cast<std::uint64_t>(bytes),
                      tensortap::detail::Op::Store, false, false, ++id, /*name_kept=*/true};
  };

  // Warm-up: the device's arena, events and staging's pinned memory.
  for (int i = 0; i < 256; ++i) capture(engine, spec_of(0), stream, source);
  engine.end_step();
  engine.flush();

  // The counters see what they must, or nothing they print is believed.
  t_counting = true;
  const Counts check0 = now();
  {
    std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    std::vector<int> v(3);
    int n = 0;
    cudaGetDeviceCount(&n);
  }
  const Counts check1 = now();
  t_counting = false;
  if (check1.locks - check0.locks != 1 || check1.allocations - check0.allocations != 1 ||
      check1.calls - check0.calls != 1) {
    std::fprintf(stderr,
                 "bench_cuda_host: the counters do not see a known lock, allocation and runtime call (%llu, %llu, "
                 "%llu): refusing to print counts\n",
                 check1.locks - check0.locks, check1.allocations - check0.allocations, check1.calls - check0.calls);
    return 1;
  }

  const int marker = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  std::printf("training thread %ld\n", static_cast<long>(::syscall(SYS_gettid)));
  std::fflush(stdout);
  mark(marker, "tensortap-bench-begin");
  const CallCounts calls_a = calls_now();
  t_counting = true;
  const Counts a = now();
  CallCounts calls_flushing;  // the training thread's calls inside its flushes
  CallCounts calls_ending;    // and at the steps' ends
  const long me = static_cast<long>(::syscall(SYS_gettid));
  long long done = 0, steps = 0;
  unsigned long long step_end_calls = 0;  // the training thread's at the steps' ends
  Counts ending, end_step_own;  // around the steps' ends, and end_step()'s own
  Counts flushing;  // what the flushes between steps did: not the captures'
  for (std::int64_t step = 1; done < captures; ++step, ++steps) {
    for (long long k = 0; k < per_step && done < captures; ++k, ++done)
      measured_capture(engine, spec_of(step), stream, source);
    // The step's end, as Recorder::step() makes it: with --batch on, the
    // step's one event. The training thread's, counted apart (a step's, not
    // a capture's).
    // Its allocations, locks and signals are left out of the captures'
    // with the bookkeeping's here (none in a steady step: said apart).
    const Counts s0 = now();
    const CallCounts ce0 = calls_now();
    const unsigned long long e0 = tensortap_fake_cudart_calls();
    const Counts in0 = now();
    engine.end_step();
    const Counts in1 = now();
    step_end_calls += tensortap_fake_cudart_calls() - e0;
    for (const auto& [key, n] : calls_now())
      if (const auto was = ce0.find(key); key.first == me && n > (was == ce0.end() ? 0 : was->second))
        calls_ending[key] += n - (was == ce0.end() ? 0 : was->second);
    const Counts s1 = now();
    ending.allocations += s1.allocations - s0.allocations;
    ending.locks += s1.locks - s0.locks;
    ending.signals += s1.signals - s0.signals;
    end_step_own.allocations += in1.allocations - in0.allocations;
    end_step_own.locks += in1.locks - in0.locks;
    end_step_own.signals += in1.signals - in0.signals;
    // The copier keeps up with a step, as on a GPU that is not saturated:
    // without this the fake's copies fall behind and the event pool (1,024)
    // grows, which is the engine's answer to a backlog, not a capture's
    // steady cost.
    const Counts f0 = now();
    const CallCounts c0 = calls_now();
    mark(marker, "tensortap-flush-begin");
    engine.flush();
    mark(marker, "tensortap-flush-end");
    // The bookkeeping's own allocations inside the flush's window, left out with it.
    for (const auto& [key, n] : calls_now())
      if (const auto was = c0.find(key); n > (was == c0.end() ? 0 : was->second))
        calls_flushing[key] += n - (was == c0.end() ? 0 : was->second);
    const Counts f1 = now();
    flushing.allocations += f1.allocations - f0.allocations;
    flushing.locks += f1.locks - f0.locks;
    flushing.signals += f1.signals - f0.signals;
    flushing.calls += f1.calls - f0.calls;
  }
  Counts b = now();
  const CallCounts calls_b = calls_now();
  b.allocations -= flushing.allocations;
  b.locks -= flushing.locks;
  b.signals -= flushing.signals;
  b.calls -= flushing.calls + step_end_calls;
  b.allocations -= ending.allocations;
  b.locks -= ending.locks;
  b.signals -= ending.signals;
  t_counting = false;
  mark(marker, "tensortap-bench-end");
  ::close(marker);
  const double batched_step = batch ? batched_gradients(engine, stream, device, bytes, per_step) : 0;
  if (batched_step < 0) return 1;
  const long long batched_records = batch ? (10 + 200) * 2 * per_step : 0;
  engine.flush();
  engine.stop();
  staging.stop();
  writer.join();
  if (drained.load() != captures + 256 + batched_records) {
    std::fprintf(stderr, "bench_cuda_host: %lld records reached staging, not %lld\n", drained.load(),
                 captures + 256 + batched_records);
    return 1;
  }
  const double n = static_cast<double>(captures);
  std::printf("%lld captures of %lld bytes (contiguous float32, byte copy), %lld a step (the copier drained between "
              "steps, not counted), after 256 of warm-up\n",
              captures, bytes, per_step);
  std::printf("per capture, training thread, the runtime's own work left out:\n");
  std::printf("  heap allocations       %.3f\n", static_cast<double>(b.allocations - a.allocations) / n);
  std::printf("  mutex acquisitions     %.3f\n", static_cast<double>(b.locks - a.locks) / n);
  std::printf("  condition signals      %.3f\n", static_cast<double>(b.signals - a.signals) / n);
  std::printf("  CUDA runtime calls     %.3f\n", static_cast<double>(b.calls - a.calls) / n);
  print_by_thread(calls_a, calls_b, calls_flushing, calls_ending, static_cast<long>(::syscall(SYS_gettid)), writer_tid.load(), n,
                  static_cast<double>(steps));
  // DESIGN's fixed line (docs/design.md, "Measuring"): a capture here is an
  // activation's or a gradient's alike (one tensor, one capture).
  const double per = static_cast<double>(b.calls - a.calls) / n;
  // A capture's own calls; a step's are its captures' and those at its end
  // (on: the step's event and its graph check). The gradients' figure is
  // the capture path's with --batch off, the batch's with it on.
  const double at_end = static_cast<double>(step_end_calls) / static_cast<double>(steps);
  std::printf("  at a step's end (CudaEngine::end_step), training thread: %.3f runtime calls, %.3f heap allocations, "
              "%.3f mutex acquisitions, %.3f condition signals\n",
              at_end, static_cast<double>(end_step_own.allocations) / static_cast<double>(steps),
              static_cast<double>(end_step_own.locks) / static_cast<double>(steps),
              static_cast<double>(end_step_own.signals) / static_cast<double>(steps));
  // With one event a step, a step's gradients go in one batch with their
  // statistics (sdk/src/cuda/batch.h): counted on their own steps.
  const double grads_step = batch ? batched_step : per * static_cast<double>(per_step) + at_end;
  std::printf("runtime calls, training thread: per captured activation %.3f, per step for %lld parameter gradients "
              "%.3f (TENSORTAP_CUDA_BATCH=%s)\n",
              per, per_step, grads_step, batch ? "on" : "off");
  const tensortap::detail::CudaEngineCounters c = engine.counters();
  std::printf("copier: %llu records in %llu device-to-host copies\n", static_cast<unsigned long long>(c.records),
              static_cast<unsigned long long>(c.copies));
  cudaFree(device);
  cudaStreamDestroy(stream);
  return 0;
}
