// What Options::tensorboard costs the writer thread, against statistics
// alone (issue 34): the same steps of 64 tensors, statistics of each every
// step, with TensorBoard events off, on without histograms, on with
// histograms every 100 steps (the default) and every step. The writer's
// work is the process's CPU time less the training thread's time in step()
// and capture(): the writer thread, and flush(), called every step so each
// step's work is done before the next (it runs the durable writes on the
// caller's thread). The training thread's time in step() and capture() is
// what TensorBoard must not change. Modes interleave, their order
// rotating between repetitions; medians. Also the event file's bytes per step.
//
//   bench_tensorboard [--reps 5] [--steps 300] [--json FILE]
//   bench_tensorboard --only MODE [--steps N]   one run of mode 0-3, for callgrind
//       (--separate-threads=yes: the training thread's instructions, on against off)
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"

namespace {

constexpr int kTensors = 64;
constexpr int64_t kElements = 4096;  // 16 KiB of float32 each

double seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double process_cpu() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

struct Mode {
  const char* name;
  bool tensorboard;
  int64_t histograms_every;
};

const Mode kModes[] = {{"statistics only", false, 0},
                       {"+ tensorboard, no histograms", true, 0},
                       {"+ tensorboard, histograms every 100 (default)", true, 100},
                       {"+ tensorboard, histograms every step", true, 1}};

struct Sample {
  double writer_us = 0, training_us = 0, event_bytes = 0;
};

Sample run_once(const Mode& mode, int64_t steps, const std::vector<torch::Tensor>& tensors,
                const std::vector<std::string>& names) {
  BenchDir dir;
  auto opts = tensortap::Options(dir.path + "/run").every(0).stats_every(1);
  if (mode.tensorboard) opts.tensorboard(tensortap::TensorBoardOptions().histograms_every(mode.histograms_every));
  Sample s;
  {
    tensortap::Recorder rec(opts);
    rec.step(0);
    rec.flush();
    const double cpu0 = process_cpu();
    double train = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      const double t0 = seconds(CLOCK_THREAD_CPUTIME_ID);
      rec.step(step);
      for (int i = 0; i < kTensors; ++i) rec.capture(names[i], tensors[i]);
      train += seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
      // flush() runs the durable part of the writer's work (the files'
      // fsync) on this thread: counted with the writer's.
      rec.flush();
    }
    const double cpu = process_cpu() - cpu0;
    rec.close();
    s.training_us = 1e6 * train / static_cast<double>(steps);
    s.writer_us = 1e6 * (cpu - train) / static_cast<double>(steps);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir.path + "/run"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      s.event_bytes += static_cast<double>(e.file_size()) / static_cast<double>(steps);
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  int64_t steps = 300;
  std::string json;
  int only = -1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_tensorboard [--reps N] [--steps N] [--json FILE] [--only MODE]\n");
      return 2;
    }
  }
  torch::manual_seed(0);
  std::vector<torch::Tensor> tensors;
  std::vector<std::string> names;
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back(torch::randn({kElements}));
    names.push_back(fmt::format("model.layers.{}.mlp.out", i));
  }
  constexpr std::size_t kN = std::size(kModes);
  if (only >= 0) {
    if (only >= static_cast<int>(kN)) return 2;
    const Sample s = run_once(kModes[only], steps, tensors, names);
    std::printf("%s: writer %.0f us/step, training %.0f us/step, %.0f event bytes/step\n", kModes[only].name,
                s.writer_us, s.training_us, s.event_bytes);
    return 0;
  }
  std::vector<std::vector<Sample>> samples(kN);
  run_once(kModes[0], 20, tensors, names);  // warm: staging, the allocator, page cache
  for (int r = 0; r < reps; ++r)
    for (std::size_t k = 0; k < kN; ++k) {
      const std::size_t m = (k + static_cast<std::size_t>(r)) % kN;
      samples[m].push_back(run_once(kModes[m], steps, tensors, names));
    }
  std::printf("%d tensors of %lld float32 a step, statistics every step, flush() every step; %lld steps x %d reps, medians\n\n",
              kTensors, static_cast<long long>(kElements), static_cast<long long>(steps), reps);
  std::printf("| mode | writer (thread + flush), CPU us/step | vs statistics only | training thread in step() + capture(), CPU us/step | vs statistics only | event bytes/step |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  std::string out = "{\"tensors\": " + std::to_string(kTensors) + ", \"elements\": " + std::to_string(kElements) +
                    ", \"steps\": " + std::to_string(steps) + ", \"modes\": [";
  double base_w = 0, base_t = 0;
  for (std::size_t m = 0; m < kN; ++m) {
    std::vector<double> w, t, b;
    for (const Sample& s : samples[m]) {
      w.push_back(s.writer_us);
      t.push_back(s.training_us);
      b.push_back(s.event_bytes);
    }
    const double mw = median(w), mt = median(t), mb = median(b);
    if (m == 0) {
      base_w = mw;
      base_t = mt;
    }
    std::printf("| %s | %.0f | %.2fx | %.0f | %.2fx | %.0f |\n", kModes[m].name, mw, mw / base_w, mt, mt / base_t, mb);
    out += fmt::format("{}{{\"mode\": \"{}\", \"writer_us\": {}, \"training_us\": {}, \"event_bytes\": {}}}",
                       m ? ", " : "", kModes[m].name, mw, mt, mb);
  }
  out += "]}\n";
  if (!json.empty()) {
    std::FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) return 1;
    std::fputs(out.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
