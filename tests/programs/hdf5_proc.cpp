// Writes HDF5 runs for test_hdf5.py.
//   hdf5_proc append DIR STEPS SLEEP_MS [new_names]
//                                          x = full([4, 3], step) each step (and with
//                                          new_names "new<step>" too), flush(), then
//                                          prints "flushed <step>"
//   hdf5_proc options DIR                 DIR/gzip and DIR/plain: the same tensors with
//                                          and without deflate + shuffle
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include <tensortap/tensortap.h>

using tensortap::Format;
using tensortap::Options;

static int append(const std::string& dir, int64_t steps, int sleep_ms, bool new_names) {
  tensortap::Recorder rec(Options(dir).format(Format::Hdf5).overwrite(true));
  for (int64_t s = 0; s < steps; ++s) {
    rec.step(s);
    rec.capture("x", at::full({4, 3}, static_cast<double>(s)));
    if (new_names) rec.capture("new" + std::to_string(s), at::full({2}, static_cast<double>(s)));
    rec.flush();
    std::printf("flushed %lld\n", static_cast<long long>(s));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  rec.close();
  return 0;
}

static void write(const std::string& dir, const tensortap::Hdf5Options& h5) {
  tensortap::Recorder rec(Options(dir).format(Format::Hdf5).hdf5(h5).overwrite(true));
  for (int64_t s = 0; s < 20; ++s) {
    rec.step(s);
    rec.capture("scalar", at::scalar_tensor(static_cast<double>(s)));
    rec.capture("row", at::arange(1000, at::kFloat).remainder(7) + s);  // 4 KB rows, compressible
    rec.capture("wide", at::zeros({300, 1000}));                        // 1.2 MB rows: chunks split a row
  }
  rec.close();
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "append" && (argc == 5 || (argc == 6 && std::string(argv[5]) == "new_names")))
    return append(argv[2], std::atoll(argv[3]), std::atoi(argv[4]), argc == 6);
  if (mode == "options" && argc == 3) {
    write(std::string(argv[2]) + "/gzip", tensortap::Hdf5Options().deflate(4).shuffle(true));
    write(std::string(argv[2]) + "/plain", tensortap::Hdf5Options());
    return 0;
  }
  std::fprintf(stderr, "usage: hdf5_proc append DIR STEPS SLEEP_MS [new_names] | hdf5_proc options DIR\n");
  return 2;
}
