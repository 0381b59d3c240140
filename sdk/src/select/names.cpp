#include "sdk/src/select/names.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include <fmt/format.h>

#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

// Recorder::scope() names, innermost last, with the table each belongs to.
thread_local std::vector<std::pair<const NameTable*, std::string>> t_scopes;

// The last name this thread was given that is not the table's copy (a
// repeat's "name#k"): GivenName points here until the thread's next one.
thread_local std::string t_given;

// The entry this thread looked up last, and its table's id_.
struct LastLookup {
  std::uint64_t table = 0;
  void* entry = nullptr;
};
thread_local LastLookup t_last;

std::atomic<std::uint64_t> g_table_ids{0};

GivenName given(std::string name) {
  t_given = std::move(name);
  return GivenName(&t_given, false);
}

}  // namespace

int VerdictCache::find(const std::string& name, std::uint64_t hash) const noexcept {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.name < 0) return -1;
    if (slot.hash == hash) {
      const auto& [known, selected] = names_[static_cast<std::size_t>(slot.name)];
      if (NameHash::equal(known, name)) return selected ? 1 : 0;
    }
  }
}

void VerdictCache::add(const std::string& name, std::uint64_t hash, bool selected) {
  if (names_.size() == kCapacity) {
    // Forgotten at once, not one by one: no list to keep in order, and a
    // loop over more names than fit pays a match per name per round either
    // way.
    names_.clear();
    std::fill(slots_.begin(), slots_.end(), Slot{});
  }
  names_.emplace_back(name, selected);
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = hash & mask;
  while (slots_[i].name >= 0) i = (i + 1) & mask;
  slots_[i] = Slot{hash, static_cast<std::int32_t>(names_.size() - 1)};
}

std::uint64_t next_table_id() { return g_table_ids.fetch_add(1, std::memory_order_relaxed) + 1; }

NameTable::Entry& NameTable::entry(const std::string& name, const Sampling* admit) {
  LastLookup& last = t_last;
  Entry* previous = last.table == id_ ? static_cast<Entry*>(last.entry) : nullptr;
  if (previous != nullptr && previous->second.next != nullptr &&
      NameHash::equal(previous->second.next->first, name)) {
    last.entry = previous->second.next;
    return *previous->second.next;
  }
  Entry& e = find(name, admit);
  // Never a guess: it stands for every name left out.
  if (&e == &left_out_) return e;
  if (previous != nullptr) previous->second.next = &e;
  last = LastLookup{id_, &e};
  return e;
}

NameTable::Entry& NameTable::find(const std::string& name, const Sampling* admit) {
  const std::uint64_t hash = NameHash()(name);
  const std::size_t mask = index_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = index_[i];
    if (slot.entry == nullptr) {
      // A new name: with `admit`, interned only if selected, and then known
      // to be; a name left out costs the table nothing.
      if (admit == nullptr) return add(name, hash);
      if (!selected(name, hash, *admit)) return left_out_;
      Entry& e = add(name, hash);
      e.second.selected = 1;
      return e;
    }
    if (slot.hash == hash && NameHash::equal(slot.entry->first, name)) return *slot.entry;
  }
}

bool NameTable::selected(const std::string& name, std::uint64_t hash, const Sampling& sampling) {
  const int known = verdicts_.find(name, hash);
  if (known >= 0) return known == 1;
  // Matched once (the patterns allocate as they search), then known.
  const bool selected = sampling.selected(name);
  verdicts_.add(name, hash, selected);
  return selected;
}

std::size_t NameTable::verdicts() const {
  std::lock_guard<SpinLock> lock(mu_);
  return verdicts_.size();
}

std::size_t NameTable::size() const {
  std::lock_guard<SpinLock> lock(mu_);
  return entries_.size();
}

NameTable::Entry& NameTable::add(const std::string& name, std::uint64_t hash) {
  const auto place = [](std::vector<Slot>& index, std::uint64_t h, Entry* e) {
    std::size_t i = h & (index.size() - 1);
    while (index[i].entry != nullptr) i = (i + 1) & (index.size() - 1);
    index[i] = Slot{h, e};
  };
  // Everything that may throw (out of memory) comes before the entry goes
  // in, so a failed add leaves no entry the index lacks (a second entry of
  // the same name would count its repeats apart).
  if (2 * (entries_.size() + 1) > index_.size()) {
    // At most half full: probes stay short. Rebuilt from the entries, whose
    // hashes are computed again (once per doubling).
    std::vector<Slot> bigger(index_.size() * 2);
    for (Entry& other : entries_) place(bigger, NameHash()(other.first), &other);
    index_.swap(bigger);
  }
  Entry& e = entries_.emplace_back(std::piecewise_construct, std::forward_as_tuple(name), std::forward_as_tuple());
  e.second.has_hash = name.find('#') != std::string::npos;
  place(index_, hash, &e);
  return e;
}

GivenName NameTable::next_name(Entry& entry, Kind kind, std::int64_t step) {
  const std::string& name = entry.first;
  NameState& state = entry.second;
  auto& slots = state.counts[static_cast<std::size_t>(kind)];
  NameState::Count* count = slots[0].step == step ? &slots[0] : slots[1].step == step ? &slots[1] : nullptr;
  if (count == nullptr) {
    // A new step for this name: recycle the older of the two counters.
    count = slots[0].step <= slots[1].step ? &slots[0] : &slots[1];
    if (count->step > step) {
      // Older than both steps the counters hold: a capture on another
      // thread that read its step before two step() calls. How many records
      // of `name` that step had is forgotten, and restarting its count would
      // give a name (and a file) a record of that step already has. A name
      // of its own instead, which no counted record can have.
      return given(fmt::format("{}#late{}", name, ++state.late[static_cast<std::size_t>(kind)]));
    }
    *count = {step, 0};
  }
  int& k = count->next;
  // The common case: the name's first record in the step. A name without
  // '#' cannot be one that a repeat ("x#1") or the user ("h#1") took.
  if (k == 0 && !state.has_hash) {
    k = 1;
    return GivenName(&name, true);
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
  return given(candidate.substr(1));
}

void NameTable::push_scope(const std::string& name) {
  if (name.empty()) fail("Recorder::scope(\"\"): a scope needs a name");
  t_scopes.emplace_back(this, name);
}

void NameTable::pop_scope() noexcept {
  for (auto it = t_scopes.rbegin(); it != t_scopes.rend(); ++it)
    if (it->first == this) {
      t_scopes.erase(std::next(it).base());
      return;
    }
}

std::string NameTable::scoped(Kind kind, const std::string& name) const {
  if (t_scopes.empty() || (kind != Kind::Activation && kind != Kind::ActivationGrad && kind != Kind::Tensor))
    return name;
  std::string out;
  for (const auto& [table, scope] : t_scopes)
    if (table == this) out += scope + "/";
  return out + name;
}

GivenName NameTable::repeat(Kind kind, const std::string& name, std::int64_t step) {
  std::lock_guard<SpinLock> lock(mu_);
  if (t_scopes.empty()) return next_name(entry(name), kind, step);
  return next_name(entry(scoped(kind, name)), kind, step);
}

std::optional<GivenName> NameTable::capture_name(const std::string& name, std::int64_t step, const Sampling& sampling) {
  if (!t_scopes.empty()) {
    // Inside a scope: selected by the caller's name (its verdict cached),
    // named by the scoped one.
    std::lock_guard<SpinLock> lock(mu_);
    if (!selected(name, NameHash()(name), sampling)) return std::nullopt;
    return next_name(entry(scoped(Kind::Tensor, name)), Kind::Tensor, step);
  }
  // Selection and the repeat suffix: one lock, one lookup. A name is
  // interned only once it is known to be selected: a name left out
  // (Options::exclude, a name made from the step) costs the table nothing,
  // and is matched against the patterns at each capture instead.
  std::lock_guard<SpinLock> lock(mu_);
  auto& e = entry(name, &sampling);
  NameState& state = e.second;
  if (state.selected < 0) state.selected = sampling.selected(name) ? 1 : 0;
  if (state.selected == 0) return std::nullopt;
  return next_name(e, Kind::Tensor, step);
}

}  // namespace tensortap::detail
