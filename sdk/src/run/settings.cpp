#include "sdk/src/run/settings.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "sdk/src/flight/triggers.h"
#include "sdk/src/sinks/tensorboard.h"
#include "writers/src/check.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {
namespace {

// An integer from the environment, or `fallback` if the variable is unset.
std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  TENSORTAP_CHECK(errno == 0 && *end == '\0' && n >= 0, "environment variable {}='{}' is not a non-negative integer",
                  name, v);
  return n;
}

// 0.1 took a negative stop, rank or world size for "unset". It still
// means that for one release, with a warning, and becomes an error after.
void unset_if_negative(std::optional<std::int64_t>& value, const char* setting) {
  if (!value || *value >= 0) return;
  fmt::print(stderr,
             "tensortap: warning: Options::{}({}) taken as unset; a negative value for it is deprecated and will be "
             "an error: leave it unset (std::nullopt)\n",
             setting, *value);
  value.reset();
}

}  // namespace

Options settle(Options o) {
  unset_if_negative(o.stop(), "stop");
  unset_if_negative(o.rank(), "rank");
  unset_if_negative(o.world_size(), "world_size");
  validate(o);
  return o;
}

void validate(const Options& o) {
  validate_triggers(o);
  TENSORTAP_CHECK(o.stats_every() >= 0, "Options::stats_every({}) must be 0 (off) or more", o.stats_every());
  TENSORTAP_CHECK(o.flight_recorder() >= 0, "Options::flight_recorder({}) must be 0 (off) or more",
                  o.flight_recorder());
  if (o.tensorboard()) {
    TENSORTAP_CHECK(tensorboard_built(),
                    "Options::tensorboard: this tensortap was built without TensorBoard event files (CMake found no "
                    "protobuf: install libprotobuf-dev and protobuf-compiler and build it again)");
    TENSORTAP_CHECK(o.tensorboard()->histograms_every() >= 0,
                    "TensorBoardOptions::histograms_every({}) must be 0 (none) or more",
                    o.tensorboard()->histograms_every());
    for (const std::string& name : o.tensorboard()->stats())
      TENSORTAP_CHECK(std::find(kStatsFieldNames.begin(), kStatsFieldNames.end(), name) != kStatsFieldNames.end(),
                      "TensorBoardOptions::stats: '{}' is not a statistic; TensorSummary's fields are min, max, mean, "
                      "std, norm, nan, posinf, neginf, zeros and numel",
                      name);
  }
  for (Kind k : kAllKinds)
    TENSORTAP_CHECK(o.every(k) >= 0, "Options::every({}) must be 0 (never) or more (kind {})", o.every(k),
                    kind_name(k));
  TENSORTAP_CHECK(o.start() >= 0, "Options::start({}) must not be negative", o.start());
  TENSORTAP_CHECK(o.buffer_bytes() >= kMinBufferBytes && o.buffer_bytes() <= kMaxBufferBytes,
                  "Options::buffer_bytes({}) must be at least {} and at most {} (1 TiB)", o.buffer_bytes(),
                  kMinBufferBytes, kMaxBufferBytes);
  TENSORTAP_CHECK(o.flight_recorder_bytes() <= kMaxFlightBytes,
                  "Options::flight_recorder_bytes({}) must be at most {} (256 TiB)", o.flight_recorder_bytes(),
                  kMaxFlightBytes);
  for (std::int64_t s : o.steps()) TENSORTAP_CHECK(s >= 0, "Options::steps() holds {}: steps must not be negative", s);
  const Hdf5Options& h = o.hdf5();
  TENSORTAP_CHECK(h.deflate() >= 0 && h.deflate() <= 9, "Hdf5Options::deflate({}) must be 0 (off) to 9", h.deflate());
  TENSORTAP_CHECK(h.chunk_bytes() == 0 || (h.chunk_bytes() >= 1024 && h.chunk_bytes() <= kMaxChunkBytes),
                  "Hdf5Options::chunk_bytes({}) must be 0 (sized from the records) or at least 1024 and at most {} "
                  "(1 GiB)",
                  h.chunk_bytes(), kMaxChunkBytes);
  TENSORTAP_CHECK(h.flush_every() >= 0, "Hdf5Options::flush_every({}) must be 0 (sized from the records) or more",
                  h.flush_every());
  TENSORTAP_CHECK(o.dumps_percent() >= 0 && o.dumps_percent() <= 100,
                  "Options::dumps_percent({}) must be a percent of max_bytes, 0 to 100", o.dumps_percent());
  TENSORTAP_CHECK(!(o.max_bytes() > 0 && o.on_budget() == Budget::KeepLatest && o.format() == Format::Hdf5),
                  "Options::on_budget(Budget::KeepLatest) with Format::Hdf5: a record's rows in tensors.h5 cannot be "
                  "given up in place; use Budget::StopCapture, or Format::Npy or Format::Packed");
  TENSORTAP_CHECK(o.stall_after().count() >= 0, "Options::stall_after({} ms) must be 0 (off) or more",
                  o.stall_after().count());
  const PackedOptions& pk = o.packed();
  // Below 4 KiB a segment holds hardly a record: a file per record, as Npy.
  TENSORTAP_CHECK(pk.segment_bytes() >= 4096, "PackedOptions::segment_bytes({}) must be at least 4096",
                  pk.segment_bytes());
}

Placement place(const Options& o, const std::optional<std::string>& options_from_env) {
  Placement p;
  p.options_from_env = options_from_env;
  p.world_size = o.world_size() ? *o.world_size() : env_int("WORLD_SIZE", 1);
  // LOCAL_RANK only stands in for an unset RANK: read, and checked, only
  // then (else LOCAL_RANK=zz would refuse a recorder whose RANK is valid).
  if (o.rank()) {
    p.rank = *o.rank();
  } else {
    const char* rank = std::getenv("RANK");
    p.rank = rank != nullptr && *rank != '\0' ? env_int("RANK", -1) : env_int("LOCAL_RANK", -1);
  }
  if (p.rank < 0) {
    // Every process would think it is rank 0 and overwrite the others.
    TENSORTAP_CHECK(p.world_size <= 1,
                    "the world size is {} but this process's rank is unknown: set Options::rank() or the RANK "
                    "environment variable",
                    p.world_size);
    p.rank = 0;
  }
  TENSORTAP_CHECK(p.world_size >= 1, "the world size must be at least 1, not {}", p.world_size);
  TENSORTAP_CHECK(p.rank < p.world_size,
                  "rank {} is outside a world of size {} (set by Options or by the RANK, LOCAL_RANK and WORLD_SIZE "
                  "environment variables)",
                  p.rank, p.world_size);
  if (p.world_size > 1) p.sub_dir = fmt::format("rank{}", p.rank);
  p.run_dir = p.world_size > 1 ? fmt::format("{}/{}", o.dir(), p.sub_dir) : o.dir();
  return p;
}

}  // namespace tensortap::detail
