#pragma once

// Settings from the environment (docs/leaving-it-on.md), read when a recorder is
// made: `TENSORTAP=off` makes it inert, `TENSORTAP_OPTIONS` overrides the
// options the code set, key by key. Both are parsed strictly: a value or a
// key they do not understand is refused by name, never ignored.

#include <optional>
#include <string>

#include <tensortap/options.h>

namespace tensortap::detail {

/// Whether `TENSORTAP` turns tensortap off: "off", "0" or "false" (any
/// case); unset, empty or "on": no. Throws `Error` naming any other value.
bool tensortap_off();

/// Applies `text` (TENSORTAP_OPTIONS' grammar) to `options`: `key=value`
/// pairs separated by `,` (`\,` a comma inside a value), lists joined by
/// `+`, booleans 1/0/true/false/on/off, enumerations as run.json spells
/// them, sizes with K/M/G/T (powers of 1024, optional `iB`), durations with
/// ms/s/m/h (bare: seconds), `stop=none`, `every.<kind>=n`, nested
/// `hdf5.*`, `packed.*`, `tensorboard.*`. The last of a key given twice
/// wins. Throws `Error` naming the key and its value for an unknown key, a
/// value that does not parse, or `dump_on` (set in code).
void apply_options_text(Options& options, const std::string& text);

/// `TENSORTAP_CUDA_STATS`: how a statistics-only capture of a
/// CUDA tensor reaches the engine. "arena": the fused kernels write the ten
/// numbers into the engine's device arena (no allocation, no copy on the
/// device); "tensor": into a tensor of LibTorch's caching allocator, which
/// is then captured. Unset or empty: the default, `kCudaStatsInArena`.
/// Throws `Error` naming any other value.
bool cuda_stats_in_arena();
/// What `cuda_stats_in_arena` gives when the variable is unset.
constexpr bool kCudaStatsInArena = true;

/// `TENSORTAP_CUDA_BATCH`: "on", one CUDA event a step for a stream's
/// snapshots, handed to the copier at the step's end (docs/recording.md);
/// "off", one a snapshot. Unset or empty: `kCudaBatch`. Throws `Error`
/// naming any other value.
bool cuda_batch();
/// What `cuda_batch` gives when the variable is unset: off until a device
/// run shows the records identical and the time better.
constexpr bool kCudaBatch = false;

/// `TENSORTAP_OPTIONS` applied to `options`; returns the string as given,
/// or nullopt when the variable is unset.
std::optional<std::string> apply_environment(Options& options);

}  // namespace tensortap::detail
