#include "writers/src/writer.h"

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/check.h"
#include "writers/src/file.h"
#include "writers/src/npy/writer.h"
#include "writers/src/packed/writer.h"
#ifdef TENSORTAP_HAVE_HDF5
#include "writers/src/hdf5/writer.h"
#endif

namespace tensortap::detail {

std::unique_ptr<Writer> make_writer(Format format, const Hdf5Options& hdf5, const PackedOptions& packed,
                                    const Dir& dir) {
  switch (format) {
    case Format::Npy: return std::make_unique<NpyWriter>(dir);
    case Format::Packed: return std::make_unique<PackedWriter>(dir, packed);
    case Format::Hdf5:
#ifdef TENSORTAP_HAVE_HDF5
      return std::make_unique<Hdf5Writer>(dir, hdf5);
#else
      (void)hdf5;
      break;
#endif
  }
  fail(
      "run '{}': Format::Hdf5 is not available: this tensortap was built "
      "without HDF5 (TENSORTAP_WITH_HDF5=OFF or libhdf5-dev missing); use Format::Npy",
      dir.path());
}

}  // namespace tensortap::detail
