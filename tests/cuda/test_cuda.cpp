// CUDA tensors through the whole recorder: values, in-place changes after
// capture, memory over many captures, several devices. Built only with a
// LibTorch that has CUDA; every case skips (with a warning) without a device.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

#include "tests/support/extreme_stats.h"
#include "tests/support/helpers.h"
#include "sdk/src/cuda/capture.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/cuda/pinned.h"
#include "sdk/src/front/front_end.h"
#include "sdk/src/core/stats.h"
#include "sdk/src/sinks/tensorboard.h"

namespace {

bool have_cuda() {
  if (!torch::cuda::is_available()) {
    WARN("skipped: LibTorch sees no CUDA device");
    return false;
  }
  return true;
}

using tt_test::npy;

// What the file must hold: the tensor's values on the host, bfloat16 widened
// to float32 as the writers store it, conjugate views resolved.
at::Tensor expected_of(const at::Tensor& t) {
  at::Tensor c = t.cpu().resolve_conj().resolve_neg();
  return c.scalar_type() == at::kBFloat16 ? c.to(at::kFloat) : c;
}

bool same(const at::Tensor& got, const at::Tensor& want) {
  return got.scalar_type() == want.scalar_type() && got.sizes() == want.sizes() && torch::equal(got, want);
}

// Host memory the kernel counts as locked or pinned for this process
// (VmLck + VmPin in /proc/self/status, kB): the operating system's view,
// not tensortap's counter.
std::int64_t locked_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  std::int64_t kb = 0;
  while (std::getline(in, line))
    if (line.rfind("VmLck:", 0) == 0 || line.rfind("VmPin:", 0) == 0) kb += std::stoll(line.substr(6));
  return kb;
}

}  // namespace

TEST_CASE("CUDA captures hold exactly t.cpu(), every dtype and layout", "[gpu][cuda][torch]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(0);
  const auto on = [&](at::ScalarType t) { return torch::TensorOptions().dtype(t).device(dev); };
  std::vector<std::pair<std::string, at::Tensor>> cases{
      {"f32", torch::randn({37, 65}, on(torch::kFloat))},
      {"f64", torch::randn({13, 7}, on(torch::kDouble))},
      {"f16", torch::randn({1000}, on(torch::kHalf))},
      {"bf16", torch::randn({33, 3}, on(torch::kBFloat16))},
      {"c64", torch::randn({5, 7}, on(torch::kComplexFloat))},
      {"c128", torch::randn({9}, on(torch::kComplexDouble))},
      {"u8", torch::randint(0, 256, {777}, on(torch::kByte))},
      {"i8", torch::randint(-128, 128, {777}, on(torch::kChar))},
      {"i16", torch::randint(-30000, 30000, {300}, on(torch::kShort))},
      {"i32", torch::randint(-1000000, 1000000, {300}, on(torch::kInt))},
      {"i64", torch::randint(-1000000, 1000000, {3, 100}, on(torch::kLong))},
      {"bool", torch::rand({99}, on(torch::kFloat)) > 0.5},
      {"scalar", torch::tensor(3.5, on(torch::kFloat))},
      {"empty", torch::empty({0, 5}, on(torch::kFloat))},
      // Not a plain byte copy: strided, sliced with a step, conjugated,
      // bfloat16 strided.
      {"transposed", torch::randn({64, 48}, on(torch::kFloat)).t()},
      {"stepped", torch::randn({100}, on(torch::kDouble)).slice(0, 1, 100, 3)},
      {"conj", torch::randn({6, 6}, on(torch::kComplexFloat)).conj()},
      {"bf16_t", torch::randn({40, 24}, on(torch::kBFloat16)).t()},
      // Larger than a staging buffer (chunks) and than the device budget
      // (its own snapshot).
      {"large", torch::randn({3 << 20}, on(torch::kFloat))},
      {"large_t", torch::randn({1024, 1500}, on(torch::kFloat)).t()},
      // Contiguous, but not at the start of its storage: a byte copy from
      // the view's first element, not the storage's.
      {"offset", torch::randn({4096}, on(torch::kFloat)).slice(0, 100, 1100)},
      {"offset_2d", torch::randn({64, 64}, on(torch::kFloat)).slice(0, 3, 10)},
      // Not C-contiguous: ATen's copy into C order.
      {"channels_last", torch::randn({2, 3, 8, 8}, on(torch::kFloat)).contiguous(at::MemoryFormat::ChannelsLast)},
      // Every row the same memory: stored as the full expanded array.
      {"expanded", torch::randn({1, 64}, on(torch::kFloat)).expand({32, 64})},
      {"expanded_scalar", torch::randn({}, on(torch::kFloat)).expand({5, 7})},
  };
  const std::uint64_t before = tensortap::detail::cuda_captures();
  std::vector<at::Tensor> expected;
  {
    tensortap::Recorder rec(tensortap::Options(run).buffer_bytes(1 << 20));
    rec.step(0);
    for (const auto& [name, t] : cases) {
      rec.capture(name, t);
      expected.push_back(expected_of(t));
    }
    rec.close();
    CHECK(rec.counters().dropped == 0);
    CHECK(rec.counters().errors == 0);
  }
  // Through the engine, not a synchronous copy to the host.
  CHECK(tensortap::detail::cuda_captures() - before == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].first << ": " << cases[i].second.toString() << " " << cases[i].second.sizes());
    const at::Tensor got = tensortap::load_npy(npy(run, "tensor", cases[i].first, 0));
    CHECK(same(got, expected[i]));
  }
}

TEST_CASE("captured gradients and weights survive opt.step() and zero_grad() in place, 1,000 steps",
          "[gpu][cuda][torch][slow]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(64, 128), torch::nn::Functional(torch::relu),
                              torch::nn::Linear(128, 10));
  model->to(dev);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const at::Tensor weight = model->named_parameters()["0.weight"];
  constexpr int kSteps = 1000;
  // What each step's files must hold, kept on the device and taken in stream
  // order like the captures: no host synchronization in the loop, so the
  // copier races with the steps that follow, as in real training.
  std::vector<at::Tensor> want_grad, want_weight, want_bias_grad;
  {
    auto rec = tensortap::watch(*model, tensortap::Options(run).every(1).buffer_bytes(256 << 10));
    for (int step = 0; step < kSteps; ++step) {
      rec->step(step);
      const at::Tensor x = torch::randn({32, 64}, dev);
      const at::Tensor loss = model->forward(x).pow(2).mean();
      loss.backward();
      // The gradient hooks hold the step's gradient; weight.grad() is what
      // the optimizer sees: the same values.
      rec->capture("w", weight);
      rec->capture("w_grad", weight.grad());
      want_weight.push_back(weight.detach().clone());
      want_grad.push_back(weight.grad().detach().clone());
      want_bias_grad.push_back(model->named_parameters()["2.bias"].grad().detach().clone());
      opt.step();                            // changes the weight in place
      opt.zero_grad(/*set_to_none=*/false);  // zeroes the gradient in place
    }
    rec->close();
    CHECK(rec->counters().dropped == 0);
    CHECK(rec->counters().errors == 0);
  }
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    REQUIRE(same(tensortap::load_npy(npy(run, "tensor", "w", step)), want_weight[step].cpu()));
    REQUIRE(same(tensortap::load_npy(npy(run, "tensor", "w_grad", step)), want_grad[step].cpu()));
    // Through watch(): the hook's accumulator is overwritten in place by the
    // next step's backward.
    REQUIRE(same(tensortap::load_npy(npy(run, "grad", "0.weight", step)), want_grad[step].cpu()));
    REQUIRE(same(tensortap::load_npy(npy(run, "grad", "2.bias", step)), want_bias_grad[step].cpu()));
  }
}

TEST_CASE("no growth of pinned or device memory over 10,000 captures", "[gpu][cuda][torch][slow]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const torch::Device dev(torch::kCUDA, 0);
  constexpr std::size_t kBuffer = 1 << 20;  // the device budget is 2 MiB
  // Small ones coalesce, one is chunked, one is larger than the device
  // budget (a snapshot from LibTorch's allocator), one needs a kernel.
  std::vector<at::Tensor> tensors{
      torch::randn({16}, dev),
      torch::randn({1000}, dev),
      torch::randn({64, 64}, dev),
      torch::randn({400000}, dev),
      torch::randn({800000}, dev),
      torch::randn({256, 64}, torch::TensorOptions().dtype(torch::kBFloat16).device(dev)).t()};
  tensortap::Recorder rec(tensortap::Options(dir / "run").every(1).buffer_bytes(kBuffer));
  std::int64_t step = 0;
  const auto steps = [&](int n) {
    for (int i = 0; i < n; ++i, ++step) {
      rec.step(step);
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        rec.capture("t" + std::to_string(k), tensors[k]);
        tensors[k].add_(1);
      }
    }
    rec.flush();
  };
  steps(100);  // warm-up: arena, events, pinned buffers, allocator blocks
  const auto reserved = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).reserved_bytes[0].current; };
  std::size_t free_before = 0, free_after = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_before, &total) == cudaSuccess);
  const auto reserved_before = reserved();
  const std::size_t pinned_before = tensortap::detail::pinned_host_bytes();
  const std::int64_t locked_before = locked_kb();
  const int n = 10000 / static_cast<int>(tensors.size()) + 1;
  steps(n);
  REQUIRE(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
  CHECK(free_after == free_before);
  CHECK(locked_kb() == locked_before);
  CHECK(reserved() == reserved_before);
  CHECK(tensortap::detail::pinned_host_bytes() == pinned_before);
  CHECK(pinned_before >= 2 * kBuffer);  // the staging buffers are pinned
  rec.close();
  CHECK(rec.counters().records == static_cast<std::int64_t>((100 + n) * tensors.size()));
  CHECK(rec.counters().errors == 0);
}

TEST_CASE("CPU and CUDA tensors, and every GPU, in one run", "[gpu][cuda][torch]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  const int devices = static_cast<int>(torch::cuda::device_count());
  std::vector<std::pair<std::string, at::Tensor>> cases{{"cpu", torch::randn({100})}};
  for (int d = 0; d < devices; ++d)
    cases.emplace_back("gpu" + std::to_string(d), torch::randn({1000 + d}, torch::Device(torch::kCUDA, d)));
  std::vector<at::Tensor> expected;
  for (const auto& c : cases) expected.push_back(c.second.cpu());
  tensortap::Recorder rec(tensortap::Options(run).every(1));
  for (int step = 0; step < 20; ++step) {
    rec.step(step);
    for (const auto& [name, t] : cases) rec.capture(name, t);
  }
  rec.close();
  CHECK(rec.counters().records == static_cast<std::int64_t>(20 * cases.size()));
  for (int step = 0; step < 20; ++step)
    for (std::size_t i = 0; i < cases.size(); ++i) {
      INFO(cases[i].first << " step " << step);
      CHECK(same(tensortap::load_npy(npy(run, "tensor", cases[i].first, step)), expected[i]));
    }
  if (devices < 2) WARN("only 1 CUDA device: the several-GPU part ran on one");
}

TEST_CASE("DropNewest drops CUDA captures when the device budget is full, and counts them", "[gpu][cuda][torch]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const torch::Device dev(torch::kCUDA, 0);
  const at::Tensor t = torch::randn({200000}, dev);  // 800 KB: 2 fit in a 2 MiB budget
  tensortap::Recorder rec(
      tensortap::Options(dir / "run").every(1).buffer_bytes(1 << 20).overflow(tensortap::Overflow::DropNewest));
  // Keep the stream busy so snapshots pile up: what the copier waits for
  // has not run yet.
  at::Tensor big = torch::randn({4096, 4096}, dev);
  rec.step(0);
  for (int i = 0; i < 20; ++i) big = big.mm(big).div_(4096);
  for (int i = 0; i < 50; ++i) rec.capture("x", t);
  rec.close();
  const auto s = rec.counters();
  CHECK(s.dropped > 0);
  CHECK(s.records + s.dropped == 50);
  CHECK(s.errors == 0);
}

TEST_CASE("statistics and full captures of CUDA tensors never synchronize the host", "[gpu][cuda][torch][stats]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  const torch::Device gpu(torch::kCUDA, 0);
  std::vector<at::Tensor> ts;
  for (int i = 0; i < 8; ++i) ts.push_back(torch::randn({256, 64 + i}, gpu));
  ts[3].index_put_({0, 0}, std::numeric_limits<float>::quiet_NaN());
  std::vector<at::Tensor> host;
  for (const auto& t : ts) host.push_back(t.cpu());
  // Full tensors on even steps, statistics of every tensor on every step.
  tensortap::Recorder rec(tensortap::Options(run).every(2).stats_every(1));
  rec.step(0);  // warm-up: the engine's arena, events and streams are made here
  for (std::size_t i = 0; i < ts.size(); ++i) rec.capture(fmt::format("t{}", i), ts[i]);
  // Any synchronizing call through c10 (.item(), a blocking copy, a stream
  // or device synchronize) now throws on this thread.
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  try {
    for (std::int64_t step = 1; step < 50; ++step) {
      rec.step(step);
      for (std::size_t i = 0; i < ts.size(); ++i) rec.capture(fmt::format("t{}", i), ts[i]);
    }
  } catch (...) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    throw;
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  rec.close();
  CHECK(rec.counters().stats_rows == 50 * 8);
  CHECK(rec.counters().errors == 0);
  // The table holds what the host computes of the same values.
  const std::string table = tt_test::read_file(run + "/stats.npy");
  REQUIRE(table.size() == 512 + 50 * 8 * 96);
  for (std::size_t r = 0; r < 50 * 8; ++r) {
    double v[12];
    std::memcpy(v, table.data() + 512 + r * 96, sizeof v);
    std::int64_t series = 0, nan = 0;
    std::memcpy(&series, &v[1], 8);
    std::memcpy(&nan, &v[7], 8);
    const at::Tensor& h = host.at(static_cast<std::size_t>(series));
    const at::Tensor fin = h.masked_select(h.isfinite()).to(at::kDouble);
    CHECK(nan == h.isnan().sum().item<std::int64_t>());
    CHECK(v[4] == Approx(fin.mean().item<double>()).epsilon(1e-9).margin(1e-12));
    CHECK(v[6] == Approx(fin.norm().item<double>()).epsilon(1e-9));
  }
}

TEST_CASE("the fused statistics kernels agree with the host scan, every float dtype, size and special value",
          "[gpu][cuda][torch][stats][fused]") {
  if (!have_cuda()) return;
  using tensortap::detail::fused_device_stats;
  const torch::Device gpu(torch::kCUDA, 0);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // 5M values (float32): more than the kernels' 1,024 blocks of 4,096 take
  // in one sweep, so the threads loop.
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{256}, std::int64_t{4099},
                               (std::int64_t{1} << 20) + 3, std::int64_t{5'000'000}}) {
    for (const auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
      if (n > (1 << 21) && dtype != at::kFloat) continue;
      at::Tensor h = (torch::randn({n}, torch::kDouble) * 3 + 1);
      if (n >= 7) {
        h[1] = nan;
        h[2] = inf;
        h[3] = -inf;
        h[4] = 0.0;
        h[5] = -0.0;
        h[n - 1] = -inf;
      }
      const at::Tensor t = h.to(dtype).to(gpu);
      INFO(n << " values of " << c10::toString(dtype));
      const at::Tensor fused = fused_device_stats(t);
      REQUIRE(fused.defined());
      const at::Tensor v = fused.cpu();
      const auto got = tensortap::detail::stats_from_vector(v.data_ptr<double>());
      // bfloat16 is stored, and scanned on the host, as float32 (exactly).
      const at::Tensor host_copy = dtype == at::kBFloat16 ? t.cpu().to(at::kFloat) : t.cpu().contiguous();
      tensortap::detail::StatsAccumulator acc(tensortap::detail::dtype_info(host_copy.scalar_type())->element);
      acc.add(host_copy.data_ptr(), host_copy.nbytes());
      const auto want = acc.result();
      CHECK(got.min == want.min);
      CHECK(got.max == want.max);
      const double scale = std::max(std::abs(want.min), std::abs(want.max));
      CHECK(got.mean == Approx(want.mean).epsilon(1e-12).margin(1e-12 * scale));
      CHECK(got.std == Approx(want.std).epsilon(1e-12));
      CHECK(got.norm == Approx(want.norm).epsilon(1e-12));
      CHECK(got.nan == want.nan);
      CHECK(got.posinf == want.posinf);
      CHECK(got.neginf == want.neginf);
      CHECK(got.zeros == want.zeros);
      CHECK(got.numel == want.numel);
    }
  }
  // Nothing finite: the five real fields are NaN, as the host's.
  const auto none = tensortap::detail::stats_from_vector(
      fused_device_stats(torch::full({300}, nan, torch::dtype(torch::kFloat).device(gpu))).cpu().data_ptr<double>());
  CHECK(std::isnan(none.min));
  CHECK(std::isnan(none.norm));
  CHECK(none.nan == 300);
  // A view that starts inside its storage; float64 values past 1e154, whose
  // squared deviations overflowed before the kernels summed such values
  // scaled (issue 63; the extreme inputs' test below holds them to it).
  const at::Tensor base = torch::randn({10000}, torch::dtype(torch::kDouble).device(gpu));
  for (const at::Tensor& t : {base.narrow(0, 17, 5000), base * 1e160}) {
    const auto got = tensortap::detail::stats_from_vector(fused_device_stats(t).cpu().data_ptr<double>());
    const at::Tensor host_copy = t.cpu().contiguous();
    tensortap::detail::StatsAccumulator acc(tensortap::detail::dtype_info(at::kDouble)->element);
    acc.add(host_copy.data_ptr(), host_copy.nbytes());
    const auto want = acc.result();
    CHECK(got.min == want.min);
    CHECK(got.max == want.max);
    CHECK(got.mean == Approx(want.mean).epsilon(1e-12).margin(1e-12 * std::abs(want.max)));
    CHECK(std::isfinite(got.std));
    CHECK(got.numel == want.numel);
  }
  // Where they do not apply, ATen's path is taken: a transposed view, a
  // negated view (its bytes are not its values), integers, the CPU.
  CHECK_FALSE(fused_device_stats(at::_neg_view(torch::ones({16}, gpu))).defined());
  CHECK_FALSE(fused_device_stats(torch::ones({4, 4}, gpu).t()).defined());
  CHECK_FALSE(fused_device_stats(torch::ones({16}, torch::dtype(torch::kInt).device(gpu))).defined());
  CHECK_FALSE(fused_device_stats(torch::ones({16})).defined());
}

TEST_CASE("on a GPU, every statistics path agrees with the host scan on extreme inputs (the statistics contract)",
          "[gpu][cuda][torch][stats][fused]") {
  if (!have_cuda()) return;
  // The fused kernels, and ATen's reductions on the device (device_stats:
  // the path of the tensors the kernels do not take).
  const torch::Device gpu(torch::kCUDA, 0);
  for (const tt_test::ExtremeCase& c : tt_test::extreme_cases()) {
    INFO(c.label);
    const auto want = tt_test::host_stats(c.values);
    const at::Tensor t = at::tensor(c.values, at::kDouble).to(gpu);
    const at::Tensor fused = tensortap::detail::fused_device_stats(t);
    REQUIRE(fused.defined());
    INFO("the fused kernels");
    tt_test::require_agree(tensortap::detail::stats_from_vector(fused.cpu().data_ptr<double>()), want);
    INFO("ATen's reductions on the device");
    tt_test::require_agree(
        tensortap::detail::stats_from_vector(tensortap::detail::device_stats(t).cpu().data_ptr<double>()), want);
  }
}

TEST_CASE("captures return while a long kernel still runs: no host synchronization, seen from outside",
          "[gpu][cuda][torch]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const torch::Device gpu(torch::kCUDA, 0);
  // Arena 2 MiB: `large` is over it; the rest stay in it while nothing
  // leaves the device. Full captures: their statistics are computed on the
  // host, from the bytes copied.
  tensortap::Recorder rec(tensortap::Options(dir / "run").every(1).stats_every(2).buffer_bytes(1 << 20));
  const at::Tensor small = torch::randn({256}, gpu);
  const at::Tensor large = torch::randn({1 << 20}, gpu);  // 4 MiB
  // How many captures wait behind the kernel. Not more: the GPU's launch
  // queue holds fewer than a few thousand operations, and once it is full
  // every launch waits for the device, the user's own as well as ours (seen
  // on an H200: 1,100 full captures, a copy and an event each, 2,200
  // operations, waited for the kernel). The event pool's growth past what
  // it holds up front is the engine test "more records in flight than the
  // event pool holds" (a pool of 4).
  constexpr int kMany = 300;
  // Warm-up: the arena, the first events, pinned staging, allocator blocks.
  rec.step(0);
  rec.capture("small", small);
  rec.capture("large", large);
  rec.flush();
  // A kernel of seconds on the current stream, and an event after it: any
  // wait of the host for the stream, a device synchronization, or a free or
  // allocation that synchronizes, would return only once it is ready.
  at::cuda::sleep(std::int64_t{1} << 32);
  cudaEvent_t after = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&after, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventRecord(after, c10::cuda::getCurrentCUDAStream(0).stream()) == cudaSuccess);
  // The slowest capture, to say where a wait happened if one did.
  double slowest_ms = 0;
  std::string slowest;
  const auto timed = [&](const std::string& what, const std::function<void()>& capture) {
    const auto t0 = std::chrono::steady_clock::now();
    capture();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ms > slowest_ms) {
      slowest_ms = ms;
      slowest = what;
    }
  };
  rec.step(2);  // full tensors and statistics of each
  timed("small, step 2", [&] { rec.capture("small", small); });
  timed("large, step 2", [&] { rec.capture("large", large); });
  rec.step(3);  // full tensors only
  for (int i = 0; i < kMany; ++i) timed("many #" + std::to_string(i), [&] { rec.capture("many", small); });
  const cudaError_t still = cudaEventQuery(after);
  INFO("slowest capture: " << slowest << ", " << slowest_ms << " ms");
  CHECK(still == cudaErrorNotReady);
  REQUIRE(cudaEventSynchronize(after) == cudaSuccess);
  cudaEventDestroy(after);
  rec.close();
  CHECK(rec.counters().errors == 0);
  CHECK(rec.counters().dropped == 0);
  CHECK(rec.counters().records == 2 + 2 + kMany);
  CHECK(rec.counters().stats_rows == 2 + 2);
}

TEST_CASE("a capture on a non-default current stream is ordered on that stream", "[gpu][cuda][torch]") {
  if (!have_cuda()) return;
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  const torch::Device gpu(torch::kCUDA, 0);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
  REQUIRE(side != c10::cuda::getDefaultCUDAStream(0));
  std::vector<at::Tensor> expected;
  {
    tensortap::Recorder rec(tensortap::Options(run).every(1));
    c10::cuda::CUDAStreamGuard guard(side);
    at::Tensor t = torch::zeros({1 << 16}, gpu);
    for (int step = 0; step < 20; ++step) {
      // Held back on the side stream, so the capture's snapshot, the
      // writes before it and the one after it are all still queued there:
      // only the stream order keeps them apart.
      at::cuda::sleep(std::int64_t{1} << 20);
      t.add_(1);
      rec.step(step);
      rec.capture("t", t);
      expected.push_back(torch::full({1 << 16}, static_cast<float>(step + 1)));
      t.mul_(-1);  // after the capture: must not be in its file
      t.mul_(-1);
    }
    rec.close();
    CHECK(rec.counters().errors == 0);
  }
  for (int step = 0; step < 20; ++step) {
    INFO("step " << step);
    CHECK(same(tensortap::load_npy(npy(run, "tensor", "t", step)), expected[static_cast<std::size_t>(step)]));
  }
}

namespace {

// The driver's own view of CUDA contexts in this process, asked through
// libcuda directly (dlopen: the tests must not need the driver to link).
// Returns "" when no context exists, otherwise what does; `driver` says
// whether there was a driver to ask.
std::string cuda_contexts(bool& driver) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  driver = lib != nullptr;
  if (!lib) return "";
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  using Get = int (*)(int*, int);
  using State = int (*)(int, unsigned*, int*);
  using Current = int (*)(void**);
  const auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  const auto count = reinterpret_cast<Count>(dlsym(lib, "cuDeviceGetCount"));
  const auto get = reinterpret_cast<Get>(dlsym(lib, "cuDeviceGet"));
  const auto state = reinterpret_cast<State>(dlsym(lib, "cuDevicePrimaryCtxGetState"));
  const auto current = reinterpret_cast<Current>(dlsym(lib, "cuCtxGetCurrent"));
  if (!init || !count || !get || !state || !current) return "libcuda.so.1 lacks the driver API's context queries";
  // cuInit starts the driver, it creates no context.
  if (init(0) != 0) return "";  // a driver without a usable device: no context can exist
  std::string found;
  void* ctx = nullptr;
  if (current(&ctx) == 0 && ctx != nullptr) found += "a current context on this thread; ";
  int n = 0;
  if (count(&n) != 0) n = 0;
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    unsigned flags = 0;
    int active = 0;
    if (get(&dev, i) == 0 && state(dev, &flags, &active) == 0 && active)
      found += fmt::format("device {}'s primary context is active; ", i);
  }
  return found;
}

}  // namespace

// Run alone, in a process of its own, by the case below: no earlier case may
// have touched the device.
TEST_CASE("cpu recording in a CUDA build, in a fresh process", "[.cuda_fresh_process]") {
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  {
    tensortap::Recorder rec(tensortap::Options(run).stats_every(1));
    for (int step = 0; step < 3; ++step) {
      rec.step(step);
      rec.capture("x", torch::arange(10, torch::kFloat) * step);
    }
    rec.close();
    REQUIRE(rec.counters().records == 3);
    REQUIRE(rec.counters().errors == 0);
  }
  REQUIRE(torch::equal(tensortap::load_npy(npy(run, "tensor", "x", 2)), torch::arange(10, torch::kFloat) * 2));
  bool driver = false;
  const std::string contexts = cuda_contexts(driver);
  INFO((driver ? "the driver was asked" : "no CUDA driver here (libcuda.so.1 does not load)"));
  REQUIRE(contexts.empty());
}

TEST_CASE("a CUDA build records CPU tensors, with or without a GPU or driver, and never creates a CUDA context",
          "[cuda][torch]") {
  // A CUDA-enabled LibTorch on a machine without a driver (CI) must not make
  // a run fail; on a GPU machine, a run of CPU tensors must not take the
  // device's memory for a context. A fresh process of this binary checks it.
  char exe[4096] = {};
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  REQUIRE(len > 0);
  const char* argv[] = {exe, "cpu recording in a CUDA build, in a fresh process", nullptr};
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, exe, nullptr, nullptr, const_cast<char* const*>(argv), environ) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("a CUDA 0-d tensor known only by its statistics is its one TensorBoard scalar", "[gpu][cuda][torch]") {
  // Issue 47: in a statistics-only run a CUDA tensor reaches the writer
  // thread as its device's statistics vector, never as bytes; the loss must
  // still be `tensor/loss` (written from the row), with no statistics tags.
  if (!have_cuda()) return;
  if (!tensortap::detail::tensorboard_built()) {
    WARN("skipped: built without TensorBoard event files");
    return;
  }
  tt_test::TempDir dir;
  const std::string run = dir / "run";
  {
    tensortap::Recorder rec(tensortap::Options(run).every(0).stats_every(1).tensorboard(true));
    for (std::int64_t step = 0; step < 3; ++step) {
      rec.step(step);
      rec.capture("loss", torch::full({}, 0.5 + static_cast<double>(step), torch::Device(torch::kCUDA, 0)));
      rec.capture("w", torch::ones({16}, torch::Device(torch::kCUDA, 0)));
    }
    rec.close();
    CHECK(rec.counters().errors == 0);
  }
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(run))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events += tt_test::read_file(e.path().string());
  REQUIRE_FALSE(events.empty());
  CHECK(events.find("tensor/loss") != std::string::npos);
  CHECK(events.find("tensor/loss/") == std::string::npos);
  CHECK(events.find("tensor/w/mean") != std::string::npos);
  // Three values of the loss: 0.5, 1.5 and 2.5 as float32 right after its tag.
  for (const float v : {0.5F, 1.5F, 2.5F}) {
    char want[16] = "tensor/loss\x15";
    std::memcpy(want + 12, &v, 4);
    CHECK(events.find(std::string(want, 16)) != std::string::npos);
  }
}

TEST_CASE("statistics reduced into the engine's arena (TENSORTAP_CUDA_STATS=arena) equal those through a tensor",
          "[gpu][cuda][torch][stats][fused]") {
  if (!have_cuda()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  // The fused kernels' dtypes, one of many blocks, float64 past 1e154, and
  // what they do not take (a strided view, an integer tensor): ATen's path
  // in both modes.
  std::vector<at::Tensor> ts{torch::randn({1000}, gpu),
                             torch::randn({1 << 22}, gpu),
                             torch::full({64}, 1e300, torch::TensorOptions().dtype(torch::kDouble).device(gpu)),
                             torch::randn({300}, gpu).to(torch::kBFloat16),
                             torch::randn({300}, gpu).to(torch::kHalf),
                             torch::randn({40, 30}, gpu).t(),
                             torch::arange(500, torch::TensorOptions().dtype(torch::kLong).device(gpu))};
  tt_test::TempDir dir;
  std::string tables[2];
  for (int arena = 0; arena < 2; ++arena) {
    ::setenv("TENSORTAP_CUDA_STATS", arena ? "arena" : "tensor", 1);
    const std::string run = dir / (arena ? "arena" : "tensor");
    const std::uint64_t before = tensortap::detail::cuda_captures();
    {
      tensortap::Recorder rec(tensortap::Options(run).every(0).stats_every(1));
      for (std::int64_t step = 0; step < 3; ++step) {
        rec.step(step);
        for (std::size_t i = 0; i < ts.size(); ++i) rec.capture(fmt::format("t{}", i), ts[i]);
      }
      rec.close();
      CHECK(rec.counters().stats_rows == 3 * ts.size());
      CHECK(rec.counters().errors == 0);
    }
    // Every statistics vector went through the engine, whichever way.
    CHECK(tensortap::detail::cuda_captures() - before == 3 * ts.size());
    tables[arena] = tt_test::read_file(run + "/stats.npy");
  }
  ::unsetenv("TENSORTAP_CUDA_STATS");
  REQUIRE(tables[0].size() == 512 + 3 * ts.size() * 96);
  // The same kernels, the same order: the same bytes.
  CHECK(tables[0] == tables[1]);
}

TEST_CASE("a step's gradients in one batch (TENSORTAP_CUDA_BATCH=on) write what one capture each writes",
          "[gpu][cuda][torch][batch]") {
  // Issue 73's cases, on a device: the gradients gathered at each pass's
  // end (hooks/src/params.cpp), two micro-batches a step, clip_grad_norm_
  // between backward and the optimizer's step, a layer frozen then
  // unfrozen, a parameter with no gradient, gradient records every other
  // step and statistics every step (the stats-only steps take the batch's
  // statistics kernels), and grad_per_backward (recorded in the hooks, not
  // batched). Every file of the two runs is the same, byte for byte.
  if (!have_cuda()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  tt_test::TempDir dir;
  const auto train = [&](const std::string& run, bool per_backward) {
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 10));
    torch::nn::Linear unused(8, 8);  // registered, never used: no gradient
    net->register_module("unused", unused);
    net->to(gpu);
    torch::optim::SGD opt(net->parameters(), 0.01);
    auto rec = tensortap::watch(*net, tensortap::Options(run)
                                          .every(2)
                                          .stats_every(1)
                                          .kinds({tensortap::Kind::Grad, tensortap::Kind::Param})
                                          .grad_per_backward(per_backward));
    for (std::int64_t step = 0; step < 6; ++step) {
      net[2]->as<torch::nn::Linear>()->weight.set_requires_grad(step >= 3);
      rec->step(step);
      opt.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        const at::Tensor x = torch::randn({16, 32}, gpu);
        net->forward(x).pow(2).mean().backward();
      }
      torch::nn::utils::clip_grad_norm_(net->parameters(), 0.5);
      opt.step();
    }
    rec->close();
    CHECK(rec->counters().errors == 0);
    CHECK(rec->counters().dropped == 0);
  };
  for (const bool per_backward : {false, true}) {
    INFO("grad_per_backward " << per_backward);
    std::string runs[2];
    for (int on = 0; on < 2; ++on) {
      ::setenv("TENSORTAP_CUDA_BATCH", on ? "on" : "off", 1);
      runs[on] = dir / fmt::format("{}-{}", per_backward ? "per-backward" : "per-step", on ? "on" : "off");
      const std::uint64_t gathered = tensortap::detail::FrontEnd::gathered();
      train(runs[on], per_backward);
      // With the switch on, the step's sums came from .grad at each pass's
      // end (zero_grad() sets none in LibTorch 2.x), not from the hooks.
      CHECK((tensortap::detail::FrontEnd::gathered() > gathered) == (on && !per_backward));
    }
    ::unsetenv("TENSORTAP_CUDA_BATCH");
    CHECK(tt_test::check_same_records(runs[0], runs[1]) > 0);
  }
}
