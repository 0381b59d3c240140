#include "writers/src/npy/writer.h"

#include <sys/stat.h>

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
          std::uint64_t& written)
      : dir_(std::move(dir)),
        file_(dir_, std::move(file)),
        rel_(std::move(rel_path)),
        header_(std::move(header)),
        size_(header_.size() + nbytes),
        left_(nbytes),
        written_(written) {}

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
    written_ += size_;
    std::string loc = "\"file\":";
    append_json_string(loc, rel_);
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
  std::uint64_t& written_;    // the writer's count, which outlives the sink
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
                                   npy_header(npy_descr(meta.dtype.element), meta.shape), meta.nbytes, bytes_);
}

}  // namespace tensortap::detail
