#include "writers/src/hdf5/layout.h"

#include <algorithm>

#include <fmt/format.h>

#include "writers/src/dtypes.h"
#include "writers/src/versions.h"

namespace tensortap::detail {
namespace {

constexpr hsize_t kMaxRowsPerChunk = 256;
constexpr hsize_t kStepsChunk = 256;
// Automatic sizing (Hdf5Options::chunk_bytes and flush_every 0). A flush
// writes every chunk it finds dirty whole, and costs about 10 us of its own
// (the object headers and chunk indexes of the series written); a row costs
// about 5 us whatever its size (bench/README.md, section 2). So small rows
// share a chunk of kSmallChunk (a flush of one row rewrites 64 KiB at most,
// about 20 us of memory bandwidth) and wait for a flush until about
// kFlushBytes per series have come, kMaxFlushSteps steps at most; rows from
// kSmallChunk up get chunks of their own, split above kLargeChunk so that a
// reader of part of a row reads little more.
constexpr std::size_t kSmallChunk = std::size_t{64} << 10;
constexpr std::size_t kLargeChunk = std::size_t{1} << 20;
constexpr std::uint64_t kFlushBytes = std::uint64_t{64} << 10;
constexpr std::int64_t kMaxFlushSteps = 8;


void write_string_attr(H5::H5Object& obj, const char* name, const std::string& value) {
  H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  type.setCset(H5T_CSET_UTF8);
  H5::Attribute a = obj.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
  a.write(type, value);
}

void write_ints_attr(H5::H5Object& obj, const char* name, c10::IntArrayRef v) {
  const hsize_t n = v.size();
  H5::DataSpace space = n == 0 ? H5::DataSpace(H5S_NULL) : H5::DataSpace(1, &n);
  H5::Attribute a = obj.createAttribute(name, H5::PredType::STD_I64LE, space);
  if (n != 0) a.write(H5::PredType::NATIVE_INT64, v.data());
}

// Chunk dims for rows of `shape`: about `target` bytes, at most 256 rows,
// halving the largest axis of a row that alone exceeds the target.
std::vector<hsize_t> chunk_dims(c10::IntArrayRef shape, std::size_t elem, std::size_t target) {
  std::vector<hsize_t> inner;
  for (std::int64_t d : shape) inner.push_back(static_cast<hsize_t>(std::max<std::int64_t>(d, 1)));
  auto bytes = [&] {
    hsize_t b = elem;
    for (hsize_t d : inner) b *= d;
    return b;
  };
  while (bytes() > target) {
    auto it = std::max_element(inner.begin(), inner.end());
    if (it == inner.end() || *it == 1) break;
    *it = (*it + 1) / 2;
  }
  std::vector<hsize_t> dims{std::clamp<hsize_t>(target / bytes(), 1, kMaxRowsPerChunk)};
  dims.insert(dims.end(), inner.begin(), inner.end());
  return dims;
}

}  // namespace

// The file type of each stored element, the way h5py writes (and reads) it.
H5::DataType file_type(Element e) {
  switch (e) {
    case Element::Bool: {
      // h5py's bool: an int8 enum of FALSE and TRUE.
      H5::EnumType en(H5::PredType::NATIVE_INT8);
      std::int8_t f = 0, v = 1;
      en.insert("FALSE", &f);
      en.insert("TRUE", &v);
      return en;
    }
    // A float8's bit patterns: the group's dtype attribute names the format.
    case Element::F8E4M3FN:
    case Element::F8E5M2:
    case Element::F8E4M3FNUZ:
    case Element::F8E5M2FNUZ:
    case Element::F8E8M0FNU:
    case Element::U8: return H5::PredType::STD_U8LE;
    case Element::I8: return H5::PredType::STD_I8LE;
    case Element::I16: return H5::PredType::STD_I16LE;
    case Element::I32: return H5::PredType::STD_I32LE;
    case Element::I64: return H5::PredType::STD_I64LE;
    case Element::U16: return H5::PredType::STD_U16LE;
    case Element::U32: return H5::PredType::STD_U32LE;
    case Element::U64: return H5::PredType::STD_U64LE;
    case Element::F16: {
      // HDF5 1.10 has no predefined half: build IEEE binary16 as h5py does.
      H5::FloatType h(H5::PredType::IEEE_F32LE);
      h.setFields(15, 10, 5, 0, 10);
      h.setSize(2);
      h.setEbias(15);
      return h;
    }
    case Element::F32: return H5::PredType::IEEE_F32LE;
    case Element::F64: return H5::PredType::IEEE_F64LE;
    case Element::C64:
    case Element::C128: {
      // h5py's complex: a compound of `r` and `i`.
      const bool f32 = e == Element::C64;
      const H5::PredType& part = f32 ? H5::PredType::IEEE_F32LE : H5::PredType::IEEE_F64LE;
      H5::CompType c(static_cast<std::size_t>(f32 ? 8 : 16));
      c.insertMember("r", 0, part);
      c.insertMember("i", f32 ? 4 : 8, part);
      return c;
    }
  }
  fail("HDF5 cannot store element type {}", static_cast<int>(e));
}

void set_dense_links(hid_t plist) {
  if (H5Pset_link_phase_change(plist, 0, 0) < 0)
    throw H5::PropListIException("set_dense_links", "H5Pset_link_phase_change failed");
}

H5::Group create_group(H5::H5File& file, const std::string& path) {
  H5::PropList gcpl(H5P_GROUP_CREATE);
  set_dense_links(gcpl.getId());
  const hid_t id = H5Gcreate2(file.getId(), path.c_str(), H5P_DEFAULT, gcpl.getId(), H5P_DEFAULT);
  if (id < 0) throw H5::GroupIException("create_group", "H5Gcreate2 failed");
  H5::Group g(id);  // takes a reference of its own
  H5Gclose(id);
  return g;
}

std::mutex& hdf5_mutex() {
  // Leaked: a recorder held in a static closes its HDF5 file at exit.
  static std::mutex* const mu = new std::mutex;
  return *mu;
}

std::vector<hsize_t> data_chunk(const RecordDesc& first, const Hdf5Options& options) {
  const std::size_t elem = element_size(first.dtype.element);
  std::size_t target = options.chunk_bytes();
  if (target == 0) {
    std::uint64_t row = elem;
    for (std::int64_t d : first.shape) row *= static_cast<std::uint64_t>(std::max<std::int64_t>(d, 1));
    target = row < kSmallChunk ? kSmallChunk : static_cast<std::size_t>(std::min<std::uint64_t>(row, kLargeChunk));
  }
  return chunk_dims(first.shape, elem, target);
}

std::uint64_t chunk_bytes(const std::vector<hsize_t>& chunk, Element stored) {
  std::uint64_t bytes = element_size(stored);
  for (hsize_t d : chunk) bytes *= d;
  return bytes;
}

std::size_t chunk_cache_bytes(const std::vector<hsize_t>& chunk, Element stored) {
  // Rows that share a chunk fill it in the cache, between flushes; a chunk
  // that is one row, or part of one, is filled by the record's own writes,
  // and a cache smaller than the chunk makes HDF5 write them straight from
  // staging instead of copying them into the cache first.
  if (chunk.empty() || chunk[0] == 1) return 0;
  return static_cast<std::size_t>(chunk_bytes(chunk, stored));
}

std::int64_t auto_flush_steps(std::uint64_t mean_record_bytes) {
  if (mean_record_bytes == 0) return 1;
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(kFlushBytes / mean_record_bytes), 1, kMaxFlushSteps);
}

void write_file_attributes(H5::H5File& file) {
  H5::Group root = file.openGroup("/");
  write_string_attr(root, "tensortap_version", kTensortapVersion);
  write_string_attr(root, "torch_version", kTorchVersion);
  write_ints_attr(root, "format_version", {kFormatVersion});
}

void create_series_group(H5::H5File& file, const RecordDesc& first, const Hdf5Options& options, Hdf5Series& s) {
  const std::string kind_group = fmt::format("/{}", kind_name(first.kind));
  if (!file.nameExists(kind_group)) create_group(file, kind_group);
  H5::Group g = create_group(file, s.group);
  write_string_attr(g, "name", first.name);
  write_string_attr(g, "kind", kind_name(first.kind));
  write_string_attr(g, "dtype", first.dtype.name);
  write_ints_attr(g, "shape", first.shape);

  const std::vector<hsize_t> max(s.rank + 1, H5S_UNLIMITED);
  H5::DSetCreatPropList dcpl;
  s.chunk = data_chunk(first, options);
  dcpl.setChunk(static_cast<int>(s.chunk.size()), s.chunk.data());
  if (options.shuffle()) dcpl.setShuffle();
  if (options.deflate() > 0) dcpl.setDeflate(static_cast<unsigned>(options.deflate()));
  H5::DSetAccPropList dapl;
  // One chunk at a time is filled: a few slots suffice (HDF5's default of
  // 521 costs an allocation per dataset). w0 1: a full chunk goes first.
  dapl.setChunkCache(13, chunk_cache_bytes(s.chunk, first.dtype.element), 1.0);
  s.data = g.createDataSet("data", file_type(first.dtype.element),
                           H5::DataSpace(static_cast<int>(s.rank + 1), s.extent.data(), max.data()), dcpl, dapl);

  const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
  H5::DSetCreatPropList steps_dcpl;
  steps_dcpl.setChunk(1, &kStepsChunk);
  const std::int64_t unfinished = -1;
  steps_dcpl.setFillValue(H5::PredType::NATIVE_INT64, &unfinished);
  s.steps = g.createDataSet("steps", H5::PredType::STD_I64LE, H5::DataSpace(1, &zero, &unlimited), steps_dcpl);
  if (s.rank > 0) {
    const hsize_t dims[2] = {0, s.rank}, maxd[2] = {H5S_UNLIMITED, s.rank}, ch[2] = {kStepsChunk, s.rank};
    H5::DSetCreatPropList shapes_dcpl;
    shapes_dcpl.setChunk(2, ch);
    s.shapes = g.createDataSet("shapes", H5::PredType::STD_I64LE, H5::DataSpace(2, dims, maxd), shapes_dcpl);
  }
}

std::uint64_t new_chunk_bytes(const Hdf5Series& s, c10::IntArrayRef shape, hsize_t row) {
  if (s.chunk.empty() || row % s.chunk[0] != 0) return 0;
  std::uint64_t bytes = chunk_bytes(s.chunk, s.element);
  for (std::size_t i = 0; i < shape.size() && i + 1 < s.chunk.size(); ++i)
    bytes *= (std::max<std::uint64_t>(shape[i], 1) + s.chunk[i + 1] - 1) / s.chunk[i + 1];
  return bytes;
}

}  // namespace tensortap::detail
