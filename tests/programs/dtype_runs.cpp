// Writes, through the writers themselves, runs of the dtypes LibTorch 2.x
// adds (uint16, uint32, uint64, float8), which LibTorch 1.13 cannot make as
// tensors: a writer takes a dtype description, not a tensor. tests/python/test_float8.py
// reads them with the Python reader.
//
//   dtype_runs OUT [hdf5]     writes OUT/npy, OUT/packed (and OUT/hdf5)
//
// Records, each at step 0:
//   u16, u32, u64       values with the top bit set, and the largest
//   <float8 format>     its 256 codes, 0..255, as stored
//   <format>.decoded    float32: tensortap's C++ decoding of the same codes
//                       (what its statistics see), for the reader to compare
//                       with its own
#include <fcntl.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <tensortap/error.h>

#include "writers/src/dtypes.h"
#include "writers/src/file.h"
#include "writers/src/lines_file.h"
#include "writers/src/writer.h"

using namespace tensortap::detail;

namespace {

struct Payload {
  RecordDesc desc;
  std::vector<unsigned char> bytes;
};

template <typename T>
Payload unsigned_record(const char* name, const char* dtype, Element element) {
  const std::vector<T> values = {
      0, 1, static_cast<T>(T(1) << (8 * sizeof(T) - 1)), static_cast<T>(~T(0)), static_cast<T>(~T(0) - 1), 12345};
  Payload p;
  p.desc.name = name;
  p.desc.dtype = DtypeInfo{dtype, element, c10::ScalarType::Undefined, false};
  p.desc.shape = {2, 3};
  p.bytes.resize(values.size() * sizeof(T));
  std::memcpy(p.bytes.data(), values.data(), p.bytes.size());
  return p;
}

std::vector<Payload> payloads() {
  std::vector<Payload> out;
  out.push_back(unsigned_record<std::uint16_t>("u16", "uint16", Element::U16));
  out.push_back(unsigned_record<std::uint32_t>("u32", "uint32", Element::U32));
  out.push_back(unsigned_record<std::uint64_t>("u64", "uint64", Element::U64));
  const std::pair<const char*, Element> formats[] = {{"float8_e4m3fn", Element::F8E4M3FN},
                                                     {"float8_e5m2", Element::F8E5M2},
                                                     {"float8_e4m3fnuz", Element::F8E4M3FNUZ},
                                                     {"float8_e5m2fnuz", Element::F8E5M2FNUZ},
                                                     {"float8_e8m0fnu", Element::F8E8M0FNU}};
  for (const auto& [name, element] : formats) {
    Payload codes;
    codes.desc.name = name;
    codes.desc.dtype = DtypeInfo{name, element, c10::ScalarType::Byte, true};
    codes.desc.shape = {16, 16};
    for (int c = 0; c < 256; ++c) codes.bytes.push_back(static_cast<unsigned char>(c));
    out.push_back(codes);
    Payload decoded;
    decoded.desc.name = std::string(name) + ".decoded";
    decoded.desc.shape = {16, 16};
    decoded.bytes.resize(256 * sizeof(float));
    for (int c = 0; c < 256; ++c) {
      const float v = float8_value(element, static_cast<std::uint8_t>(c));
      std::memcpy(decoded.bytes.data() + c * sizeof(float), &v, sizeof v);
    }
    out.push_back(decoded);
  }
  for (Payload& p : out) p.desc.nbytes = p.bytes.size();
  return out;
}

void write_run(const std::string& path, tensortap::Format format, const char* format_name) {
  const Dir dir = Dir::open(path, true);
  auto writer = make_writer(format, tensortap::Hdf5Options(), tensortap::PackedOptions(), dir);
  std::vector<Payload> records = payloads();
  std::vector<const RecordDesc*> descs;
  for (const Payload& p : records) descs.push_back(&p.desc);
  writer->prepare(descs);
  std::string index;
  for (const Payload& p : records) {
    auto sink = writer->begin(p.desc);
    sink->append(p.bytes.data(), p.bytes.size());
    append_index_line(index, p.desc, sink->finish());
  }
  writer->sync(true);
  writer->close();
  const std::string run_json = std::string(R"({"format_version":1,"closed":true,"options":{"format":")") + format_name +
                               R"("},"rank":0,"world_size":1})";
  for (const auto& [name, text] : {std::pair<const char*, const std::string&>{"index.jsonl", index},
                                   std::pair<const char*, const std::string&>{"run.json", run_json}}) {
    File f = dir.open_file(name, O_WRONLY | O_CREAT | O_TRUNC);
    f.write_all(text.data(), text.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT [hdf5]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  try {
    // Fresh each time: a writer never overwrites a file of an earlier run.
    std::filesystem::remove_all(out);
    Dir::open(out, true);
    write_run(out + "/npy", tensortap::Format::Npy, "npy");
    write_run(out + "/packed", tensortap::Format::Packed, "packed");
    if (argc > 2 && std::string(argv[2]) == "hdf5") write_run(out + "/hdf5", tensortap::Format::Hdf5, "hdf5");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtype_runs: %s\n", e.what());
    return 1;
  }
  return 0;
}
