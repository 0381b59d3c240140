#pragma once

// What the options resolve to when a recorder is made: whether they are in
// range, and which rank writes where.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <tensortap/options.h>

namespace tensortap::detail {

// Size options are bounded well below where arithmetic on them (alignment
// to pages, twice the buffer for the device arena) could wrap around.
/// Smaller buffers would turn every capture into a chunked stream.
constexpr std::size_t kMinBufferBytes = 4096;
constexpr std::size_t kMaxBufferBytes = std::size_t{1} << 40;  // 1 TiB
constexpr std::size_t kMaxFlightBytes = std::size_t{1} << 48;  // 256 TiB
/// HDF5 chunks stay below 4 GiB.
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 30;
/// Steps share a word with the kind bits (see Sampling).
constexpr std::int64_t kMaxStep = std::int64_t{1} << 47;

/// `options` as a recorder uses them: what 0.1 spelled differently (a
/// negative stop, rank or world size for "unset") in today's form, with a
/// warning on stderr, then validated. Throws `Error` naming the first
/// setting out of its range.
Options settle(Options options);
/// Throws `Error` naming the first setting of `options` out of its range.
void validate(const Options& options);

/// Where this process writes: its rank, the world size, and its directory.
struct Placement {
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  /// The options' dir, or its rank<r>/ below it with several ranks.
  std::string run_dir;
  /// "rank<r>" with several ranks, "" otherwise.
  std::string sub_dir;
  /// TENSORTAP_OPTIONS as given (run.json's "options_from_env"), if set.
  std::optional<std::string> options_from_env;
};

/// Resolves the rank and the world size from `options`, or from the
/// RANK, LOCAL_RANK and WORLD_SIZE environment variables. Throws `Error`
/// when they are malformed or contradict each other.
Placement place(const Options& options, const std::optional<std::string>& options_from_env = std::nullopt);

}  // namespace tensortap::detail
