// Format::Packed: .npy images appended to packed/<n>.npys at 64-byte-aligned
// offsets. Python's side (np.load at the offset, the reader) is in
// test_reader.py, on the runs e2e_writer makes.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include <ATen/ATen.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "writers/src/file.h"
#include "writers/src/npy/format.h"
#include "writers/src/packed/writer.h"

namespace fs = std::filesystem;
using tensortap::Format;
using tensortap::Options;
using tensortap::PackedOptions;
using tensortap::Recorder;
using tt_test::TempDir;

namespace {

struct Located {
  std::string name;
  std::int64_t step = 0;
  std::string file;
  std::uint64_t offset = 0;
  std::uint64_t nbytes = 0;
};

// The index lines of a packed run, in order.
std::vector<Located> packed_records(const std::string& run) {
  static const std::regex re(
      R"re("step":(\d+),"kind":"[a-z_]+","name":"([^"]*)".*"file":"([^"]*)","offset":(\d+),"nbytes":(\d+)\})re");
  std::vector<Located> out;
  for (const auto& line : tt_test::read_lines(run + "/index.jsonl")) {
    std::smatch m;
    REQUIRE(std::regex_search(line, m, re));
    out.push_back({m[2], std::stoll(m[1]), m[3], std::stoull(m[4]), std::stoull(m[5])});
  }
  return out;
}

using tt_test::error_of;

// A float32 record of `n` elements, for the writer on its own.
tensortap::detail::RecordDesc float_record(const std::string& name, std::int64_t n) {
  tensortap::detail::RecordDesc d;
  d.name = name;
  d.shape = {n};
  d.nbytes = static_cast<std::uint64_t>(n) * 4;
  return d;
}

// Whether `got` holds exactly the bytes of `want` (NaNs and signed zeros included).
bool same_bytes(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor a = got.contiguous(), b = want.contiguous();
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("packed records are .npy images at 64-byte offsets, bit-exact for every dtype", "[writers][packed]") {
  TempDir dir;
  std::map<std::string, at::Tensor> want;
  const at::Tensor base = at::arange(12, at::kDouble).reshape({3, 4}) - 5;
  want["bool"] = base.remainder(2) == 0;
  want["uint8"] = (base + 5).to(at::kByte);
  want["int16"] = base.to(at::kShort);
  want["int64"] = base.to(at::kLong) * std::int64_t{1000000007};
  want["float16"] = (base * 0.5).to(at::kHalf);
  want["float32"] = at::tensor({1.5f, NAN, INFINITY, -INFINITY, -0.0f, 3e-40f});
  want["float64"] = base * 1e300;
  want["complex64"] = at::complex(base, -0.5 * base).to(at::kComplexFloat);
  want["complex128"] = at::complex(base, base * 3);
  want["bfloat16"] = (base * 0.25).to(at::kBFloat16);
  want["scalar"] = at::scalar_tensor(3.5, at::kDouble);
  want["empty"] = at::empty({0, 3});
  want["transposed"] = at::arange(6, at::kInt).reshape({2, 3}).t();
  {
    Recorder rec{Options(dir.path).format(Format::Packed)};
    rec.step(7);
    for (const auto& [name, t] : want) rec.capture(name, t);
    rec.close();
  }
  REQUIRE_THAT(tt_test::read_file(dir / "run.json"),
               Catch::Contains("\"format\": \"packed\"") && Catch::Contains("\"segment_bytes\": 1073741824"));
  const auto recs = packed_records(dir.path);
  REQUIRE(recs.size() == want.size());
  std::uint64_t last_end = 0;
  for (const auto& r : recs) {
    INFO(r.name << " at " << r.offset);
    REQUIRE(r.step == 7);
    REQUIRE(r.file == "packed/00000000.npys");
    REQUIRE(r.offset % 64 == 0);
    REQUIRE(r.offset >= last_end);  // records never overlap
    last_end = r.offset + r.nbytes;
    // The header is the one a .npy file gets: parse it from the image's bytes.
    const std::string seg = tt_test::read_file(dir / r.file);
    REQUIRE(r.offset + r.nbytes <= seg.size());
    const std::string image = seg.substr(r.offset, r.nbytes);
    const auto end = tensortap::detail::npy_header_end(image, image.size(), r.name);
    const auto h = tensortap::detail::parse_npy_header(image.substr(0, end), image.size(), r.name);
    REQUIRE(h.data_offset % 64 == 0);
    REQUIRE(h.data_offset + h.data_bytes == r.nbytes);
    const at::Tensor& t = want.at(r.name);
    const at::Tensor stored = t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
    REQUIRE(same_bytes(tensortap::load_npy(dir / r.file, r.offset), stored));
    REQUIRE(same_bytes(tensortap::load_npy(dir / r.file, r.offset, tensortap::LoadOptions().mmap(true)), stored));
  }
  // The gaps between records are zeros.
  const std::string seg = tt_test::read_file(dir / "packed/00000000.npys");
  std::uint64_t at_ = 0;
  for (const auto& r : recs) {
    for (std::uint64_t i = at_; i < r.offset; ++i) REQUIRE(seg[i] == '\0');
    at_ = r.offset + r.nbytes;
  }
}

TEST_CASE("packed segments roll at segment_bytes, between records", "[writers][packed]") {
  TempDir dir;
  {
    Recorder rec{Options(dir.path).format(Format::Packed).packed(PackedOptions().segment_bytes(8192))};
    for (std::int64_t s = 0; s < 10; ++s) {
      rec.step(s);
      rec.capture("small", at::full({8}, static_cast<float>(s)));
      rec.capture("big", at::full({500}, static_cast<double>(s), at::kDouble));  // 4000 bytes: two to a segment at most
    }
    rec.close();
  }
  const auto recs = packed_records(dir.path);
  REQUIRE(recs.size() == 20);
  std::set<std::string> files;
  for (const auto& r : recs) {
    INFO(r.name << " step " << r.step);
    files.insert(r.file);
    REQUIRE(r.offset % 64 == 0);
    REQUIRE(r.offset + r.nbytes <= 8192);
    const double v = static_cast<double>(r.step);
    if (r.name == "big")
      REQUIRE(at::equal(tensortap::load_npy(dir / r.file, r.offset), at::full({500}, v, at::kDouble)));
    else
      REQUIRE(at::equal(tensortap::load_npy(dir / r.file, r.offset), at::full({8}, v, at::kFloat)));
  }
  REQUIRE(files.size() >= 5);
  REQUIRE(files.size() < 20);  // segments are shared
  REQUIRE(files.count("packed/00000000.npys") == 1);
  REQUIRE(files.count("packed/00000001.npys") == 1);
  for (const auto& f : tt_test::files_under(dir / "packed")) {
    REQUIRE(f.extension() == ".npys");
    REQUIRE(fs::file_size(f) <= 8192);
  }
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir / "other").packed(PackedOptions().segment_bytes(100))}; }),
               Catch::Contains("segment_bytes(100)"));
}

TEST_CASE("a packed record larger than a staging buffer arrives in chunks, whole", "[writers][packed]") {
  TempDir dir;
  // Larger than staging (chunked) and than the writer's gathering buffer.
  const at::Tensor big = at::arange(3 << 20, at::kFloat) * 0.5f;
  {
    Recorder rec{Options(dir.path).format(Format::Packed).buffer_bytes(1 << 16)};
    rec.step(0);
    rec.capture("before", at::ones({3}));
    rec.capture("big", big);
    rec.capture("after", at::full({5}, 2.0));
    rec.close();
    REQUIRE(rec.counters().records == 3);
    REQUIRE(rec.counters().errors == 0);
  }
  const auto recs = packed_records(dir.path);
  REQUIRE(recs.size() == 3);
  for (const auto& r : recs) REQUIRE(r.offset % 64 == 0);
  REQUIRE(at::equal(tensortap::load_npy(dir / recs[0].file, recs[0].offset), at::ones({3})));
  REQUIRE(at::equal(tensortap::load_npy(dir / recs[1].file, recs[1].offset), big));
  REQUIRE(at::equal(tensortap::load_npy(dir / recs[2].file, recs[2].offset), at::full({5}, 2.0)));
}

TEST_CASE("the flight recorder and statistics work with Format::Packed", "[writers][packed]") {
  TempDir dir;
  {
    Recorder rec{Options(dir.path).format(Format::Packed).stats_every(1).flight_recorder(3)};
    for (std::int64_t s = 0; s < 20; ++s) {
      rec.step(s);
      rec.capture("w", at::full({16}, static_cast<float>(s)));
      rec.capture("loss", at::full({1}, s == 12 ? NAN : 1.0f));
    }
    rec.close();
    REQUIRE(rec.counters().dumps == 1);
  }
  std::set<std::int64_t> steps;
  for (const auto& r : packed_records(dir.path)) {
    steps.insert(r.step);
    if (r.name == "w")
      REQUIRE(at::equal(tensortap::load_npy(dir / r.file, r.offset), at::full({16}, static_cast<float>(r.step))));
  }
  REQUIRE(steps == std::set<std::int64_t>{9, 10, 11, 12});
  REQUIRE(fs::exists(dir / "stats.npy"));
  REQUIRE(tt_test::read_lines(dir / "stats_series.jsonl").size() == 2);
}

TEST_CASE("overwrite removes packed/, and a link planted there is refused, never followed", "[writers][packed]") {
  TempDir dir;
  {
    Recorder old{Options(dir.path).format(Format::Packed)};
    old.step(0);
    old.capture("a", at::ones({2}));
  }
  REQUIRE(fs::exists(dir / "packed/00000000.npys"));
  {
    Recorder fresh{Options(dir.path).overwrite(true)};  // an Npy run now
    fresh.step(0);
    fresh.capture("b", at::ones({2}));
  }
  REQUIRE_FALSE(fs::exists(dir / "packed"));

  TempDir outside;
  fs::create_directories(outside / "dir");
  TempDir run;
  fs::create_directory_symlink(outside / "dir", run / "packed");
  REQUIRE_THAT(error_of([&] { Recorder r{Options(run.path).format(Format::Packed)}; }),
               Catch::Contains("packed") && Catch::Contains("in the way"));
  {
    Recorder r{Options(run.path).format(Format::Packed).overwrite(true)};
    r.step(0);
    r.capture("x", at::ones({2}));
  }
  REQUIRE_FALSE(fs::is_symlink(run / "packed"));
  REQUIRE(fs::is_empty(outside / "dir"));

  // A link planted after the run opened, before its first record: the record
  // fails, naming the link, and nothing lands outside.
  TempDir late;
  Recorder r{Options(late.path).format(Format::Packed)};
  fs::create_directory_symlink(outside / "dir", late / "packed");
  r.step(0);
  r.capture("x", at::ones({2}));
  REQUIRE_THAT(error_of([&] { r.close(); }), Catch::Contains("packed") && Catch::Contains("link"));
  REQUIRE(r.counters().errors >= 1);
  REQUIRE(fs::is_empty(outside / "dir"));
}

TEST_CASE("a packed record dropped part way leaves an unindexed stretch the next one skips", "[writers][packed]") {
  using namespace tensortap::detail;
  TempDir dir;
  const Dir run = Dir::open(dir.path, false);
  PackedWriter w(run, PackedOptions());
  const RecordDesc d = float_record("x", 4);
  const float v[4] = {1, 2, 3, 4};
  {
    auto dropped = w.begin(d);
    dropped->append(v, 8);  // half its data, then gone
  }
  auto sink = w.begin(d);
  sink->append(v, 16);
  const std::string loc = sink->finish();
  // A short record is refused at finish(), naming the segment and the offset.
  {
    auto short_one = w.begin(d);
    REQUIRE_THAT(error_of([&] { short_one->finish(); }), Catch::Contains("00000000.npys") && Catch::Contains("short"));
  }
  REQUIRE(w.sync(true));
  w.close();
  std::smatch m;
  REQUIRE(std::regex_search(loc, m, std::regex(R"re("offset":(\d+),"nbytes":(\d+))re")));
  const std::uint64_t offset = std::stoull(m[1]);
  REQUIRE(offset > 0);
  REQUIRE(offset % 64 == 0);
  REQUIRE(at::equal(tensortap::load_npy(dir / "packed/00000000.npys", offset), at::tensor({1.f, 2.f, 3.f, 4.f})));
}

TEST_CASE("load_npy at an offset names the file and the offset when it cannot read", "[writers][packed]") {
  TempDir dir;
  std::ofstream(dir / "seg.npys", std::ios::binary) << std::string(128, 'x');
  REQUIRE_THAT(error_of([&] { tensortap::load_npy(dir / "seg.npys", 64); }),
               Catch::Contains("seg.npys") && Catch::Contains("offset 64"));
  REQUIRE_THAT(error_of([&] { tensortap::load_npy(dir / "seg.npys", 4096); }),
               Catch::Contains("seg.npys") && Catch::Contains("offset 4096") && Catch::Contains("past the end"));
}

TEST_CASE("Recorder::flush() makes packed records durable and indexed", "[writers][packed]") {
  TempDir dir;
  Recorder rec{Options(dir.path).format(Format::Packed)};
  for (std::int64_t s = 0; s < 5; ++s) {
    rec.step(s);
    rec.capture("x", at::full({3}, static_cast<float>(s)));
  }
  // Whatever the cadence did meanwhile, flush() forces the segment to disk
  // and every record's index line out.
  rec.flush();
  const auto recs = packed_records(dir.path);
  REQUIRE(recs.size() == 5);
  for (const auto& r : recs)
    REQUIRE(at::equal(tensortap::load_npy(dir / r.file, r.offset), at::full({3}, static_cast<float>(r.step))));
  rec.step(5);
  rec.capture("x", at::full({3}, 5.0f));
  rec.close();
  REQUIRE(packed_records(dir.path).size() == 6);
}

TEST_CASE("a packed record larger than segment_bytes gets a segment of its own", "[writers][packed][hostile]") {
  TempDir dir;
  const at::Tensor big = at::arange(4096, at::kFloat);  // 16 KiB, four times the segment size
  {
    Recorder rec{Options(dir.path).format(Format::Packed).packed(PackedOptions().segment_bytes(4096))};
    rec.step(0);
    rec.capture("small", at::ones({4}));
    rec.capture("big", big);
    rec.capture("after", at::full({4}, 3.0f));
    rec.close();
    REQUIRE(rec.counters().records == 3);
    REQUIRE(rec.counters().errors == 0);
  }
  const auto recs = packed_records(dir.path);
  REQUIRE(recs.size() == 3);
  REQUIRE(recs[1].offset == 0);  // it starts a segment, whole
  REQUIRE(recs[0].file != recs[1].file);
  REQUIRE(recs[1].file != recs[2].file);
  REQUIRE(at::equal(tensortap::load_npy(dir / recs[1].file, recs[1].offset), big));
  REQUIRE(at::equal(tensortap::load_npy(dir / recs[2].file, recs[2].offset), at::full({4}, 3.0f)));
}

TEST_CASE("a link planted at the next segment's name is refused, never followed", "[writers][packed][hostile]") {
  TempDir dir, outside;
  const std::string target = outside / "victim";
  {
    Recorder rec{Options(dir.path).format(Format::Packed).packed(PackedOptions().segment_bytes(4096))};
    rec.step(0);
    rec.capture("a", at::full({600}, 1.0f));  // 2.4 KiB: the next record rolls
    rec.flush();
    REQUIRE(fs::exists(dir / "packed/00000000.npys"));
    fs::create_symlink(target, dir / "packed/00000001.npys");
    rec.step(1);
    rec.capture("b", at::full({600}, 2.0f));
    const std::string err = error_of([&] { rec.close(); });
    REQUIRE_THAT(err, Catch::Contains("00000001.npys"));
    const auto s = rec.counters();
    REQUIRE(s.records + s.errors == s.captured);
    REQUIRE(s.records >= 1);
    REQUIRE(s.errors >= 1);
  }
  REQUIRE_FALSE(fs::exists(target));  // nothing was created through the link
  REQUIRE(fs::is_symlink(dir / "packed/00000001.npys"));
  const auto recs = packed_records(dir.path);
  REQUIRE(recs.size() == 1);
  REQUIRE(at::equal(tensortap::load_npy(dir / recs[0].file, recs[0].offset), at::full({600}, 1.0f)));
}

TEST_CASE("packed segments roll while a record is still arriving in chunks, and it finishes where it began",
          "[writers][packed][hostile]") {
  using namespace tensortap::detail;
  TempDir dir;
  const Dir run = Dir::open(dir.path, false);
  PackedWriter w(run, PackedOptions().segment_bytes(4096));
  const RecordDesc big = float_record("big", 3000);  // larger than a segment: it has one to itself
  const at::Tensor big_data = at::arange(3000, at::kFloat);
  auto big_sink = w.begin(big);
  big_sink->append(big_data.data_ptr(), 4000);  // its first chunk, then others' records meanwhile
  const RecordDesc small = float_record("small", 64);
  std::vector<std::string> locs;
  for (int i = 0; i < 40; ++i) {
    const at::Tensor v = at::full({64}, static_cast<float>(i));
    auto sink = w.begin(small);
    sink->append(v.data_ptr(), 256);
    locs.push_back(sink->finish());
    // Index lines are written only once sync() says every finished record is durable.
    if (i % 10 == 9) REQUIRE(w.sync(true));
  }
  big_sink->append(static_cast<const char*>(big_data.data_ptr()) + 4000, 8000);
  const std::string big_loc = big_sink->finish();
  REQUIRE(w.sync(true));
  w.close();

  const std::regex re(R"re("file":"([^"]*)","offset":(\d+),"nbytes":(\d+))re");
  std::map<std::string, int> per_file;
  for (std::size_t i = 0; i <= locs.size(); ++i) {
    const std::string& loc = i < locs.size() ? locs[i] : big_loc;
    std::smatch m;
    REQUIRE(std::regex_search(loc, m, re));
    ++per_file[m[1]];
    const at::Tensor got = tensortap::load_npy(dir / m[1].str(), std::stoull(m[2]));
    REQUIRE(at::equal(got, i < locs.size() ? at::full({64}, static_cast<float>(i)) : big_data));
  }
  REQUIRE(big_loc.find("\"file\":\"packed/00000000.npys\",\"offset\":0,") != std::string::npos);
  REQUIRE(per_file["packed/00000000.npys"] == 1);
  REQUIRE(per_file.size() >= 4);  // 40 x 384 bytes rolled on, with the big record live
  for (const auto& f : tt_test::files_under(dir / "packed"))
    if (f.filename() != "00000000.npys") REQUIRE(fs::file_size(f) <= 4096);
}

TEST_CASE("segment_bytes holds while one thread streams large records and another captures small ones",
          "[writers][packed][hostile]") {
  TempDir dir;
  const at::Tensor big = at::arange(1 << 20, at::kFloat);  // 4 MiB: in chunks through 64 KiB staging
  {
    Recorder rec{Options(dir.path)
                     .format(Format::Packed)
                     .buffer_bytes(64 << 10)
                     .packed(PackedOptions().segment_bytes(64 << 10))};
    rec.step(0);
    std::thread streamer([&] {
      for (int i = 0; i < 3; ++i) rec.capture("big", big);
    });
    for (int i = 0; i < 1000; ++i) rec.capture("small", at::full({256}, static_cast<float>(i)));
    streamer.join();
    rec.close();
    const auto s = rec.counters();
    REQUIRE(s.errors == 0);
    REQUIRE(s.records == s.captured);
  }
  std::map<std::string, int> per_file;
  for (const auto& r : packed_records(dir.path)) {
    ++per_file[r.file];
    INFO(r.name << " in " << r.file << " at " << r.offset);
    if (r.name.rfind("big", 0) == 0)
      REQUIRE(at::equal(tensortap::load_npy(dir / r.file, r.offset), big));
    else  // "small#k" is the capture of i = k, in order on this thread
      REQUIRE(at::equal(tensortap::load_npy(dir / r.file, r.offset),
                        at::full({256}, r.name == "small" ? 0.0f : std::stof(r.name.substr(6)))));
  }
  for (const auto& [file, n] : per_file) {
    INFO(file << " holds " << n << " record(s)");
    // Only a record larger than a segment may pass segment_bytes, alone.
    if (fs::file_size(dir / file) > (64u << 10)) REQUIRE(n == 1);
  }
}

TEST_CASE("on a full disk a packed segment does not roll: no new file, descriptor or buffer per failed record",
          "[writers][packed][hostile]") {
  using namespace tensortap::detail;
  TempDir dir;
  const Dir run = Dir::open(dir.path, false);
  PackedWriter w(run, PackedOptions().segment_bytes(4096));
  const RecordDesc d = float_record("x", 640);  // 2.5 KiB: every second record rolls
  const at::Tensor first = at::full({640}, 1.0f);
  auto sink = w.begin(d);
  sink->append(first.data_ptr(), d.nbytes);
  const std::string loc = sink->finish();  // gathered, not yet written
  // A file size limit below what is gathered: every write fails.
  tt_test::FileSizeLimit limit(64);
  int failed = 0;
  for (int i = 0; i < 50; ++i) {
    try {
      auto s = w.begin(d);
    } catch (const tensortap::Error& e) {
      REQUIRE_THAT(e.what(), Catch::Contains("00000000.npys"));
      ++failed;
    }
  }
  limit.lift();
  REQUIRE(failed == 50);
  REQUIRE(tt_test::files_under(dir / "packed").size() == 1);
  // Space again: the gathered record reaches its segment, the next rolls.
  const at::Tensor second = at::full({640}, 2.0f);
  auto again = w.begin(d);
  again->append(second.data_ptr(), d.nbytes);
  const std::string loc2 = again->finish();
  REQUIRE(w.sync(true));
  w.close();
  REQUIRE(loc.find("\"file\":\"packed/00000000.npys\",\"offset\":0,") != std::string::npos);
  REQUIRE(loc2.find("\"file\":\"packed/00000001.npys\",\"offset\":0,") != std::string::npos);
  REQUIRE(at::equal(tensortap::load_npy(dir / "packed/00000000.npys", 0), first));
  REQUIRE(at::equal(tensortap::load_npy(dir / "packed/00000001.npys", 0), second));
  REQUIRE(tt_test::files_under(dir / "packed").size() == 2);
}
