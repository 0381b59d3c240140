#include "writers/src/npy/writer.h"

#include <sys/stat.h>

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/check.h"
#include "writers/src/file.h"
#include "writers/src/json.h"
#include "writers/src/npy/format.h"
#include "writers/src/paths.h"

namespace tensortap::detail {
namespace {

class NpySink final : public RecordSink {
 public:
  NpySink(Dir dir, std::string file, std::string rel_path, std::string header, std::uint64_t nbytes,
          NpyWriter& writer, std::int64_t step)
      : dir_(std::move(dir)),
        file_(dir_, std::move(file)),
        rel_(std::move(rel_path)),
        header_(std::move(header)),
        size_(header_.size() + nbytes),
        left_(nbytes),
        writer_(writer),
        step_(step) {}

  void append(const void* data, std::size_t n) override {
    if (n > left_) fail("record '{}' got more bytes than its shape holds", file_.path());
    left_ -= n;
    // The header goes out with the first chunk: one system call for a small record.
    file_.write(header_.data(), header_.size(), data, n);
    header_.clear();
  }

  std::string finish() override {
    if (!header_.empty()) file_.write(header_.data(), header_.size());
    if (left_ != 0) fail("record '{}' is {} bytes short", file_.path(), left_);
    file_.commit();
    std::string loc = "\"file\":";
    append_json_string(loc, rel_);
    writer_.finished(step_, std::move(rel_), size_);
    return loc;
  }

 private:
  // The record's own directory, held open so the file lands in it whatever
  // happens to the path meanwhile; before file_, which uses it.
  Dir dir_;
  AtomicFile file_;
  std::string rel_;
  std::string header_;
  const std::uint64_t size_;  // of the whole file
  std::uint64_t left_;
  NpyWriter& writer_;  // outlives the sink
  const std::int64_t step_;
};

// A directory's own apparent size (du counts it).
std::uint64_t own_size(const Dir& d) {
  struct stat st {};
  return ::fstat(d.fd(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

}  // namespace

std::unique_ptr<RecordSink> NpyWriter::begin(const RecordDesc& meta) {
  const std::string rel_dir = fmt::format("npy/{}/{}", kind_name(meta.kind), encode_name(meta.name));
  const bool create = made_.count(rel_dir) == 0;
  Dir dir = dir_.sub(rel_dir, create);
  if (create) {
    made_.insert(rel_dir);
    bytes_ += own_size(dir);
    // Its kind's directory, the first time (npy/ itself sits at the top).
    const std::string kind_dir = fmt::format("npy/{}", kind_name(meta.kind));
    if (made_.insert(kind_dir).second) bytes_ += own_size(dir_.sub(kind_dir, false));
  }
  std::string file = step_stem(meta.step) + ".npy";
  std::string rel = rel_dir + "/" + file;
  return std::make_unique<NpySink>(std::move(dir), std::move(file), std::move(rel),
                                   npy_header(npy_descr(meta.dtype.element), meta.shape), meta.nbytes, *this,
                                   meta.step);
}

void NpyWriter::finished(std::int64_t step, std::string rel, std::uint64_t bytes) {
  bytes_ += bytes;
  if (keep_latest_) steps_[step].push_back(StepFile{std::move(rel), bytes});
}

std::uint64_t NpyWriter::bytes_held_by(std::int64_t step) const {
  std::uint64_t n = 0;
  if (auto it = steps_.find(step); it != steps_.end())
    for (const StepFile& k : it->second) n += k.bytes;
  return n;
}

Writer::GiveUp NpyWriter::plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                                       const std::set<std::int64_t>& kept) const {
  // Oldest step first, up to what is wanted: as long as the steps given up.
  GiveUp g{from, 0};
  for (auto it = steps_.begin(); it != steps_.end() && it->first < limit && g.bytes < want; ++it) {
    if (kept.count(it->first) != 0) continue;
    for (const StepFile& k : it->second) g.bytes += k.bytes;
    g.below = std::max(g.below, it->first + 1);
  }
  if (g.bytes < want) g.below = std::max(from, limit);
  return g;
}

std::uint64_t NpyWriter::give_up(std::int64_t below, const std::set<std::int64_t>& kept) {
  std::uint64_t freed = 0;
  std::exception_ptr first;
  for (auto it = steps_.begin(); it != steps_.end() && it->first < below;) {
    if (kept.count(it->first) != 0) {
      ++it;
      continue;
    }
    for (const StepFile& k : it->second) {
      try {
        dir_.unlink(k.rel);
        bytes_ -= k.bytes;
        freed += k.bytes;
      } catch (...) {
        // It stays (counted, hidden all the same); the rest still go, and
        // it is not tried again at each give-up.
        if (!first) first = std::current_exception();
      }
    }
    it = steps_.erase(it);
  }
  if (first) std::rethrow_exception(first);
  return freed;
}

}  // namespace tensortap::detail
