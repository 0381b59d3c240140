// tensortap::load_params: a module's parameters and buffers from a run's
// `param` and `buffer` records at a step, the way a C++ port
// starts from the Python model's weights.
#include <tensortap/checkpoint.h>

#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "writers/src/check.h"
#include "writers/src/run_records.h"

namespace tensortap {
namespace {

std::string shape_text(c10::IntArrayRef s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The first few of `names`, and how many more.
std::string some(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 5) out += fmt::format(" and {} more", names.size() - 5);
  return out;
}

// The records of step `step`, by kind and name: the last line wins, as
// for the reader (a record written again keeps the newest).
using StepRecords = std::map<std::pair<Kind, std::string>, detail::IndexRecord>;

StepRecords step_records(const detail::Dir& dir, const std::string& run, std::int64_t step) {
  StepRecords records;
  for (detail::IndexRecord& r : detail::read_index(dir, dir.path()))
    if (r.step == step && (r.kind == Kind::Param || r.kind == Kind::Buffer))
      records[{r.kind, r.name}] = std::move(r);
  // A step a disk budget gave up (Budget::KeepLatest) may have lines whose
  // files are gone; one a dump kept has them all.
  const std::int64_t given_up = detail::given_up_below(dir);
  if (step < given_up) {
    bool whole = !records.empty();
    for (const auto& kv : records) whole = whole && dir.exists(kv.second.file);
    TENSORTAP_CHECK(whole,
                    "run '{}' gave up step {} to its disk budget (Budget::KeepLatest: run.json's \"given_up_below\" "
                    "is {}); load a step from {} on",
                    run, step, given_up, given_up);
  }
  return records;
}

// One of the module's tensors, under each of its names, and the record that
// will set it.
struct Target {
  Kind kind;
  std::vector<std::string> names;
  at::Tensor tensor;
  const detail::IndexRecord* record = nullptr;
};

// The module's tensors, each once (tied weights: one target of several
// names), parameters first.
std::vector<Target> module_targets(torch::nn::Module& module) {
  std::vector<Target> targets;
  std::map<const void*, std::size_t> index;
  const auto add = [&](Kind kind, const std::string& name, const at::Tensor& t) {
    if (!t.defined()) return;
    const auto [it, fresh] = index.emplace(t.unsafeGetTensorImpl(), targets.size());
    if (fresh) targets.push_back({kind, {}, t});
    targets[it->second].names.push_back(name);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) add(Kind::Param, p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) add(Kind::Buffer, b.key(), b.value());
  return targets;
}

// Gives each target its record (by the first of its names the run holds a
// record of) and returns what stops the load: targets with none, or of
// another shape or dtype, and under `strict` records no target took; empty
// when every target can be set.
std::string match_records(std::vector<Target>& targets, const StepRecords& records, bool strict) {
  std::vector<std::string> missing, mismatched, extra;
  std::unordered_set<const detail::IndexRecord*> used;
  for (Target& t : targets) {
    for (const std::string& n : t.names) {
      const auto it = records.find({t.kind, n});
      if (it == records.end()) continue;
      t.record = &it->second;
      break;
    }
    if (t.record == nullptr) {
      missing.push_back(fmt::format("{} '{}'", kind_name(t.kind), t.names.front()));
      continue;
    }
    used.insert(t.record);
    for (const std::string& n : t.names) {
      const auto it = records.find({t.kind, n});
      if (it != records.end()) used.insert(&it->second);
    }
    const detail::IndexRecord& r = *t.record;
    if (c10::IntArrayRef(r.shape) != t.tensor.sizes() || !detail::holds_dtype(r, t.tensor.scalar_type()))
      mismatched.push_back(fmt::format("{} '{}' is {} {} in the run and {} {} in the module", kind_name(r.kind),
                                       r.name, r.dtype, shape_text(r.shape),
                                       detail::index_dtype_name(t.tensor.scalar_type()), shape_text(t.tensor.sizes())));
  }
  if (strict)
    for (const auto& [key, r] : records)
      if (used.count(&r) == 0) extra.push_back(fmt::format("{} '{}'", kind_name(key.first), key.second));

  std::string problems;
  const auto say = [&](const std::vector<std::string>& names, const char* what) {
    if (!names.empty()) problems += fmt::format("; {} {}: {}", names.size(), what, some(names));
  };
  say(missing, "not recorded at that step (record kinds param and buffer)");
  say(mismatched, "of another shape or dtype");
  say(extra, "recorded but not in the module (strict=false loads the rest)");
  return problems;
}

}  // namespace

void load_params(torch::nn::Module& module, const std::string& run, std::int64_t step, std::int64_t rank,
                 bool strict) {
  const detail::Dir dir = detail::open_rank_dir(run, rank);
  const StepRecords records = step_records(dir, run, step);
  std::vector<Target> targets = module_targets(module);
  const std::string problems = match_records(targets, records, strict);
  if (!problems.empty())
    detail::fail("load_params: run '{}' step {}{}: nothing was set{}", run, step,
                 rank != 0 ? fmt::format(" rank {}", rank) : std::string(), problems);
  if (records.empty() && targets.empty()) return;

  // Every record read before any is set: a file that cannot be read sets
  // nothing either.
  std::vector<at::Tensor> values;
  values.reserve(targets.size());
  for (const Target& t : targets) values.push_back(detail::read_record(dir, dir.path(), *t.record));
  c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i].tensor.copy_(values[i]);
}

}  // namespace tensortap
