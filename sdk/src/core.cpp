#include "sdk/src/core.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sdk/src/stats.h"
#include "sdk/src/triggers.h"
#include "writers/src/dtypes.h"

namespace tensortap::detail {
namespace {

// Smaller buffers would turn every capture into a chunked stream.
constexpr std::size_t kMinBufferBytes = 4096;
// Size options are bounded well below where arithmetic on them (alignment
// to pages, twice the buffer for the device arena) could wrap around.
constexpr std::size_t kMaxBufferBytes = std::size_t{1} << 40;          // 1 TiB
constexpr std::size_t kMaxFlightBytes = std::size_t{1} << 48;          // 256 TiB
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 30;           // HDF5 chunks stay below 4 GiB
// Steps share a word with the kind bits (see Core::state_).
constexpr std::int64_t kMaxStep = std::int64_t{1} << 47;

// The kinds `step` samples, as KindSet bits.
std::uint64_t sampled_bits(const Options& o, std::int64_t step) {
  if (step < o.start()) return 0;
  if (o.stop() >= 0 && step >= o.stop()) return 0;
  if (!o.steps().empty() && std::find(o.steps().begin(), o.steps().end(), step) == o.steps().end()) return 0;
  std::uint64_t bits = 0;
  for (Kind k : kAllKinds)
    if (o.kinds().contains(k) && (!o.steps().empty() || (o.every(k) > 0 && (step - o.start()) % o.every(k) == 0)))
      bits |= KindSet::bit(k);
  return bits;
}

// The kinds whose statistics `step` takes, as KindSet bits.
std::uint64_t stats_bits(const Options& o, std::int64_t step) {
  if (o.stats_every() <= 0 || step < o.start()) return 0;
  if (o.stop() >= 0 && step >= o.stop()) return 0;
  return (step - o.start()) % o.stats_every() == 0 ? o.kinds().bits() : 0;
}

void validate(const Options& o) {
  validate_triggers(o);
  if (o.stats_every() < 0)
    throw Error(fmt::format("tensortap: Options::stats_every({}) must be 0 (off) or more", o.stats_every()));
  if (o.flight_recorder() < 0)
    throw Error(fmt::format("tensortap: Options::flight_recorder({}) must be 0 (off) or more", o.flight_recorder()));
  for (Kind k : kAllKinds)
    if (o.every(k) < 0)
      throw Error(fmt::format("tensortap: Options::every({}) must be 0 (never) or more (kind {})", o.every(k), kind_name(k)));
  if (o.start() < 0)
    throw Error(fmt::format("tensortap: Options::start({}) must not be negative", o.start()));
  if (o.buffer_bytes() < kMinBufferBytes || o.buffer_bytes() > kMaxBufferBytes)
    throw Error(fmt::format("tensortap: Options::buffer_bytes({}) must be at least {} and at most {} (1 TiB)",
                            o.buffer_bytes(), kMinBufferBytes, kMaxBufferBytes));
  if (o.flight_recorder_bytes() > kMaxFlightBytes)
    throw Error(fmt::format("tensortap: Options::flight_recorder_bytes({}) must be at most {} (256 TiB)",
                            o.flight_recorder_bytes(), kMaxFlightBytes));
  for (std::int64_t s : o.steps())
    if (s < 0) throw Error(fmt::format("tensortap: Options::steps() holds {}: steps must not be negative", s));
  const Hdf5Options& h = o.hdf5();
  if (h.deflate() < 0 || h.deflate() > 9)
    throw Error(fmt::format("tensortap: Hdf5Options::deflate({}) must be 0 (off) to 9", h.deflate()));
  if (h.chunk_bytes() < 1024 || h.chunk_bytes() > kMaxChunkBytes)
    throw Error(fmt::format("tensortap: Hdf5Options::chunk_bytes({}) must be at least 1024 and at most {} (1 GiB)",
                            h.chunk_bytes(), kMaxChunkBytes));
  if (h.flush_every() < 1)
    throw Error(fmt::format("tensortap: Hdf5Options::flush_every({}) must be at least 1", h.flush_every()));
}

// Copies `src` (a CPU tensor) into `dst` as C-order bytes of dtype `stored`.
void copy_into(char* dst, const at::Tensor& src, c10::ScalarType stored, std::size_t nbytes) {
  if (nbytes == 0) return;
  // A conjugate or negative view is "contiguous" but its bytes are not its
  // values: let copy_ resolve it.
  if (src.scalar_type() == stored && src.is_contiguous() && !src.is_conj() && !src.is_neg()) {
    std::memcpy(dst, src.data_ptr(), nbytes);
    return;
  }
  at::from_blob(dst, src.sizes(), at::TensorOptions().dtype(stored)).copy_(src);
}

// An integer from the environment, or `fallback` if the variable is unset.
std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < 0)
    throw Error(fmt::format("tensortap: environment variable {}='{}' is not a non-negative integer", name, v));
  return n;
}

// Resolves the rank, the world size and the directory this process writes.
void place(const Options& o, RunInfo& info) {
  info.world_size = o.world_size() >= 0 ? o.world_size() : env_int("WORLD_SIZE", 1);
  info.rank = o.rank() >= 0 ? o.rank() : env_int("RANK", env_int("LOCAL_RANK", -1));
  if (info.rank < 0) {
    // Every process would think it is rank 0 and overwrite the others.
    if (info.world_size > 1)
      throw Error(fmt::format("tensortap: the world size is {} but this process's rank is unknown: set "
                              "Options::rank() or the RANK environment variable",
                              info.world_size));
    info.rank = 0;
  }
  if (info.world_size < 1)
    throw Error(fmt::format("tensortap: the world size must be at least 1, not {}", info.world_size));
  if (info.rank >= info.world_size)
    throw Error(fmt::format("tensortap: rank {} is outside a world of size {} (set by Options or by the "
                            "RANK, LOCAL_RANK and WORLD_SIZE environment variables)",
                            info.rank, info.world_size));
  info.run_dir = info.world_size > 1 ? fmt::format("{}/rank{}", o.dir(), info.rank) : o.dir();
}

}  // namespace

Core::Core(Options options)
    : options_((validate(options), std::move(options))),
      include_(options_.include(), "include"),
      exclude_(options_.exclude(), "exclude"),
      tap_sequential_(options_.tap_sequential(), "tap_sequential"),
      has_include_(!options_.include().empty()),
      has_exclude_(!options_.exclude().empty()),
      // HDF5 datasets have at most 32 axes, one of them the row; NumPy 1.x
      // reads at most 32 axes.
      max_dims_(options_.format() == Format::Hdf5 ? 31 : 32),
      max_dims_why_(options_.format() == Format::Hdf5
                        ? "an HDF5 run stores at most 31 dimensions (a dataset has at most 32 axes, one of them the row)"
                        : "a .npy file NumPy can read has at most 32 dimensions"),
      scan_non_finite_(options_.flight_recorder() > 0 && Triggers(options_).checks_non_finite()),
      staging_(options_.buffer_bytes(), options_.overflow(), cuda_staging_memory()) {
  place(options_, info_);
  const auto& only = options_.ranks();
  // A rank left out captures nothing and creates nothing: no directory, no
  // thread, no memory. Its hooks see no sampled step.
  if (!only.empty() && std::find(only.begin(), only.end(), info_.rank) == only.end()) return;
  // Opened once: everything is written through this descriptor, so a
  // chdir() or a link planted in the directory cannot move the run.
  run_dir_ = std::make_unique<RunDir>(options_.dir(), info_.world_size > 1 ? fmt::format("rank{}", info_.rank) : "",
                                      options_.overwrite());
  const Dir& dir = run_dir_->dir();
  auto writer = make_writer(options_.format(), options_.hdf5(), dir);
  info_.start_time = utc_now();
  write_run_json(dir, run_json(options_, info_));
  auto index = std::make_unique<LinesFile>(dir, "index.jsonl");
  backend_ = std::make_unique<Backend>(staging_, std::move(writer), std::move(index), options_, dir,
                                       [this](const DumpRecord& d) { dumped(d); });
  // Device memory that snapshots may hold, per GPU: as much as host staging.
  cuda_ = make_cuda_engine(staging_, 2 * options_.buffer_bytes(),
                           [b = backend_.get()](const std::string& what) { b->report(what); });
}

Core::~Core() {
  try {
    close();
  } catch (...) {
    // The writer thread already reported it on stderr.
  }
}

bool Core::selected(const std::string& name) const {
  if (has_include_ && !include_.search(name)) return false;
  if (has_exclude_ && exclude_.search(name)) return false;
  return true;
}

std::string Core::next_name(NameState& state, Kind kind, const std::string& name, std::int64_t step) {
  auto& slots = state.counts[static_cast<std::size_t>(kind)];
  NameState::Count* count = slots[0].step == step ? &slots[0] : slots[1].step == step ? &slots[1] : nullptr;
  if (count == nullptr) {
    // A new step for this name: recycle the older of the two counters.
    count = slots[0].step <= slots[1].step ? &slots[0] : &slots[1];
    *count = {step, 0};
  }
  int& k = count->next;
  // The common case: the name's first record in the step. A name without
  // '#' cannot be one that a repeat ("x#1") or the user ("h#1") took.
  if (k == 0 && name.find('#') == std::string::npos) {
    k = 1;
    return name;
  }
  TakenNames* taken = taken_[0].step == step ? &taken_[0] : taken_[1].step == step ? &taken_[1] : nullptr;
  if (taken == nullptr) {
    taken = taken_[0].step <= taken_[1].step ? &taken_[0] : &taken_[1];
    taken->step = step;
    taken->names.clear();
  }
  // Kinds are separate namespaces: the key is the kind's byte, then the name.
  std::string key(1, static_cast<char>(kind));
  key += name;
  std::string candidate = k == 0 ? key : fmt::format("{}#{}", key, k);
  while (taken->names.count(candidate) != 0) candidate = fmt::format("{}#{}", key, ++k);
  ++k;
  taken->names.insert(candidate);
  return candidate.substr(1);
}

namespace {

// Recorder::scope() names, innermost last, with the core each belongs to.
thread_local std::vector<std::pair<const Core*, std::string>> t_scopes;

}  // namespace

void Core::push_scope(const std::string& name) {
  if (name.empty()) throw Error("tensortap: Recorder::scope(\"\"): a scope needs a name");
  t_scopes.emplace_back(this, name);
}

void Core::pop_scope() noexcept {
  for (auto it = t_scopes.rbegin(); it != t_scopes.rend(); ++it)
    if (it->first == this) {
      t_scopes.erase(std::next(it).base());
      return;
    }
}

std::string Core::scoped(Kind kind, const std::string& name) const {
  if (t_scopes.empty() || (kind != Kind::Activation && kind != Kind::ActivationGrad && kind != Kind::Tensor))
    return name;
  std::string out;
  for (const auto& [core, scope] : t_scopes)
    if (core == this) out += scope + "/";
  return out + name;
}

std::string Core::repeat_name(Kind kind, const std::string& name, std::int64_t step) {
  std::lock_guard<std::mutex> lock(names_mu_);
  if (!t_scopes.empty()) {
    const std::string full = scoped(kind, name);
    return next_name(names_[full], kind, full, step);
  }
  return next_name(names_[name], kind, name, step);
}

void Core::record_grads(const std::unordered_set<const void*>& params) {
  if (closed()) throw Error(fmt::format("tensortap: record_grads() after close() of run '{}'", info_.run_dir));
  const std::int64_t step = current_step();
  if (step < 0)
    throw Error("tensortap: record_grads() before the first step(): call Recorder::step(s) at the start of each "
                "iteration");
  std::lock_guard<std::mutex> lock(control_mu_);
  for (auto& w : watchers_) w->record_grads(params, step);
}

void Core::check_capturable(Kind kind, const std::string& name, const at::Tensor& t,
                            std::int64_t step) const {
  const char* why = nullptr;
  if (!t.defined()) why = "the tensor is undefined";
  else if (t.layout() != at::kStrided) why = "only dense (strided) tensors can be stored; call .to_dense() first";
  else if (t.is_quantized()) why = "quantized tensors cannot be stored; call .dequantize() first";
  else if (t.is_meta()) why = "meta tensors have no data";
  else if (dtype_info(t.scalar_type()) == nullptr) why = "NumPy has no dtype for it";
  else if (t.dim() > max_dims_) why = max_dims_why_;
  if (why != nullptr)
    throw Error(fmt::format("tensortap: cannot capture '{}' (kind {}, step {}): {} ({})", name,
                            kind_name(kind), step, why, describe_tensor(t)));
}

std::uint64_t Core::plan(std::int64_t step) const {
  const std::uint64_t state = state_.load(std::memory_order_relaxed);
  // The current step's plan is in the state word; a late record (gradients
  // commit when the next step begins) gets its own step's.
  std::uint64_t bits = static_cast<std::int64_t>(state >> kStepShift) - 1 == step
                           ? state & kBitsMask
                           : (capturing() ? sampled_bits(options_, step) | stats_bits(options_, step) << kStatsShift : 0);
  if (full_halted_.load(std::memory_order_relaxed)) bits &= ~std::uint64_t{0xFF};
  return bits;
}

void Core::record_as(Kind kind, std::string name, const at::Tensor& tensor, std::int64_t step) {
  if (closed()) return;
  check_capturable(kind, name, tensor, step);
  const std::uint64_t bits = plan(step);
  const bool full = (bits & KindSet::bit(kind)) != 0;
  const bool stats = (bits >> kStatsShift & KindSet::bit(kind)) != 0;
  if (!full && !stats) return;
  // Statistics only, of a tensor off the host: reduce it on its own device
  // and send the ten numbers down the same path as a tensor.
  const bool stats_vector = !full && !tensor.device().is_cpu();
  at::Tensor src = stats_vector ? device_stats(tensor) : tensor;
  const DtypeInfo& info = *dtype_info(src.scalar_type());
  // Only ATen ops need autograd off; the common case, a memcpy of a CPU
  // tensor, runs none (and the guard's two thread-local switches were 5% of
  // a small capture).
  std::optional<at::NoGradGuard> no_grad;
  if (!src.device().is_cpu() || src.scalar_type() != info.stored || !src.is_contiguous() || src.is_conj() ||
      src.is_neg())
    no_grad.emplace();
  // CUDA goes through the engine, without a host sync (for a statistics
  // vector: queued behind the reductions on the current stream). Devices
  // without an engine come to the host synchronously.
  const bool on_engine = src.is_cuda() && cuda_ != nullptr;
  if (!src.device().is_cpu() && !on_engine) src = src.to(at::kCPU);

  auto meta = std::make_shared<RecordMeta>();
  meta->kind = kind;
  meta->name = std::move(name);
  meta->step = step;
  meta->dtype = src.scalar_type();
  meta->stored = info.stored;
  meta->shape = src.sizes().vec();
  meta->nbytes = static_cast<std::uint64_t>(src.numel()) * c10::elementSize(info.stored);
  meta->write = full;
  meta->stats_row = stats;
  meta->stats_vector = stats_vector;
  meta->check = full && scan_non_finite_;
  const std::uint64_t id = next_record_.fetch_add(1, std::memory_order_relaxed);
  const bool may_drop = options_.overflow() == Overflow::DropNewest;

  if (on_engine) {
    if (cuda_capture(*cuda_, meta, src, may_drop, id)) captured_.fetch_add(1, std::memory_order_relaxed);
    else if (!closed()) dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }

  if (meta->nbytes <= staging_.capacity()) {
    Slot slot;
    slot.meta = meta;
    slot.record = id;
    slot.nbytes = meta->nbytes;
    auto ticket = staging_.reserve(std::move(slot), may_drop);
    if (!ticket) {
      if (!closed()) dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    try {
      copy_into(ticket->dst, src, info.stored, meta->nbytes);
    } catch (...) {
      staging_.commit(*ticket, false);
      throw;
    }
    staging_.commit(*ticket, true);
    captured_.fetch_add(1, std::memory_order_relaxed);
    return;
  }

  // Larger than a buffer: stream it through in chunks of whole elements, as
  // large as the room in the filling buffer allows. It may be dropped only
  // before its first chunk; once started, it waits for room so that no half
  // record is ever written.
  const at::Tensor flat = src.to(info.stored).contiguous().resolve_conj().resolve_neg();
  const char* bytes = static_cast<const char*>(flat.data_ptr());
  const std::size_t unit = c10::elementSize(info.stored);
  for (std::uint64_t off = 0; off < meta->nbytes;) {
    Slot slot;
    slot.meta = meta;
    slot.record = id;
    slot.nbytes = static_cast<std::size_t>(meta->nbytes - off);
    slot.first = off == 0;
    auto ticket = staging_.reserve(std::move(slot), may_drop && off == 0, unit);
    if (!ticket) {
      // Either dropped before its first chunk, or cut off by close(): the
      // writer discards the chunks it already has.
      if (!closed()) dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    std::memcpy(ticket->dst, bytes + off, ticket->nbytes);
    staging_.commit(*ticket, true);
    off += ticket->nbytes;
  }
  captured_.fetch_add(1, std::memory_order_relaxed);
}

void Core::hook_failed(std::exception_ptr error) noexcept {
  std::string what = "unknown error in a hook";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  if (backend_) {
    // A record a hook could not hand over: captured, and failed.
    captured_.fetch_add(1, std::memory_order_relaxed);
    backend_->report(what);
  }
  if (options_.on_error() == OnError::Stop) {
    stopped_.store(true, std::memory_order_relaxed);
    state_.fetch_and(~kBitsMask, std::memory_order_relaxed);
  }
}

void Core::check_stopped() {
  if (options_.on_error() != OnError::Stop || !capturing()) return;
  if (!stopped_.load(std::memory_order_relaxed) && !backend_->failed()) return;
  stopped_.store(true, std::memory_order_relaxed);
  state_.fetch_and(~kBitsMask, std::memory_order_relaxed);
  throw Error(fmt::format("tensortap: run '{}': capture stopped after an error (Options::on_error(Stop)): {}",
                          info_.run_dir, backend_->first_error()));
}

void Core::capture(const std::string& name, const at::Tensor& tensor) {
  if (!active(Kind::Tensor)) {
    if (closed())
      throw Error(fmt::format("tensortap: capture('{}') after close() of run '{}'", name, info_.run_dir));
    if (current_step() < 0)
      throw Error(fmt::format("tensortap: capture('{}') before the first step(): call "
                              "Recorder::step(s) at the start of each iteration",
                              name));
    return;
  }
  const std::int64_t step = current_step();
  std::string record_name;
  if (!t_scopes.empty()) {
    // Inside a scope: selected by the caller's name, named by the scoped one.
    if (!selected(name)) return;
    record_name = repeat_name(Kind::Tensor, name, step);
  } else {
    // Selection and the repeat suffix: one lock, one lookup.
    std::lock_guard<std::mutex> lock(names_mu_);
    NameState& state = names_[name];
    if (state.selected < 0) state.selected = selected(name) ? 1 : 0;
    if (state.selected == 0) return;
    record_name = next_name(state, Kind::Tensor, name, step);
  }
  record_as(Kind::Tensor, std::move(record_name), tensor, step);
}

void Core::step(std::int64_t step) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (closed())
    throw Error(fmt::format("tensortap: step({}) after close() of run '{}'", step, info_.run_dir));
  const std::int64_t previous = current_step();
  if (step < 0) throw Error(fmt::format("tensortap: step({}): steps must not be negative", step));
  if (step >= kMaxStep) throw Error(fmt::format("tensortap: step({}): steps must be below 2^47", step));
  if (step <= previous)
    throw Error(fmt::format("tensortap: step({}) after step({}): steps must increase", step, previous));
  check_stopped();
  after_dumps();
  std::uint64_t bits = 0;
  if (capturing()) {
    if (!full_halted_.load(std::memory_order_relaxed)) bits = sampled_bits(options_, step);
    bits |= stats_bits(options_, step) << kStatsShift;
  }
  state_.store((static_cast<std::uint64_t>(step) + 1) << kStepShift | bits, std::memory_order_relaxed);
  // Watchers run hooks' work (committing gradients, snapshotting
  // parameters): their failures are hook failures, and every watcher runs.
  const auto guarded = [&](auto&& f) {
    try {
      f();
    } catch (...) {
      hook_failed(std::current_exception());
    }
  };
  if (previous >= 0)
    for (auto& w : watchers_) guarded([&] { w->on_step_end(); });
  for (auto& w : watchers_) guarded([&] { w->on_step_begin(step); });
  // The last step's records go to the writer now, in one wake-up.
  if (capturing()) staging_.kick();
  check_stopped();
}

void Core::after_dumps() {
  if (!capturing()) return;
  const std::int64_t dumps = backend_->dumps();
  if (dumps == dumps_seen_) return;
  dumps_seen_ = dumps;
  DumpRecord last;
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    // What the loop sees until the next step() (Recorder::dumps()).
    seen_dumps_ = info_.dumps;
    if (!info_.dumps.empty()) last = info_.dumps.back();
  }
  if (options_.after_dump() == AfterDump::Continue) return;
  // Without a flight recorder a trigger only marks the run: only Throw acts.
  const bool marked_only = options_.flight_recorder() <= 0;
  if (!marked_only) full_halted_.store(true, std::memory_order_relaxed);
  if (options_.after_dump() != AfterDump::Throw) return;
  std::string why = last.trigger == "user" ? std::string("Recorder::dump()")
                    : last.trigger == "non_finite" ? "a " + last.reason
                                                   : fmt::format("Trigger::{}", last.trigger);
  if (last.window > 0) why += fmt::format(" (value {} against a median of {})", last.value, last.median);
  throw Error(fmt::format("tensortap: run '{}': {} after {} at step {}{} (Options::after_dump(Throw))", info_.run_dir,
                          marked_only ? std::string("a trigger fired")
                                      : fmt::format("the flight recorder dumped steps {}", fmt::join(last.steps, ", ")),
                          why, last.step,
                          last.name.empty() ? "" : fmt::format(" in {} '{}'", kind_name(last.kind), last.name)));
}

std::vector<DumpRecord> Core::dumps() const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return seen_dumps_;
}

void Core::dumped(const DumpRecord& dump) noexcept {
  try {
    std::lock_guard<std::mutex> lock(info_mu_);
    info_.dumps.push_back(dump);
    write_run_json(run_dir_->dir(), run_json(options_, info_));
  } catch (const std::exception& e) {
    backend_->report(e.what(), 0);
  } catch (...) {
    backend_->report("cannot rewrite run.json after a dump", 0);
  }
}

void Core::dump() {
  if (options_.flight_recorder() <= 0)
    throw Error("tensortap: Recorder::dump() needs the flight recorder: set Options::flight_recorder(k)");
  if (closed()) throw Error(fmt::format("tensortap: dump() after close() of run '{}'", info_.run_dir));
  const std::int64_t step = current_step();
  if (step < 0) throw Error("tensortap: dump() before the first step()");
  if (!capturing()) return;
  // A marker in the pipeline, after every record captured before the call:
  // the writer thread dumps what it holds when it gets there.
  auto meta = std::make_shared<RecordMeta>();
  meta->step = step;
  meta->write = false;
  meta->dump = true;
  meta->nbytes = 0;
  Slot slot;
  slot.meta = meta;
  slot.record = next_record_.fetch_add(1, std::memory_order_relaxed);
  slot.nbytes = 0;
  if (auto ticket = staging_.reserve(std::move(slot), /*may_drop=*/false)) staging_.commit(*ticket, true);
}

std::string Core::failure_message(std::int64_t errors, const std::string& first) const {
  if (errors == 0) return fmt::format("tensortap: run '{}': {}", info_.run_dir, first);
  return fmt::format("tensortap: run '{}': {} record(s) failed; first: {}", info_.run_dir, errors, first);
}

void Core::rethrow_background_error() const {
  const std::string err = backend_->first_error();
  if (!err.empty()) throw Error(failure_message(backend_->errors(), err));
}

void Core::flush() {
  if (!capturing()) return;
  if (cuda_) cuda_flush(*cuda_);
  staging_.wait_drained();
  if (!closed()) backend_->sync();
  rethrow_background_error();
}

void Core::close() {
  std::lock_guard<std::mutex> closing(close_mu_);
  if (closed()) {
    if (!close_error_.empty()) throw Error(close_error_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    // Commit the last step's gradients while captures are still accepted.
    if (current_step() >= 0)
      for (auto& w : watchers_) {
        try {
          w->on_step_end();
        } catch (...) {
          hook_failed(std::current_exception());
        }
      }
    state_.store(state_.load(std::memory_order_relaxed) & ~kBitsMask, std::memory_order_relaxed);
    closed_.store(true, std::memory_order_release);
    for (auto& w : watchers_) w->detach();
    watchers_.clear();
  }
  if (!capturing()) return;
  if (cuda_) cuda_stop(*cuda_);
  backend_->stop();
  // Hooks (Taps above all) may keep this object alive as long as the model:
  // give the staging memory back now.
  staging_.free_memory();
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    info_.closed = true;
    info_.end_time = utc_now();
    info_.stats = stats();
    info_.first_error = backend_->first_error();
    seen_dumps_ = info_.dumps;
    try {
      write_run_json(run_dir_->dir(), run_json(options_, info_));
    } catch (const std::exception& e) {
      close_error_ = e.what();
    }
    // The last write: let go of the directory and its lock.
    run_dir_->release();
  }
  if (!info_.first_error.empty()) close_error_ = failure_message(info_.stats.errors, info_.first_error);
  if (!close_error_.empty()) throw Error(close_error_);
}

Stats Core::stats() const {
  Stats s;
  if (!capturing()) return s;
  s.captured = captured_.load(std::memory_order_relaxed);
  s.records = backend_->records();
  s.bytes = backend_->bytes();
  s.dropped = dropped_.load(std::memory_order_relaxed) + backend_->flight_dropped();
  s.errors = backend_->errors();
  s.stats_rows = backend_->stats_rows();
  s.dumps = backend_->dumps();
  return s;
}

void Core::claim(const std::vector<Claim>& claims) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (closed()) throw Error(fmt::format("tensortap: watch() on the closed recorder of run '{}'", info_.run_dir));
  std::unordered_set<std::string> names;
  std::unordered_set<const void*> objects;
  for (const Claim& c : claims) {
    const char* what = c.kind == Kind::Grad ? "parameter" : c.kind == Kind::Buffer ? "buffer" : "tap point";
    if (auto it = claimed_objects_.find(c.object); it != claimed_objects_.end())
      throw Error(fmt::format("tensortap: watch(): the {} '{}' is already watched by this recorder (as '{}', run "
                              "'{}'); watching a module twice would record everything twice",
                              what, c.name, it->second, info_.run_dir));
    std::string key(1, static_cast<char>(c.kind));
    key += c.name;
    // Within one call a tied weight may appear under two names; across
    // calls, one name for two objects would mix their records.
    if (objects.insert(c.object).second && claimed_names_.count(key) != 0)
      throw Error(fmt::format("tensortap: watch(): a {} named '{}' is already watched by this recorder (run '{}'); "
                              "give the second module a prefix: tensortap::watch(module, recorder, \"G\")",
                              what, c.name, info_.run_dir));
    names.insert(std::move(key));
  }
  for (const Claim& c : claims) claimed_objects_.emplace(c.object, c.name);
  claimed_names_.insert(names.begin(), names.end());
}

void Core::add_watcher(std::shared_ptr<Watcher> watcher) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (closed()) {
    watcher->detach();
    return;
  }
  watchers_.push_back(std::move(watcher));
}

}  // namespace tensortap::detail
