// What capturing costs the training thread.
//
//   build/bench/bench_hot_path
//
// BM_CaptureNotSampled, BM_TapNotSampled: the cost on a step that is not
// sampled; BM_TapUnbound is the same Tap with no recorder, the floor.
// BM_CaptureFixedCost/<captures per step> (BM_EnqueueSampled before issue 48,
// after a class that is gone): a sampled capture of a one-element
// tensor, so what is left is the enqueue (naming, metadata, staging lock,
// waking the writer), not the copy: the fixed cost of a capture.
// BM_CaptureSampled/<bytes> against BM_Memcpy/<bytes>: the bytes per second
// the training thread moves into warm staging while the writer thread drains
// to /dev/shm on the other core, against a plain memcpy; BM_MemcpyRing copies
// into a destination that rotates like staging (caches as cold).
// BM_CaptureSampledCold/<bytes>: the same into staging memory touched for the
// first time, as on the first sampled steps of a run (page faults).
// BM_Capture64x1K/<sampled>: issue 33's measure, steps of 64 captures of
// 1 KiB, each from its own tensor under its own name, with a recorder that
// samples every step (1) or none (0), 2,000 steps each: its instructions
// per record, on minus off, are bench/hot_path_64x1k.sh's.
// BM_CaptureSelection/exclude:<0|1>/left_out:<0|1> (issue 57): capture() of
// 25 names a step under a 100-name include (exclude:0) or a one-word exclude
// (exclude:1), names the selection records or leaves out; items/s a
// capture. BM_CaptureLeftOutThreads/exclude:<0|1>/threads:<1|4>: left-out
// names from 1 and 4 threads at once. Round 4 matched a left-out name again
// at every call, allocating, under the name table's lock: 21 us against 44
// ns recorded. Leaving a name out should cost no more than recording it.
#include <algorithm>
#include <cstring>
#include <string>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/nn/modules/container/sequential.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"

namespace {

void BM_CaptureNotSampled(benchmark::State& state) {
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").every(1000000));
  rec.step(1);
  const at::Tensor t = at::ones({256});
  for (auto _ : state) rec.capture("x", t);
}
BENCHMARK(BM_CaptureNotSampled);

void BM_TapNotSampled(benchmark::State& state) {
  BenchDir dir;
  torch::nn::Sequential seq{tensortap::Tap()};
  auto rec = tensortap::watch(*seq, tensortap::Options(dir.path + "/run").every(1000000));
  rec->step(1);
  auto tap = seq->ptr<tensortap::TapImpl>(0);
  const at::Tensor t = at::ones({256});
  for (auto _ : state) benchmark::DoNotOptimize(tap->forward(t));
}
BENCHMARK(BM_TapNotSampled);

void BM_TapUnbound(benchmark::State& state) {
  tensortap::Tap tap;
  const at::Tensor t = at::ones({256});
  for (auto _ : state) benchmark::DoNotOptimize(tap->forward(t));
}
BENCHMARK(BM_TapUnbound);

// Staging memory is touched once and then reused for the whole run, so a
// steady-state figure must not pay its first-touch page faults: fill both
// buffers once and wait for the writer.
void warm_staging(tensortap::Recorder& rec, std::size_t buffer_bytes, std::int64_t& step) {
  const at::Tensor big = at::zeros({static_cast<std::int64_t>(buffer_bytes / 4)});
  for (int i = 0; i < 2; ++i) {
    rec.step(step++);
    rec.capture("warm", big);
  }
  rec.flush();
}

void BM_Memcpy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(n, 1), dst(n, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// memcpy into a destination that moves through two buffers of the size
// BM_CaptureSampled's staging has, as staging does: the destination is as
// cold in the caches as staging's, so the gap between this and BM_Memcpy is
// the hardware's, not tensortap's.
void BM_MemcpyRing(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::size_t buffer = std::max<std::size_t>(n, 4 << 20);
  std::vector<char> src(n, 1), dst(2 * buffer, 0);
  const std::size_t slot = (n + 63) / 64 * 64;
  std::size_t at = 0;
  for (auto _ : state) {
    if (at + slot > dst.size()) at = 0;
    std::memcpy(dst.data() + at, src.data(), n);
    at += slot;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

// One capture per step. Captures come in bursts that fit in one staging
// buffer, with the writer draining between bursts outside the timed region:
// this is what the training thread pays while staging has room. What it pays
// when the writer falls behind is the writer's rate (bench_writers, and
// bench_scale for the knee).
void BM_CaptureSampled(benchmark::State& state, bool warm) {
  const auto n = static_cast<std::size_t>(state.range(0));
  // Warm: a small buffer, reused burst after burst. Cold: one buffer large
  // enough for every capture, each landing on pages not touched before.
  const std::size_t buffer = std::max<std::size_t>(n, warm ? (4 << 20) : (64 << 20));
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").buffer_bytes(buffer));
  std::int64_t step = 0;
  if (warm) warm_staging(rec, buffer, step);
  const at::Tensor t = at::ones({static_cast<std::int64_t>(n / 4)});
  const std::size_t burst = std::max<std::size_t>(1, buffer / ((n + 63) / 64 * 64));
  std::size_t in_burst = 0;
  for (auto _ : state) {
    rec.step(step++);
    rec.capture("x", t);
    if (++in_burst == burst) {
      state.PauseTiming();
      rec.flush();
      in_burst = 0;
      state.ResumeTiming();
    }
  }
  rec.close();  // after the loop, untimed: the drain is the writer's cost
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
  state.counters["dropped"] = static_cast<double>(rec.counters().dropped);
}

// A sampled capture of a one-element tensor: the copy is 4 bytes, the rest
// is the enqueue. With k captures per step, step() is amortized over k.
// Names as a model's are (longer than a short string's 15 characters). As
// in BM_CaptureSampled, captures come in bursts that fit in staging, with
// the writer draining between bursts outside the timed region: the
// writer's own cost per record is bench_writers' and bench_scale's figure.
void BM_CaptureFixedCost(benchmark::State& state) {
  const auto k = static_cast<std::size_t>(state.range(0));
  BenchDir dir;
  const std::size_t buffer = 4 << 20;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").format(tensortap::Format::Packed).buffer_bytes(buffer));
  std::int64_t step = 0;
  warm_staging(rec, buffer, step);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < k; ++i) names.push_back("model.layers." + std::to_string(i) + ".mlp.out");
  const at::Tensor t = at::ones({1});
  // 64-byte slots: 16,384 of them are a quarter of a buffer.
  const std::size_t burst = std::max<std::size_t>(1, 1024 / k);
  std::size_t in_burst = 0;
  for (auto _ : state) {
    rec.step(step++);
    for (const std::string& name : names) rec.capture(name, t);
    if (++in_burst == burst) {
      state.PauseTiming();
      rec.flush();
      in_burst = 0;
      state.ResumeTiming();
    }
  }
  rec.close();  // after the loop, untimed: the drain is the writer's cost
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * k));
}
BENCHMARK(BM_CaptureFixedCost)->Arg(1)->UseRealTime();

void BM_Capture64x1K(benchmark::State& state) {
  const bool sampled = state.range(0) != 0;
  BenchDir dir;
  const std::size_t buffer = 16 << 20;
  tensortap::Options options(dir.path + "/run");
  options.format(tensortap::Format::Packed).buffer_bytes(buffer);
  if (!sampled) options.every(0);
  tensortap::Recorder rec(options);
  // No warm-up captures: they would count in the instructions of
  // hot_path_64x1k.sh; the writer thread populates staging as it starts.
  std::int64_t step = 0;
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (int i = 0; i < 64; ++i) {
    names.push_back("model.layers." + std::to_string(i) + ".mlp.out");
    tensors.push_back(at::full({256}, static_cast<float>(i)));
  }
  // 100 steps of 64 records of 1 KiB (and their slots) fit in a 16 MiB
  // staging buffer; the writer drains between bursts, untimed.
  int in_burst = 0;
  for (auto _ : state) {
    rec.step(step++);
    for (int i = 0; i < 64; ++i) rec.capture(names[static_cast<std::size_t>(i)], tensors[static_cast<std::size_t>(i)]);
    if (++in_burst == 100) {
      state.PauseTiming();
      rec.flush();
      in_burst = 0;
      state.ResumeTiming();
    }
  }
  rec.close();
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 64);
  state.counters["dropped"] = static_cast<double>(rec.counters().dropped);
}
BENCHMARK(BM_Capture64x1K)->Arg(0)->Arg(1)->Iterations(2000)->UseRealTime();
BENCHMARK(BM_CaptureFixedCost)->Arg(64)->UseRealTime();

// The recorder of BM_CaptureSelection: a 100-name include ("^model\\.layers\\.<k>\\.mlp\\.out$",
// k < 100, an alternation the automaton searches in full for a name it
// does not hold) or a one-word exclude ("attn").
tensortap::Options selection_options(const std::string& dir, bool include) {
  tensortap::Options options(dir);
  options.format(tensortap::Format::Packed).buffer_bytes(16 << 20);
  if (include) {
    std::string pattern;
    for (int i = 0; i < 100; ++i)
      pattern += (i ? "|" : "") + std::string("^model\\.layers\\.") + std::to_string(i) + "\\.mlp\\.out$";
    options.include(pattern);
  } else {
    options.exclude("attn");
  }
  return options;
}

// 25 names: "model.layers.<k>.mlp.out" are recorded by either pattern,
// "....attn.out" left out by either; k from `first`.
std::vector<std::string> selection_names(int first, bool left_out) {
  std::vector<std::string> names;
  for (int i = 0; i < 25; ++i)
    names.push_back("model.layers." + std::to_string(first + i) + (left_out ? ".attn.out" : ".mlp.out"));
  return names;
}

// One thread: a step, 25 captures, recorded or left out.
void BM_CaptureSelection(benchmark::State& state) {
  const bool include = state.range(0) == 0;
  const bool left_out = state.range(1) != 0;
  BenchDir dir;
  tensortap::Recorder rec(selection_options(dir.path + "/run", include));
  const std::vector<std::string> names = selection_names(0, left_out);
  const at::Tensor x = at::ones({1});
  std::int64_t step = 0;
  int in_burst = 0;
  for (auto _ : state) {
    rec.step(step++);
    for (const std::string& name : names) rec.capture(name, x);
    if (!left_out && ++in_burst == 200) {
      state.PauseTiming();
      rec.flush();
      in_burst = 0;
      state.ResumeTiming();
    }
  }
  rec.close();
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 25);
  state.counters["records"] = static_cast<double>(rec.counters().records);
}
BENCHMARK(BM_CaptureSelection)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"exclude", "left_out"})->UseRealTime();

// Left-out names from 1 and 4 threads at once, each its own 25: whether
// leaving a name out serialises the threads (round 4 matched it under the
// name table's lock). One step: nothing is recorded, nothing to drain.
std::unique_ptr<BenchDir> g_selection_dir;
std::unique_ptr<tensortap::Recorder> g_selection_rec;
void BM_CaptureLeftOutThreads(benchmark::State& state) {
  const bool include = state.range(0) == 0;
  if (state.thread_index() == 0) {
    g_selection_dir = std::make_unique<BenchDir>();
    g_selection_rec =
        std::make_unique<tensortap::Recorder>(selection_options(g_selection_dir->path + "/run", include));
    g_selection_rec->step(0);
  }
  const std::vector<std::string> names = selection_names(state.thread_index() * 25, true);
  const at::Tensor x = at::ones({1});
  for (auto _ : state)
    for (const std::string& name : names) g_selection_rec->capture(name, x);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 25);
  if (state.thread_index() == 0) {
    g_selection_rec->close();
    g_selection_rec.reset();
    g_selection_dir.reset();
  }
}
BENCHMARK(BM_CaptureLeftOutThreads)->Arg(0)->Arg(1)->ArgName("exclude")->Threads(1)->Threads(4)->UseRealTime();

// A fine-tune with a frozen backbone (issue 58): 12 frozen Linear(32, 32)
// layers and a trainable head of 4, batch 8 (small, so that a step is the
// graph's overhead, not arithmetic), one forward and backward a step, a
// recorder sampling every 100th step. watch:0, the head alone is watched;
// watch:1, the whole model: the head's hooks also look for a layer unfrozen
// since step() (a relaxed load, and a lock once a step); watch:2, the
// backbone alone, every watched parameter frozen: the first backward node
// of a step looks, through a RecordFunction callback, which costs every
// ATen op a check while it is on. The differences are what finding a layer
// unfrozen during a step costs.
void BM_FrozenBackboneStep(benchmark::State& state) {
  const int watch = static_cast<int>(state.range(0));
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 12; ++i) {
    net->push_back(torch::nn::Linear(32, 32));
    net->push_back(torch::nn::ReLU());
  }
  for (auto& p : net->parameters()) p.set_requires_grad(false);
  for (int i = 0; i < 4; ++i) {
    net->push_back(torch::nn::Linear(32, 32));
    net->push_back(torch::nn::Tanh());
  }
  BenchDir dir;
  tensortap::Options options(dir.path + "/run");
  options.format(tensortap::Format::Packed).every(100).kinds({tensortap::Kind::Grad});
  if (watch == 0) options.exclude("^([0-9]|1[0-9]|2[0-3])\\.");  // the 12 frozen layers: children 0-23
  if (watch == 2) options.include("^([0-9]|1[0-9]|2[0-3])\\.");
  auto rec = tensortap::watch(*net, options);
  const at::Tensor x = at::randn({8, 32});
  std::int64_t step = 0;
  for (auto _ : state) {
    rec->step(step++);
    net->forward(x).sum().backward();
    for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
  }
  rec->close();
}
BENCHMARK(BM_FrozenBackboneStep)->Arg(0)->Arg(1)->Arg(2)->ArgName("watch")->UseRealTime();

// Sizes 1 KiB to 64 MiB; iterations bounded by bytes, because every sampled
// capture becomes a file in /dev/shm.
const bool registered = [] {
  for (std::int64_t n : {1 << 10, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20}) {
    benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy)->Arg(n);
    benchmark::RegisterBenchmark("BM_MemcpyRing", BM_MemcpyRing)->Arg(n);
    const std::int64_t iters = std::clamp<std::int64_t>((std::int64_t{512} << 20) / n, 16, 20000);
    benchmark::RegisterBenchmark("BM_CaptureSampled", BM_CaptureSampled, true)
        ->Arg(n)
        ->Iterations(iters)
        ->UseRealTime();
    const std::int64_t cold_iters = std::clamp<std::int64_t>((std::int64_t{64} << 20) / n, 1, 2000);
    benchmark::RegisterBenchmark("BM_CaptureSampledCold", BM_CaptureSampled, false)
        ->Arg(n)
        ->Iterations(cold_iters)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
