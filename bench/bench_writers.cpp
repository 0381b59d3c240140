// How fast the writer thread persists records, against raw write() of the
// same bytes to the same directory.
//
//   build/bench/bench_writers
//   TENSORTAP_BENCH_DIR=/path/on/disk build/bench/bench_writers --benchmark_filter=Fsync
//
// BM_RawWrite is open, write, close of a new file: the floor for one file
// per record; BM_RawAppend, write() of each record to one open file: the
// floor for the packed format (BM_PackedWrite: its writer alone;
// BM_RecorderWritePacked: the whole pipeline). BM_NpyWrite is tensortap's .npy writer (header in the same
// writev, a temporary name, rename). The Fsync variants add fsync() before
// the file counts as written; tensortap itself never fsyncs a .npy, so its
// variant opens the finished file again to fsync it (one open and close more
// than a writer with a built-in fsync would pay). On tmpfs fsync is almost
// free: run the Fsync variants on a disk with TENSORTAP_BENCH_DIR.
//
// BM_Triggers/<rules>: what a statistics row costs the writer thread in the
// dump rules, per row, over 64 tensors named as a watched MLP's (weights,
// biases, ReLU and tanh taps and their inputs, the loss) for 1,000 steps:
// 0 non_finite() alone (the default), 1 the nine live health rules.
//
//   build/bench/bench_writers --benchmark_filter=Triggers
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"
#include "sdk/src/flight/triggers.h"
#include "writers/src/npy/writer.h"
#include "writers/src/packed/writer.h"
#ifdef TENSORTAP_HAVE_HDF5
#include "writers/src/hdf5/writer.h"
#endif

namespace {

void BM_Triggers(benchmark::State& state) {
  using tensortap::Kind;
  using tensortap::Trigger;
  tensortap::Options options("x");
  options.stats_every(1);
  if (state.range(0) == 1)
    for (Trigger t : {Trigger::vanishing_gradient(), Trigger::exploding_tensor(), Trigger::all_zero(),
                      Trigger::unchanged_tensor(), Trigger::loss_not_decreasing(), Trigger::dead_relu(),
                      Trigger::saturated_activation(), Trigger::tensor_variance(),
                      Trigger::poor_weight_initialization()})
      options.dump_on(t.cooldown(1));
  else
    options.dump_on(Trigger::non_finite());
  std::vector<tensortap::TensorSummary> rows;
  const char* acts[] = {"relu", "tanh"};
  for (int layer = 0; layer < 8; ++layer) {
    const std::string fc = fmt::format("fc{}", layer);
    const std::string act = fmt::format("{}{}", acts[layer % 2], layer);
    for (const auto& [kind, name] :
         {std::pair{Kind::Param, fc + ".weight"}, std::pair{Kind::Param, fc + ".bias"}, std::pair{Kind::Grad, fc + ".weight"},
          std::pair{Kind::Grad, fc + ".bias"}, std::pair{Kind::Activation, act + "_input"}, std::pair{Kind::Activation, act},
          std::pair{Kind::ActivationGrad, act}, std::pair{Kind::ActivationGrad, act + "_input"}}) {
      tensortap::TensorSummary s;
      s.kind = kind;
      s.name = name;
      s.min = -1;
      s.max = 1;
      s.std = 0.5;
      s.norm = 30;
      s.numel = 4096;
      rows.push_back(s);
    }
  }
  tensortap::TensorSummary loss;
  loss.kind = Kind::Tensor;
  loss.name = "loss";
  loss.numel = 1;
  std::int64_t step = 0;
  std::string error;
  for (auto _ : state) {
    tensortap::detail::Triggers triggers(options);
    for (int i = 0; i < 1000; ++i, ++step) {
      for (tensortap::TensorSummary& s : rows) {
        s.step = step;
        // A little movement, so that no rule sees a constant series.
        s.std = 0.5 + 1e-3 * static_cast<double>(step % 7);
        s.norm = 30 + 1e-2 * static_cast<double>(step % 5);
        benchmark::DoNotOptimize(triggers.evaluate(s, false, error));
      }
      loss.step = step;
      loss.mean = loss.min = loss.max = 2.0 - 1e-4 * static_cast<double>(i);
      benchmark::DoNotOptimize(triggers.evaluate(loss, false, error));
    }
  }
  state.SetItemsProcessed(state.iterations() * 1000 * static_cast<std::int64_t>(rows.size() + 1));
}
BENCHMARK(BM_Triggers)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_RawWrite(benchmark::State& state, bool sync) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  std::vector<char> data(n, 1);
  std::int64_t i = 0;
  for (auto _ : state) {
    const std::string path = fmt::format("{}/{:08d}.bin", dir.path, i++);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::write(fd, data.data(), n) != static_cast<ssize_t>(n) || (sync && ::fsync(fd) != 0) ||
        ::close(fd) != 0)
      state.SkipWithError("write failed");
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void BM_NpyWrite(benchmark::State& state, bool sync) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  const auto run_dir = tensortap::detail::Dir::open(dir.path, false);
  tensortap::detail::NpyWriter writer(run_dir);
  std::vector<char> data(n, 1);
  tensortap::detail::RecordDesc meta;
  meta.name = "x";
  meta.shape = {static_cast<std::int64_t>(n / 4)};
  meta.nbytes = n;
  for (auto _ : state) {
    auto sink = writer.begin(meta);
    sink->append(data.data(), n);
    benchmark::DoNotOptimize(sink->finish());
    if (sync) {
      const std::string path = fmt::format("{}/npy/tensor/x/{:08d}.npy", dir.path, meta.step);
      const int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0 || ::fsync(fd) != 0 || ::close(fd) != 0) state.SkipWithError("fsync failed");
    }
    ++meta.step;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// The whole pipeline, sustained: captures back to back through a Recorder
// (Overflow::Block) until the last is on disk, so the rate is the writer
// thread's, staging and index.jsonl included. The capturing thread is the
// benchmark's; the writer runs on the other core.
void BM_RecorderWrite(benchmark::State& state, tensortap::Format format) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").format(format));
  std::int64_t step = 0;
  {
    // Staging is touched once and reused: measure the steady state.
    const at::Tensor warm = at::zeros({static_cast<std::int64_t>(rec.options().buffer_bytes() / 4)});
    for (int i = 0; i < 2; ++i) {
      rec.step(step++);
      rec.capture("warm", warm);
    }
    rec.flush();
  }
  const at::Tensor t = at::ones({static_cast<std::int64_t>(n / 4)});
  const std::int64_t last = step + static_cast<std::int64_t>(state.max_iterations);
  for (auto _ : state) {
    rec.step(step++);
    rec.capture("x", t);
    if (step == last) rec.flush();  // timed: the last one is on disk
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// The packed format's floor: the same bytes appended to one file, one
// write() per record.
void BM_RawAppend(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  std::vector<char> data(n, 1);
  const std::string path = dir.path + "/all.bin";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) state.SkipWithError("open failed");
  for (auto _ : state)
    if (::write(fd, data.data(), n) != static_cast<ssize_t>(n)) state.SkipWithError("write failed");
  if (::close(fd) != 0) state.SkipWithError("close failed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// tensortap's packed writer alone, one record per batch (the writer thread
// syncs after every batch), until the last is durable.
void BM_PackedWrite(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  const auto run_dir = tensortap::detail::Dir::open(dir.path, false);
  tensortap::detail::PackedWriter writer(run_dir, tensortap::PackedOptions());
  std::vector<char> data(n, 1);
  tensortap::detail::RecordDesc meta;
  meta.name = "x";
  meta.shape = {static_cast<std::int64_t>(n / 4)};
  meta.nbytes = n;
  std::int64_t left = static_cast<std::int64_t>(state.max_iterations);
  for (auto _ : state) {
    auto sink = writer.begin(meta);
    sink->append(data.data(), n);
    benchmark::DoNotOptimize(sink->finish());
    writer.sync(/*force=*/false);
    ++meta.step;
    if (--left == 0) writer.close();  // timed: the last one is durable
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

#ifdef TENSORTAP_HAVE_HDF5
// One series growing by a row per record, one record per sampled step, the
// writer synced after each as the writer thread does after each batch: at
// the default cadence (Hdf5Options::flush_every 0, sized from the records)
// or, with arg 2 set, flushed every step. The last row is flushed inside the
// timing. Arg 1: deflate level. The data is a ramp of small integers as
// floats: compressible, like many activations, but not all zeros.
void BM_Hdf5Write(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  const auto run_dir = tensortap::detail::Dir::open(dir.path, false);
  tensortap::detail::Hdf5Writer writer(run_dir, tensortap::Hdf5Options()
                                                    .deflate(static_cast<int>(state.range(1)))
                                                    .shuffle(state.range(1) > 0)
                                                    .flush_every(state.range(2)));
  std::vector<float> data(n / 4);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 251);
  tensortap::detail::RecordDesc meta;
  meta.name = "x";
  meta.shape = {static_cast<std::int64_t>(n / 4)};
  meta.nbytes = n;
  writer.prepare({&meta});
  std::int64_t i = 0;
  for (auto _ : state) {
    auto sink = writer.begin(meta);
    sink->append(data.data(), n);
    benchmark::DoNotOptimize(sink->finish());
    writer.sync(/*force=*/++i == static_cast<std::int64_t>(state.max_iterations));
    ++meta.step;
  }
  writer.close();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// The cost of a name that first appears when the file already holds
// range(0) names, each written in the step before and the step after (as in
// training, where every step writes every name), 1 KiB rows, every step
// flushed. Timed: the new name's datasets, its row and the flush. Counters:
// `journal_span_ms`, the span the journal covers (a crash in it is rolled back
// to before it); `step_after_extra_ms`, how much longer the step after the
// new name takes than the step before it (before the datasets were made in
// SWMR mode, it reopened every dataset the new name's window had closed);
// `row_us`, a row of an old name in the step before, its flush included;
// `old_name_ms`, the timed work for a name the file already has (a row and
// a flush, whose cost grows with the datasets open, new name or not).
void BM_Hdf5NewName(benchmark::State& state) {
  const auto names = static_cast<int>(state.range(0));
  BenchDir dir;
  const auto run_dir = tensortap::detail::Dir::open(dir.path, false);
  tensortap::detail::Hdf5Writer writer(run_dir, tensortap::Hdf5Options().flush_every(1));
  std::vector<float> data(256, 1.0f);
  std::vector<tensortap::detail::RecordDesc> metas(static_cast<std::size_t>(names));
  std::vector<const tensortap::detail::RecordDesc*> all;
  for (int i = 0; i < names; ++i) {
    metas[i].name = fmt::format("layer{}.weight", i);
    metas[i].shape = {256};
    metas[i].nbytes = 1024;
    all.push_back(&metas[i]);
  }
  const auto write_row = [&](tensortap::detail::RecordDesc& m, std::int64_t step) {
    m.step = step;
    auto sink = writer.begin(m);
    sink->append(data.data(), 1024);
    benchmark::DoNotOptimize(sink->finish());
  };
  std::int64_t step = 0;
  // Every old name's step, flushed: its time in milliseconds.
  const auto old_names_step = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& m : metas) write_row(m, step);
    writer.sync(/*force=*/true);
    ++step;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  writer.prepare(all);
  old_names_step();
  double span = 0, before = 0, after = 0, old_row = 0;
  for (auto _ : state) {
    state.PauseTiming();
    before += old_names_step();
    {
      // The same work for a name the file has: one row, flushed.
      const auto t0 = std::chrono::steady_clock::now();
      write_row(metas[0], step);
      writer.sync(/*force=*/true);
      old_row += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    tensortap::detail::RecordDesc fresh;
    fresh.name = fmt::format("new{}", step);
    fresh.shape = {256};
    fresh.nbytes = 1024;
    state.ResumeTiming();
    writer.prepare({&fresh});
    write_row(fresh, step);
    writer.sync(/*force=*/true);
    state.PauseTiming();
    span += std::chrono::duration<double, std::milli>(writer.last_span()).count();
    after += old_names_step();
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["journal_span_ms"] = span / n;
  state.counters["old_name_ms"] = old_row / n;
  state.counters["step_after_extra_ms"] = (after - before) / n;
  state.counters["row_us"] = names > 0 ? before * 1e3 / n / names : 0;
  writer.close();
}
#endif

// Iterations bounded by bytes: every iteration is a new file (or rows) in
// the bench directory, and tmpfs holds them in memory until the end.
std::int64_t iterations(std::int64_t n, std::int64_t budget, std::int64_t most) {
  return std::clamp<std::int64_t>(budget / n, 8, most);
}

const bool registered = [] {
  const std::int64_t sizes[] = {64, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 16 << 20};
  for (std::int64_t n : sizes) {
    const std::int64_t it = iterations(n, std::int64_t{512} << 20, 2000);
    benchmark::RegisterBenchmark("BM_RawWrite", BM_RawWrite, false)->Arg(n)->Iterations(it);
    benchmark::RegisterBenchmark("BM_NpyWrite", BM_NpyWrite, false)->Arg(n)->Iterations(it);
    benchmark::RegisterBenchmark("BM_RecorderWrite", BM_RecorderWrite, tensortap::Format::Npy)
        ->Arg(n)
        ->Iterations(it)
        ->UseRealTime();
    // Packed records are cheap: more of them, for a run long enough to time.
    const std::int64_t it_packed = iterations(n, std::int64_t{512} << 20, 20000);
    benchmark::RegisterBenchmark("BM_RawAppend", BM_RawAppend)->Arg(n)->Iterations(it_packed);
    benchmark::RegisterBenchmark("BM_PackedWrite", BM_PackedWrite)->Arg(n)->Iterations(it_packed);
    benchmark::RegisterBenchmark("BM_RecorderWritePacked", BM_RecorderWrite, tensortap::Format::Packed)
        ->Arg(n)
        ->Iterations(it_packed)
        ->UseRealTime();
    // A disk fsync costs milliseconds: fewer files.
    const std::int64_t it_sync = iterations(n, std::int64_t{64} << 20, 100);
    benchmark::RegisterBenchmark("BM_RawWriteFsync", BM_RawWrite, true)->Arg(n)->Iterations(it_sync);
    benchmark::RegisterBenchmark("BM_NpyWriteFsync", BM_NpyWrite, true)->Arg(n)->Iterations(it_sync);
  }
#ifdef TENSORTAP_HAVE_HDF5
  for (std::int64_t n : sizes) {
    if (n < (1 << 10)) continue;
    // As many rows as raw write() writes files, for the same noise.
    const std::int64_t it = iterations(n, std::int64_t{512} << 20, 2000);
    benchmark::RegisterBenchmark("BM_Hdf5Write", BM_Hdf5Write)->Args({n, 0, 0})->Iterations(it);
    benchmark::RegisterBenchmark("BM_Hdf5Write", BM_Hdf5Write)->Args({n, 0, 1})->Iterations(it);
    // deflate recompresses a whole chunk per flush: far slower, fewer rows.
    benchmark::RegisterBenchmark("BM_Hdf5Write", BM_Hdf5Write)
        ->Args({n, 4, 0})
        ->Iterations(iterations(n, std::int64_t{64} << 20, 100));
  }
  for (std::int64_t names : {10, 100, 1000, 3000})
    benchmark::RegisterBenchmark("BM_Hdf5NewName", BM_Hdf5NewName)
        ->Arg(names)
        ->Iterations(8)
        ->Unit(benchmark::kMillisecond);
#endif
  return true;
}();

}  // namespace
