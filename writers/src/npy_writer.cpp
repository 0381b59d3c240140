#include "writers/src/npy_writer.h"

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/file.h"
#include "writers/src/json.h"
#include "writers/src/npy_format.h"
#include "writers/src/paths.h"

namespace tensortap::detail {
namespace {

class NpySink final : public RecordSink {
 public:
  NpySink(const std::string& abs_path, std::string rel_path, std::string header,
          std::uint64_t nbytes)
      : file_(abs_path), rel_(std::move(rel_path)), header_(std::move(header)), left_(nbytes) {}

  void append(const void* data, std::size_t n) override {
    if (n > left_)
      throw Error(fmt::format("tensortap: record '{}' got more bytes than its shape holds", file_.path()));
    left_ -= n;
    // The header goes out with the first chunk: one system call for a small record.
    file_.write(header_.data(), header_.size(), data, n);
    header_.clear();
  }

  std::string finish() override {
    if (!header_.empty()) file_.write(header_.data(), header_.size());
    if (left_ != 0)
      throw Error(fmt::format("tensortap: record '{}' is {} bytes short", file_.path(), left_));
    file_.commit();
    std::string loc = "\"file\":";
    append_json_string(loc, rel_);
    return loc;
  }

 private:
  AtomicFile file_;
  std::string rel_;
  std::string header_;
  std::uint64_t left_;
};

}  // namespace

NpyWriter::NpyWriter(std::string dir) : dir_(std::move(dir)) {}

std::unique_ptr<RecordSink> NpyWriter::begin(const RecordMeta& meta) {
  const std::string rel_dir = fmt::format("npy/{}/{}", kind_name(meta.kind), encode_name(meta.name));
  const std::string abs_dir = dir_ + "/" + rel_dir;
  if (made_.count(rel_dir) == 0) {
    make_dirs(abs_dir);
    made_.insert(rel_dir);
  }
  const std::string file = step_stem(meta.step) + ".npy";
  return std::make_unique<NpySink>(abs_dir + "/" + file, rel_dir + "/" + file,
                                   npy_header(npy_descr(meta.stored), meta.shape), meta.nbytes);
}

}  // namespace tensortap::detail
