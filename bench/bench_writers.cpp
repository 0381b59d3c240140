// How fast the writer thread persists records, against raw write() of the
// same bytes to the same directory.
//
//   build/bench/bench_writers
//   TENSORTAP_BENCH_DIR=/path/on/disk build/bench/bench_writers
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "bench_dir.h"
#include "writers/src/npy_writer.h"
#ifdef TENSORTAP_HAVE_HDF5
#include "writers/src/hdf5_writer.h"
#endif

namespace {

void BM_RawWrite(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  std::vector<char> data(n, 1);
  std::int64_t i = 0;
  for (auto _ : state) {
    const std::string path = fmt::format("{}/{:08d}.bin", dir.path, i++);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::write(fd, data.data(), n) != static_cast<ssize_t>(n) || ::close(fd) != 0)
      state.SkipWithError("write failed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void BM_NpyWrite(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  tensortap::detail::NpyWriter writer(dir.path);
  std::vector<char> data(n, 1);
  tensortap::detail::RecordMeta meta;
  meta.name = "x";
  meta.shape = {static_cast<std::int64_t>(n / 4)};
  meta.nbytes = n;
  for (auto _ : state) {
    auto sink = writer.begin(meta);
    sink->append(data.data(), n);
    benchmark::DoNotOptimize(sink->finish());
    ++meta.step;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

BENCHMARK(BM_RawWrite)->RangeMultiplier(16)->Range(1 << 10, 16 << 20)->Iterations(300);
BENCHMARK(BM_NpyWrite)->RangeMultiplier(16)->Range(1 << 10, 16 << 20)->Iterations(300);

#ifdef TENSORTAP_HAVE_HDF5
// One series growing by a row per record, flushed after each record as the
// default cadence does (one record per sampled step). Arg 1: deflate level.
// The data is a ramp of small integers as floats: compressible, like many
// activations, but not all zeros.
void BM_Hdf5Write(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  tensortap::detail::Hdf5Writer writer(
      dir.path, tensortap::Hdf5Options().deflate(static_cast<int>(state.range(1))).shuffle(state.range(1) > 0));
  std::vector<float> data(n / 4);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 251);
  tensortap::detail::RecordMeta meta;
  meta.name = "x";
  meta.shape = {static_cast<std::int64_t>(n / 4)};
  meta.nbytes = n;
  writer.prepare({&meta});
  for (auto _ : state) {
    auto sink = writer.begin(meta);
    sink->append(data.data(), n);
    benchmark::DoNotOptimize(sink->finish());
    writer.sync(/*force=*/true);
    ++meta.step;
  }
  writer.close();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}
BENCHMARK(BM_Hdf5Write)
    ->ArgsProduct({benchmark::CreateRange(1 << 10, 16 << 20, 16), {0, 4}})
    ->Iterations(300);
#endif

}  // namespace
