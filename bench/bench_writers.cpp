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

}  // namespace
