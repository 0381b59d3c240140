#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <thread>

#include <ATen/ATen.h>

#include <tensortap/error.h>
#include <tensortap/npy.h>

#include "tests/support/helpers.h"
#include "writers/src/npy/format.h"

using tt_test::TempDir;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A .npy file made by hand, the way NumPy lays it out.
std::string npy_file(int major, const std::string& dict, const std::string& data) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const size_t n = header.size();
  for (size_t b = 0; b < (major == 1 ? 2u : 4u); ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xFF));
  return out + header + data;
}

std::string error_of(const std::string& path) {
  try {
    tensortap::load_npy(path);
  } catch (const tensortap::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("npy header pads data to 64 bytes", "[writers][npy]") {
  using tensortap::detail::npy_header;
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{}, {0}, {5}, {2, 3}, {1, 2, 3, 4, 5, 6, 7, 8}, {123456789, 987654321}}) {
    const std::string h = npy_header("<f4", shape);
    CAPTURE(shape);
    REQUIRE(h.size() % 64 == 0);
    REQUIRE(h.compare(0, 6, "\x93NUMPY") == 0);
    REQUIRE(h[6] == 1);
    REQUIRE(h[7] == 0);
    const size_t len = static_cast<unsigned char>(h[8]) | (static_cast<unsigned char>(h[9]) << 8);
    REQUIRE(len + 10 == h.size());
    REQUIRE(h.back() == '\n');
  }
}

TEST_CASE("npy header text is what NumPy writes", "[writers][npy]") {
  using tensortap::detail::npy_header;
  const std::string h = npy_header("<f4", {2, 3});
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  REQUIRE(h.substr(10, dict.size()) == dict);
  REQUIRE(h.substr(10 + dict.size()).find_first_not_of(' ') == h.size() - 10 - dict.size() - 1);
  REQUIRE(npy_header("|b1", {7}).find("'shape': (7,), }") != std::string::npos);
  REQUIRE(npy_header("<f8", {}).find("'shape': (), }") != std::string::npos);
}

TEST_CASE("npy header switches to format 2.0 when it outgrows 16 bits", "[writers][npy]") {
  std::vector<std::int64_t> shape(30000, 1);  // "1, " each: past 65535 bytes
  const std::string h = tensortap::detail::npy_header("<f4", shape);
  REQUIRE(h[6] == 2);
  REQUIRE(h.size() % 64 == 0);
  std::uint32_t len = 0;
  std::memcpy(&len, h.data() + 8, 4);
  REQUIRE(len + 12 == h.size());
}

TEST_CASE("save_npy and load_npy round-trip every dtype", "[writers][npy]") {
  TempDir dir;
  const at::Tensor base = at::arange(24, at::kDouble).reshape({2, 3, 4}) - 7;
  for (auto dtype : {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf, at::kFloat,
                     at::kDouble, at::kComplexFloat, at::kComplexDouble}) {
    CAPTURE(c10::toString(dtype));
    at::Tensor t = dtype == at::kByte ? (base + 7).to(dtype) : base.to(dtype);
    if (at::isComplexType(dtype)) t = t + at::mul(base.to(dtype), c10::complex<double>(0, 0.5));
    const std::string path = dir / (std::string(c10::toString(dtype)) + ".npy");
    tensortap::save_npy(path, t);
    const at::Tensor back = tensortap::load_npy(path);
    REQUIRE(back.scalar_type() == dtype);
    REQUIRE(back.sizes() == t.sizes());
    REQUIRE(at::equal(back, t));
  }
}

TEST_CASE("save_npy stores bfloat16 as float32 exactly", "[writers][npy]") {
  TempDir dir;
  const at::Tensor t = (at::arange(10, at::kFloat) * 0.375 - 1).to(at::kBFloat16);
  tensortap::save_npy(dir / "b.npy", t);
  const at::Tensor back = tensortap::load_npy(dir / "b.npy");
  REQUIRE(back.scalar_type() == at::kFloat);
  REQUIRE(at::equal(back, t.to(at::kFloat)));
}

TEST_CASE("load_npy reads big-endian, Fortran-order and format 2.0 and 3.0 files", "[writers][npy]") {
  TempDir dir;
  // int32 [[1, 2, 3], [4, 5, 6]], big-endian, stored column by column.
  std::string data;
  for (int v : {1, 4, 2, 5, 3, 6}) data += std::string{0, 0, 0, static_cast<char>(v)};
  write_bytes(dir / "f.npy", npy_file(1, "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }", data));
  const at::Tensor t = tensortap::load_npy(dir / "f.npy");
  REQUIRE(t.scalar_type() == at::kInt);
  REQUIRE(at::equal(t, at::arange(1, 7, at::kInt).reshape({2, 3})));
  REQUIRE(t.is_contiguous());

  std::string f64(16, '\0');
  const double vals[2] = {1.5, -2.25};
  std::memcpy(f64.data(), vals, 16);
  for (int major : {2, 3}) {
    write_bytes(dir / "v.npy", npy_file(major, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2,)}", f64));
    REQUIRE(at::equal(tensortap::load_npy(dir / "v.npy"), at::tensor({1.5, -2.25}, at::kDouble)));
  }
}

TEST_CASE("load_npy rejects malformed files with the file name and the reason", "[writers][npy]") {
  TempDir dir;
  const std::string p = dir / "bad.npy";
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  struct Case {
    const char* what;
    std::string bytes;
    const char* reason;
  };
  std::string long_len = npy_file(1, ok_dict, std::string(8, '\0'));
  long_len[8] = '\xff';
  long_len[9] = '\xff';
  const Case cases[] = {
      {"bad magic", "\x93NUMPX\x01\x00" + std::string(100, ' '), "bad magic"},
      {"empty", "", "bad magic"},
      {"unknown version", npy_file(1, ok_dict, std::string(8, '\0')).replace(6, 1, "\x07"), "version 7"},
      {"header past the end", long_len, "past the end"},
      {"not a dict", npy_file(1, "['descr', '<f4']", ""), "not a Python dict"},
      {"object dtype", npy_file(1, "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", ""), "dtype '|O'"},
      {"structured dtype", npy_file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", ""),
       "quoted string"},
      {"negative shape", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", ""), "negative"},
      {"overflowing shape",
       npy_file(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }", ""),
       "overflows"},
      {"empty shape whose other axes overflow",
       npy_file(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4611686018427387904, 4), }", ""),
       "overflows"},
      {"shape larger than the file",
       npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,), }", std::string(8, '\0')),
       "needs 4000000000 bytes"},
      {"truncated data", npy_file(1, ok_dict, std::string(5, '\0')), "needs 8 bytes"},
      {"missing key", npy_file(1, "{'descr': '<f4', 'shape': (2,), }", std::string(8, '\0')), "lacks"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    write_bytes(p, c.bytes);
    const std::string err = error_of(p);
    REQUIRE_THAT(err, Catch::Contains(p));
    REQUIRE_THAT(err, Catch::Contains(c.reason));
  }
  REQUIRE_THAT(error_of(dir / "missing.npy"), Catch::Contains("No such file"));
}

namespace {

// How many mappings of `path` this process holds.
int mappings_of(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find(path) != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE("load_npy can map a file instead of reading it", "[writers][npy]") {
  TempDir dir;
  const std::string p = dir / "m.npy";
  const at::Tensor t = at::arange(4096, at::kFloat).reshape({64, 64});
  tensortap::save_npy(p, t);
  {
    at::Tensor m = tensortap::load_npy(p, tensortap::LoadOptions().mmap(true));
    REQUIRE(mappings_of(p) == 1);
    REQUIRE(at::equal(m, t));
    at::Tensor view = m[3];  // keeps the storage, and so the mapping, alive
    m = at::Tensor();
    REQUIRE(mappings_of(p) == 1);
    view.fill_(-1);  // copy-on-write: the file keeps its values
    REQUIRE(at::equal(tensortap::load_npy(p), t));
  }
  REQUIRE(mappings_of(p) == 0);  // released when the last tensor died

  // Fortran order maps to a transposed view; the other byte order is read.
  std::string data;
  for (int v : {1, 4, 2, 5, 3, 6}) data += std::string{static_cast<char>(v), 0, 0, 0};
  write_bytes(dir / "f.npy", npy_file(1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", data));
  const at::Tensor f = tensortap::load_npy(dir / "f.npy", tensortap::LoadOptions().mmap(true));
  REQUIRE(at::equal(f, at::arange(1, 7, at::kInt).reshape({2, 3})));
  REQUIRE_FALSE(f.is_contiguous());
  std::reverse(data.begin(), data.end());  // now big-endian, back to front
  write_bytes(dir / "b.npy", npy_file(1, "{'descr': '>i4', 'fortran_order': False, 'shape': (6,), }", data));
  REQUIRE(at::equal(tensortap::load_npy(dir / "b.npy", tensortap::LoadOptions().mmap(true)),
                    at::tensor({6, 3, 5, 2, 4, 1}, at::kInt)));
  // Empty arrays have nothing to map.
  tensortap::save_npy(dir / "e.npy", at::empty({0, 5}));
  REQUIRE(tensortap::load_npy(dir / "e.npy", tensortap::LoadOptions().mmap(true)).sizes() == at::IntArrayRef{0, 5});
}

TEST_CASE("load_npy refuses a FIFO at once instead of waiting for a writer", "[writers][npy]") {
  TempDir dir;
  const std::string fifo = dir / "planted.npy";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Before: open() blocked until someone opened the FIFO for writing, which
  // nobody does. Run in a thread so a regression fails here, not hangs.
  // (Detached: a std::async future would wait for a hung thread.)
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  std::thread([done, fifo] { done->set_value(tt_test::error_of([&] { tensortap::load_npy(fifo); })); }).detach();
  REQUIRE(result.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  const std::string error = result.get();
  CHECK_THAT(error, Catch::Contains("planted.npy"));
  CHECK_THAT(error, Catch::Contains("not a regular file"));
  // And at an offset, as for a packed segment.
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_npy(fifo, 128); }), Catch::Contains("not a regular file"));
}
