// What capturing CUDA tensors costs training, on a GPU (LibTorch with CUDA).
//
//   build/bench/bench_cuda
//
// BM_CaptureCuda/<bytes>/<layout>: the training thread's time per capture()
// of a CUDA tensor (contiguous float32, a strided view, bfloat16), step()
// included; the target is 20 us or less. Everything
// after the snapshot (the copy to the host, the file) is off that thread;
// the staging and device budget are large enough that no capture waits.
// BM_CaptureCudaNaive/<bytes>: the naive way, t.cpu() in the hook, which
// waits for the device and the copy.
//
// BM_TrainMlp/<mode>, BM_TrainCnn/<mode>, BM_TrainTransformer/<mode>: time
// per training step of an MLP, a CNN and a small transformer encoder sized
// for a GPU. mode 0: tensortap off (the model's Taps pass through); 1:
// watch() sampling every 100 steps; 2: every step, every gradient and
// activation; 3: statistics only (every(0).stats_every(1)) of every
// gradient and activation at every step; 4: the pageable peer, no
// tensortap: a hook on each tensor mode 2 captures does t.detach().cpu()
// and write()s the bytes, on the training thread. An iteration is 50 steps,
// then a synchronization of the training stream: its own kernels, not the
// copier's copies or the writer's files, which run beside it (flush() comes
// after the timed loop). The counter bytes_per_step is what tensortap
// captured per step (for the PCIe budget, scripts/gpu_summary.py). The
// device-to-host rate of the engine against cudaMemcpyAsync (0.85) is
// bench_cuda_engine's: through capture() the rate would be the writer's and
// the disk's, not the copy engine's. Modes are interleaved, 3 rounds; the
// targets are step time ratios (mode 1 / mode 0, mode 3 / mode 0) of 1.03
// or less. scripts/gpu.sh prints the ratios.
//
// BM_Paired*/<mode> (after train_paired below): modes 1 and 3 measured
// against an unwatched twin in alternating blocks; drift cancels, a little
// of the watched side's background work may not be counted.
//
//   build/bench/bench_cuda --profile DIR
//
// instead profiles, with PyTorch's profiler (Kineto, CUPTI), three steps of
// the MLP capturing every step (mode 2), and twenty captures of one CUDA
// tensor taken for statistics only, and two hundred captures of a 4 KiB
// tensor, and saves the traces as DIR/step_trace.json, stats_trace.json and
// capture_trace.json (Chrome's trace format).
// bench/gpu_timeline.py reads them: the streams the copies ran on, their
// overlap with the training's kernels, the kernels per statistics vector,
// and a picture of the timeline.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"

namespace {

bool have_cuda(benchmark::State& state) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

const torch::Device kGpu(torch::kCUDA, 0);

// Arg 1, the tensor captured: 0 contiguous float32; 1 a strided view (the
// transpose of a square float32 matrix: the snapshot gathers it on the
// device); 2 bfloat16 (widened to float32 on the device).
at::Tensor capture_source(std::int64_t bytes, std::int64_t layout) {
  if (layout == 2) return torch::ones({bytes / 2}, torch::dtype(torch::kBFloat16).device(kGpu));
  if (layout == 1) {
    auto side = static_cast<std::int64_t>(std::sqrt(static_cast<double>(bytes / 4)));
    return torch::ones({side, side}, kGpu).t();
  }
  return torch::ones({bytes / 4}, kGpu);
}

void BM_CaptureCuda(benchmark::State& state) {
  if (!have_cuda(state)) return;
  const auto n = state.range(0);
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").buffer_bytes(std::size_t{512} << 20));
  const at::Tensor t = capture_source(n, state.range(1));
  std::int64_t step = 0;
  // Warm-up: the device arena, the events, the pinned staging buffers.
  rec.step(step++);
  rec.capture("x", t);
  rec.flush();
  for (auto _ : state) {
    rec.step(step++);
    rec.capture("x", t);
  }
  rec.close();  // outside the timed loop: the copies and files are not the training thread's
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(t.nbytes()));
  state.counters["dropped"] = static_cast<double>(rec.counters().dropped);
}

void BM_CaptureCudaNaive(benchmark::State& state) {
  if (!have_cuda(state)) return;
  const at::Tensor t = torch::ones({state.range(0) / 4}, kGpu);
  for (auto _ : state) benchmark::DoNotOptimize(t.detach().cpu());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// 4 KiB to 1 MiB; 500 captures fit in the staging buffers and device budget.
BENCHMARK(BM_CaptureCuda)->ArgsProduct({{4 << 10, 64 << 10, 1 << 20}, {0, 1, 2}})->Iterations(500)->UseRealTime();
BENCHMARK(BM_CaptureCudaNaive)->RangeMultiplier(16)->Range(4 << 10, 1 << 20)->UseRealTime();

// Mode 4, the pageable peer: what the same captures cost done by hand in a
// hook, t.detach().cpu() (which waits for the device) and a write() of the
// bytes, all on the training thread.
struct PageablePeer {
  int fd = -1;
  void write_tensor(const at::Tensor& t) const {
    const at::Tensor host = t.detach().cpu().contiguous();
    const auto* p = static_cast<const char*>(host.data_ptr());
    for (std::size_t left = host.nbytes(); left > 0;) {
      const ssize_t n = ::write(fd, p, left);
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  // An activation and, through a hook on it, its gradient: what a Tap takes.
  at::Tensor activation(const at::Tensor& x) const {
    write_tensor(x);
    if (x.requires_grad()) x.register_hook([this](const at::Tensor& g) { write_tensor(g); });
    return x;
  }
};
const PageablePeer* peer = nullptr;  // set while a mode 4 benchmark runs

at::Tensor tapped(tensortap::Tap& tap, const at::Tensor& x) { return peer ? peer->activation(tap(x)) : tap(x); }

struct GpuMlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  tensortap::Tap h1, h2;
  GpuMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(1024, 2048));
    h1 = register_module("h1", tensortap::Tap());
    fc2 = register_module("fc2", torch::nn::Linear(2048, 2048));
    h2 = register_module("h2", tensortap::Tap());
    fc3 = register_module("fc3", torch::nn::Linear(2048, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = tapped(h1, torch::relu(fc1(x)));
    x = tapped(h2, torch::relu(fc2(x)));
    return fc3(x);
  }
};
TORCH_MODULE(GpuMlp);

struct GpuCnnImpl : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear fc{nullptr};
  tensortap::Tap a1, a2;
  GpuCnnImpl() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1)));
    a1 = register_module("a1", tensortap::Tap());
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).padding(1)));
    a2 = register_module("a2", tensortap::Tap());
    fc = register_module("fc", torch::nn::Linear(128 * 8 * 8, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    namespace F = torch::nn::functional;
    x = F::max_pool2d(tapped(a1, torch::relu(c1(x))), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(tapped(a2, torch::relu(c2(x))), F::MaxPool2dFuncOptions(2));
    return fc(x.flatten(1));
  }
};
TORCH_MODULE(GpuCnn);

// A small transformer encoder: token embedding, two encoder layers (d_model
// 256, 4 heads, feed-forward 1024, no dropout) with a Tap after each, mean
// over the sequence, a linear head. Input: tokens [sequence, batch].
struct GpuTransformerImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::TransformerEncoderLayer l1{nullptr}, l2{nullptr};
  torch::nn::Linear head{nullptr};
  tensortap::Tap t1, t2;
  GpuTransformerImpl() {
    const auto layer = torch::nn::TransformerEncoderLayerOptions(256, 4).dim_feedforward(1024).dropout(0.0);
    emb = register_module("emb", torch::nn::Embedding(1000, 256));
    l1 = register_module("l1", torch::nn::TransformerEncoderLayer(layer));
    t1 = register_module("t1", tensortap::Tap());
    l2 = register_module("l2", torch::nn::TransformerEncoderLayer(layer));
    t2 = register_module("t2", tensortap::Tap());
    head = register_module("head", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    torch::Tensor x = tapped(t1, l1(emb(tokens)));
    x = tapped(t2, l2(x));
    return head(x.mean(0));
  }
};
TORCH_MODULE(GpuTransformer);

constexpr int kStepsPerIteration = 50;

// The options of modes 1 (every 100 steps), 2 (every step) and 3
// (statistics only, every step).
tensortap::Options mode_options(const std::string& run, std::int64_t mode) {
  tensortap::Options options(run);
  options.buffer_bytes(std::size_t{256} << 20);
  if (mode == 3)
    options.every(0).stats_every(1);
  else
    options.every(mode == 1 ? 100 : 1);
  return options;
}

template <class Model>
void train(benchmark::State& state, Model model, const at::Tensor& x, const at::Tensor& y) {
  const auto mode = state.range(0);
  model->to(kGpu);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  BenchDir dir;
  std::shared_ptr<tensortap::Recorder> rec;
  PageablePeer pageable;
  if (mode >= 1 && mode <= 3) {
    rec = tensortap::watch(*model, mode_options(dir.path + "/run", mode));
  } else if (mode == 4) {
    pageable.fd = ::open((dir.path + "/peer.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (pageable.fd < 0) {
      state.SkipWithError("cannot open the peer's file");
      return;
    }
    peer = &pageable;
    // Every parameter's gradient, as watch() takes them.
    for (auto& p : model->parameters())
      p.register_hook([&pageable](const at::Tensor& g) { pageable.write_tensor(g); });
  }
  std::int64_t step = 0;
  const auto one_step = [&] {
    if (rec) rec->step(step);
    ++step;
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 20; ++i) one_step();  // warm-up: kernels, allocator, arena
  if (rec) rec->flush();
  torch::cuda::synchronize();
  for (auto _ : state) {
    for (int i = 0; i < kStepsPerIteration; ++i) one_step();
    // The training stream's own work, not the copier's: a device-wide sync
    // or a flush() here would time tensortap's copies and files, which run
    // beside training, not in it.
    at::cuda::getCurrentCUDAStream().synchronize();
  }
  // Untimed: what is still queued must still reach the disk.
  if (rec) rec->flush();
  peer = nullptr;
  if (pageable.fd >= 0) ::close(pageable.fd);
  state.SetItemsProcessed(state.iterations() * kStepsPerIteration);
  state.counters["step_time"] = benchmark::Counter(static_cast<double>(state.iterations() * kStepsPerIteration),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if (rec) {
    rec->close();
    const auto c = rec->counters();
    state.counters["dropped"] = static_cast<double>(c.dropped);
    state.counters["bytes_per_step"] = static_cast<double>(c.bytes) / static_cast<double>(step);
    state.counters["stats_rows_per_step"] = static_cast<double>(c.stats_rows) / static_cast<double>(step);
  }
}

// BM_Paired*/<mode>: the same model twice, one watched in `mode` (1, 2 or
// 3, as above) and one not, trained in alternating blocks of 10 steps (the
// order swapped every block pair), each block timed to the end of its own
// stream's work. Drift in clocks and load then falls on both alike, which
// three rounds of BM_Train* could not resolve to 3% (their rounds differed
// by up to 20% on an H200 machine). The copier's copies and the writer run
// beside the blocks as they would beside training; a watched block's copies
// and files may spill into the next block, an unwatched one about half the
// time, so the ratio understates by up to half of that spill. Counters:
// off_step and on_step (s), ratio = on / off.
template <class Model>
void train_paired(benchmark::State& state, const std::function<Model()>& make, const at::Tensor& x,
                  const at::Tensor& y) {
  const auto mode = state.range(0);
  Model off = make(), on = make();
  off->to(kGpu);
  on->to(kGpu);
  torch::optim::SGD opt_off(off->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD opt_on(on->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  BenchDir dir;
  auto rec = tensortap::watch(*on, mode_options(dir.path + "/run", mode));
  std::int64_t step = 0;
  const auto block = [&](Model& model, torch::optim::SGD& opt, bool watched) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
      if (watched) rec->step(step++);
      const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    at::cuda::getCurrentCUDAStream().synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < 4; ++i) {  // warm-up: kernels, allocator, arena
    block(off, opt_off, false);
    block(on, opt_on, true);
  }
  rec->flush();
  double t_off = 0, t_on = 0;
  std::int64_t pairs = 0;
  for (auto _ : state) {
    if (pairs++ % 2 == 0) {
      t_off += block(off, opt_off, false);
      t_on += block(on, opt_on, true);
    } else {
      t_on += block(on, opt_on, true);
      t_off += block(off, opt_off, false);
    }
  }
  rec->flush();
  rec->close();
  state.counters["off_step"] = t_off / static_cast<double>(pairs * 10);
  state.counters["on_step"] = t_on / static_cast<double>(pairs * 10);
  state.counters["ratio"] = t_on / t_off;
  state.counters["dropped"] = static_cast<double>(rec->counters().dropped);
}

void BM_PairedMlp(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train_paired<GpuMlp>(state, [] { return GpuMlp(); }, torch::randn({512, 1024}, kGpu),
                       torch::randint(0, 10, {512}, torch::dtype(torch::kLong).device(kGpu)));
}

void BM_PairedCnn(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train_paired<GpuCnn>(state, [] { return GpuCnn(); }, torch::randn({128, 3, 32, 32}, kGpu),
                       torch::randint(0, 10, {128}, torch::dtype(torch::kLong).device(kGpu)));
}

void BM_PairedTransformer(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train_paired<GpuTransformer>(state, [] { return GpuTransformer(); },
                               torch::randint(0, 1000, {64, 32}, torch::dtype(torch::kLong).device(kGpu)),
                               torch::randint(0, 10, {32}, torch::dtype(torch::kLong).device(kGpu)));
}

void BM_TrainMlp(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train(state, GpuMlp(), torch::randn({512, 1024}, kGpu),
        torch::randint(0, 10, {512}, torch::dtype(torch::kLong).device(kGpu)));
}

void BM_TrainCnn(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train(state, GpuCnn(), torch::randn({128, 3, 32, 32}, kGpu),
        torch::randint(0, 10, {128}, torch::dtype(torch::kLong).device(kGpu)));
}

void BM_TrainTransformer(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train(state, GpuTransformer(), torch::randint(0, 1000, {64, 32}, torch::dtype(torch::kLong).device(kGpu)),
        torch::randint(0, 10, {32}, torch::dtype(torch::kLong).device(kGpu)));
}

namespace profiler = torch::autograd::profiler;

void start_profiler() {
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<torch::profiler::impl::ActivityType> activities{torch::profiler::impl::ActivityType::CPU,
                                                                 torch::profiler::impl::ActivityType::CUDA};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
}

int profile(const std::string& out) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_cuda --profile: no CUDA device\n");
    return 1;
  }
  BenchDir dir;
  {
    // One step of the MLP with everything captured (mode 2), after warm-up.
    torch::manual_seed(0);
    GpuMlp model;
    model->to(kGpu);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    const at::Tensor x = torch::randn({512, 1024}, kGpu);
    const at::Tensor y = torch::randint(0, 10, {512}, torch::dtype(torch::kLong).device(kGpu));
    auto rec = tensortap::watch(*model, tensortap::Options(dir.path + "/step").every(1).buffer_bytes(std::size_t{256}
                                                                                                      << 20));
    std::int64_t step = 0;
    const auto one_step = [&] {
      rec->step(step++);
      const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    };
    for (int i = 0; i < 20; ++i) one_step();
    rec->flush();
    torch::cuda::synchronize();
    start_profiler();
    for (int i = 0; i < 3; ++i) one_step();
    // Inside the window: the copies of the last step still run after it.
    torch::cuda::synchronize();
    rec->flush();
    profiler::disableProfiler()->save(out + "/step_trace.json");
    rec->close();
    std::printf("bench_cuda --profile: 3 steps, %lld records in all, trace in %s/step_trace.json\n",
                static_cast<long long>(rec->counters().records), out.c_str());
  }
  {
    // Statistics only: the kernels one statistics vector takes.
    constexpr int kCaptures = 20;
    const at::Tensor t = torch::randn({1 << 20}, kGpu);
    tensortap::Recorder rec(tensortap::Options(dir.path + "/stats").every(0).stats_every(1));
    rec.step(0);
    rec.capture("warm", t);
    rec.flush();
    torch::cuda::synchronize();
    start_profiler();
    for (int i = 0; i < kCaptures; ++i) {
      rec.step(i + 1);
      rec.capture("x", t);
    }
    torch::cuda::synchronize();
    rec.flush();
    profiler::disableProfiler()->save(out + "/stats_trace.json");
    rec.close();
    std::printf("bench_cuda --profile: %d statistics captures of a 4 MiB float32 tensor, %lld rows, trace in "
                "%s/stats_trace.json\n",
                kCaptures, static_cast<long long>(rec.counters().stats_rows), out.c_str());
  }
  {
    // The training thread's side of a capture: 200 captures of a 4 KiB
    // tensor, one a step, after warm-up. Its CUDA runtime calls, and the
    // copier's beside them, show where the microseconds go.
    constexpr int kCaptures = 200;
    const at::Tensor t = torch::randn({1024}, kGpu);
    tensortap::Recorder rec(tensortap::Options(dir.path + "/capture").buffer_bytes(std::size_t{64} << 20));
    for (int i = 0; i < 20; ++i) {
      rec.step(i);
      rec.capture("x", t);
    }
    rec.flush();
    torch::cuda::synchronize();
    start_profiler();
    for (int i = 0; i < kCaptures; ++i) {
      rec.step(20 + i);
      rec.capture("x", t);
    }
    rec.flush();
    profiler::disableProfiler()->save(out + "/capture_trace.json");
    rec.close();
    std::printf("bench_cuda --profile: %d captures of a 4 KiB tensor, trace in %s/capture_trace.json\n", kCaptures,
                out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--profile") return profile(argv[2]);
  // Modes interleaved round by round, so drift spreads over all of them.
  for (int round = 0; round < 3; ++round)
    for (int mode = 0; mode < 5; ++mode) {
      benchmark::RegisterBenchmark("BM_TrainMlp", BM_TrainMlp)->Arg(mode)->UseRealTime()->MinTime(0.5);
      benchmark::RegisterBenchmark("BM_TrainCnn", BM_TrainCnn)->Arg(mode)->UseRealTime()->MinTime(0.5);
      benchmark::RegisterBenchmark("BM_TrainTransformer", BM_TrainTransformer)->Arg(mode)->UseRealTime()->MinTime(0.5);
    }
  for (const int mode : {1, 3}) {
    benchmark::RegisterBenchmark("BM_PairedMlp", BM_PairedMlp)->Arg(mode)->UseRealTime()->MinTime(6.0);
    benchmark::RegisterBenchmark("BM_PairedCnn", BM_PairedCnn)->Arg(mode)->UseRealTime()->MinTime(6.0);
    benchmark::RegisterBenchmark("BM_PairedTransformer", BM_PairedTransformer)->Arg(mode)->UseRealTime()->MinTime(6.0);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
