#include "sdk/src/sinks/run_json.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sdk/src/sinks/option_table.h"
#include "writers/src/json.h"
#include "writers/src/versions.h"

namespace tensortap::detail {
namespace {

// A double as JSON: NaN and infinities, which JSON lacks, as null.
std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// run.json's "aliases", when a tensor has several names:
// {"tok.weight": ["lm_head.weight"]}: one tensor, recorded once.
void append_aliases(std::string& j, const RunInfo& info) {
  if (info.aliases.empty()) return;
  j += "  \"aliases\": {";
  for (std::size_t i = 0; i < info.aliases.size(); ++i) {
    j += i ? ", " : "";
    append_json_string(j, info.aliases[i].first);
    j += ": [";
    for (std::size_t k = 0; k < info.aliases[i].second.size(); ++k) {
      j += k ? ", " : "";
      append_json_string(j, info.aliases[i].second[k]);
    }
    j += "]";
  }
  j += "},\n";
}

// run.json's "taps", when watch() bound any that declare what flows
// through them: {"hidden1": "relu"}: what the health rules judge the tap by.
void append_taps(std::string& j, const RunInfo& info) {
  if (info.taps.empty()) return;
  j += "  \"taps\": {";
  for (std::size_t i = 0; i < info.taps.size(); ++i) {
    j += i ? ", " : "";
    append_json_string(j, info.taps[i].first);
    j += ": ";
    append_json_string(j, info.taps[i].second);
  }
  j += "},\n";
}

// run.json's "budget" under Options::max_bytes, and "monitoring" once the
// budget stopped the statistics.
void append_budget(std::string& j, const BudgetState& b) {
  const auto step_or_null = [](std::int64_t s) { return s < 0 ? std::string("null") : std::to_string(s); };
  j += fmt::format(
      "  \"budget\": {{\"max_bytes\": {}, \"policy\": \"{}\", \"reached_at_step\": {}, \"refused_records\": {}, "
      "\"refused_bytes\": {}, \"given_up_below\": {}",
      b.max_bytes, b.policy == Budget::KeepLatest ? "keep_latest" : "stop_capture", step_or_null(b.reached_at_step),
      b.refused_records, b.refused_bytes, step_or_null(b.given_up_below));
  // KeepLatest's give-ups of dumped steps, statistics and events (docs/design.md#runjson).
  if (b.dumps_given_up_below >= 0) j += fmt::format(", \"dumps_given_up_below\": {}", b.dumps_given_up_below);
  if (!b.kept_below.empty()) {
    j += ", \"kept_steps\": ";
    append_json_ints(j, b.kept_below);
  }
  if (b.dump_records_refused > 0) j += fmt::format(", \"dump_records_refused\": {}", b.dump_records_refused);
  if (b.late_records_refused > 0) j += fmt::format(", \"late_records_refused\": {}", b.late_records_refused);
  if (b.stats_rows_given_up > 0) j += fmt::format(", \"stats_rows_given_up\": {}", b.stats_rows_given_up);
  if (b.event_files_given_up > 0) j += fmt::format(", \"event_files_given_up\": {}", b.event_files_given_up);
  j += "},\n";
  if (b.statistics_stopped_at >= 0) {
    j += fmt::format("  \"monitoring\": {{\"statistics_stopped_at\": {}, \"reason\": ", b.statistics_stopped_at);
    append_json_string(j, b.stopped_reason);
    j += fmt::format(", \"resumed_at\": {}}},\n", step_or_null(b.resumed_at));
  }
}

}  // namespace

void append_dump_json(std::string& j, const Dump& d) {
  j += fmt::format("{{\"step\": {}, \"reason\": \"{}\", \"steps\": ", d.step, d.reason);
  append_json_ints(j, d.steps);
  if (d.trigger == "stall") {
    j += fmt::format(", \"last_step\": {}, \"stalled_seconds\": {}, \"waiting\": [", d.last_step,
                     json_number(d.stalled_seconds));
    for (std::size_t i = 0; i < d.waiting.size(); ++i) {
      j += i ? ", " : "";
      append_json_string(j, d.waiting[i]);
    }
    j += "]";
  }
  if (!d.refused_steps.empty()) {
    j += ", \"refused_steps\": ";
    append_json_ints(j, d.refused_steps);
    j += ", \"refused_reason\": ";
    append_json_string(j, d.refused_reason);
  }
  // Dumps no rule made have no tensor and no trigger.
  if (d.trigger != "user" && d.trigger != "stall" && d.trigger != "request") {
    j += fmt::format(", \"kind\": \"{}\", \"name\": ", kind_name(d.kind));
    append_json_string(j, d.name);
    j += fmt::format(", \"trigger\": {{\"kind\": \"{}\"", d.trigger);
    if (d.window > 0) j += fmt::format(", \"factor\": {}, \"window\": {}", d.factor, d.window);
    j += "}";
    if (d.window > 0)
      j += fmt::format(", \"value\": {}, \"median\": {}", json_number(d.value), json_number(d.median));
    // A health rule's: its measure and the bound it crossed, always.
    if (!std::isnan(d.threshold))
      j += fmt::format(", \"value\": {}, \"threshold\": {}", json_number(d.value), json_number(d.threshold));
  }
  j += "}";
}

std::string run_json(const Options& o, const RunInfo& info) {
  std::string j = "{\n";
  j += fmt::format("  \"format_version\": {},\n", kFormatVersion);
  j += fmt::format("  \"tensortap_version\": \"{}\",\n", kTensortapVersion);
  j += "  \"run_id\": ";
  append_json_string(j, info.run_id);
  j += ",\n";
  j += fmt::format("  \"torch_version\": \"{}\",\n", kTorchVersion);
  // Every setting, by the option table (sinks/option_table.h).
  j += "  \"options\": ";
  append_options_json(j, o, 4);
  j += ",\n  \"options_from_env\": ";
  if (info.options_from_env)
    append_json_string(j, *info.options_from_env);
  else
    j += "null";
  j += ",\n";
  j += fmt::format("  \"rank\": {},\n  \"world_size\": {},\n", info.rank, info.world_size);
  j += fmt::format("  \"start_time\": \"{}\",\n", info.start_time);
  // The last kListedDumps dumps, and how many came before them: run.json
  // keeps its size whatever the number of dumps (docs/design.md#runjson).
  const std::size_t omitted = info.dumps.size() > kListedDumps ? info.dumps.size() - kListedDumps : 0;
  j += "  \"dumps\": [";
  for (std::size_t i = omitted; i < info.dumps.size(); ++i) {
    j += i > omitted ? ",\n    " : "\n    ";
    append_dump_json(j, info.dumps[i]);
  }
  j += info.dumps.empty() ? "],\n" : "\n  ],\n";
  if (omitted > 0) j += fmt::format("  \"dumps_omitted\": {},\n", omitted);
  append_aliases(j, info);
  append_taps(j, info);
  if (info.budget) append_budget(j, *info.budget);
  if (info.closed) {
    j += fmt::format("  \"end_time\": \"{}\",\n", info.end_time);
    j += fmt::format("  \"records\": {},\n  \"bytes\": {},\n  \"dropped\": {},\n  \"errors\": {},\n",
                     info.counters.records, info.counters.bytes, info.counters.dropped, info.counters.errors);
    if (!info.first_error.empty()) {
      j += "  \"first_error\": ";
      append_json_string(j, info.first_error.substr(0, 2000));  // run.json keeps its size
      j += ",\n";
    }
  }
  j += fmt::format("  \"closed\": {}\n}}\n", info.closed ? "true" : "false");
  return j;
}

namespace {

// What close() adds to run.json besides the dumps: the end time, the
// counters and the first error (2,000 characters, escaped).
constexpr std::uint64_t kCloseBytes = 16384;

}  // namespace

void RunManifest::open(const Dir& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  dir_ = &dir;
  info_.start_time = utc_now();
  const std::string json = run_json(options_, info_);
  run_json_room_ = write_run_json(*dir_, json);
  run_json_need_ = json.size() + kCloseBytes;
}

void RunManifest::add_dump(const Dump& dump) {
  std::string line;
  append_dump_json(line, dump);
  line += '\n';
  // The lines of dumps whose append failed (none, but after a full disk),
  // then this one.
  std::string lines;
  std::size_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info_.dumps.push_back(dump);
    total = info_.dumps.size();
    for (std::size_t i = appended_; i + 1 < total; ++i) {
      append_dump_json(lines, info_.dumps[i]);
      lines += '\n';
    }
  }
  lines += line;
  // run.json lists the last kListedDumps: what close() needs follows them.
  listed_bytes_.push_back(line.size() + 8);
  run_json_need_ += listed_bytes_.back();
  if (listed_bytes_.size() > kListedDumps) {
    run_json_need_ -= listed_bytes_.front();
    listed_bytes_.pop_front();
  }
  // The files outside the lock: dumps() (Recorder::dumps(), on the training
  // thread) never waits for the disk. Only the writer thread gets here.
  //
  // close() lists every dump in run.json: its blocks grow ahead of that
  // text, doubling (so a reservation once in many dumps), so that close()
  // can still rewrite it in place on a full disk.
  if (run_json_need_ > run_json_room_) {
    run_json_room_ = 2 * run_json_need_;
    reserve_run_json(*dir_, run_json_room_);
  }
  // Created at the first dump, exclusively: RunDir removed or refused any
  // file of that name when the run opened.
  // With a disk budget it rolls to dumps.1.jsonl, one older generation kept.
  if (dumps_file_ && roll_bytes_ > 0 && dumps_file_->size() > 0 && dumps_file_->size() + lines.size() > roll_bytes_) {
    // Renamed while open (a failed rename leaves the file as it was).
    dir_->rename("dumps.jsonl", "dumps.1.jsonl");
    dumps_file_.reset();
  }
  if (!dumps_file_) dumps_file_ = std::make_unique<LinesFile>(*dir_, "dumps.jsonl");
  dumps_file_->append(lines);
  appended_ = total;
  // On disk before step() can see the dump and act on it.
  dumps_file_->datasync();
}

std::vector<Dump> RunManifest::dumps(std::size_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t n = std::min(limit, info_.dumps.size());
  return std::vector<Dump>(info_.dumps.begin(), info_.dumps.begin() + static_cast<std::ptrdiff_t>(n));
}

Dump RunManifest::last_dump(std::size_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t n = std::min(limit, info_.dumps.size());
  return n > 0 ? info_.dumps[n - 1] : Dump{};
}

void RunManifest::write_budget(const BudgetState& state) {
  std::string json;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info_.budget = state;
    json = run_json(options_, info_);
  }
  // The syncs outside the lock: dumps() (on the training thread) never
  // waits for the disk. Only the writer thread writes run.json before close().
  run_json_room_ = std::max(run_json_room_, write_run_json(*dir_, json, /*durable=*/true));
}

void RunManifest::add_aliases(const std::string& name, const std::vector<std::string>& others) {
  std::lock_guard<std::mutex> lock(mu_);
  // run.json's rewrite at close has kCloseBytes of room beyond what open
  // wrote (a full disk rewrites it in place): the list stays well inside.
  std::size_t bytes = 0;
  for (const auto& [n, o] : info_.aliases) {
    bytes += n.size() + 8;
    for (const std::string& x : o) bytes += x.size() + 4;
  }
  if (bytes > kCloseBytes / 2) return;
  info_.aliases.emplace_back(name, others);
}

void RunManifest::add_taps(const std::vector<std::pair<std::string, std::string>>& taps) {
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded as the aliases are (a model of ten thousand taps says the first).
  std::size_t bytes = 0;
  for (const auto& [n, w] : info_.taps) bytes += n.size() + w.size() + 8;
  for (const auto& [name, word] : taps) {
    if (bytes > kCloseBytes / 4) break;
    const auto same = [&](const auto& t) { return t.first == name; };
    if (std::find_if(info_.taps.begin(), info_.taps.end(), same) != info_.taps.end()) continue;
    info_.taps.emplace_back(name, word);
    bytes += name.size() + word.size() + 8;
  }
  taps_changed_.store(true);
}

void RunManifest::rewrite() {
  if (dir_ == nullptr) return;
  std::string json;
  {
    std::lock_guard<std::mutex> lock(mu_);
    json = run_json(options_, info_);
  }
  // What close() writes grows with what this one says.
  run_json_need_ = std::max<std::uint64_t>(run_json_need_, json.size() + kCloseBytes);
  run_json_room_ = std::max(run_json_room_, write_run_json(*dir_, json, /*durable=*/true));
  if (run_json_need_ > run_json_room_) {
    run_json_room_ = 2 * run_json_need_;
    reserve_run_json(*dir_, run_json_room_);
  }
}

void RunManifest::close(const Counters& counters, const std::string& first_error) {
  std::lock_guard<std::mutex> lock(mu_);
  // A closed run holds no file; the writer thread, which appends, has stopped.
  dumps_file_.reset();
  info_.closed = true;
  info_.end_time = utc_now();
  info_.counters = counters;
  info_.first_error = first_error;
  write_run_json(*dir_, run_json(options_, info_));
}

}  // namespace tensortap::detail
