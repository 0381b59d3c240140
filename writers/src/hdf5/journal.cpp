#include "writers/src/hdf5/journal.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

void Hdf5Journal::begin(std::uint64_t limit) {
  saved_.clear();
  limit_ = limit;
  // A journal left by an earlier failure, or planted, says nothing about
  // this span: replaced (a link is removed, never followed).
  dir_.unlink(kName);
  File f = dir_.open_file(kName, O_RDWR | O_CREAT | O_EXCL);
  unsigned char head[16];
  std::memcpy(head, kMagic, 8);
  put_u64(head + 8, limit);
  f.write_all(head, sizeof head);
  file_ = std::move(f);
  length_ = sizeof head;
}

void Hdf5Journal::save(const File& data, std::uint64_t offset, std::uint64_t n) {
  if (!file_) return;
  std::uint64_t lo = offset;
  const std::uint64_t hi = std::min(offset + n, limit_);
  while (lo < hi) {
    // The first saved range that ends after lo: skip what it covers.
    auto it = saved_.upper_bound(lo);
    if (it != saved_.begin()) {
      auto prev = std::prev(it);
      if (prev->second > lo) {
        lo = prev->second;
        continue;
      }
    }
    const std::uint64_t end = it == saved_.end() ? hi : std::min(hi, it->first);
    std::vector<unsigned char> old(end - lo);
    old.resize(data.pread_upto(old.data(), old.size(), lo));
    unsigned char head[16];
    put_u64(head, lo);
    put_u64(head + 8, old.size());
    // One write: a crash leaves the record whole or short, never wrong.
    try {
      file_.write_all(head, sizeof head, old.data(), old.size());
    } catch (...) {
      // Cut a part-written record off, so that a later one is read from its
      // start; the overwrite is refused, so no saved byte is missing.
      try {
        file_.truncate(length_);
      } catch (...) {
        frozen_ = true;  // the journal cannot be trusted: write nothing more
      }
      throw;
    }
    length_ += sizeof head + old.size();
    saved_[lo] = end;
    lo = end;
  }
}

void Hdf5Journal::end() {
  if (!file_) return;
  saved_.clear();
  file_.truncate(0);
  file_.close();
  dir_.unlink(kName);
}

namespace {

// The driver: POSIX reads and writes of a descriptor the writer opened (so
// HDF5 never resolves the path again), like HDF5's sec2 driver, plus the
// journal's save before each write and truncation. HDF5 calls it from C:
// nothing may throw out of it.
struct Config {
  const File* file;
  Hdf5Journal* journal;
};

// HDF5 sees the base; the driver's callbacks cast back to the whole.
struct Driven : H5FD_t {
  File file;
  // The descriptor, where get_handle() can point to it (as sec2's handle).
  int handle;
  haddr_t eoa;
  haddr_t eof;
  dev_t dev;
  ino_t ino;
  Hdf5Journal* journal;
};

Driven* driven(H5FD_t* f) { return static_cast<Driven*>(f); }
const Driven* driven(const H5FD_t* f) { return static_cast<const Driven*>(f); }

// Puts why on HDF5's error stack, where its own messages go.
herr_t push_error(const char* func, const std::string& why) {
  H5Epush2(H5E_DEFAULT, __FILE__, func, __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_WRITEERROR, "%s", why.c_str());
  return -1;
}

void* fapl_copy(const void* info) {
  void* p = std::malloc(sizeof(Config));
  if (p) std::memcpy(p, info, sizeof(Config));
  return p;
}

herr_t fapl_free(void* info) {
  std::free(info);
  return 0;
}

H5FD_t* open(const char* /*name*/, unsigned flags, hid_t fapl, haddr_t /*maxaddr*/) {
  const auto* cfg = static_cast<const Config*>(H5Pget_driver_info(fapl));
  if (cfg == nullptr) return nullptr;
  try {
    auto f = std::make_unique<Driven>();
    f->file = cfg->file->dup();
    if (flags & H5F_ACC_TRUNC) f->file.truncate(0);
    const struct stat st = f->file.status();
    f->handle = f->file.fd();
    f->eoa = 0;
    f->eof = static_cast<haddr_t>(st.st_size);
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->journal = cfg->journal;
    return f.release();
  } catch (const std::exception&) {
    return nullptr;
  }
}

herr_t close(H5FD_t* file) {
  std::unique_ptr<Driven> f(driven(file));
  try {
    f->file.close();
  } catch (const std::exception&) {
    return -1;
  }
  return 0;
}

int cmp(const H5FD_t* a, const H5FD_t* b) {
  const Driven *x = driven(a), *y = driven(b);
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t*, unsigned long* flags) {
  // What sec2 says of itself: SWMR writing needs SUPPORTS_SWMR_IO.
  if (flags)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_POSIX_COMPAT_HANDLE | H5FD_FEAT_SUPPORTS_SWMR_IO |
             H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t) { return driven(file)->eoa; }

herr_t set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  driven(file)->eoa = addr;
  return 0;
}

haddr_t get_eof(const H5FD_t* file, H5FD_mem_t) { return driven(file)->eof; }

herr_t get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &driven(file)->handle;
  return 0;
}

herr_t read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  std::size_t got = 0;
  try {
    got = driven(file)->file.pread_upto(buf, size, addr);
  } catch (const Error& e) {
    return push_error("tensortap_read", fmt::format("read of tensors.h5 failed: {}", e.code().message()));
  }
  // Past the end of the file: zeros, as in sec2.
  std::memset(static_cast<char*>(buf) + got, 0, size - got);
  return 0;
}

herr_t write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  Driven* f = driven(file);
  if (f->journal && f->journal->frozen()) return 0;  // given up: see Hdf5Journal::freeze()
  try {
    if (f->journal) f->journal->save(f->file, addr, size);
  } catch (const std::exception& e) {
    return push_error("tensortap_write", fmt::format("cannot save what a write would overwrite: {}", e.what()));
  }
  try {
    f->file.pwrite_all(buf, size, addr);
  } catch (const Error& e) {
    return push_error("tensortap_write", fmt::format("write of tensors.h5 failed: {}", e.code().message()));
  }
  f->eof = std::max<haddr_t>(f->eof, addr + size);
  return 0;
}

herr_t flush(H5FD_t*, hid_t, hbool_t) { return 0; }

herr_t truncate(H5FD_t* file, hid_t, hbool_t) {
  Driven* f = driven(file);
  if (f->eoa == f->eof || (f->journal && f->journal->frozen())) return 0;
  try {
    if (f->journal && f->eoa < f->eof) f->journal->save(f->file, f->eoa, f->eof - f->eoa);
  } catch (const std::exception& e) {
    return push_error("tensortap_truncate", fmt::format("cannot save what a truncation would drop: {}", e.what()));
  }
  try {
    f->file.truncate(f->eoa);
  } catch (const Error& e) {
    return push_error("tensortap_truncate", fmt::format("truncation of tensors.h5 failed: {}", e.code().message()));
  }
  f->eof = f->eoa;
  return 0;
}

// No file lock (see journaled_fapl()): readers that want to wait for new
// names' datasets look for the journal.
herr_t lock(H5FD_t*, hbool_t) { return 0; }

herr_t unlock(H5FD_t*) { return 0; }

hid_t driver_id() {
  static hid_t id = [] {
    static H5FD_class_t c{};
#if H5_VERSION_GE(1, 13, 2)
    c.version = H5FD_CLASS_VERSION;                    // 1.14's class carries a version and a value
    c.value = static_cast<H5FD_class_value_t>(0x2B5);  // outside HDF5's own and its test range
#endif
    c.name = "tensortap_journaled";
    c.maxaddr = (static_cast<haddr_t>(1) << 63) - 1;  // off_t's largest
    c.fc_degree = H5F_CLOSE_WEAK;
    c.fapl_size = sizeof(Config);
    c.fapl_copy = fapl_copy;
    c.fapl_free = fapl_free;
    c.open = open;
    c.close = close;
    c.cmp = cmp;
    c.query = query;
    c.get_eoa = get_eoa;
    c.set_eoa = set_eoa;
    c.get_eof = get_eof;
    c.get_handle = get_handle;
    c.read = read;
    c.write = write;
    c.flush = flush;
    c.truncate = truncate;
    c.lock = lock;
    c.unlock = unlock;
    const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
    std::copy(std::begin(map), std::end(map), std::begin(c.fl_map));
    return H5FDregister(&c);
  }();
  return id;
}

}  // namespace

H5::FileAccPropList journaled_fapl(const File& file, Hdf5Journal* journal) {
  const hid_t id = driver_id();
  if (id < 0) fail("HDF5: cannot register tensortap's file driver");
  H5::FileAccPropList fapl;
  const Config cfg{&file, journal};
  fapl.setDriver(id, &cfg);
  return fapl;
}

}  // namespace tensortap::detail
