#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <tensortap/kinds.h>

#include "sdk/src/select/sampling.h"
#include "sdk/src/select/spin_lock.h"

namespace tensortap::detail {

/// A name a `NameTable` gave: in the common case, a name's first record in
/// a step, the table's own copy of it, so that no string is built per
/// record; a string of its own otherwise.
class GivenName {
 public:
  explicit GivenName(const std::string* table_copy) : ref_(table_copy) {}
  explicit GivenName(std::string own) : own_(std::move(own)) {}
  const std::string& str() const { return ref_ != nullptr ? *ref_ : own_; }

 private:
  // The table's copy: it keeps every name until it is destroyed.
  const std::string* ref_ = nullptr;
  std::string own_;
};

/// The names records get: a repeat of a name within a step is `name#1`,
/// `name#2`..., and inside `Recorder::scope()`s a name is prefixed with
/// them. Thread-safe.
class NameTable {
 public:
  /// The name the next record of `name` in `step` gets: `name`, then
  /// `name#1`, `name#2`... Valid while the table lives.
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
  };
  // Names with a '#' given out in the current and the previous step, kind
  // byte first: the only ones a repeat's "name#k" can collide with (a name
  // the user captured as such, "h#1"). Empty unless there are repeats.
  struct TakenNames {
    std::int64_t step = -1;
    std::unordered_set<std::string> names;
  };
  // The state of `name`, created on its first use; mu_ is held. The key is
  // the table's copy of the name.
  std::pair<const std::string, NameState>& entry(const std::string& name);
  // The repeat name of `entry`'s name in `step`; mu_ is held.
  GivenName next_name(std::pair<const std::string, NameState>& entry, Kind kind, std::int64_t step);

  SpinLock mu_;
  std::unordered_map<std::string, NameState> names_;
  TakenNames taken_[2];
};

}  // namespace tensortap::detail
