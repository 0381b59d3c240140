// The CUDA transfer engine through the CUDA runtime API alone: device
// buffers filled by cudaMemcpy, pushed through the engine into a Staging,
// whose buffers a stand-in writer thread reads back. Built wherever the CUDA
// toolkit is; the [gpu] cases skip (with a warning) where no device is.
#include <cuda_runtime_api.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "sdk/src/cuda/capture_core.h"
#ifdef TENSORTAP_TEST_BATCH_KERNELS
#include "sdk/src/cuda/batch.h"
#include "tests/cuda/kernel_reference.h"
#include "writers/src/stats_fields.h"
#endif
#include "sdk/src/cuda/device.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/cuda/pinned.h"
#include "sdk/src/core/staging.h"
#include "sdk/src/run/environment.h"
#include "tests/support/alloc_faults.h"

// After the headers that bring in c10: Debian's LibTorch logs through glog,
// whose CHECK would otherwise replace Catch's (a failed check aborted the
// case rather than being reported and counted).
#include <catch2/catch.hpp>

namespace {

using tensortap::Overflow;
using tensortap::detail::CudaEngine;
using tensortap::detail::CudaEngineOptions;
using tensortap::detail::Record;
using tensortap::detail::RecordDesc;
using tensortap::detail::RecordSpec;
using tensortap::detail::Staging;

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

// Every case runs twice in CI (tests/CMakeLists.txt): one event a snapshot,
// and with TENSORTAP_CUDA_BATCH=on one event a step, read as the recorder
// reads it: the two paths must write the same records.
CudaEngineOptions engine_options() {
  CudaEngineOptions options;
  options.batch_events = tensortap::detail::cuda_batch();
  return options;
}

// Catch2 v2 has no SKIP: the [gpu] cases warn and return.
bool have_gpu() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    WARN("skipped: no CUDA device (" << (e != cudaSuccess ? cudaGetErrorName(e) : "0 devices") << ")");
    return false;
  }
  return true;
}

// Deterministic bytes that differ from record to record and from offset to
// offset, so a record landing in another's place is caught.
std::vector<char> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<char> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<char>(x);
  }
  return v;
}

std::shared_ptr<const Record> meta_for(std::uint64_t id, std::size_t nbytes) {
  auto r = std::make_shared<Record>();
  RecordDesc* m = &r->desc;
  m->name = "r" + std::to_string(id);
  m->dtype = *tensortap::detail::dtype_info(c10::ScalarType::Byte);
  m->shape = {static_cast<std::int64_t>(nbytes)};
  m->nbytes = nbytes;
  return r;
}

// The staging slot of record `id`, `nbytes` long, as Snapshotter::tensor
// makes it for a CPU tensor.
tensortap::detail::Slot slot_for(std::uint64_t id, std::size_t nbytes) {
  tensortap::detail::Slot slot;
  slot.record = *meta_for(id, nbytes);
  slot.id = id;
  slot.nbytes = nbytes;
  return slot;
}

// What Snapshotter::tensor does for a CPU tensor: record `id`, `nbytes`
// bytes 'c', copied into staging and committed. False where staging refuses
// it. No Catch2 assertions: tests call it from other threads.
bool commit_cpu_record(Staging& staging, std::uint64_t id, std::size_t nbytes) {
  const tensortap::detail::Slot slot = slot_for(id, nbytes);
  auto t = staging.reserve(slot, false);
  if (!t) return false;
  std::memset(t->dst, 'c', t->nbytes);
  staging.commit(*t, true);
  return true;
}

// A device buffer on `dev` (left current), freed at scope exit.
struct DeviceBuffer {
  void* data = nullptr;
  int device = 0;
  DeviceBuffer(std::size_t n, int dev = 0) : device(dev) {
    CUDA_OK(cudaSetDevice(dev));
    CUDA_OK(cudaMalloc(&data, n == 0 ? 1 : n));
  }
  // One holding a copy of `host`.
  explicit DeviceBuffer(const std::vector<char>& host, int dev = 0) : DeviceBuffer(host.size(), dev) {
    CUDA_OK(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    cudaSetDevice(device);
    cudaFree(data);
  }
  char* bytes() const { return static_cast<char*>(data); }
};

// What the WriterThread does, minus the files: takes buffers, reassembles each
// record from its chunks, hands the buffers back.
struct Drain {
  Staging& staging;
  std::mutex mu;
  std::map<std::uint64_t, std::vector<char>> records;  // complete, ok records
  std::map<std::uint64_t, std::vector<char>> open;
  std::atomic<int> slots{0};
  std::atomic<int> failed{0};
  std::atomic<int> buffers{0};
  std::atomic<bool> pause{false};
  // Off: only count records (10,000 captures would not fit in memory).
  bool keep = true;
  std::size_t complete = 0;
  std::thread thread;

  explicit Drain(Staging& s, bool keep_bytes = true) : staging(s), keep(keep_bytes) {
    thread = std::thread([this] {
      while (Staging::Buffer* b = staging.take()) {
        while (pause.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& slot : b->slots) {
          ++slots;
          if (!slot.ok) {
            ++failed;
            open.erase(slot.id);
            continue;
          }
          if (!keep) {
            complete += slot.last ? 1 : 0;
            continue;
          }
          auto& bytes = open[slot.id];
          bytes.insert(bytes.end(), b->data + slot.offset, b->data + slot.offset + slot.nbytes);
          if (slot.last) {
            records[slot.id] = std::move(bytes);
            open.erase(slot.id);
            ++complete;
          }
        }
        ++buffers;
        staging.release(b);
      }
    });
  }
  void stop() {
    staging.stop();
    if (thread.joinable()) thread.join();
  }
  ~Drain() { stop(); }
};

// The `n` bytes at device address `src`, as capture_on_engine takes a
// tensor: a snapshot larger than the arena from cudaMalloc.
struct BytesSource {
  const void* data;
  std::size_t n;
  int device;
  bool byte_copy() const { return true; }
  const void* bytes() const { return data; }
  void copy_into(void*, cudaStream_t) { throw std::logic_error("a byte copy"); }
  void* own_snapshot(std::function<void()>& release) {
    void* external = nullptr;
    if (cudaMalloc(&external, n) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    release = [external, device = device] {
      cudaSetDevice(device);
      cudaFree(external);
    };
    return external;
  }
  std::string describe() const { return "'r' (bytes)"; }
};

// Pushes the `n` bytes at device address `src` through the engine: through
// the capture path's own core (sdk/src/cuda/capture_core.h: reserve, copy
// on `stream`, submit the record's spec into a pooled entry), or, with a
// `release` to run on the copier thread, by hand through the engine's
// other submit (a record built beforehand). No Catch2 assertions: tests
// call it from several threads. Throws on CUDA errors.
bool push(CudaEngine& engine, std::uint64_t id, const void* src, std::size_t n, cudaStream_t stream,
          bool may_drop = false, int device = 0, std::function<void()> release = {}) {
  if (!release) {
    const auto record = meta_for(id, n);
    BytesSource source{src, n, device};
    return tensortap::detail::capture_on_engine(engine, tensortap::detail::RecordSpec::of(*record, id), device, stream,
                                                source, may_drop);
  }
  auto snap = engine.reserve(device, n, may_drop);
  if (!snap) return false;
  if (snap->external) {
    void* external = nullptr;
    if (cudaMalloc(&external, n) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    snap->data = external;
    release = [external, device, release] {
      cudaSetDevice(device);
      cudaFree(external);
      if (release) release();
    };
  }
  if (n > 0 && cudaMemcpyAsync(snap->data, src, n, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
    throw std::runtime_error("cudaMemcpyAsync failed");
  engine.submit(*snap, stream, RecordSpec::of(*meta_for(id, n), id), 1, std::move(release));
  return true;
}

// A non-blocking stream on `device`, which is left current.
cudaStream_t new_stream(int device = 0) {
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaSetDevice(device));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

// Blocks `stream` until `gate` opens: lets a test hold snapshots "in
// flight" for as long as it likes without touching the host side.
void CUDART_CB wait_for_gate(void* gate) {
  auto* open = static_cast<std::atomic<bool>*>(gate);
  while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// What engines report (the role of the run's Failures); each test starts it empty.
std::vector<std::string> g_reports;
std::mutex g_reports_mu;
CudaEngine::Report collect() {
  std::lock_guard<std::mutex> lock(g_reports_mu);
  g_reports.clear();
  return [](const std::string& what) {
    std::lock_guard<std::mutex> lock(g_reports_mu);
    g_reports.push_back(what);
  };
}
std::size_t reports() {
  std::lock_guard<std::mutex> lock(g_reports_mu);
  for (const auto& r : g_reports) UNSCOPED_INFO(r);
  return g_reports.size();
}

// A stream from new_stream(), destroyed at scope exit; it converts to
// cudaStream_t, so push() and the runtime's calls take it as it is.
class Stream {
 public:
  explicit Stream(int device = 0) : stream_(new_stream(device)) {}
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return stream_; }

 private:
  cudaStream_t stream_;
};

// Holds `stream` (wait_for_gate) from construction until open(), or until
// the gate goes: a case that fails with the gate shut does not leave the
// stream held.
class Gate {
 public:
  explicit Gate(cudaStream_t stream) { CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &open_)); }
  ~Gate() { open(); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  void open() { open_ = true; }

 private:
  std::atomic<bool> open_{false};
};

// What most [gpu] cases start from: a staging area in pinned memory, a
// Drain taking its buffers, and an engine filling it whose reports
// collect() gathers. Built in that order, destroyed in the reverse.
struct Rig {
  Staging staging;
  Drain drain;
  CudaEngine engine;

  Rig(std::size_t staging_bytes, Overflow overflow, CudaEngineOptions options = engine_options(),
      bool keep_bytes = true)
      : staging(staging_bytes, overflow, tensortap::detail::pinned_host_memory()),
        drain(staging, keep_bytes),
        engine(staging, std::move(options), collect()) {}

  // Returns when every record submitted so far has been taken by the drain.
  void settle() {
    engine.flush();
    staging.wait_drained();
  }

  // The drain holds exactly `expected`: record i, expected[i].
  void check_records(const std::vector<std::vector<char>>& expected) {
    std::lock_guard<std::mutex> lock(drain.mu);
    REQUIRE(drain.records.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("record " << i << ", " << expected[i].size() << " bytes");
      CHECK(drain.records[i] == expected[i]);
    }
  }

  // The drain holds `count` records, each of them `bytes`.
  void check_records(std::size_t count, const std::vector<char>& bytes) {
    std::lock_guard<std::mutex> lock(drain.mu);
    REQUIRE(drain.records.size() == count);
    for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  }
};

// The default options, but for the size of the arena.
CudaEngineOptions with_device_bytes(std::size_t bytes) {
  CudaEngineOptions options = engine_options();
  options.device_bytes = bytes;
  return options;
}

}  // namespace

TEST_CASE("pinned host memory works, or falls back to pageable memory without a driver", "[cuda]") {
  const auto memory = tensortap::detail::pinned_host_memory();
  const std::size_t before = tensortap::detail::pinned_host_bytes();
  void* p = memory.allocate(1 << 20);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
  std::memset(p, 7, 1 << 20);  // writable either way
  const std::size_t during = tensortap::detail::pinned_host_bytes();
  CHECK((during == before || during == before + (1 << 20)));
  memory.release(p);
  CHECK(tensortap::detail::pinned_host_bytes() == before);
}

TEST_CASE("the engine's runtime helpers work without a device", "[cuda]") {
  CHECK(tensortap::detail::cuda_device_count() >= 0);
  CHECK(tensortap::detail::cuda_error_string(cudaErrorMemoryAllocation).find("cudaErrorMemoryAllocation") == 0);
  Staging staging(1 << 16, Overflow::Block);
  CudaEngine engine(staging, engine_options(), collect());
  if (tensortap::detail::cuda_device_count() == 0) {
    // No device: a capture is an error naming the device, not a crash.
    CHECK_THROWS_WITH(engine.reserve(0, 16, false), Catch::Contains("cuda:0"));
  }
  engine.flush();  // nothing submitted: returns at once
  engine.stop();
  CHECK(engine.counters().records == 0);
}

TEST_CASE("the engine copies device bytes exactly, every size", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block);
  Stream stream;
  const std::vector<std::size_t> sizes{0, 1, 3, 63, 64, 65, 4096, 100000, (1 << 20) - 1, 1 << 20};
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    expected.push_back(pattern(sizes[i], i));
    sources.push_back(std::make_unique<DeviceBuffer>(expected.back()));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) REQUIRE(push(rig.engine, i, sources[i]->data, sizes[i], stream));
  rig.settle();
  rig.check_records(expected);
  CHECK(rig.drain.failed == 0);
  CHECK(rig.engine.counters().records == sizes.size());
}

TEST_CASE("a snapshot holds the values at capture, whatever the stream does next", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block);
  Stream stream;
  constexpr std::size_t n = 256 << 10;
  DeviceBuffer buf(n);
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> values;
  for (int i = 0; i < 20; ++i) {
    expected.push_back(pattern(n, 100 + i));
    values.push_back(std::make_unique<DeviceBuffer>(expected.back()));
  }
  // Hold the stream so every snapshot is still queued when the overwrites are
  // enqueued: only stream order keeps them apart.
  Gate gate(stream);
  for (int i = 0; i < 20; ++i) {
    CUDA_OK(cudaMemcpyAsync(buf.data, values[i]->data, n, cudaMemcpyDeviceToDevice, stream));  // an optimizer step
    REQUIRE(push(rig.engine, i, buf.data, n, stream));
  }
  CUDA_OK(cudaMemsetAsync(buf.data, 0, n, stream));  // what zero_grad() does
  gate.open();
  rig.settle();
  // The memset is the stream's, not the engine's: done before `buf` is
  // freed (the real cudaFree waits for the device; the fake's does not, and
  // ThreadSanitizer saw it write freed memory).
  CUDA_OK(cudaStreamSynchronize(stream));
  CHECK(reports() == 0);
  rig.check_records(expected);
}

TEST_CASE("small records are coalesced into few copies", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(4 << 20, Overflow::Block);
  Stream stream;
  constexpr int kRecords = 200;
  std::vector<std::vector<char>> expected;
  DeviceBuffer src(kRecords * 1000);
  for (int i = 0; i < kRecords; ++i) {
    expected.push_back(pattern(100 + i * 3, i));
    CUDA_OK(cudaMemcpy(src.bytes() + i * 1000, expected.back().data(), expected.back().size(), cudaMemcpyHostToDevice));
  }
  Gate gate(stream);
  // The first record's batch waits on the held stream; the rest queue up
  // behind it and leave in one batch.
  REQUIRE(push(rig.engine, 0, src.bytes(), expected[0].size(), stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int i = 1; i < kRecords; ++i) REQUIRE(push(rig.engine, i, src.bytes() + i * 1000, expected[i].size(), stream));
  gate.open();
  rig.settle();
  rig.check_records(expected);
  INFO("copies: " << rig.engine.counters().copies);
  CHECK(rig.engine.counters().copies <= 4);
}

TEST_CASE("records larger than a staging buffer go in chunks, larger than the arena in their own snapshot",
          "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(256 << 10, Overflow::Block, with_device_bytes(1 << 20));
  Stream stream;
  // In the arena but 3 chunks; larger than the arena; and small ones between.
  const std::vector<std::size_t> sizes{700 << 10, 1000, (3 << 20) + 12, 5, (2 << 20) + 1};
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  std::atomic<int> released{0};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    expected.push_back(pattern(sizes[i], 7 + i));
    sources.push_back(std::make_unique<DeviceBuffer>(expected.back()));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)
    REQUIRE(push(rig.engine, i, sources[i]->data, sizes[i], stream, false, 0, [&released] { ++released; }));
  rig.settle();
  rig.check_records(expected);
  CHECK(released == static_cast<int>(sizes.size()));
  CHECK(rig.drain.slots > static_cast<int>(sizes.size()) + 10);  // chunked
  CHECK(rig.drain.failed == 0);
}

TEST_CASE("a full arena blocks reserve() until the copier frees room, and nothing is lost", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block, with_device_bytes(64 << 10));
  Stream stream;
  constexpr std::size_t n = 16 << 10;
  const auto bytes = pattern(n, 3);
  DeviceBuffer src(bytes);
  Gate gate(stream);
  for (int i = 0; i < 4; ++i) REQUIRE(push(rig.engine, i, src.data, n, stream));
  // The arena is full and the stream held: the fifth waits.
  auto fifth = std::async(std::launch::async, [&] { return push(rig.engine, 4, src.data, n, stream); });
  CHECK(fifth.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  gate.open();
  REQUIRE(fifth.get());
  rig.settle();
  rig.check_records(5, bytes);
  CHECK(rig.engine.counters().refused == 0);
}

TEST_CASE("more records in flight than the event pool holds: the pool grows, nothing waits", "[gpu][cuda]") {
  if (!have_gpu()) return;
  CudaEngineOptions options = engine_options();
  options.max_records = 4;
  Rig rig(1 << 20, Overflow::DropNewest, options);
  Stream stream;
  constexpr std::size_t n = 256;
  const auto bytes = pattern(n, 5);
  DeviceBuffer src(bytes);
  // The stream is held: no copy can complete and no event come back, so
  // every one of the 40 records is in flight at once. With a fixed pool the
  // fifth would wait (or, allowed to drop, be refused).
  Gate gate(stream);
  const auto created_before = rig.engine.counters().events_created;
  auto pushes = std::async(std::launch::async, [&] {
    int queued = 0;
    for (int i = 0; i < 40; ++i) queued += push(rig.engine, i, src.data, n, stream, /*may_drop=*/true) ? 1 : 0;
    return queued;
  });
  const bool returned = pushes.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  gate.open();
  REQUIRE(returned);
  CHECK(pushes.get() == 40);
  CHECK(rig.engine.counters().refused == 0);
  // At least the 36 records beyond the pool of 4 needed an event of their
  // own; one event a step, they share the pool's.
  const auto created = rig.engine.counters().events_created - created_before;
  if (rig.engine.batch_events())
    REQUIRE(created < 36);  // the device's pool and completion events, made at its first snapshot
  else
    REQUIRE(created >= 36);
  rig.settle();
  rig.check_records(40, bytes);
}

TEST_CASE("a device switch that fails leaves no error behind for torch to find", "[gpu][cuda][invalid_device]") {
  if (!have_gpu()) return;
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  CUDA_OK(cudaSetDevice(0));
  {
    // No such device: cudaSetDevice fails inside the guard.
    tensortap::detail::DeviceGuard guard(count + 3);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  CHECK(current == 0);
}

TEST_CASE("the copier's calls do not invalidate a user's CUDA graph capture", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block);
  Stream stream, user;
  constexpr std::size_t n = 4096;
  const auto bytes = pattern(n, 9);
  DeviceBuffer src(bytes);
  // Copies held in flight: the copier waits on their events (a blocking
  // call, unsafe during a global-mode capture in another thread's view).
  Gate gate(stream);
  for (int i = 0; i < 8; ++i) REQUIRE(push(rig.engine, i, src.data, n, stream));
  CUDA_OK(cudaStreamBeginCapture(user, cudaStreamCaptureModeGlobal));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  gate.open();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(user, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  CHECK(ended == cudaSuccess);
  rig.settle();
  rig.check_records(8, bytes);
}

TEST_CASE("a full arena refuses new snapshots when dropping is allowed, and counts them", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::DropNewest, with_device_bytes(64 << 10));
  Stream stream;
  constexpr std::size_t n = 16 << 10;
  DeviceBuffer src(n);
  Gate gate(stream);
  int queued = 0, dropped = 0;
  for (int i = 0; i < 10; ++i) (push(rig.engine, i, src.data, n, stream, /*may_drop=*/true) ? queued : dropped)++;
  CHECK(queued == 4);
  CHECK(dropped == 6);
  CHECK(rig.engine.counters().refused == 6);
  gate.open();
  rig.settle();
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  CHECK(rig.drain.records.size() == 4);
}

TEST_CASE("a slow writer holds the copier back, not the training thread, until the arena fills", "[gpu][cuda]") {
  if (!have_gpu()) return;
  // Staging smaller than the arena: the copier waits for the writer (it
  // must commit what it holds first, or the writer could never take it).
  Rig rig(64 << 10, Overflow::Block, with_device_bytes(1 << 20));
  rig.drain.pause = true;  // before any record: the drain looks at it only once it takes a buffer
  Stream stream;
  constexpr std::size_t n = 40 << 10;
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  for (int i = 0; i < 30; ++i) {
    expected.push_back(pattern(n, 50 + i));
    sources.push_back(std::make_unique<DeviceBuffer>(expected.back()));
  }
  auto pusher = std::async(std::launch::async, [&] {
    int queued = 0;
    for (int i = 0; i < 30; ++i) queued += push(rig.engine, i, sources[i]->data, n, stream) ? 1 : 0;
    return queued;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  rig.drain.pause = false;
  CHECK(pusher.get() == 30);
  rig.settle();
  rig.check_records(expected);
}

TEST_CASE("several threads and streams capture at once", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(256 << 10, Overflow::Block, with_device_bytes(512 << 10));
  constexpr int kThreads = 4, kEach = 300;
  std::vector<char> all(kThreads * kEach * 64);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<char>(i * 31 + 7);
  DeviceBuffer src(all);
  std::atomic<int> queued{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      for (int i = 0; i < kEach; ++i) {
        const int id = t * kEach + i;
        queued += push(rig.engine, id, src.bytes() + id * 64, 1 + id % 64, stream) ? 1 : 0;
      }
      // One event a step: a stream outlives its step's snapshots' hand-over
      // (docs/recording.md); without it, nothing.
      rig.engine.end_step();
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    });
  for (auto& th : threads) th.join();
  CHECK(queued == kThreads * kEach);
  rig.settle();
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  REQUIRE(rig.drain.records.size() == kThreads * kEach);
  for (int id = 0; id < kThreads * kEach; ++id) {
    const std::vector<char> want(all.begin() + id * 64, all.begin() + id * 64 + 1 + id % 64);
    if (rig.drain.records[id] != want) FAIL("record " << id << " differs");
  }
}

TEST_CASE("records from several devices in one run", "[gpu][cuda]") {
  if (!have_gpu()) return;
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2) {
    WARN("skipped: needs 2 CUDA devices, found " << devices);
    return;
  }
  Rig rig(1 << 20, Overflow::Block);
  std::vector<std::unique_ptr<Stream>> streams;
  for (int d = 0; d < devices; ++d) streams.push_back(std::make_unique<Stream>(d));
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  std::vector<std::vector<char>> expected;
  for (int i = 0; i < 40; ++i) {
    const int d = i % devices;
    expected.push_back(pattern(10000 + i, i));
    sources.push_back(std::make_unique<DeviceBuffer>(expected.back(), d));
  }
  for (int i = 0; i < 40; ++i) {
    const int d = i % devices;
    REQUIRE(push(rig.engine, i, sources[i]->data, expected[i].size(), *streams[d], false, d));
  }
  rig.settle();
  rig.check_records(expected);
}

TEST_CASE("stop() commits everything submitted, later reservations are refused", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block);
  Stream stream;
  DeviceBuffer src(4096);
  for (int i = 0; i < 50; ++i) REQUIRE(push(rig.engine, i, src.data, 4096, stream));
  rig.engine.stop();
  CHECK_FALSE(rig.engine.reserve(0, 16, false).has_value());
  rig.staging.wait_drained();
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  CHECK(rig.drain.records.size() == 50);
}

TEST_CASE("no growth of device or pinned memory over 10,000 captures", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block, with_device_bytes(4 << 20), /*keep_bytes=*/false);
  Stream stream;
  DeviceBuffer src(8 << 20);
  const auto capture_some = [&](int from, int count) {
    for (int i = from; i < from + count; ++i) {
      // Sizes from 1 byte to 3 MiB: coalesced, single and chunked.
      const std::size_t n = i % 97 == 0 ? (3 << 20) : static_cast<std::size_t>(1 + (i * 7919) % 200000);
      REQUIRE(push(rig.engine, i, src.data, n, stream));
    }
    rig.settle();
  };
  capture_some(0, 500);  // warm-up: arena, pools, staging buffers
  std::size_t free_before = 0, free_after = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  const std::size_t pinned_before = tensortap::detail::pinned_host_bytes();
  const auto events_before = rig.engine.counters().events_created;
  capture_some(500, 10000);
  CUDA_OK(cudaMemGetInfo(&free_after, &total));
  CHECK(free_after == free_before);
  CHECK(tensortap::detail::pinned_host_bytes() == pinned_before);
  CHECK(rig.engine.counters().events_created == events_before);
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  CHECK(rig.drain.complete == 10500);
  CHECK(rig.drain.failed == 0);
  CHECK(reports() == 0);
}

TEST_CASE("CPU captures share the staging buffers with the engine", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(128 << 10, Overflow::Block, with_device_bytes(256 << 10));
  Stream stream;
  constexpr int kEach = 400;
  std::vector<char> all(kEach * 512);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<char>(i * 13 + 5);
  DeviceBuffer src(all);
  // What Snapshotter::tensor does for a CPU tensor, from another thread: CPU
  // slots land between the engine's, which must not copy over them.
  std::thread cpu([&] {
    for (int i = 0; i < kEach; ++i)
      if (!commit_cpu_record(rig.staging, 100000 + i, 1 + i % 300)) return;
  });
  for (int i = 0; i < kEach; ++i) REQUIRE(push(rig.engine, i, src.bytes() + i * 512, 1 + i % 500, stream));
  cpu.join();
  rig.settle();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  REQUIRE(rig.drain.records.size() == 2 * kEach);
  for (int i = 0; i < kEach; ++i) {
    const std::vector<char> want(all.begin() + i * 512, all.begin() + i * 512 + 1 + i % 500);
    if (rig.drain.records[i] != want) FAIL("device record " << i << " differs");
    if (rig.drain.records[100000 + i] != std::vector<char>(1 + i % 300, 'c')) FAIL("CPU record " << i << " differs");
  }
}

TEST_CASE("a cancelled snapshot gives its room back and writes nothing", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block, with_device_bytes(64 << 10));
  Stream stream;
  int released = 0;
  for (int i = 0; i < 20; ++i) {
    auto snap = rig.engine.reserve(0, 48 << 10, /*may_drop=*/true);
    REQUIRE(snap);  // room comes back after each cancel
    rig.engine.cancel(*snap, stream, [&released] { ++released; });
    rig.engine.flush();
  }
  DeviceBuffer src(100);
  REQUIRE(push(rig.engine, 7, src.data, 100, stream));
  rig.settle();
  CHECK(released == 20);
  CHECK(reports() == 0);
  CHECK(rig.engine.counters().records == 1);
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  CHECK(rig.drain.records.size() == 1);
}

// Runs `f` on another thread and says whether it returned within a minute:
// a call that hangs fails the test instead of hanging the suite. (The
// thread is left to finish; a hang is a failure whatever it does next.)
bool returns(std::function<void()> f) {
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  std::thread([f = std::move(f), done] {
    f();
    done->set_value();
  }).detach();
  return finished.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
}

TEST_CASE("submit() and cancel() give the room back even with no memory left, and stop() returns", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block);
  constexpr std::size_t n = 4096;
  const auto bytes = pattern(n, 11);
  DeviceBuffer src(bytes);  // device 0 left current
  auto kept = rig.engine.reserve(0, n, false);
  auto cancelled = rig.engine.reserve(0, n, false);
  REQUIRE(kept);
  REQUIRE(cancelled);
  // The legacy default stream: the calls below queue no work that the fake
  // runtime would allocate for.
  CUDA_OK(cudaMemcpyAsync(kept->data, src.data, n, cudaMemcpyDeviceToDevice, nullptr));
  const auto record = meta_for(0, n);
  const RecordSpec spec = RecordSpec::of(*record, 0);
  bool threw = false;
  tt_test::fail_allocations(1000);
  try {
    rig.engine.submit(*kept, nullptr, spec, 1);
    rig.engine.cancel(*cancelled, nullptr);
  } catch (...) {
    threw = true;
  }
  tt_test::fail_allocations(0);
  CHECK_FALSE(threw);
  REQUIRE(returns([&] { rig.engine.flush(); }));
  REQUIRE(returns([&] { rig.engine.stop(); }));
  rig.staging.wait_drained();
  CHECK(reports() == 0);
  CHECK(rig.engine.counters().records == 1);
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  REQUIRE(rig.drain.records.size() == 1);
  CHECK(rig.drain.records[0] == bytes);
}

TEST_CASE("flush() waits for every record submitted before it, whichever device finishes first", "[gpu][cuda]") {
  if (!have_gpu()) return;
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    WARN("skipped: needs 2 CUDA devices, found " << devices);
    return;
  }
  Rig rig(1 << 20, Overflow::Block);
  Stream s0(0), s1(1);
  constexpr std::size_t n = 1000;
  DeviceBuffer src0(n, 0), src1(n, 1);
  Gate gate0(s0);
  CUDA_OK(cudaSetDevice(1));
  Gate gate1(s1);
  // The copier waits for record 0 (device 0, held), so records 1 and 2 are
  // taken together: device 0's batch (record 2) is issued, and completes,
  // before device 1's (record 1, held).
  REQUIRE(push(rig.engine, 0, src0.data, n, s0, false, 0));
  // One event a step: record 0 reaches the copier at a step's end (none
  // on the other path), and records 1 and 2 at flush() and the next end.
  rig.engine.end_step();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(push(rig.engine, 1, src1.data, n, s1, false, 1));
  auto flushed = std::async(std::launch::async, [&] { rig.engine.flush(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(push(rig.engine, 2, src0.data, n, s0, false, 0));
  rig.engine.end_step();
  gate0.open();
  // Records 0 and 2 reach staging: as many records as flush() waits for
  // have retired, but not record 1, which it waits for.
  for (int i = 0; i < 6000 && rig.engine.counters().records < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(rig.engine.counters().records == 2);
  CHECK(flushed.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  gate1.open();
  flushed.get();
  rig.staging.wait_drained();
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  CHECK(rig.drain.records.size() == 3);
}

TEST_CASE("a copier out of memory drops what it holds, reported, and flush() and stop() return", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block);
  Stream stream;
  constexpr std::size_t n = 4096;
  const auto bytes = pattern(n, 13);
  DeviceBuffer src(bytes);
  // Record 0's release runs on the copier thread: from there on, the
  // copier's next allocation fails (while it takes records 1 to 4).
  std::atomic<bool> armed{false};
  REQUIRE(push(rig.engine, 0, src.data, n, stream, false, 0, [&armed] {
    tt_test::fail_allocations(1);
    armed = true;
  }));
  REQUIRE(returns([&] { rig.engine.flush(); }));
  REQUIRE(armed);
  for (int i = 1; i <= 4; ++i) REQUIRE(push(rig.engine, i, src.data, n, stream));
  REQUIRE(returns([&] { rig.engine.flush(); }));
  const auto dropped = rig.engine.counters().dropped;
  CHECK(dropped >= 1);
  // It goes on: later records arrive.
  REQUIRE(push(rig.engine, 5, src.data, n, stream));
  REQUIRE(returns([&] { rig.engine.flush(); }));
  REQUIRE(returns([&] { rig.engine.stop(); }));
  rig.staging.wait_drained();
  CHECK(reports() == dropped);
  CHECK(rig.engine.counters().records + dropped == 6);
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  CHECK(rig.drain.records.size() + dropped == 6);
  CHECK(rig.drain.records.count(0) == 1);
  CHECK(rig.drain.records.count(5) == 1);
  for (const auto& [id, got] : rig.drain.records) CHECK(got == bytes);
}

namespace {

// Staging memory that says who allocated it: how often, on which thread,
// with which device current.
std::atomic<int> g_staging_allocs{0};
std::atomic<int> g_staging_releases{0};
std::atomic<int> g_staging_device{-1};
std::mutex g_staging_mu;
std::thread::id g_staging_thread;

void* staging_allocate(std::size_t bytes) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  g_staging_device = device;
  {
    std::lock_guard<std::mutex> lock(g_staging_mu);
    g_staging_thread = std::this_thread::get_id();
  }
  ++g_staging_allocs;
  return tensortap::detail::pinned_host_memory().allocate(bytes);
}
void staging_release(void* p) {
  ++g_staging_releases;
  tensortap::detail::pinned_host_memory().release(p);
}

// What the driver says the memory of the staging buffer being filled is: a
// reservation of a few bytes, committed (as failed: nothing is written).
cudaMemoryType memory_type(Staging& staging) {
  const tensortap::detail::Slot slot = slot_for(999999, 64);
  auto t = staging.reserve(slot, false);
  if (!t) return cudaMemoryTypeUnregistered;
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, t->dst);
  staging.commit(*t, false);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cudaMemoryTypeUnregistered;  // older runtimes: an error for pageable memory
  }
  return attr.type;
}

}  // namespace

TEST_CASE("staging moves to pinned memory once, from the copier, with the record's device current", "[gpu][cuda]") {
  if (!have_gpu()) return;
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  const int device = devices - 1;  // the last: a wrong device 0 shows
  g_staging_allocs = 0;
  g_staging_releases = 0;
  g_staging_device = -1;
  {
    Staging staging(64 << 10, Overflow::Block);
    Drain drain(staging);
    CudaEngineOptions options = engine_options();
    options.staging_memory.allocate = staging_allocate;
    options.staging_memory.release = staging_release;
    CudaEngine engine(staging, options, collect());
    // CPU records only: nothing pinned.
    for (int i = 0; i < 3; ++i) REQUIRE(commit_cpu_record(staging, 100 + i, 1000));
    staging.wait_drained();
    CHECK(g_staging_allocs == 0);
    CHECK(memory_type(staging) == cudaMemoryTypeUnregistered);  // pageable, as the driver sees it
    Stream stream(device);
    constexpr std::size_t n = 40 << 10;
    std::vector<std::vector<char>> expected;
    std::vector<std::unique_ptr<DeviceBuffer>> sources;
    for (int i = 0; i < 10; ++i) {
      expected.push_back(pattern(n, 70 + i));
      sources.push_back(std::make_unique<DeviceBuffer>(expected.back(), device));
    }
    // The training thread's current device is left alone.
    CUDA_OK(cudaSetDevice(0));
    for (int i = 0; i < 10; ++i) REQUIRE(push(engine, i, sources[i]->data, n, stream, false, device));
    engine.flush();
    staging.wait_drained();
    CHECK(g_staging_allocs == 2);  // both buffers, once
    CHECK(g_staging_device == device);
    CHECK(memory_type(staging) == cudaMemoryTypeHost);  // pinned, as the driver sees it
    {
      std::lock_guard<std::mutex> lock(g_staging_mu);
      CHECK(g_staging_thread != std::this_thread::get_id());
    }
    CHECK(reports() == 0);
    engine.stop();
    drain.stop();
    std::lock_guard<std::mutex> lock(drain.mu);
    REQUIRE(drain.records.size() == 13);
    for (int i = 0; i < 10; ++i) CHECK(drain.records[i] == expected[i]);
    CHECK(drain.records[100] == std::vector<char>(1000, 'c'));
  }
  CHECK(g_staging_releases == 2);
}

TEST_CASE("snapshots larger than the arena are bounded by bytes, not one at a time", "[gpu][cuda]") {
  if (!have_gpu()) return;
  CudaEngineOptions options = engine_options();
  options.device_bytes = 1 << 20;
  options.large_bytes = 4 << 20;
  Rig rig(1 << 20, Overflow::DropNewest, options);
  Stream stream;
  constexpr std::size_t large = (3 << 20) / 2, huge = 5 << 20;
  const auto bytes = pattern(huge, 17);
  DeviceBuffer src(bytes);
  // The stream is held: every snapshot stays alive.
  Gate gate(stream);
  // Two fit in the 4 MiB budget (one at a time would refuse the second), a
  // third does not, nor one over the budget while others are held.
  CHECK(push(rig.engine, 0, src.data, large, stream, /*may_drop=*/true));
  CHECK(push(rig.engine, 1, src.data, large, stream, /*may_drop=*/true));
  CHECK_FALSE(push(rig.engine, 2, src.data, large, stream, /*may_drop=*/true));
  CHECK_FALSE(push(rig.engine, 3, src.data, huge, stream, /*may_drop=*/true));
  CHECK(rig.engine.counters().refused == 2);
  // Small records still use the arena meanwhile.
  CHECK(push(rig.engine, 4, src.data, 1000, stream, /*may_drop=*/true));
  gate.open();
  rig.engine.flush();
  // Alone, one over the budget goes.
  CHECK(push(rig.engine, 5, src.data, huge, stream, /*may_drop=*/true));
  rig.settle();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(rig.drain.mu);
  REQUIRE(rig.drain.records.size() == 4);
  CHECK(rig.drain.records[0] == std::vector<char>(bytes.begin(), bytes.begin() + large));
  CHECK(rig.drain.records[1] == std::vector<char>(bytes.begin(), bytes.begin() + large));
  CHECK(rig.drain.records[4] == std::vector<char>(bytes.begin(), bytes.begin() + 1000));
  CHECK(rig.drain.records[5] == bytes);
}

namespace {

// Arena memory that fails, or counts.
std::atomic<int> g_arena_allocs{0};
std::atomic<int> g_arena_releases{0};
std::atomic<int> g_arena_device{-1};

tensortap::detail::DeviceMemory arena_memory(bool fails) {
  tensortap::detail::DeviceMemory m;
  m.allocate = [fails](int device, std::size_t bytes) -> void* {
    ++g_arena_allocs;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) cudaGetLastError();
    g_arena_device = current == device ? device : -1;
    if (fails) throw std::runtime_error("CUDA out of memory (test)");
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  };
  m.release = [](int device, void* p) {
    ++g_arena_releases;
    cudaSetDevice(device);
    cudaFree(p);
  };
  return m;
}

}  // namespace

TEST_CASE("the arena comes from the memory the engine is given, and goes back to it", "[gpu][cuda]") {
  if (!have_gpu()) return;
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  const int device = devices - 1;
  g_arena_allocs = 0;
  g_arena_releases = 0;
  g_arena_device = -1;
  CudaEngineOptions options = engine_options();
  options.arena_memory = arena_memory(/*fails=*/false);
  Rig rig(1 << 20, Overflow::Block, options);
  Stream stream(device);
  constexpr std::size_t n = 10000;
  const auto bytes = pattern(n, 19);
  DeviceBuffer src(bytes, device);
  CUDA_OK(cudaSetDevice(0));
  for (int i = 0; i < 20; ++i) {
    auto snap = rig.engine.reserve(device, n, false);
    REQUIRE(snap);
    CHECK_FALSE(snap->external);  // in the arena
    CUDA_OK(cudaMemcpyAsync(snap->data, src.data, n, cudaMemcpyDeviceToDevice, stream));
    rig.engine.submit(*snap, stream, RecordSpec::of(*meta_for(i, n), i), 1);
  }
  rig.engine.flush();
  CHECK(g_arena_allocs == 1);
  CHECK(g_arena_device == device);
  rig.engine.stop();
  CHECK(g_arena_releases == 1);
  rig.staging.wait_drained();
  CHECK(reports() == 0);
  rig.check_records(20, bytes);
}

TEST_CASE("an arena out of memory is tried and reported once, and captures go on without it", "[gpu][cuda]") {
  if (!have_gpu()) return;
  g_arena_allocs = 0;
  g_arena_releases = 0;
  CudaEngineOptions options = engine_options();
  options.arena_memory = arena_memory(/*fails=*/true);
  std::vector<std::string> warnings;
  options.warn = [&warnings](const std::string& what) { warnings.push_back(what); };
  Rig rig(1 << 20, Overflow::Block, options);
  Stream stream;
  constexpr std::size_t n = 10000;
  const auto bytes = pattern(n, 23);
  DeviceBuffer src(bytes);
  // No arena: a small snapshot is the caller's to allocate, as a large one.
  auto probe = rig.engine.reserve(0, n, false);
  REQUIRE(probe);
  CHECK(probe->external);
  rig.engine.cancel(*probe, stream);
  for (int i = 0; i < 30; ++i) REQUIRE(push(rig.engine, i, src.data, n, stream));
  rig.engine.flush();
  CHECK(g_arena_allocs == 1);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("cuda:0") && Catch::Contains("CUDA out of memory (test)"));
  rig.engine.stop();
  CHECK(g_arena_releases == 0);
  rig.staging.wait_drained();
  CHECK(reports() == 0);
  rig.check_records(30, bytes);
}

// ---- One event a step (CudaEngineOptions::batch_events, TENSORTAP_CUDA_BATCH=on) ----

// The fake runtime's counts of this thread's calls (tests/cuda/fake_cudart.cpp);
// absent against the real runtime, where the cases below check records only.
extern "C" __attribute__((weak)) void tensortap_fake_cudart_each_call(
    void (*fn)(long tid, const char* call, unsigned long long n, void* ctx), void* ctx);

namespace {

// This thread's runtime calls so far, by call; empty against the real runtime.
std::map<std::string, unsigned long long> my_calls() {
  std::map<std::string, unsigned long long> out;
  if (tensortap_fake_cudart_each_call == nullptr) return out;
  struct Ctx {
    long tid;
    std::map<std::string, unsigned long long>* out;
  } ctx{static_cast<long>(::syscall(SYS_gettid)), &out};
  tensortap_fake_cudart_each_call(
      [](long tid, const char* call, unsigned long long n, void* c) {
        auto* x = static_cast<Ctx*>(c);
        if (tid == x->tid) (*x->out)[call] = n;
      },
      &ctx);
  return out;
}

CudaEngineOptions batched(std::size_t device_bytes = std::size_t{128} << 20) {
  CudaEngineOptions options;
  options.device_bytes = device_bytes;
  options.batch_events = true;
  return options;
}

}  // namespace

TEST_CASE("one event a step: a step's snapshots share one event and one graph check, records exact",
          "[gpu][cuda][batch]") {
  if (!have_gpu()) return;
  Rig rig(4 << 20, Overflow::Block, batched());
  Stream stream;
  constexpr int steps = 3, per_step = 64;
  std::vector<std::vector<char>> expected;
  std::vector<DeviceBuffer> sources;
  sources.reserve(per_step);
  for (int i = 0; i < per_step; ++i) {
    expected.push_back(pattern(1000 + 64 * static_cast<std::size_t>(i), 100 + static_cast<std::uint64_t>(i)));
    sources.emplace_back(expected.back());
  }
  // Warm-up: the arena and its events.
  REQUIRE(push(rig.engine, 1000, sources[0].data, expected[0].size(), stream));
  rig.engine.end_step();
  rig.settle();
  const auto before = my_calls();
  std::uint64_t id = 0;
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < per_step; ++i)
      REQUIRE(push(rig.engine, id++, sources[static_cast<std::size_t>(i)].data, expected[static_cast<std::size_t>(i)].size(), stream));
    rig.engine.end_step();
  }
  const auto after = my_calls();
  rig.settle();
  CHECK(reports() == 0);
  {
    std::lock_guard<std::mutex> lock(rig.drain.mu);
    REQUIRE(rig.drain.records.size() == static_cast<std::size_t>(steps * per_step + 1));
    for (std::uint64_t k = 0; k < id; ++k) CHECK(rig.drain.records[k] == expected[k % per_step]);
  }
  if (!after.empty()) {
    const auto delta = [&](const char* call) {
      const auto a = after.find(call), b = before.find(call);
      return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
    };
    // One device-to-device copy a snapshot; a step's event and its graph
    // checks (at the first capture, and before the event) once a step.
    CHECK(delta("cudaMemcpyAsync") == static_cast<unsigned long long>(steps * per_step));
    CHECK(delta("cudaEventRecord") == static_cast<unsigned long long>(steps));
    CHECK(delta("cudaStreamIsCapturing") == static_cast<unsigned long long>(2 * steps));
  }
}

TEST_CASE("one event a step: a full arena hands the step's snapshots over early; nothing waits forever",
          "[gpu][cuda][batch]") {
  if (!have_gpu()) return;
  constexpr std::size_t n = 16 << 10;
  const auto bytes = pattern(n, 41);
  DeviceBuffer src(bytes);
  SECTION("Overflow::Block: 40 snapshots through an arena of 4, in one step") {
    Rig rig(1 << 20, Overflow::Block, batched(64 << 10));
    Stream stream;
    for (int i = 0; i < 40; ++i) REQUIRE(push(rig.engine, i, src.data, n, stream));
    rig.engine.end_step();
    rig.settle();
    CHECK(reports() == 0);
    rig.check_records(40, bytes);
  }
  SECTION("Overflow::DropNewest: the arena's 4 kept, the rest refused and counted") {
    Rig rig(1 << 20, Overflow::DropNewest, batched(64 << 10));
    Stream stream;
    Gate gate(stream);
    int queued = 0, dropped = 0;
    for (int i = 0; i < 10; ++i) (push(rig.engine, i, src.data, n, stream, /*may_drop=*/true) ? queued : dropped)++;
    CHECK(queued == 4);
    CHECK(dropped == 6);
    gate.open();
    rig.engine.end_step();
    rig.settle();
    rig.check_records(4, bytes);
  }
}

TEST_CASE("one event a step: snapshots on two streams in one step, flush() and stop() without a step's end",
          "[gpu][cuda][batch]") {
  if (!have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block, batched());
  Stream a, b;
  std::vector<std::vector<char>> expected;
  for (int i = 0; i < 12; ++i) expected.push_back(pattern(3000 + static_cast<std::size_t>(i), 7 + static_cast<std::uint64_t>(i)));
  std::vector<std::unique_ptr<DeviceBuffer>> src;
  for (const auto& e : expected) src.push_back(std::make_unique<DeviceBuffer>(e));
  // Alternating streams: each change ends the group on the other.
  for (std::size_t i = 0; i < 6; ++i)
    REQUIRE(push(rig.engine, i, src[i]->data, expected[i].size(), i % 2 == 0 ? a : b));
  // flush() hands over what waits for the step's end, and returns.
  rig.engine.flush();
  for (std::size_t i = 6; i < 12; ++i) REQUIRE(push(rig.engine, i, src[i]->data, expected[i].size(), a));
  // stop() too, with no step's end to come.
  rig.engine.stop();
  rig.staging.wait_drained();
  CHECK(reports() == 0);
  rig.check_records(expected);
}

TEST_CASE("one event a step: a CUDA graph capture must begin at a step boundary", "[cuda][batch]") {
  // The fake runtime answers cudaStreamIsCapturing after cudaStreamBeginCapture;
  // a GPU would also turn the snapshot's copy into a graph node.
  if (tensortap_fake_cudart_each_call == nullptr || !have_gpu()) return;
  Rig rig(1 << 20, Overflow::Block, batched());
  Stream stream;
  const auto bytes = pattern(4096, 5);
  DeviceBuffer src(bytes);
  SECTION("begun within a step, after a snapshot: that step's records are lost, each reported") {
    REQUIRE(push(rig.engine, 0, src.data, bytes.size(), stream));
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    rig.engine.end_step();
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    // The snapshot's copy still runs on the stream (no event follows it):
    // done before its source is freed (the fake's cudaFree does not wait).
    CUDA_OK(cudaStreamSynchronize(stream));
    rig.settle();
    std::lock_guard<std::mutex> lock(g_reports_mu);
    REQUIRE(g_reports.size() == 1);
    CHECK_THAT(g_reports[0], Catch::Contains("'r0'") && Catch::Contains("step boundary"));
    CHECK(rig.drain.records.empty());
  }
  SECTION("begun at a step boundary: the step's first snapshot is refused by name") {
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CHECK_THROWS_WITH(push(rig.engine, 0, src.data, bytes.size(), stream), Catch::Contains("CUDA graph"));
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    rig.engine.end_step();
    REQUIRE(push(rig.engine, 1, src.data, bytes.size(), stream));
    rig.engine.end_step();
    rig.settle();
    CHECK(reports() == 0);
    std::lock_guard<std::mutex> lock(rig.drain.mu);
    CHECK(rig.drain.records.size() == 1);
  }
}

TEST_CASE("TENSORTAP_CUDA_BATCH is parsed strictly", "[cuda][batch]") {
  const char* was = std::getenv("TENSORTAP_CUDA_BATCH");
  const std::string saved = was != nullptr ? was : "";
  ::setenv("TENSORTAP_CUDA_BATCH", " ON ", 1);
  CHECK(tensortap::detail::cuda_batch());
  ::setenv("TENSORTAP_CUDA_BATCH", "off", 1);
  CHECK_FALSE(tensortap::detail::cuda_batch());
  ::setenv("TENSORTAP_CUDA_BATCH", "yes", 1);
  CHECK_THROWS_WITH(tensortap::detail::cuda_batch(), Catch::Contains("TENSORTAP_CUDA_BATCH=yes"));
  ::setenv("TENSORTAP_CUDA_BATCH", "", 1);
  CHECK(tensortap::detail::cuda_batch() == tensortap::detail::kCudaBatch);
  if (was != nullptr)
    ::setenv("TENSORTAP_CUDA_BATCH", saved.c_str(), 1);
  else
    ::unsetenv("TENSORTAP_CUDA_BATCH");
}

#ifdef TENSORTAP_TEST_BATCH_KERNELS
// A step's gradients in one batch (sdk/src/cuda/batch.h, issue 73): where
// tensortap's kernels exist. On the fake runtime they are their host
// references (tests/cuda/kernel_reference.h), so these cases test the
// batch's plumbing and counts; on a GPU they test the kernels against the
// references too.
namespace {

using tensortap::detail::BatchItem;
using tensortap::detail::BatchTensor;
using tensortap::detail::StatsElement;

constexpr std::size_t kStatsBytes = tensortap::detail::kStatsFields * sizeof(double);

std::size_t element_bytes(StatsElement e) {
  return e == StatsElement::Float64 ? 8 : e == StatsElement::Float32 ? 4 : 2;
}

// A gradient: `n` values of `element` on the device, and what the batch
// must write of it, from the host reference.
struct Grad {
  StatsElement element;
  std::int64_t n;
  std::vector<char> values;
  std::unique_ptr<DeviceBuffer> device;
  std::vector<char> stored;
  std::vector<char> stats;

  Grad(StatsElement e, std::int64_t count, std::uint64_t seed)
      : element(e), n(count), values(pattern(static_cast<std::size_t>(count) * element_bytes(e), seed)),
        device(std::make_unique<DeviceBuffer>(values)),
        stored(static_cast<std::size_t>(tensortap::detail::batch_copy_bytes(e, count))), stats(kStatsBytes) {
    BatchTensor t;
    t.data = values.data();
    t.n = n;
    t.element = e;
    t.copy = stored.data();
    t.stats = reinterpret_cast<double*>(stats.data());
    tt_test::run_batch_on_host(&t, 1);
  }
};

// The records of one gradient: its full record (id) and its statistics (id + 1).
struct GradRecords {
  std::shared_ptr<const Record> full, stats;
  RecordSpec full_spec, stats_spec;
  GradRecords(std::uint64_t id, const Grad& g)
      : full(meta_for(id, g.stored.size())), stats(meta_for(id + 1, kStatsBytes)),
        full_spec(RecordSpec::of(*full, id)), stats_spec(RecordSpec::of(*stats, id + 1)) {}
};

std::vector<Grad> gradients(int count) {
  std::vector<Grad> grads;
  const StatsElement kinds[] = {StatsElement::Float32, StatsElement::Float64, StatsElement::Float16,
                                StatsElement::BFloat16};
  // Sizes from empty to several of the kernels' blocks (4,096 values each).
  const std::int64_t sizes[] = {0, 1, 255, 256, 4097, 70000, 1000, 64};
  for (int i = 0; i < count; ++i)
    grads.emplace_back(i % 3 == 0 ? kinds[(i / 3) % 4] : StatsElement::Float32, sizes[i % 8] + i,
                       static_cast<std::uint64_t>(500 + i));
  return grads;
}

}  // namespace

TEST_CASE("a step's gradients in one batch: one launch a step, each record as its host reference's",
          "[gpu][cuda][batch]") {
  if (!have_gpu()) return;
  Rig rig(16 << 20, Overflow::Block, batched());
  Stream stream;
  const std::vector<Grad> grads = gradients(64);
  constexpr int steps = 3;
  const auto run_step = [&](int step) {
    std::vector<GradRecords> records;
    records.reserve(grads.size());
    std::vector<BatchItem> items(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      records.emplace_back(static_cast<std::uint64_t>(step * 1000 + 2 * i), grads[i]);
      items[i].tensor.data = grads[i].device->data;
      items[i].tensor.n = grads[i].n;
      items[i].tensor.element = grads[i].element;
      items[i].full = &records[i].full_spec;
      items[i].stats = &records[i].stats_spec;
    }
    tensortap::detail::capture_batch_on_engine(rig.engine, 0, stream, items.data(), items.size(), false);
    for (const BatchItem& item : items) CHECK((item.queued == 2 && !item.left));
    rig.engine.end_step();
  };
  run_step(0);  // warm-up: the arena and its events
  rig.settle();
  const auto before = my_calls();
  const std::uint64_t copies = rig.engine.counters().copies;
  for (int step = 1; step <= steps; ++step) run_step(step);
  const auto after = my_calls();
  rig.settle();
  CHECK(reports() == 0);
  {
    std::lock_guard<std::mutex> lock(rig.drain.mu);
    REQUIRE(rig.drain.records.size() == static_cast<std::size_t>(steps + 1) * grads.size() * 2);
    for (int step = 0; step <= steps; ++step)
      for (std::size_t i = 0; i < grads.size(); ++i) {
        INFO("step " << step << ", gradient " << i << ", " << grads[i].n << " values");
        const auto id = static_cast<std::uint64_t>(step * 1000 + 2 * i);
        CHECK(rig.drain.records[id] == grads[i].stored);
        CHECK(rig.drain.records[id + 1] == grads[i].stats);
        // float32 and float64 are stored as they are: their bytes.
        if (grads[i].element == StatsElement::Float32 || grads[i].element == StatsElement::Float64)
          CHECK(grads[i].stored == grads[i].values);
      }
  }
  // Each step's records lie next to each other in the arena and in
  // staging: the copier moves a step's batch to the host in one copy.
  CHECK(rig.engine.counters().copies - copies == static_cast<std::uint64_t>(steps));
  if (!after.empty()) {
    const auto delta = [&](const char* call) {
      const auto a = after.find(call), b = before.find(call);
      return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
    };
    // The training thread, a step: one launch (each tensor's last block
    // merges, counting itself in a slot of the engine's counters), the
    // step's event and its two graph checks (at the batch, and before the
    // event); no copy.
    CHECK(delta("cudaLaunchKernel") == 1u * steps);
    CHECK(delta("cudaMemcpyAsync") == 0u);
    CHECK(delta("cudaEventRecord") == 1u * steps);
    CHECK(delta("cudaStreamIsCapturing") == 2u * steps);
    unsigned long long total = 0;
    for (const auto& [call, n] : after) total += n - (before.count(call) != 0 ? before.at(call) : 0);
    CHECK(total == 4u * steps);
  }
}

TEST_CASE("a backward pass's gather copies each gradient's bytes, 70 of them in two launches", "[gpu][cuda][batch]") {
  // launch_copies (hooks/src/params.cpp's final callback): sizes from
  // none to several blocks' shares (32 KiB each), and sides that are not
  // 16-byte aligned (the kernel's byte loop) beside those that are.
  if (!have_gpu()) return;
  Stream stream;
  const std::size_t sizes[] = {0, 1, 15, 16, 17, 4096, 32768 + 48, (1u << 20) + 3, 64, 100};
  std::vector<std::vector<char>> values;
  std::vector<std::unique_ptr<DeviceBuffer>> from, into;
  std::vector<tensortap::detail::CopyTensor> copies;
  for (std::size_t i = 0; i < 70; ++i) {
    const std::size_t n = sizes[i % 10] + (i / 10) * 16, skew = i % 4 == 3 ? 1 : 0;
    values.push_back(pattern(n, 900 + i));
    from.push_back(std::make_unique<DeviceBuffer>(n + skew));
    into.push_back(std::make_unique<DeviceBuffer>(n + 16));
    CUDA_OK(cudaMemcpy(from.back()->bytes() + skew, values.back().data(), n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(into.back()->data, 0x5a, n + 16));
    copies.push_back({from.back()->bytes() + skew, into.back()->bytes() + (i % 5 == 4 ? 8 : 0),
                      static_cast<std::int64_t>(n)});
  }
  const auto before = my_calls();
  REQUIRE(tensortap::detail::launch_copies(copies.data(), tensortap::detail::kBatchTensors, stream) == 0);
  REQUIRE(tensortap::detail::launch_copies(copies.data() + tensortap::detail::kBatchTensors,
                                           static_cast<int>(copies.size()) - tensortap::detail::kBatchTensors,
                                           stream) == 0);
  const auto after = my_calls();
  CUDA_OK(cudaStreamSynchronize(stream));
  for (std::size_t i = 0; i < copies.size(); ++i) {
    INFO("tensor " << i << ", " << copies[i].bytes << " bytes");
    const std::size_t at = i % 5 == 4 ? 8 : 0, n = values[i].size();
    std::vector<char> back(n + 16);
    CUDA_OK(cudaMemcpy(back.data(), into[i]->data, back.size(), cudaMemcpyDeviceToHost));
    CHECK(std::vector<char>(back.begin() + static_cast<std::ptrdiff_t>(at),
                            back.begin() + static_cast<std::ptrdiff_t>(at + n)) == values[i]);
    // Nothing written past it, nor before it.
    CHECK(std::count(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(at), '\x5a') ==
          static_cast<std::ptrdiff_t>(at));
    CHECK(std::count(back.begin() + static_cast<std::ptrdiff_t>(at + n), back.end(), '\x5a') ==
          static_cast<std::ptrdiff_t>(16 - at));
  }
  if (!after.empty()) {
    CHECK(after.at("cudaLaunchKernel") - (before.count("cudaLaunchKernel") ? before.at("cudaLaunchKernel") : 0) ==
          2u);
  }
}

TEST_CASE("a batch launches twice when the engine's counter slots are all in use, and gives each slot back once "
          "its launch has run",
          "[gpu][cuda][batch]") {
  // The fake's launch checks a slot is zero when taken and holds it until
  // the launch runs on its stream: a slot given back early aborts.
  if (!have_gpu()) return;
  Rig rig(16 << 20, Overflow::Block, batched());
  Stream stream;
  const std::vector<Grad> grads = gradients(3);
  constexpr int batches = 40;  // more than the 16 slots, all held by the gate
  std::vector<std::vector<GradRecords>> records(batches);
  const auto before = my_calls();
  {
    Gate gate(stream);
    for (int b = 0; b < batches; ++b) {
      std::vector<BatchItem> items(grads.size());
      records[static_cast<std::size_t>(b)].reserve(grads.size());
      for (std::size_t i = 0; i < grads.size(); ++i) {
        records[static_cast<std::size_t>(b)].emplace_back(static_cast<std::uint64_t>(b * 100 + 2 * i), grads[i]);
        items[i].tensor.data = grads[i].device->data;
        items[i].tensor.n = grads[i].n;
        items[i].tensor.element = grads[i].element;
        items[i].stats = &records[static_cast<std::size_t>(b)][i].stats_spec;
      }
      tensortap::detail::capture_batch_on_engine(rig.engine, 0, stream, items.data(), items.size(), false);
    }
    if (const auto after = my_calls(); !after.empty()) {
      const auto launches = after.at("cudaLaunchKernel") - (before.count("cudaLaunchKernel") ? before.at("cudaLaunchKernel") : 0);
      CHECK(launches == static_cast<unsigned long long>(16 + 2 * (batches - 16)));
    }
    gate.open();
    rig.engine.end_step();
    rig.settle();
  }
  CHECK(reports() == 0);
  {
    std::lock_guard<std::mutex> lock(rig.drain.mu);
    REQUIRE(rig.drain.records.size() == static_cast<std::size_t>(batches) * grads.size());
    for (int b = 0; b < batches; ++b)
      for (std::size_t i = 0; i < grads.size(); ++i)
        CHECK(rig.drain.records[static_cast<std::uint64_t>(b * 100 + 2 * i + 1)] == grads[i].stats);
  }
  // Every slot back: a batch now launches once.
  std::vector<GradRecords> again;
  again.emplace_back(9000, grads[0]);
  BatchItem item;
  item.tensor.data = grads[0].device->data;
  item.tensor.n = grads[0].n;
  item.tensor.element = grads[0].element;
  item.stats = &again[0].stats_spec;
  const auto b0 = my_calls();
  for (int k = 0; k < 16; ++k) tensortap::detail::capture_batch_on_engine(rig.engine, 0, stream, &item, 1, false);
  if (const auto b1 = my_calls(); !b1.empty()) CHECK(b1.at("cudaLaunchKernel") - b0.at("cudaLaunchKernel") == 16u);
  rig.engine.end_step();
  rig.settle();
}

TEST_CASE("a batch leaves what is too large for it, refuses what finds no room under DropNewest, and a graph "
          "capture is refused with nothing held",
          "[gpu][cuda][batch]") {
  if (!have_gpu()) return;
  std::vector<Grad> grads;
  grads.emplace_back(StatsElement::Float32, 1000, 1);
  grads.emplace_back(StatsElement::Float32, 100000, 2);  // 400 KB: more than a quarter of a 1 MiB arena
  grads.emplace_back(StatsElement::Float32, 0, 3);
  std::vector<GradRecords> records;
  for (std::size_t i = 0; i < grads.size(); ++i) records.emplace_back(2 * i, grads[i]);
  std::vector<BatchItem> items(grads.size() + 1);  // and a parameter with no gradient this step: nothing
  for (std::size_t i = 0; i < grads.size(); ++i) {
    items[i].tensor.data = grads[i].device->data;
    items[i].tensor.n = grads[i].n;
    items[i].full = &records[i].full_spec;
    items[i].stats = &records[i].stats_spec;
  }
  SECTION("too large: left for the per-tensor path, nothing of it taken") {
    Rig rig(4 << 20, Overflow::Block, batched(1 << 20));
    Stream stream;
    tensortap::detail::capture_batch_on_engine(rig.engine, 0, stream, items.data(), items.size(), false);
    CHECK((items[0].queued == 2 && !items[0].left));
    CHECK((items[1].queued == 0 && items[1].left));
    CHECK((items[2].queued == 2 && !items[2].left));
    CHECK((items[3].queued == 0 && !items[3].left));
    rig.engine.end_step();
    rig.settle();
    CHECK(reports() == 0);
    std::lock_guard<std::mutex> lock(rig.drain.mu);
    CHECK(rig.drain.records.size() == 4);
    CHECK(rig.drain.records[0] == grads[0].stored);
    CHECK(rig.drain.records[1] == grads[0].stats);
    CHECK(rig.drain.records[5] == grads[2].stats);
  }
  SECTION("a full arena under DropNewest: the records that fit, the rest refused and counted") {
    Rig rig(4 << 20, Overflow::DropNewest, batched(64 << 10));
    Stream stream;
    Gate gate(stream);
    std::vector<Grad> many;
    for (int i = 0; i < 8; ++i) many.emplace_back(StatsElement::Float32, 3000, 10 + static_cast<std::uint64_t>(i));
    std::vector<GradRecords> recs;
    for (std::size_t i = 0; i < many.size(); ++i) recs.emplace_back(2 * i, many[i]);
    std::vector<BatchItem> batch(many.size());
    for (std::size_t i = 0; i < many.size(); ++i) {
      batch[i].tensor.data = many[i].device->data;
      batch[i].tensor.n = many[i].n;
      batch[i].full = &recs[i].full_spec;
    }
    // 12 KB each, 16 KB a chunk (a quarter of the arena): each launch holds
    // one; the arena keeps at most five while the stream is held.
    tensortap::detail::capture_batch_on_engine(rig.engine, 0, stream, batch.data(), batch.size(), true);
    int queued = 0;
    for (const BatchItem& b : batch) queued += b.queued;
    CHECK(queued >= 1);
    CHECK(queued < 8);
    CHECK(rig.engine.counters().refused == static_cast<std::uint64_t>(8 - queued));
    gate.open();
    rig.engine.end_step();
    rig.settle();
    CHECK(reports() == 0);
    std::lock_guard<std::mutex> lock(rig.drain.mu);
    CHECK(rig.drain.records.size() == static_cast<std::size_t>(queued));
    for (const auto& [id, bytes] : rig.drain.records) CHECK(bytes == many[id / 2].stored);
  }
  SECTION("a stream being captured into a CUDA graph: refused, naming the batch; flush() and stop() return") {
    Rig rig(4 << 20, Overflow::Block, batched(1 << 20));
    Stream stream;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CHECK_THROWS_WITH(
        tensortap::detail::capture_batch_on_engine(rig.engine, 0, stream, items.data(), 1, false),
        Catch::Contains("a batch of 1 tensor(s) of step 0 on cuda:0") && Catch::Contains("CUDA graph"));
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    rig.engine.end_step();
    rig.settle();
    rig.engine.stop();
    CHECK(rig.drain.records.empty());
  }
}
#endif
