#include "sdk/src/cuda/batch.h"

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <optional>

#include "sdk/src/cuda/capture_core.h"
#include "sdk/src/core/stats.h"
#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

static_assert(CudaEngine::kCounterSlot >= static_cast<std::size_t>(kBatchTensors), "a counter a tensor of a launch");

constexpr std::size_t kStatsBytes = kStatsVectorSize * sizeof(double);

std::size_t scratch_bytes(const BatchItem& item) {
  return static_cast<std::size_t>(stats_partials(item.tensor.n)) * kStatsPartialDoubles * sizeof(double);
}

// What a batch's records take in the arena, at most (alignment included).
std::size_t arena_need(const BatchItem& item) {
  std::size_t need = 0;
  if (item.full != nullptr) need += static_cast<std::size_t>(item.full->nbytes) + 64;
  if (item.stats != nullptr) need += kStatsBytes + 64 + scratch_bytes(item) + 64;
  return need;
}

// The step's name for messages: "3 tensors of step 100 on cuda:0".
std::string describe(const BatchItem& first, std::size_t count, int device) {
  const RecordSpec* any = first.full != nullptr ? first.full : first.stats;
  return fmt::format("a batch of {} tensor(s) of step {} on cuda:{} (the first '{}')", count,
                     any != nullptr ? any->step : -1, device, any != nullptr ? any->name : std::string());
}

// One launch's share, at most kBatchTensors items whose records fit a
// quarter of the arena together: the room reserved for them, and what the
// kernels are given.
struct Chunk {
  Chunk(CudaEngine& e, int d, cudaStream_t s, BatchItem* const* i, std::size_t c)
      : engine(e), device(d), stream(s), items(i), count(c) {}
  CudaEngine& engine;
  const int device;
  const cudaStream_t stream;
  BatchItem* const* items;
  const std::size_t count;
  std::array<std::optional<CudaEngine::Snapshot>, kBatchTensors> full{}, stats{};
  std::optional<CudaEngine::Snapshot> scratch;
  // The counters of a one-launch merge (null: two launches).
  unsigned* counters = nullptr;
  std::array<BatchTensor, kBatchTensors> tensors{};
  // The item of each tensor given to the kernels.
  std::array<std::size_t, kBatchTensors> of{};
  int launched = 0;

  // The scratch first, then each tensor's copy and statistics, so that the
  // records lie next to each other in the arena (and in staging): the
  // copier moves them in one copy. Throws (an arena that cannot be made).
  void reserve(bool may_drop) {
    std::size_t scratch_total = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (items[i]->stats != nullptr) scratch_total += scratch_bytes(*items[i]);
    if (scratch_total > 0) scratch = engine.reserve(device, scratch_total, may_drop);
    char* partials = scratch ? static_cast<char*>(scratch->data) : nullptr;
    if (partials != nullptr) counters = engine.take_counters(device);
    for (std::size_t i = 0; i < count; ++i) {
      const BatchItem& item = *items[i];
      BatchTensor t = item.tensor;
      t.copy = nullptr;
      t.stats = t.scratch = nullptr;
      if (item.full != nullptr) {
        full[i] = engine.reserve(device, static_cast<std::size_t>(item.full->nbytes), may_drop);
        if (full[i]) t.copy = full[i]->data;
      }
      if (item.stats != nullptr && partials != nullptr) {
        stats[i] = engine.reserve(device, kStatsBytes, may_drop);
        if (stats[i]) {
          t.stats = static_cast<double*>(stats[i]->data);
          t.scratch = reinterpret_cast<double*>(partials);
        }
        partials += scratch_bytes(item);
      }
      if (t.copy == nullptr && t.stats == nullptr) continue;
      of[static_cast<std::size_t>(launched)] = i;
      tensors[static_cast<std::size_t>(launched++)] = t;
    }
  }

  // After the launch. A submit that throws has queued its own record; the
  // rest are given back.
  void submit() {
    try {
      for (int k = 0; k < launched; ++k) {
        const std::size_t i = of[static_cast<std::size_t>(k)];
        BatchItem& item = *items[i];
        if (full[i]) submit_one(full[i], *item.full, element_size(item.full->dtype.element), item);
        if (stats[i]) submit_one(stats[i], *item.stats, sizeof(double), item);
      }
    } catch (...) {
      give_back();
      throw;
    }
    // The scratch's room back once the stream is past the kernels.
    give_back();
  }

  void submit_one(std::optional<CudaEngine::Snapshot>& snap, const RecordSpec& spec, std::size_t unit,
                  BatchItem& item) {
    const CudaEngine::Snapshot taken = *snap;
    snap.reset();
    engine.submit(taken, stream, spec, unit);
    ++item.queued;
    count_cuda_capture();
  }

  void give_back() noexcept {
    for (std::size_t i = 0; i < count; ++i) {
      if (full[i]) engine.cancel(*full[i], stream);
      if (stats[i]) engine.cancel(*stats[i], stream);
      full[i].reset();
      stats[i].reset();
    }
    // The counters go back with the scratch, once the stream is past the
    // launch (or at once, where it never ran: they are still zero).
    // Two pointers: held in the std::function itself, no allocation.
    std::function<void()> release;
    if (counters != nullptr) release = [e = &engine, slot = counters] { e->give_counters(slot); };
    if (scratch)
      engine.cancel(*scratch, stream, std::move(release));
    else if (counters != nullptr)
      engine.give_counters(counters);
    scratch.reset();
    counters = nullptr;
  }
};

void capture_chunk(CudaEngine& engine, int device, cudaStream_t stream, BatchItem* const* items, std::size_t count,
                   bool may_drop) {
  Chunk chunk(engine, device, stream, items, count);
  try {
    chunk.reserve(may_drop);
  } catch (const std::exception& e) {
    chunk.give_back();
    fail("cannot capture {}: {}", describe(*items[0], count, device), e.what());
  }
  const int error = launch_batch(chunk.tensors.data(), chunk.launched, chunk.counters, static_cast<void*>(stream));
  if (error != 0) {
    chunk.give_back();
    fail("cannot capture {}: its kernels could not be launched: {}", describe(*items[0], count, device),
         cuda_error_string(static_cast<cudaError_t>(error)));
  }
  chunk.submit();
}

}  // namespace

void capture_batch_on_engine(CudaEngine& engine, int device, cudaStream_t stream, BatchItem* items, std::size_t count,
                             bool may_drop) {
  if (count == 0) return;
  if (graph_check_due(engine, stream)) {
    cudaStreamCaptureStatus graph = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &graph) != cudaSuccess) cudaGetLastError();
    if (graph != cudaStreamCaptureStatusNone)
      fail("cannot capture {} while its stream is being captured into a CUDA graph", describe(items[0], count, device));
  }
  // Chunks of at most kBatchTensors whose records fit a quarter of the
  // arena: the reservations of one are all held until its launch, and must
  // never wait on each other for room.
  const std::size_t budget = engine.arena_bytes() / 4;
  std::array<BatchItem*, kBatchTensors> chunk{};
  std::size_t n = 0, bytes = 0;
  const auto run = [&] {
    if (n > 0) capture_chunk(engine, device, stream, chunk.data(), n, may_drop);
    n = bytes = 0;
  };
  for (std::size_t i = 0; i < count; ++i) {
    BatchItem& item = items[i];
    item.queued = 0;
    const std::size_t need = arena_need(item);
    item.left = need > budget;
    if (item.left || (item.full == nullptr && item.stats == nullptr)) continue;
    if (n == chunk.size() || bytes + need > budget) run();
    chunk[n++] = &item;
    bytes += need;
  }
  run();
}

}  // namespace tensortap::detail
