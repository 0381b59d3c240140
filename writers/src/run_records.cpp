#include "writers/src/run_records.h"

#include <fcntl.h>

#include <algorithm>
#include <limits>
#include <string_view>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "writers/src/check.h"
#include "writers/src/dtypes.h"
#include "writers/src/json.h"
#include "writers/src/npy/format.h"
#include "writers/src/run_dir.h"

#ifdef TENSORTAP_HAVE_HDF5
#include "writers/src/hdf5/read.h"
#endif

namespace tensortap::detail {
namespace {

// A strict reader of the one JSON form the index has: an object of
// strings, integers and arrays of integers (what append_index_line
// writes, and the Python twin's writer). Anything else is refused.
class LineParser {
 public:
  LineParser(std::string_view s, const std::string& where) : s_(s), where_(where) {}

  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: {} (at byte {} of the line)", where_, what, i_);
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool take(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) bad(fmt::format("expected '{}'", c));
  }
  bool at_end() {
    space();
    return i_ == s_.size();
  }

  std::int64_t integer() {
    space();
    const std::size_t start = i_;
    bool negative = false;
    if (i_ < s_.size() && s_[i_] == '-') {
      negative = true;
      ++i_;
    }
    if (i_ == s_.size() || s_[i_] < '0' || s_[i_] > '9') bad("expected an integer");
    std::uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const auto d = static_cast<std::uint64_t>(s_[i_++] - '0');
      if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - d) / 10)
        bad(fmt::format("the integer {} does not fit 63 bits", s_.substr(start, i_ - start)));
      v = v * 10 + d;
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) bad("expected an integer, not a fraction");
    return negative ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
  }

  std::string string() {
    space();
    std::string out;
    // A name's byte that is not UTF-8 is \udcXX (Python's surrogateescape,
    // as the writers put it): the byte itself.
    const std::string problem = read_json_string(s_, i_, out, /*utf8=*/false, /*surrogateescape=*/true);
    if (!problem.empty()) bad(problem);
    return out;
  }

  std::vector<std::int64_t> integers() {
    expect('[');
    std::vector<std::int64_t> out;
    if (take(']')) return out;
    do {
      out.push_back(integer());
    } while (take(','));
    expect(']');
    return out;
  }

 private:
  std::string_view s_;
  const std::string& where_;
  std::size_t i_ = 0;
};

Kind kind_named(const std::string& name, const LineParser& p) {
  for (Kind k : kAllKinds)
    if (name == kind_name(k)) return k;
  p.bad(fmt::format("a kind tensortap does not have: '{}'", name));
}

// A record's file must stay inside the rank's directory: relative, no "..",
// no empty or "." component. (Dir::open_file refuses links on the way too.)
void check_inside(const std::string& file, const std::string& where) {
  if (file.empty() || file.front() == '/') fail("{}: the file '{}' is not a path inside the run", where, file);
  std::size_t start = 0;
  while (start <= file.size()) {
    const std::size_t end = std::min(file.find('/', start), file.size());
    const std::string_view part(file.data() + start, end - start);
    if (part.empty() || part == "." || part == "..")
      fail("{}: the file '{}' is not a path inside the run", where, file);
    start = end + 1;
  }
}

// The dtype the index names (PyTorch's Python name: "float32", "bfloat16").
std::optional<c10::ScalarType> index_dtype(const std::string& name) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto t = static_cast<c10::ScalarType>(i);
    const DtypeInfo* info = dtype_info(t);
    if (info != nullptr && name == info->name) return t;
  }
  return std::nullopt;
}

}  // namespace

IndexRecord parse_index_line(std::string_view line, const std::string& where) {
  LineParser p(line, where);
  IndexRecord r;
  bool seen[10] = {};
  static constexpr const char* kMembers[10] = {"step", "kind", "name", "dtype", "shape",
                                               "file", "offset", "nbytes", "dataset", "row"};
  p.expect('{');
  if (!p.take('}')) {
    do {
      const std::string key = p.string();
      p.expect(':');
      std::size_t k = 0;
      while (k < 10 && key != kMembers[k]) ++k;
      if (k == 10) p.bad(fmt::format("a member the index does not have: '{}'", key));
      if (seen[k]) p.bad(fmt::format("the member '{}' twice", key));
      seen[k] = true;
      switch (k) {
        case 0: r.step = p.integer(); break;
        case 1: r.kind = kind_named(p.string(), p); break;
        case 2: r.name = p.string(); break;
        case 3: r.dtype = p.string(); break;
        case 4: r.shape = p.integers(); break;
        case 5: r.file = p.string(); break;
        case 6: r.offset = static_cast<std::uint64_t>(p.integer()); break;
        case 7: r.nbytes = static_cast<std::uint64_t>(p.integer()); break;
        case 8: r.dataset = p.string(); break;
        case 9: r.row = p.integer(); break;
      }
    } while (p.take(','));
    p.expect('}');
  }
  if (!p.at_end()) p.bad("more after the line's object");
  for (std::size_t k : {0, 1, 2, 3, 4, 5})
    if (!seen[k]) p.bad(fmt::format("no member '{}'", kMembers[k]));
  if (r.step < 0) p.bad("a negative step");
  for (std::int64_t d : r.shape)
    if (d < 0) p.bad("a negative dimension");
  return r;
}

Dir open_rank_dir(const std::string& path, std::int64_t rank) {
  TENSORTAP_CHECK(rank >= 0, "the rank {} of run '{}' is negative", rank, path);
  Dir root = Dir::open(path, /*create=*/false);
  const std::string name = fmt::format("rank{}", rank);
  if (root.exists(name)) return root.sub(name, /*create=*/false);
  TENSORTAP_CHECK(root.exists("index.jsonl") || root.exists("run.json"),
                  "'{}' holds no run: no index.jsonl, no run.json and no {}/", path, name);
  TENSORTAP_CHECK(rank == 0, "run '{}' has one rank, not a rank {}", path, rank);
  return root;
}

namespace {

// The records of one index file `name` of `dir`, appended to `out`.
void read_index_file(const Dir& dir, const std::string& path, const std::string& name, std::vector<IndexRecord>& out) {
  const File f = dir.open_file(name, O_RDONLY | O_NONBLOCK);
  const struct stat st = f.status();
  TENSORTAP_CHECK(S_ISREG(st.st_mode), "'{}/{}' is not a regular file", path, name);
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  text.resize(f.pread_upto(text.data(), text.size(), 0));
  std::size_t start = 0, line = 1;
  while (start < text.size()) {
    const std::size_t nl = text.find('\n', start);
    const std::string_view s(text.data() + start, (nl == std::string::npos ? text.size() : nl) - start);
    const std::string where = fmt::format("'{}/{}' line {}", path, name, line);
    if (nl == std::string::npos) {
      // A last line a crash cut short is no record, as for the Python reader.
      try {
        out.push_back(parse_index_line(s, where));
      } catch (const Error&) {
      }
      break;
    }
    if (!s.empty()) out.push_back(parse_index_line(s, where));
    start = nl + 1;
    ++line;
  }
}

// n of index.<n>.jsonl (an index segment's name, run_dir.h).
std::uint32_t segment_number(const std::string& name) {
  return static_cast<std::uint32_t>(std::stoul(name.substr(6, name.size() - 12)));
}

}  // namespace

std::vector<IndexRecord> read_index(const Dir& dir, const std::string& path) {
  // index.jsonl, then its segments in order (Budget::KeepLatest writes
  // them, and deletes those whose steps it gave up, index.jsonl included).
  std::vector<std::uint32_t> segments;
  for (const std::string& name : dir.list())
    if (name.front() != '.' && is_index_segment_name(name)) segments.push_back(segment_number(name));
  std::sort(segments.begin(), segments.end());
  std::vector<IndexRecord> out;
  // index.jsonl is what a run without segments must have.
  if (segments.empty()) read_index_file(dir, path, "index.jsonl", out);
  if (!segments.empty()) segments.insert(segments.begin(), 0);
  for (std::uint32_t n : segments) {
    try {
      read_index_file(dir, path, index_segment_name(n), out);
    } catch (const Error& e) {
      // Deleted since the listing (its steps given up): no records.
      if (e.code() != std::errc::no_such_file_or_directory) throw;
    }
  }
  return out;
}

std::int64_t given_up_below(const Dir& dir) {
  // run.json as the recorder writes it ("given_up_below": <integer>, in
  // "budget"); anything else there is no marker.
  if (!dir.exists("run.json")) return -1;
  const File f = dir.open_file("run.json", O_RDONLY | O_NONBLOCK);
  if (!S_ISREG(f.status().st_mode)) return -1;
  // The whole file (a closed run lists every dump before "budget"), up to
  // a size no run.json of tensortap's reaches.
  std::string text(static_cast<std::size_t>(std::min<std::uint64_t>(f.size(), std::uint64_t{256} << 20)), '\0');
  text.resize(f.pread_upto(text.data(), text.size(), 0));
  constexpr std::string_view kKey = "\"given_up_below\": ";
  const std::size_t at = text.find(kKey);
  if (at == std::string::npos) return -1;
  std::int64_t k = 0;
  std::size_t i = at + kKey.size(), digits = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 18; ++i, ++digits) k = k * 10 + (text[i] - '0');
  if (digits == 0 || (i < text.size() && text[i] >= '0' && text[i] <= '9')) return -1;
  return k;
}

bool holds_dtype(const IndexRecord& record, c10::ScalarType dtype) {
  const std::optional<c10::ScalarType> t = index_dtype(record.dtype);
  return t && *t == dtype;
}

std::string index_dtype_name(c10::ScalarType dtype) { return dtype_name(dtype); }

at::Tensor read_record(const Dir& dir, const std::string& path, const IndexRecord& r) {
  const std::string where = fmt::format("run '{}': {} '{}' step {}", path, kind_name(r.kind), r.name, r.step);
  check_inside(r.file, where);
  const std::optional<c10::ScalarType> dtype = index_dtype(r.dtype);
  TENSORTAP_CHECK(dtype.has_value(), "{}: a dtype this LibTorch does not have, or tensortap does not store: '{}'",
                  where, r.dtype);
  const DtypeInfo* info = dtype_info(*dtype);
  TENSORTAP_CHECK(info != nullptr, "{}: a dtype tensortap does not store: '{}'", where, r.dtype);
  at::Tensor t;
  if (!r.dataset.empty()) {
#ifdef TENSORTAP_HAVE_HDF5
    TENSORTAP_CHECK(r.row.has_value(), "{}: an HDF5 record without a row", where);
    t = read_hdf5_row(dir, r.file, r.dataset, *r.row, r.shape, *info, where);
#else
    fail("{}: this tensortap was built without HDF5 (TENSORTAP_WITH_HDF5), so it cannot read '{}'", where,
         dir.path_of(r.file));
#endif
  } else {
    t = load_npy_at(dir, r.file, r.offset.value_or(0));
  }
  TENSORTAP_CHECK(t.sizes() == c10::IntArrayRef(r.shape), "{}: the file holds shape [{}], the index says [{}]", where,
                  fmt::join(t.sizes(), ", "), fmt::join(r.shape, ", "));
  TENSORTAP_CHECK(t.scalar_type() == info->stored, "{}: the file holds {}, not what {} is stored as", where,
                  dtype_name(t.scalar_type()), r.dtype);
  // Back to the dtype captured: bfloat16 was widened exactly, a float8 is
  // its codes.
  if (info->bits) return t.view(*dtype);
  return t.scalar_type() == *dtype ? t : t.to(*dtype);
}

}  // namespace tensortap::detail
