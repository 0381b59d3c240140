// The CUDA transfer engine through the CUDA runtime API alone: device
// buffers filled by cudaMemcpy, pushed through the engine into a Staging,
// whose buffers a stand-in writer thread reads back. Built wherever the CUDA
// toolkit is; the [gpu] cases skip (with a warning) where no device is.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "sdk/src/cuda/device.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/cuda/pinned.h"
#include "sdk/src/staging.h"
#include "tests/alloc_faults.h"

namespace {

using tensortap::Overflow;
using tensortap::detail::CudaEngine;
using tensortap::detail::CudaEngineOptions;
using tensortap::detail::Record;
using tensortap::detail::RecordDesc;
using tensortap::detail::Staging;

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

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

// A device buffer, freed at scope exit.
struct DeviceBuffer {
  void* data = nullptr;
  int device = 0;
  DeviceBuffer(std::size_t n, int dev = 0) : device(dev) {
    CUDA_OK(cudaSetDevice(dev));
    CUDA_OK(cudaMalloc(&data, n == 0 ? 1 : n));
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

// Pushes the `n` bytes at device address `src` through the engine, the way
// the LibTorch glue does: reserve, copy on `stream`, submit. No Catch2
// assertions: tests call it from several threads. Throws on CUDA errors.
bool push(CudaEngine& engine, std::uint64_t id, const void* src, std::size_t n, cudaStream_t stream,
          bool may_drop = false, int device = 0, std::function<void()> release = {}) {
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
  engine.submit(*snap, stream, meta_for(id, n), id, 1, std::move(release));
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
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
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
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<std::size_t> sizes{0, 1, 3, 63, 64, 65, 4096, 100000, (1 << 20) - 1, 1 << 20};
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    expected.push_back(pattern(sizes[i], i));
    sources.push_back(std::make_unique<DeviceBuffer>(sizes[i]));
    CUDA_OK(cudaMemcpy(sources.back()->data, expected.back().data(), sizes[i], cudaMemcpyHostToDevice));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) REQUIRE(push(engine, i, sources[i]->data, sizes[i], stream));
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    INFO("record " << i << ", " << sizes[i] << " bytes");
    CHECK(drain.records[i] == expected[i]);
  }
  CHECK(drain.failed == 0);
  CHECK(engine.counters().records == sizes.size());
  cudaStreamDestroy(stream);
}

TEST_CASE("a snapshot holds the values at capture, whatever the stream does next", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t n = 256 << 10;
  DeviceBuffer buf(n);
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> values;
  for (int i = 0; i < 20; ++i) {
    expected.push_back(pattern(n, 100 + i));
    values.push_back(std::make_unique<DeviceBuffer>(n));
    CUDA_OK(cudaMemcpy(values.back()->data, expected.back().data(), n, cudaMemcpyHostToDevice));
  }
  std::atomic<bool> gate{false};
  // Hold the stream so every snapshot is still queued when the overwrites are
  // enqueued: only stream order keeps them apart.
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  for (int i = 0; i < 20; ++i) {
    CUDA_OK(cudaMemcpyAsync(buf.data, values[i]->data, n, cudaMemcpyDeviceToDevice, stream));  // an optimizer step
    REQUIRE(push(engine, i, buf.data, n, stream));
  }
  CUDA_OK(cudaMemsetAsync(buf.data, 0, n, stream));  // what zero_grad() does
  gate = true;
  engine.flush();
  staging.wait_drained();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 20);
  for (int i = 0; i < 20; ++i) CHECK(drain.records[i] == expected[i]);
  cudaStreamDestroy(stream);
}

TEST_CASE("small records are coalesced into few copies", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(4 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kRecords = 200;
  std::vector<std::vector<char>> expected;
  DeviceBuffer src(kRecords * 1000);
  for (int i = 0; i < kRecords; ++i) {
    expected.push_back(pattern(100 + i * 3, i));
    CUDA_OK(cudaMemcpy(src.bytes() + i * 1000, expected.back().data(), expected.back().size(), cudaMemcpyHostToDevice));
  }
  std::atomic<bool> gate{false};
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  // The first record's batch waits on the held stream; the rest queue up
  // behind it and leave in one batch.
  REQUIRE(push(engine, 0, src.bytes(), expected[0].size(), stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int i = 1; i < kRecords; ++i) REQUIRE(push(engine, i, src.bytes() + i * 1000, expected[i].size(), stream));
  gate = true;
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == kRecords);
  for (int i = 0; i < kRecords; ++i) CHECK(drain.records[i] == expected[i]);
  INFO("copies: " << engine.counters().copies);
  CHECK(engine.counters().copies <= 4);
  cudaStreamDestroy(stream);
}

TEST_CASE("records larger than a staging buffer go in chunks, larger than the arena in their own snapshot",
          "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(256 << 10, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 1 << 20;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // In the arena but 3 chunks; larger than the arena; and small ones between.
  const std::vector<std::size_t> sizes{700 << 10, 1000, (3 << 20) + 12, 5, (2 << 20) + 1};
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  std::atomic<int> released{0};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    expected.push_back(pattern(sizes[i], 7 + i));
    sources.push_back(std::make_unique<DeviceBuffer>(sizes[i]));
    CUDA_OK(cudaMemcpy(sources.back()->data, expected.back().data(), sizes[i], cudaMemcpyHostToDevice));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)
    REQUIRE(push(engine, i, sources[i]->data, sizes[i], stream, false, 0, [&released] { ++released; }));
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    INFO("record " << i << ", " << sizes[i] << " bytes");
    CHECK(drain.records[i] == expected[i]);
  }
  CHECK(released == static_cast<int>(sizes.size()));
  CHECK(drain.slots > static_cast<int>(sizes.size()) + 10);  // chunked
  CHECK(drain.failed == 0);
  cudaStreamDestroy(stream);
}

TEST_CASE("a full arena blocks reserve() until the copier frees room, and nothing is lost", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 64 << 10;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t n = 16 << 10;
  const auto bytes = pattern(n, 3);
  DeviceBuffer src(n);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  std::atomic<bool> gate{false};
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  for (int i = 0; i < 4; ++i) REQUIRE(push(engine, i, src.data, n, stream));
  // The arena is full and the stream held: the fifth waits.
  auto fifth = std::async(std::launch::async, [&] { return push(engine, 4, src.data, n, stream); });
  CHECK(fifth.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  gate = true;
  REQUIRE(fifth.get());
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 5);
  for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  CHECK(engine.counters().refused == 0);
  cudaStreamDestroy(stream);
}

TEST_CASE("more records in flight than the event pool holds: the pool grows, nothing waits", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::DropNewest, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.max_records = 4;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t n = 256;
  const auto bytes = pattern(n, 5);
  DeviceBuffer src(n);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  // The stream is held: no copy can complete and no event come back, so
  // every one of the 40 records is in flight at once. With a fixed pool the
  // fifth would wait (or, allowed to drop, be refused).
  std::atomic<bool> gate{false};
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  const auto created_before = engine.counters().events_created;
  auto pushes = std::async(std::launch::async, [&] {
    int queued = 0;
    for (int i = 0; i < 40; ++i) queued += push(engine, i, src.data, n, stream, /*may_drop=*/true) ? 1 : 0;
    return queued;
  });
  const bool returned = pushes.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  gate = true;
  REQUIRE(returned);
  CHECK(pushes.get() == 40);
  CHECK(engine.counters().refused == 0);
  // At least the 36 records beyond the pool of 4 needed an event of their own.
  CHECK(engine.counters().events_created - created_before >= 36);
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 40);
  for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  cudaStreamDestroy(stream);
}

TEST_CASE("a device switch that fails leaves no error behind for torch to find", "[gpu][cuda]") {
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
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t stream, user;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
  constexpr std::size_t n = 4096;
  const auto bytes = pattern(n, 9);
  DeviceBuffer src(n);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  // Copies held in flight: the copier waits on their events (a blocking
  // call, unsafe during a global-mode capture in another thread's view).
  std::atomic<bool> gate{false};
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  for (int i = 0; i < 8; ++i) REQUIRE(push(engine, i, src.data, n, stream));
  CUDA_OK(cudaStreamBeginCapture(user, cudaStreamCaptureModeGlobal));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  gate = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(user, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  CHECK(ended == cudaSuccess);
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 8);
  for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  cudaStreamDestroy(user);
  cudaStreamDestroy(stream);
}

TEST_CASE("a full arena refuses new snapshots when dropping is allowed, and counts them", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::DropNewest, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 64 << 10;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t n = 16 << 10;
  DeviceBuffer src(n);
  std::atomic<bool> gate{false};
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  int queued = 0, dropped = 0;
  for (int i = 0; i < 10; ++i) (push(engine, i, src.data, n, stream, /*may_drop=*/true) ? queued : dropped)++;
  CHECK(queued == 4);
  CHECK(dropped == 6);
  CHECK(engine.counters().refused == 6);
  gate = true;
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  CHECK(drain.records.size() == 4);
  cudaStreamDestroy(stream);
}

TEST_CASE("a slow writer holds the copier back, not the training thread, until the arena fills", "[gpu][cuda]") {
  if (!have_gpu()) return;
  // Staging smaller than the arena: the copier waits for the writer (it
  // must commit what it holds first, or the writer could never take it).
  Staging staging(64 << 10, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  drain.pause = true;
  CudaEngineOptions options;
  options.device_bytes = 1 << 20;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr std::size_t n = 40 << 10;
  std::vector<std::vector<char>> expected;
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  for (int i = 0; i < 30; ++i) {
    expected.push_back(pattern(n, 50 + i));
    sources.push_back(std::make_unique<DeviceBuffer>(n));
    CUDA_OK(cudaMemcpy(sources.back()->data, expected.back().data(), n, cudaMemcpyHostToDevice));
  }
  auto pusher = std::async(std::launch::async, [&] {
    int queued = 0;
    for (int i = 0; i < 30; ++i) queued += push(engine, i, sources[i]->data, n, stream) ? 1 : 0;
    return queued;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  drain.pause = false;
  CHECK(pusher.get() == 30);
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 30);
  for (int i = 0; i < 30; ++i) CHECK(drain.records[i] == expected[i]);
  cudaStreamDestroy(stream);
}

TEST_CASE("several threads and streams capture at once", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(256 << 10, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 512 << 10;
  CudaEngine engine(staging, options, collect());
  constexpr int kThreads = 4, kEach = 300;
  DeviceBuffer src(kThreads * kEach * 64);
  std::vector<char> all(kThreads * kEach * 64);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<char>(i * 31 + 7);
  CUDA_OK(cudaMemcpy(src.data, all.data(), all.size(), cudaMemcpyHostToDevice));
  std::atomic<int> queued{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      for (int i = 0; i < kEach; ++i) {
        const int id = t * kEach + i;
        queued += push(engine, id, src.bytes() + id * 64, 1 + id % 64, stream) ? 1 : 0;
      }
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    });
  for (auto& th : threads) th.join();
  CHECK(queued == kThreads * kEach);
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == kThreads * kEach);
  for (int id = 0; id < kThreads * kEach; ++id) {
    const std::vector<char> want(all.begin() + id * 64, all.begin() + id * 64 + 1 + id % 64);
    if (drain.records[id] != want) FAIL("record " << id << " differs");
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
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  std::vector<cudaStream_t> streams(devices);
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  std::vector<std::vector<char>> expected;
  for (int d = 0; d < devices; ++d) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
  }
  for (int i = 0; i < 40; ++i) {
    const int d = i % devices;
    expected.push_back(pattern(10000 + i, i));
    sources.push_back(std::make_unique<DeviceBuffer>(expected.back().size(), d));
    CUDA_OK(cudaMemcpy(sources.back()->data, expected.back().data(), expected.back().size(), cudaMemcpyHostToDevice));
  }
  for (int i = 0; i < 40; ++i) {
    const int d = i % devices;
    REQUIRE(push(engine, i, sources[i]->data, expected[i].size(), streams[d], false, d));
  }
  engine.flush();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 40);
  for (int i = 0; i < 40; ++i) CHECK(drain.records[i] == expected[i]);
  for (int d = 0; d < devices; ++d) {
    cudaSetDevice(d);
    cudaStreamDestroy(streams[d]);
  }
}

TEST_CASE("stop() commits everything submitted, later reservations are refused", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer src(4096);
  for (int i = 0; i < 50; ++i) REQUIRE(push(engine, i, src.data, 4096, stream));
  engine.stop();
  CHECK_FALSE(engine.reserve(0, 16, false).has_value());
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  CHECK(drain.records.size() == 50);
  cudaStreamDestroy(stream);
}

TEST_CASE("no growth of device or pinned memory over 10,000 captures", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging, /*keep_bytes=*/false);
  CudaEngineOptions options;
  options.device_bytes = 4 << 20;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer src(8 << 20);
  const auto capture_some = [&](int from, int count) {
    for (int i = from; i < from + count; ++i) {
      // Sizes from 1 byte to 3 MiB: coalesced, single and chunked.
      const std::size_t n = i % 97 == 0 ? (3 << 20) : static_cast<std::size_t>(1 + (i * 7919) % 200000);
      REQUIRE(push(engine, i, src.data, n, stream));
    }
    engine.flush();
    staging.wait_drained();
  };
  capture_some(0, 500);  // warm-up: arena, pools, staging buffers
  std::size_t free_before = 0, free_after = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  const std::size_t pinned_before = tensortap::detail::pinned_host_bytes();
  const auto events_before = engine.counters().events_created;
  capture_some(500, 10000);
  CUDA_OK(cudaMemGetInfo(&free_after, &total));
  CHECK(free_after == free_before);
  CHECK(tensortap::detail::pinned_host_bytes() == pinned_before);
  CHECK(engine.counters().events_created == events_before);
  std::lock_guard<std::mutex> lock(drain.mu);
  CHECK(drain.complete == 10500);
  CHECK(drain.failed == 0);
  CHECK(reports() == 0);
  cudaStreamDestroy(stream);
}

TEST_CASE("CPU captures share the staging buffers with the engine", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(128 << 10, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 256 << 10;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kEach = 400;
  std::vector<char> all(kEach * 512);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<char>(i * 13 + 5);
  DeviceBuffer src(all.size());
  CUDA_OK(cudaMemcpy(src.data, all.data(), all.size(), cudaMemcpyHostToDevice));
  // What Enqueue::tensor does for a CPU tensor, from another thread: CPU
  // slots land between the engine's, which must not copy over them.
  std::thread cpu([&] {
    for (int i = 0; i < kEach; ++i) {
      tensortap::detail::Slot slot;
      slot.record = *meta_for(100000 + i, 1 + i % 300);
      slot.id = 100000 + i;
      slot.nbytes = 1 + i % 300;
      auto t = staging.reserve(slot, false);
      if (!t) return;
      std::memset(t->dst, 'c', t->nbytes);
      staging.commit(*t, true);
    }
  });
  for (int i = 0; i < kEach; ++i) REQUIRE(push(engine, i, src.bytes() + i * 512, 1 + i % 500, stream));
  cpu.join();
  engine.flush();
  staging.wait_drained();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 2 * kEach);
  for (int i = 0; i < kEach; ++i) {
    const std::vector<char> want(all.begin() + i * 512, all.begin() + i * 512 + 1 + i % 500);
    if (drain.records[i] != want) FAIL("device record " << i << " differs");
    if (drain.records[100000 + i] != std::vector<char>(1 + i % 300, 'c')) FAIL("CPU record " << i << " differs");
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("a cancelled snapshot gives its room back and writes nothing", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 64 << 10;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int released = 0;
  for (int i = 0; i < 20; ++i) {
    auto snap = engine.reserve(0, 48 << 10, /*may_drop=*/true);
    REQUIRE(snap);  // room comes back after each cancel
    engine.cancel(*snap, stream, [&released] { ++released; });
    engine.flush();
  }
  DeviceBuffer src(100);
  REQUIRE(push(engine, 7, src.data, 100, stream));
  engine.flush();
  staging.wait_drained();
  CHECK(released == 20);
  CHECK(reports() == 0);
  CHECK(engine.counters().records == 1);
  std::lock_guard<std::mutex> lock(drain.mu);
  CHECK(drain.records.size() == 1);
  cudaStreamDestroy(stream);
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
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  constexpr std::size_t n = 4096;
  const auto bytes = pattern(n, 11);
  DeviceBuffer src(n);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  auto kept = engine.reserve(0, n, false);
  auto cancelled = engine.reserve(0, n, false);
  REQUIRE(kept);
  REQUIRE(cancelled);
  // The legacy default stream: the calls below queue no work that the fake
  // runtime would allocate for.
  CUDA_OK(cudaMemcpyAsync(kept->data, src.data, n, cudaMemcpyDeviceToDevice, nullptr));
  auto record = meta_for(0, n);
  bool threw = false;
  tt_test::fail_allocations(1000);
  try {
    engine.submit(*kept, nullptr, std::move(record), 0, 1);
    engine.cancel(*cancelled, nullptr);
  } catch (...) {
    threw = true;
  }
  tt_test::fail_allocations(0);
  CHECK_FALSE(threw);
  REQUIRE(returns([&] { engine.flush(); }));
  REQUIRE(returns([&] { engine.stop(); }));
  staging.wait_drained();
  CHECK(reports() == 0);
  CHECK(engine.counters().records == 1);
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 1);
  CHECK(drain.records[0] == bytes);
}

TEST_CASE("flush() waits for every record submitted before it, whichever device finishes first", "[gpu][cuda]") {
  if (!have_gpu()) return;
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    WARN("skipped: needs 2 CUDA devices, found " << devices);
    return;
  }
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
  constexpr std::size_t n = 1000;
  DeviceBuffer src0(n, 0), src1(n, 1);
  std::atomic<bool> gate0{false}, gate1{false};
  CUDA_OK(cudaLaunchHostFunc(s0, wait_for_gate, &gate0));
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaLaunchHostFunc(s1, wait_for_gate, &gate1));
  // The copier waits for record 0 (device 0, held), so records 1 and 2 are
  // taken together: device 0's batch (record 2) is issued, and completes,
  // before device 1's (record 1, held).
  REQUIRE(push(engine, 0, src0.data, n, s0, false, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(push(engine, 1, src1.data, n, s1, false, 1));
  auto flushed = std::async(std::launch::async, [&] { engine.flush(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(push(engine, 2, src0.data, n, s0, false, 0));
  gate0 = true;
  // Records 0 and 2 reach staging: as many records as flush() waits for
  // have retired, but not record 1, which it waits for.
  for (int i = 0; i < 6000 && engine.counters().records < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(engine.counters().records == 2);
  CHECK(flushed.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  gate1 = true;
  flushed.get();
  staging.wait_drained();
  std::lock_guard<std::mutex> lock(drain.mu);
  CHECK(drain.records.size() == 3);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
}

TEST_CASE("a copier out of memory drops what it holds, reported, and flush() and stop() return", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngine engine(staging, CudaEngineOptions{}, collect());
  cudaStream_t stream = new_stream();
  constexpr std::size_t n = 4096;
  const auto bytes = pattern(n, 13);
  DeviceBuffer src(n);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  // Record 0's release runs on the copier thread: from there on, the
  // copier's next allocation fails (while it takes records 1 to 4).
  std::atomic<bool> armed{false};
  REQUIRE(push(engine, 0, src.data, n, stream, false, 0, [&armed] {
    tt_test::fail_allocations(1);
    armed = true;
  }));
  REQUIRE(returns([&] { engine.flush(); }));
  REQUIRE(armed);
  for (int i = 1; i <= 4; ++i) REQUIRE(push(engine, i, src.data, n, stream));
  REQUIRE(returns([&] { engine.flush(); }));
  const auto dropped = engine.counters().dropped;
  CHECK(dropped >= 1);
  // It goes on: later records arrive.
  REQUIRE(push(engine, 5, src.data, n, stream));
  REQUIRE(returns([&] { engine.flush(); }));
  REQUIRE(returns([&] { engine.stop(); }));
  staging.wait_drained();
  CHECK(reports() == dropped);
  CHECK(engine.counters().records + dropped == 6);
  std::lock_guard<std::mutex> lock(drain.mu);
  CHECK(drain.records.size() + dropped == 6);
  CHECK(drain.records.count(0) == 1);
  CHECK(drain.records.count(5) == 1);
  for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  cudaStreamDestroy(stream);
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
  tensortap::detail::Slot slot;
  slot.record = *meta_for(999999, 64);
  slot.id = 999999;
  slot.nbytes = 64;
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
    CudaEngineOptions options;
    options.staging_memory.allocate = staging_allocate;
    options.staging_memory.release = staging_release;
    CudaEngine engine(staging, options, collect());
    // CPU records only: nothing pinned.
    for (int i = 0; i < 3; ++i) {
      tensortap::detail::Slot slot;
      slot.record = *meta_for(100 + i, 1000);
      slot.id = 100 + i;
      slot.nbytes = 1000;
      auto t = staging.reserve(slot, false);
      REQUIRE(t);
      std::memset(t->dst, 'c', t->nbytes);
      staging.commit(*t, true);
    }
    staging.wait_drained();
    CHECK(g_staging_allocs == 0);
    CHECK(memory_type(staging) == cudaMemoryTypeUnregistered);  // pageable, as the driver sees it
    cudaStream_t stream = new_stream(device);
    constexpr std::size_t n = 40 << 10;
    std::vector<std::vector<char>> expected;
    std::vector<std::unique_ptr<DeviceBuffer>> sources;
    for (int i = 0; i < 10; ++i) {
      expected.push_back(pattern(n, 70 + i));
      sources.push_back(std::make_unique<DeviceBuffer>(n, device));
      CUDA_OK(cudaMemcpy(sources.back()->data, expected.back().data(), n, cudaMemcpyHostToDevice));
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
    cudaStreamDestroy(stream);
  }
  CHECK(g_staging_releases == 2);
}

TEST_CASE("snapshots larger than the arena are bounded by bytes, not one at a time", "[gpu][cuda]") {
  if (!have_gpu()) return;
  Staging staging(1 << 20, Overflow::DropNewest, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.device_bytes = 1 << 20;
  options.large_bytes = 4 << 20;
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream = new_stream();
  constexpr std::size_t large = (3 << 20) / 2, huge = 5 << 20;
  const auto bytes = pattern(huge, 17);
  DeviceBuffer src(huge);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), huge, cudaMemcpyHostToDevice));
  // The stream is held: every snapshot stays alive.
  std::atomic<bool> gate{false};
  CUDA_OK(cudaLaunchHostFunc(stream, wait_for_gate, &gate));
  // Two fit in the 4 MiB budget (one at a time would refuse the second), a
  // third does not, nor one over the budget while others are held.
  CHECK(push(engine, 0, src.data, large, stream, /*may_drop=*/true));
  CHECK(push(engine, 1, src.data, large, stream, /*may_drop=*/true));
  CHECK_FALSE(push(engine, 2, src.data, large, stream, /*may_drop=*/true));
  CHECK_FALSE(push(engine, 3, src.data, huge, stream, /*may_drop=*/true));
  CHECK(engine.counters().refused == 2);
  // Small records still use the arena meanwhile.
  CHECK(push(engine, 4, src.data, 1000, stream, /*may_drop=*/true));
  gate = true;
  engine.flush();
  // Alone, one over the budget goes.
  CHECK(push(engine, 5, src.data, huge, stream, /*may_drop=*/true));
  engine.flush();
  staging.wait_drained();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 4);
  CHECK(drain.records[0] == std::vector<char>(bytes.begin(), bytes.begin() + large));
  CHECK(drain.records[1] == std::vector<char>(bytes.begin(), bytes.begin() + large));
  CHECK(drain.records[4] == std::vector<char>(bytes.begin(), bytes.begin() + 1000));
  CHECK(drain.records[5] == bytes);
  cudaStreamDestroy(stream);
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
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.arena_memory = arena_memory(/*fails=*/false);
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream = new_stream(device);
  constexpr std::size_t n = 10000;
  const auto bytes = pattern(n, 19);
  DeviceBuffer src(n, device);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  CUDA_OK(cudaSetDevice(0));
  for (int i = 0; i < 20; ++i) {
    auto snap = engine.reserve(device, n, false);
    REQUIRE(snap);
    CHECK_FALSE(snap->external);  // in the arena
    CUDA_OK(cudaMemcpyAsync(snap->data, src.data, n, cudaMemcpyDeviceToDevice, stream));
    engine.submit(*snap, stream, meta_for(i, n), i, 1);
  }
  engine.flush();
  CHECK(g_arena_allocs == 1);
  CHECK(g_arena_device == device);
  engine.stop();
  CHECK(g_arena_releases == 1);
  staging.wait_drained();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 20);
  for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  cudaStreamDestroy(stream);
}

TEST_CASE("an arena out of memory is tried and reported once, and captures go on without it", "[gpu][cuda]") {
  if (!have_gpu()) return;
  g_arena_allocs = 0;
  g_arena_releases = 0;
  Staging staging(1 << 20, Overflow::Block, tensortap::detail::pinned_host_memory());
  Drain drain(staging);
  CudaEngineOptions options;
  options.arena_memory = arena_memory(/*fails=*/true);
  std::vector<std::string> warnings;
  options.warn = [&warnings](const std::string& what) { warnings.push_back(what); };
  CudaEngine engine(staging, options, collect());
  cudaStream_t stream = new_stream();
  constexpr std::size_t n = 10000;
  const auto bytes = pattern(n, 23);
  DeviceBuffer src(n);
  CUDA_OK(cudaMemcpy(src.data, bytes.data(), n, cudaMemcpyHostToDevice));
  // No arena: a small snapshot is the caller's to allocate, as a large one.
  auto probe = engine.reserve(0, n, false);
  REQUIRE(probe);
  CHECK(probe->external);
  engine.cancel(*probe, stream);
  for (int i = 0; i < 30; ++i) REQUIRE(push(engine, i, src.data, n, stream));
  engine.flush();
  CHECK(g_arena_allocs == 1);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("cuda:0") && Catch::Contains("CUDA out of memory (test)"));
  engine.stop();
  CHECK(g_arena_releases == 0);
  staging.wait_drained();
  CHECK(reports() == 0);
  std::lock_guard<std::mutex> lock(drain.mu);
  REQUIRE(drain.records.size() == 30);
  for (const auto& [id, got] : drain.records) CHECK(got == bytes);
  cudaStreamDestroy(stream);
}
