#pragma once

#include <array>
#include <deque>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <tensortap/kinds.h>

#include "sdk/src/select/sampling.h"
#include "sdk/src/core/spin_lock.h"

namespace tensortap::detail {

/// A name a `NameTable` gave: in the common case, a name's first record in
/// a step, the table's own copy of it, which lives as long as the table;
/// otherwise (a repeat, `name#1`) a string of the giving thread's own,
/// valid until that thread is given its next name. Two words, so that
/// handing it over copies no string.
class GivenName {
 public:
  GivenName(const std::string* name, bool kept) : name_(name), kept_(kept) {}
  const std::string& str() const { return *name_; }
  /// Whether `str()` is the table's copy, which lives as long as the
  /// table: staging may then keep the name by reference.
  bool kept() const { return kept_; }

 private:
  const std::string* name_;
  bool kept_;
};

/// The hash of the name table: eight bytes a round, where std::hash of a
/// string (murmur, a byte at a time for the tail) cost 96 instructions for
/// a 23-character name, the largest share of a capture() by name.
struct NameHash {
  std::size_t operator()(const std::string& s) const noexcept {
    constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ULL;
    const char* p = s.data();
    const std::size_t n = s.size();
    std::uint64_t h = n * kMul;
    const auto mix = [&h](std::uint64_t w) { h = ((h << 5 | h >> 59) ^ w) * kMul; };
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) mix(load(p + i, 8));
    // The tail: the last eight bytes again (overlapping), or what there is.
    if (i < n) mix(n >= 8 ? load(p + n - 8, 8) : load(p, n));
    // A product's low bits depend only on its operands' low bits, and the
    // table indexes by the low bits: fold the high half down, twice.
    h = (h ^ h >> 32) * kMul;
    return static_cast<std::size_t>(h ^ h >> 32);
  }
  /// Whether `a` and `b` are the same name: eight bytes a round, inline,
  /// where operator== called memcmp.
  static bool equal(const std::string& a, const std::string& b) noexcept {
    const std::size_t n = a.size();
    if (n != b.size()) return false;
    const char* p = a.data();
    const char* q = b.data();
    if (n < 8) return std::memcmp(p, q, n) == 0;
    for (std::size_t i = 0; i + 8 < n; i += 8)
      if (load(p + i, 8) != load(q + i, 8)) return false;
    return load(p + n - 8, 8) == load(q + n - 8, 8);
  }

 private:
  static std::uint64_t load(const char* p, std::size_t n) noexcept {
    std::uint64_t w = 0;
    if (n == 8) {
      std::memcpy(&w, p, 8);
    } else {
      for (std::size_t i = 0; i < n; ++i) w = w << 8 | static_cast<unsigned char>(p[i]);
    }
    return w;
  }
};

/// What the patterns said of names, so that a name is matched once, not at
/// every capture: up to `kCapacity` names, forgotten all at once when a new
/// one would pass it (a name then pays its match once more). A lookup is one
/// probe of an open-addressing index, given the name's hash; it allocates
/// nothing. About 60 bytes a name, plus the name's own bytes past 15.
class VerdictCache {
 public:
  static constexpr std::size_t kCapacity = 4096;
  /// 1: selected, 0: left out, -1: not known.
  int find(const std::string& name, std::uint64_t hash) const noexcept;
  void add(const std::string& name, std::uint64_t hash, bool selected);
  std::size_t size() const { return names_.size(); }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::int32_t name = -1;  // into names_
  };
  // Twice the capacity: probes stay short.
  std::vector<Slot> slots_ = std::vector<Slot>(2 * kCapacity);
  std::vector<std::pair<std::string, bool>> names_;
};

/// A number no other NameTable of the process has.
std::uint64_t next_table_id();

/// The names records get: a repeat of a name within a step is `name#1`,
/// `name#2`..., and inside `Recorder::scope()`s a name is prefixed with
/// them. Thread-safe.
class NameTable {
 public:
  /// The name the next record of `name` in `step` gets: `name`, then
  /// `name#1`, `name#2`... (see `GivenName` for how long it is valid).
  GivenName repeat(Kind kind, const std::string& name, std::int64_t step);
  /// `repeat()` as a string of its own: lets a gradient hook keep its
  /// forward's suffix whatever order backward runs in.
  std::string repeat_name(Kind kind, const std::string& name, std::int64_t step) {
    return repeat(kind, name, step).str();
  }
  /// For `capture()`: the record name of `name` in `step`, or nullopt if
  /// `sampling` does not select it. Outside scopes, the selection is looked
  /// up once per name and found with the suffix in one lookup.
  std::optional<GivenName> capture_name(const std::string& name, std::int64_t step, const Sampling& sampling);

  /// How many names the table holds: each costs about 350 bytes for the
  /// table's life (the recorder's). Names `capture()` leaves out are not
  /// held: their verdicts are, in a bounded cache (`VerdictCache`).
  std::size_t size() const;
  /// How many verdicts the cache holds (at most VerdictCache::kCapacity).
  std::size_t verdicts() const;

  /// Scopes (Recorder::scope) on this thread, innermost last.
  void push_scope(const std::string& name);
  void pop_scope() noexcept;
  /// `name` inside this thread's scopes for kinds that scopes rename;
  /// `name` itself otherwise.
  std::string scoped(Kind kind, const std::string& name) const;

 private:
  // What is known of a base name: whether it is selected (for capture()),
  // and per kind the next repeat suffix in the current and the previous step
  // (a late gradient hook of the previous step still gets a fresh suffix).
  // Found by the caller's own string, so the common case, a name's first
  // record in a step, builds no string and allocates nothing.
  struct NameState {
    struct Count {
      std::int64_t step = -1;
      int next = 0;
    };
    std::int8_t selected = -1;  // -1: not looked up yet
    // Whether the name has a '#', so it may be one a repeat ("x#1") or the
    // user ("h#1") took: asked once, not per record.
    bool has_hash = false;
    std::array<std::array<Count, 2>, kKindCount> counts{};  // [kind][slot]
    // Records of a step older than both counters' (see next_name()).
    std::array<int, kKindCount> late{};
    // The name some thread looked up right after this one, last time: the
    // first guess for that thread's next lookup (see entry()).
    std::pair<const std::string, NameState>* next = nullptr;
  };
  // Names with a '#' given out in the current and the previous step, kind
  // byte first: the only ones a repeat's "name#k" can collide with (a name
  // the user captured as such, "h#1"). Empty unless there are repeats.
  struct TakenNames {
    std::int64_t step = -1;
    std::unordered_set<std::string> names;
  };
  using Entry = std::pair<const std::string, NameState>;
  // The state of `name`, created on its first use; mu_ is held. The key is
  // the table's copy of the name. A training loop looks names up in the
  // same order every step, so each thread's lookup first tries the name
  // that followed its previous one last time: one comparison, no hash.
  // With `admit`, a name not in the table is added only if `admit` selects
  // it (`left_out_` otherwise, whose state says "not selected"); without,
  // always.
  Entry& entry(const std::string& name, const Sampling* admit = nullptr);
  // entry() by the index: one hash.
  Entry& find(const std::string& name, const Sampling* admit);
  static Entry left_out_entry() {
    Entry e{std::string(), NameState{}};
    e.second.selected = 0;
    return e;
  }
  // Whether `sampling` selects `name`, from the cache or matched once; mu_
  // is held.
  bool selected(const std::string& name, std::uint64_t hash, const Sampling& sampling);
  // Adds `name`, of hash `hash`, which the index does not hold.
  Entry& add(const std::string& name, std::uint64_t hash);
  // The repeat name of `entry`'s name in `step`; mu_ is held.
  GivenName next_name(std::pair<const std::string, NameState>& entry, Kind kind, std::int64_t step);

  // Tells this table's entries from another's in a thread's last lookup.
  const std::uint64_t id_ = next_table_id();
  mutable SpinLock mu_;
  // The names, in a deque so that an entry never moves (records and
  // GivenNames point at its string), and an open-addressing index of them
  // (a power of two of slots, at most half used, probed in turn) whose
  // slots keep the whole hash: a lookup is one hash, about one slot and one
  // string comparison. std::unordered_map, without cached hashes, hashed
  // a neighbour's name again on a collision.
  struct Slot {
    std::uint64_t hash = 0;
    Entry* entry = nullptr;
  };
  // What a name capture() leaves out finds (see entry()): one entry for
  // all of them, never in the index, never a lookup's guess.
  Entry left_out_ = left_out_entry();
  // Verdicts of names not interned: those capture() left out, and every
  // name a capture() inside a scope was selected by.
  VerdictCache verdicts_;
  std::deque<Entry> entries_;
  std::vector<Slot> index_ = std::vector<Slot>(64);
  TakenNames taken_[2];
};

}  // namespace tensortap::detail
