#include "sdk/src/front/snapshotter.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include <sys/statvfs.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "sdk/src/cuda/capture.h"
#include "sdk/src/flight/flight.h"
#include "sdk/src/core/snapshot.h"
#include "sdk/src/core/stats.h"
#include "writers/src/check.h"
#include "writers/src/dtypes.h"

namespace tensortap::detail {
namespace {

// Up to this size a CPU record is copied under staging's lock, in one round
// of it (Staging::put): two rounds cost more than the copy. Larger copies
// run outside the lock, so that other capturing threads are not held up.
constexpr std::uint64_t kPutBytes = 16 << 10;

}  // namespace

void copy_into(char* dst, const at::Tensor& src, c10::ScalarType stored, std::size_t nbytes) {
  if (nbytes == 0) return;
  if (is_byte_copy(src, stored)) {
    Staging::copy(dst, bytes_of(src), nbytes);
    return;
  }
  at::from_blob(dst, src.sizes(), at::TensorOptions().dtype(stored)).copy_(src);
}

void copy_elements(char* dst, const at::Tensor& src, c10::ScalarType stored, std::int64_t first, std::int64_t count) {
  if (count <= 0) return;
  const std::size_t unit = c10::elementSize(stored);
  if (src.dim() == 0) {
    copy_into(dst, src, stored, unit);
    return;
  }
  // Along the first axis: a partial slice at each end (recursively), the
  // whole slices between them in one copy. A chunk costs at most two ATen
  // copies per axis, whatever the tensor's size.
  const std::int64_t inner = src.numel() / src.size(0);
  std::int64_t i = first / inner;
  if (const std::int64_t skip = first % inner; skip != 0) {
    const std::int64_t n = std::min(count, inner - skip);
    copy_elements(dst, src.select(0, i), stored, skip, n);
    dst += n * unit;
    count -= n;
    ++i;
  }
  if (const std::int64_t whole = count / inner; whole > 0) {
    copy_into(dst, src.narrow(0, i, whole), stored, static_cast<std::size_t>(whole * inner) * unit);
    dst += whole * inner * unit;
    count -= whole * inner;
    i += whole;
  }
  if (count > 0) copy_elements(dst, src.select(0, i), stored, 0, count);
}

Snapshotter::Snapshotter(const Options& options, Staging& staging, const Sampling& sampling, const std::atomic<bool>& closed,
                 bool holds, bool scans)
    : staging_(staging),
      sampling_(sampling),
      closed_(closed),
      may_drop_(options.overflow() == Overflow::DropNewest),
      compresses_(options.format() == Format::Hdf5 && options.hdf5().deflate() > 0),
      holds_(holds),
      scans_(scans),
      hold_budget_(options.flight_recorder_bytes()),
      // HDF5 datasets have at most 32 axes, one of them the row; NumPy 1.x
      // reads at most 32 axes.
      max_dims_(options.format() == Format::Hdf5 ? 31 : 32),
      max_dims_why_(
          options.format() == Format::Hdf5
              ? "an HDF5 run stores at most 31 dimensions (a dataset has at most 32 axes, one of them the row)"
              : "a .npy file NumPy can read has at most 32 dimensions"),
      put_bytes_(std::min<std::uint64_t>(kPutBytes, staging.capacity())) {
  for (std::size_t i = 0; i < dtypes_.size(); ++i) dtypes_[i] = dtype_info(static_cast<c10::ScalarType>(i));
}

void Snapshotter::refuse(Kind kind, const std::string& name, const at::Tensor& t, std::int64_t step,
                         const char* why) const {
  fail("cannot capture '{}' (kind {}, step {}): {} ({})", name, kind_name(kind), step, why, describe_tensor(t));
}

inline const DtypeInfo& Snapshotter::check(Kind kind, const std::string& name, const at::Tensor& t,
                                           std::int64_t step) const {
  const char* why = nullptr;
  const DtypeInfo* info = nullptr;
  if (!t.defined())
    why = "the tensor is undefined";
  else if (t.is_nested())
    why = "nested tensors cannot be stored; capture each of t.unbind() instead";
  else if (t.layout() != at::kStrided)
    why = "only dense (strided) tensors can be stored; call .to_dense() first";
  else if (t.is_quantized())
    why = "quantized tensors cannot be stored; call .dequantize() first";
  else if (t.is_meta())
    why = "meta tensors have no data";
  else if ((info = dtypes_[static_cast<std::size_t>(t.scalar_type())]) == nullptr)
    why = "NumPy has no dtype for it, nor does tensortap store one in its place (README.md, \"dtypes\")";
  else if (t.dim() > max_dims_)
    why = max_dims_why_;
  if (why != nullptr) refuse(kind, name, t, step, why);
  return *info;
}

void Snapshotter::record(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step,
                         bool name_kept) {
  if (closed_.load(std::memory_order_acquire)) return;
  const DtypeInfo& info = check(kind, name, tensor, step);
  const bool open = flight_ != nullptr;
  const std::uint64_t plan = sampling_.plan(step, open, open && flight_->capture_halted());
  bool full = Sampling::full(plan, kind);
  const bool stats = Sampling::stats(plan, kind);
  // A `ctl capture` window's step: stored, not held, and only what its own
  // include finds. Decided here, with the plan, not when the writer thread
  // hears of the window: a record can reach it first (a gradient, a step
  // later), and was held and lost.
  bool hold = holds_;
  if (full && Sampling::in_window(plan)) {
    hold = false;
    full = sampling_.window_selects(step, name);
  }
  if (!full && !stats) return;
  // numel() fits 63 bits, its bytes may not (an expanded view claims any
  // size without memory): refused before anything is reserved or copied.
  std::uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(tensor.numel()), c10::elementSize(info.stored), &nbytes))
    fail("cannot capture '{}' (kind {}, step {}): its {} elements are more bytes than 64 bits count ({})", name,
         kind_name(kind), step, tensor.numel(), describe_tensor(tensor));
  // A record larger than the flight recorder's whole budget can never be
  // held: dropped here, before a byte of it is copied. (It was copied whole
  // on the writer thread and dropped there: one record took memory far past
  // the budget.) Its statistics, if the step takes them, still go.
  if (full && hold && nbytes > hold_budget_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    if (!stats) return;
    full = false;
  }
  bool queued = false;
  if (full && !stats && !hold && nbytes <= put_bytes_ && tensor.device().is_cpu() &&
      is_byte_copy(tensor, info.stored)) {
    // The common case, a small dense CPU tensor stored whole: its bytes go
    // into staging as they are, in one round of the lock, with no tensor
    // made and no guard set.
    const RecordSpec spec{kind,      name, step, info, tensor.sizes(), nbytes, Op::Store, false, false,
                          next_id_.fetch_add(1, std::memory_order_relaxed), name_kept};
    queued = staging_.put(spec, bytes_of(tensor), may_drop_);
  } else {
    queued = queue(kind, name, tensor, info, step, full, hold, stats, name_kept);
  }
  if (queued) captured_.fetch_add(1, std::memory_order_relaxed);
  // Refused after close() is not a drop: the run had ended.
  else if (!closed_.load(std::memory_order_acquire))
    dropped_.fetch_add(1, std::memory_order_relaxed);
}

bool Snapshotter::queue(Kind kind, const std::string& name, const at::Tensor& tensor, const DtypeInfo& tensor_info,
                        std::int64_t step, bool full, bool hold, bool stats_row, bool name_kept) {
  // Statistics only, of a tensor off the host: reduce it on its own device
  // and send the ten numbers down the same path as a tensor. Not a 0-d
  // tensor (a loss): its one element is cheaper to send than its ten
  // statistics (a 4-byte copy against two launches), and the writer thread
  // needs its value (TensorBoard's `tensor/<name>`) and its dtype.
  const bool stats_vector = !full && !tensor.device().is_cpu() && tensor.dim() != 0;
  if ((full || stats_vector) && batched(kind, name, tensor, tensor_info, step, full, hold, stats_row)) return true;
  if (stats_vector && engine_ != nullptr && tensor.is_cuda()) {
    if (const std::optional<bool> queued = queue_fused_stats(kind, name, tensor, step, stats_row, name_kept))
      return *queued;
  }
  at::Tensor src = tensor;
  if (stats_vector) {
    // The fused kernels where they apply (two launches), ATen's reductions
    // otherwise (some 40).
    src = fused_device_stats(tensor);
    if (!src.defined()) src = device_stats(tensor);
  }
  const DtypeInfo& info = stats_vector ? *dtype_info(src.scalar_type()) : tensor_info;
  // A float8 travels as its bytes (a view, no copy): every copy below is
  // then a byte copy, on the host or the device.
  if (info.bits) src = src.view(info.stored);
  // Only ATen ops need autograd off; the common case, a memcpy of a CPU
  // tensor, runs none (and the guard's two thread-local switches were 5% of
  // a small capture).
  // Asked once: it walks sizes and strides, and the copy below needs it too.
  const bool host_bytes = src.device().is_cpu() && is_byte_copy(src, info.stored);
  std::optional<c10::NoGradGuard> no_grad;
  if (!host_bytes) no_grad.emplace();
  // CUDA goes through the engine, without a host sync (for a statistics
  // vector: queued behind the reductions on the current stream). Devices
  // without an engine come to the host synchronously.
  const bool on_engine = src.is_cuda() && engine_ != nullptr;
  if (!src.device().is_cpu() && !on_engine) src = src.to(at::kCPU);

  // The record as references to what is at hand: staging copies it once,
  // into a slot that keeps its memory (sdk/src/core/staging.h).
  const std::uint64_t nbytes = static_cast<std::uint64_t>(src.numel()) * c10::elementSize(info.stored);
  // A record streamed through staging is checked against the free space
  // first. Refused for a full disk, it still gives its statistics row when
  // the step takes one (the rules see it); the refusal is thrown after.
  std::optional<NoRoom> no_room;
  if (full && !hold && !on_engine && nbytes > staging_.capacity()) {
    try {
      check_room(kind, name, step, nbytes, src);
    } catch (const NoRoom& e) {
      if (!stats_row) throw;
      no_room = e;
      full = false;
    }
  }
  const RecordSpec spec{kind,
                        name,
                        step,
                        info,
                        src.sizes(),
                        nbytes,
                        full           ? (hold ? Op::Hold : Op::Store)
                        : stats_vector ? Op::StatsVector
                                       : Op::Stats,
                        stats_row,
                        full && scans_,
                        next_id_.fetch_add(1, std::memory_order_relaxed),
                        name_kept};

  if (on_engine) {
    return cuda_capture(*engine_, spec, src, may_drop_);
  }

  if (host_bytes && nbytes <= put_bytes_) return staging_.put(spec, bytes_of(src), may_drop_);
  if (nbytes <= staging_.capacity()) return copy_in(spec, src);

  const bool queued = stream(spec, src, host_bytes);
  // Its statistics went as the rules need them; the record counts as failed.
  if (no_room) throw *no_room;
  return queued;
}

namespace {

// The batch this thread collects, and for which Snapshotter (null: none).
struct ThreadBatch {
  const Snapshotter* owner = nullptr;
  std::vector<CudaBatchEntry> entries;
};
thread_local ThreadBatch t_batch;

}  // namespace

void Snapshotter::begin_batch() {
  if (engine_ == nullptr || !cuda_batches(*engine_)) return;
  t_batch.owner = this;
}

bool Snapshotter::batched(Kind kind, const std::string& name, const at::Tensor& tensor, const DtypeInfo& info,
                          std::int64_t step, bool full, bool hold, bool stats_row) {
  if (t_batch.owner != this || !tensor.is_cuda() || !cuda_batchable(tensor, info)) return false;
  CudaBatchEntry e;
  e.kind = kind;
  e.name = name;
  e.step = step;
  e.dtype = &info;
  e.tensor = tensor;
  e.op = !full ? Op::StatsVector : hold ? Op::Hold : Op::Store;
  e.stats_row = stats_row;
  e.scan = full && scans_;
  e.id = next_id_.fetch_add(1, std::memory_order_relaxed);
  t_batch.entries.push_back(std::move(e));
  return true;
}

void Snapshotter::end_batch() {
  if (t_batch.owner != this) return;
  t_batch.owner = nullptr;
  std::vector<CudaBatchEntry> entries;
  entries.swap(t_batch.entries);
  std::exception_ptr first;
  try {
    if (!entries.empty()) cuda_capture_batch(*engine_, entries, may_drop_);
  } catch (...) {
    // None of it was taken: each record counted as captured is lost.
    first = std::current_exception();
    captured_.fetch_sub(static_cast<std::int64_t>(entries.size()), std::memory_order_relaxed);
    entries.clear();
  }
  // record() counted each as captured when the batch took it.
  const auto refused = [&] {
    captured_.fetch_sub(1, std::memory_order_relaxed);
    if (!closed_.load(std::memory_order_acquire)) dropped_.fetch_add(1, std::memory_order_relaxed);
  };
  for (const CudaBatchEntry& e : entries) {
    if (!e.left) {
      if (!e.queued) refused();
      continue;
    }
    try {
      const bool full = e.op != Op::StatsVector;
      if (!queue(e.kind, e.name, e.tensor, full ? *e.dtype : *dtypes_[static_cast<std::size_t>(e.tensor.scalar_type())],
                 e.step, full, e.op == Op::Hold, e.stats_row, /*name_kept=*/false))
        refused();
    } catch (...) {
      captured_.fetch_sub(1, std::memory_order_relaxed);
      if (!first) first = std::current_exception();
    }
  }
  // Its memory kept for the next step's.
  entries.clear();
  t_batch.entries.swap(entries);
  if (first) std::rethrow_exception(first);
}

std::optional<bool> Snapshotter::queue_fused_stats(Kind kind, const std::string& name, const at::Tensor& tensor,
                                                   std::int64_t step, bool stats_row, bool name_kept) {
  // Reduced straight into the engine's arena where it can (no tensor, no
  // copy on the device: TENSORTAP_CUDA_STATS=arena).
  static const std::int64_t kSizes[1] = {kStatsVectorSize};
  const RecordSpec spec{kind,
                        name,
                        step,
                        *dtype_info(at::kDouble),
                        at::IntArrayRef(kSizes, 1),
                        static_cast<std::uint64_t>(kStatsVectorSize) * sizeof(double),
                        Op::StatsVector,
                        stats_row,
                        false,
                        next_id_.fetch_add(1, std::memory_order_relaxed),
                        name_kept};
  return cuda_capture_fused_stats(*engine_, spec, tensor, may_drop_);
}

bool Snapshotter::copy_in(const RecordSpec& spec, const at::Tensor& src) {
  auto ticket = staging_.reserve(spec, spec.nbytes, /*first=*/true, may_drop_);
  if (!ticket) return false;
  try {
    copy_into(ticket->dst, src, spec.dtype.stored, spec.nbytes);
  } catch (...) {
    // The slot is given back unwritten: no half record reaches the writer.
    staging_.commit(*ticket, false);
    throw;
  }
  staging_.commit(*ticket, true);
  return true;
}

bool Snapshotter::stream(const RecordSpec& spec, const at::Tensor& src, bool host_bytes) {
  // Larger than a buffer: stream it through in chunks of whole elements, as
  // large as the room in the filling buffer allows. It may be dropped only
  // before its first chunk; once started, it waits for room so that no half
  // record is ever written. A tensor that is not already its bytes (a
  // transposed view, an expanded one, another dtype) is converted chunk by
  // chunk too: never copied whole first, which took memory the size of the
  // tensor (512 MiB for a transposed 512 MiB tensor, with 1 MiB of staging).
  const char* bytes = host_bytes ? static_cast<const char*>(bytes_of(src)) : nullptr;
  const std::size_t unit = c10::elementSize(spec.dtype.stored);
  const std::uint64_t nbytes = spec.nbytes;
  for (std::uint64_t off = 0; off < nbytes;) {
    auto ticket = staging_.reserve(spec, static_cast<std::size_t>(nbytes - off), off == 0, may_drop_ && off == 0, unit);
    // Either dropped before its first chunk, or cut off by close(): the
    // writer discards the chunks it already has.
    if (!ticket) return false;
    if (bytes != nullptr) {
      Staging::copy(ticket->dst, bytes + off, ticket->nbytes);
    } else {
      try {
        copy_elements(ticket->dst, src, spec.dtype.stored, static_cast<std::int64_t>(off / unit),
                      static_cast<std::int64_t>(ticket->nbytes / unit));
      } catch (...) {
        // The writer drops the record's chunks.
        staging_.commit(*ticket, false);
        throw;
      }
    }
    staging_.commit(*ticket, true);
    off += ticket->nbytes;
  }
  return true;
}

void Snapshotter::check_room(Kind kind, const std::string& name, std::int64_t step, std::uint64_t nbytes,
                             const at::Tensor& src) const {
  // Only a record larger than staging gets here, so a system call is
  // nothing beside its copy. Compression (HDF5's deflate) may make room
  // where there seems to be none: not refused then.
  struct statvfs fs {};
  if (space_fd_ < 0 || compresses_ || ::fstatvfs(space_fd_, &fs) != 0) return;
  const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  // The descriptor is the run directory's until close() lets go of it,
  // after setting closed_: a capture racing with close() may have asked a
  // descriptor reused for another file, and its record is cut off anyway.
  if (nbytes <= free || closed_.load(std::memory_order_acquire)) return;
  const std::uint64_t total = static_cast<std::uint64_t>(fs.f_blocks) * fs.f_frsize;
  // More than the whole file system holds (an expanded view of 2^40
  // elements) is counted like a full disk, under Options::on_error, as a
  // Tap's record is: README's "Errors" promises that a capture the disk has
  // no room for is counted, not thrown (an earlier version threw).
  if (nbytes > total)
    throw NoRoom(fmt::format("cannot capture '{}' (kind {}, step {}): its {} bytes ({}) are more than the run "
                             "directory's whole file system holds ({} bytes): {} (errno {})",
                             name, kind_name(kind), step, nbytes, describe_tensor(src), total, std::strerror(ENOSPC),
                             ENOSPC),
                 std::make_error_code(std::errc::no_space_on_device));
  // A disk that is full now is not the caller's error either: the caller
  // counts it under Options::on_error, as a write that fails.
  throw NoRoom(fmt::format("cannot capture '{}' (kind {}, step {}): its {} bytes ({}) would not fit the {} bytes free "
                           "on the file system of '{}': {} (errno {})",
                           name, kind_name(kind), step, nbytes, describe_tensor(src), free,
                           run_dir_, std::strerror(ENOSPC), ENOSPC),
               std::make_error_code(std::errc::no_space_on_device));
}

void Snapshotter::dump_marker(std::int64_t step) {
  // A marker in the pipeline, after every record captured before the call:
  // the writer thread dumps what it holds when it gets there.
  Slot slot;
  slot.record.desc.step = step;
  slot.record.op = Op::Dump;
  slot.id = next_id_.fetch_add(1, std::memory_order_relaxed);
  slot.nbytes = 0;
  if (auto ticket = staging_.reserve(slot, /*may_drop=*/false)) staging_.commit(*ticket, true);
}

}  // namespace tensortap::detail
