// What tensortap costs a training loop: steps per second of the demo MLP and
// a small CNN with tensortap off, sampling every 100 steps, and capturing
// every gradient and activation on every step, against the naive synchronous
// C++ way in the same run (bench/peer_python.py is the Python way).
//
//   bench_training [--reps N] [--scale F] [--threads T] [--json PATH] [--only mlp|cnn] [--mode MODE] [--settings]
//
// --settings measures what each leave-it-on setting costs (issue 71; the
// figures of docs/leaving-it-on.md): off, every 10th step in full,
// statistics every step (no full tensors), the docs' leave-it-on line
// (every 100 of gradients and activations, statistics every step, a flight
// recorder of 20) and everything every step (every kind in full and its
// statistics), as ratios to off in the same run.
//
// Every run builds the model from the same seed and trains on the same fixed
// batches for the same steps; runs of the different modes are interleaved
// and their order rotates from one repetition to the next, so drift (another
// process, frequency changes) spreads over all modes. The figure is the
// median over repetitions. A tensortap run's time includes flush(): what is
// still queued at the end is work the run caused, and the peers write
// synchronously.
#include <malloc.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"
#include "bench_models.h"

namespace {

// Stats: statistics of every parameter gradient at every step, no full
// tensors (issue "Statistics and a NaN flight recorder": target 3%).
enum class Mode { Off, Every100, All, Stats, StatsTriggers, Naive, Every10, StatsEvery1, LeaveOn, Everything };
const std::vector<Mode> kOverheadModes{Mode::Off,  Mode::Every100,      Mode::All,
                                       Mode::Stats, Mode::StatsTriggers, Mode::Naive};
const std::vector<Mode> kSettingModes{Mode::Off, Mode::Every10, Mode::StatsEvery1, Mode::LeaveOn, Mode::Everything};
std::vector<Mode> kModes = kOverheadModes;  // --settings: kSettingModes

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Off: return "off";
    case Mode::Every100: return "every100";
    case Mode::All: return "all";
    case Mode::Stats: return "stats";
    case Mode::StatsTriggers: return "stats_triggers";
    case Mode::Naive: return "naive_cpp";
    case Mode::Every10: return "every10";
    case Mode::StatsEvery1: return "stats_every1";
    case Mode::LeaveOn: return "leave_on_line";
    case Mode::Everything: return "everything";
  }
  return "?";
}

void make_dirs(const std::string& path) {
  for (std::size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
}

// Peer (a): what one writes without tensortap. In every hook: detach, bring
// to the CPU, write the .npy, on the training thread, before the hook
// returns. It captures what tensortap's "all" mode does: every parameter's
// gradient, and at each tap point the activation and its gradient.
class NaivePeer {
 public:
  NaivePeer(std::string dir, torch::nn::Module& model) : dir_(std::move(dir)) {
    for (const auto& p : model.named_parameters()) {
      const std::string where = folder("grad", p.key());
      torch::Tensor param = p.value();
      const unsigned id = param.register_hook([this, where](const torch::Tensor& g) { save(where, g); });
      hooks_.emplace_back(param, id);
    }
  }
  ~NaivePeer() {
    for (auto& [param, id] : hooks_) param.remove_hook(id);
  }
  NaivePeer(const NaivePeer&) = delete;
  NaivePeer& operator=(const NaivePeer&) = delete;

  void step(std::int64_t s) { step_ = s; }

  torch::Tensor probe(const std::string& name, torch::Tensor x) {
    save(folder("activation", name), x);
    if (x.requires_grad()) {
      const std::string where = folder("activation_grad", name);
      x.register_hook([this, where](const torch::Tensor& g) { save(where, g); });
    }
    return x;
  }

 private:
  std::string folder(const char* kind, const std::string& name) {
    std::string path = fmt::format("{}/{}/{}", dir_, kind, name);
    if (made_.insert(path).second) make_dirs(path);
    return path;
  }
  void save(const std::string& where, const torch::Tensor& t) {
    tensortap::save_npy(fmt::format("{}/{:08d}.npy", where, step_), t.detach().cpu());
  }

  std::string dir_;
  std::int64_t step_ = 0;
  std::unordered_set<std::string> made_;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;
};

struct Plan {
  std::string model;
  std::int64_t warmup;              // untimed steps first: allocator, caches, first-touch
  std::int64_t steps;               // timed steps: a multiple of 100, so every100 samples steps/100 of them
  std::int64_t staging_warmup = 0;  // more for "all": steps that fill both staging buffers once
};

struct Timing {
  double wall = 0;         // seconds per step
  double thread_cpu = 0;   // CPU seconds per step of the training thread
  double process_cpu = 0;  // CPU seconds per step of the process (+ the writer thread, LibTorch's threads)
};

struct Result {
  std::vector<Timing> runs;  // one per repetition
  double first_loss = 0;
};

double cpu_seconds(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

template <class Model>
Timing train(const Plan& plan, Mode mode, const bench::Batches& batches, const std::string& dir, double* first_loss) {
  torch::manual_seed(42);
  Model model = bench::make_model<Model>();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::shared_ptr<tensortap::Recorder> rec;
  std::unique_ptr<NaivePeer> peer;
  if (mode == Mode::Every100 || mode == Mode::All)
    rec = tensortap::watch(*model, tensortap::Options(dir).every(mode == Mode::All ? 1 : 100));
  if (mode == Mode::Stats)
    rec = tensortap::watch(*model, tensortap::Options(dir).every(0).stats_every(1).kinds({tensortap::Kind::Grad}));
  // The same statistics with three rules evaluated on each of them.
  if (mode == Mode::StatsTriggers)
    rec = tensortap::watch(
        *model,
        tensortap::Options(dir)
            .every(0)
            .stats_every(1)
            .kinds({tensortap::Kind::Grad})
            .dump_on(tensortap::Trigger::non_finite())
            .dump_on(tensortap::Trigger::norm_jump(1e6, 20))
            .dump_on(tensortap::Trigger::when([](const tensortap::TensorSummary& st) { return st.max > 1e30; })));
  // The leave-it-on settings (--settings).
  if (mode == Mode::Every10) rec = tensortap::watch(*model, tensortap::Options(dir).every(10));
  if (mode == Mode::StatsEvery1) rec = tensortap::watch(*model, tensortap::Options(dir).every(0).stats_every(1));
  if (mode == Mode::LeaveOn)
    rec = tensortap::watch(*model, tensortap::Options(dir)
                                       .every(100)
                                       .kinds({tensortap::Kind::Grad, tensortap::Kind::Activation})
                                       .stats_every(1)
                                       .flight_recorder(20));
  if (mode == Mode::Everything)
    rec = tensortap::watch(*model,
                           tensortap::Options(dir).every(1).stats_every(1).kinds(tensortap::KindSet::all()));
  bench::Probe probe;
  if (mode == Mode::Naive) {
    peer = std::make_unique<NaivePeer>(dir, *model);
    probe = [&](const std::string& name, torch::Tensor x) { return peer->probe(name, std::move(x)); };
  }

  // Staging memory is touched once, then reused for the whole run: the
  // "all" mode warms up until it has gone through both buffers, so the
  // figure is the steady state (the first touch is BM_CaptureSampledCold).
  const std::int64_t warmup =
      mode == Mode::All || mode == Mode::Everything ? plan.warmup + plan.staging_warmup : plan.warmup;
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0;
  double thread0 = 0, process0 = 0;
  for (std::int64_t s = 0; s < warmup + plan.steps; ++s) {
    if (s == warmup) {
      t0 = Clock::now();
      thread0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
      process0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    }
    if (rec) rec->step(s);
    if (peer) peer->step(s);
    const auto& [x, y] = batches[static_cast<std::size_t>(s) % batches.size()];
    const torch::Tensor logits = peer ? bench::forward_probed(*model, x, probe) : model->forward(x);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    if (s == 0 && first_loss != nullptr) *first_loss = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  if (rec) rec->flush();
  const auto steps = static_cast<double>(plan.steps);
  Timing t;
  t.wall = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  t.thread_cpu = (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread0) / steps;
  t.process_cpu = (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process0) / steps;
  if (rec) {
    rec->close();
    const tensortap::Counters st = rec->counters();
    if (st.dropped != 0 || st.errors != 0) {
      std::fprintf(stderr, "bench_training: %s %s: %lld dropped, %lld errors\n", plan.model.c_str(), mode_name(mode),
                   static_cast<long long>(st.dropped), static_cast<long long>(st.errors));
      std::exit(1);
    }
  }
  return t;
}

// The probed forward is a copy of forward(): make sure it computes the same.
template <class Model>
void check_probed_forward(const bench::Batches& batches) {
  torch::manual_seed(42);
  Model model = bench::make_model<Model>();
  torch::NoGradGuard no_grad;
  const torch::Tensor a = model->forward(batches[0].first);
  const torch::Tensor b =
      bench::forward_probed(*model, batches[0].first, [](const std::string&, torch::Tensor x) { return x; });
  if (!torch::equal(a, b)) {
    std::fprintf(stderr, "bench_training: forward_probed differs from forward()\n");
    std::exit(1);
  }
}

// The bytes one step captures in "all" mode.
template <class Model>
std::int64_t bytes_per_step(const bench::Batches& batches, const std::string& dir) {
  torch::manual_seed(42);
  Model model = bench::make_model<Model>();
  auto rec = tensortap::watch(*model, tensortap::Options(dir));
  rec->step(0);
  const auto& [x, y] = batches[0];
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  rec->close();
  return rec->counters().bytes;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  double scale = 1.0;
  int threads = 1;
  std::string json_path, only, only_mode;  // --only, --mode: one model, one mode (for profiling)
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--settings") == 0) {
      kModes = kSettingModes;
      --i;  // a flag: no value
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_training: %s needs a value\n", argv[i]);
      return 2;
    } else if (std::strcmp(argv[i], "--reps") == 0)
      reps = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--scale") == 0)
      scale = std::atof(argv[i + 1]);
    else if (std::strcmp(argv[i], "--threads") == 0)
      threads = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--json") == 0)
      json_path = argv[i + 1];
    else if (std::strcmp(argv[i], "--only") == 0)
      only = argv[i + 1];
    else if (std::strcmp(argv[i], "--mode") == 0)
      only_mode = argv[i + 1];
    else {
      std::fprintf(
          stderr,
          "usage: bench_training [--reps N] [--scale F] [--threads T] [--json PATH] [--only mlp|cnn] [--mode MODE] "
          "[--settings]\n");
      return 2;
    }
  }
  // glibc adapts its mmap and trim thresholds to the allocation history, so
  // whether a step's activations come from fresh pages (faults) or the heap
  // depends on the runs before it: step times came out bimodal. Fixed
  // thresholds make every mode and peer allocate alike (peer_python.py sets
  // the same).
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // Both sides run with the same intra-op threads (bench/peer_python.py sets
  // the same); with one, the writer thread has the other core to itself.
  const int default_threads = at::get_num_threads();
  at::set_num_threads(threads);

  const auto round100 = [&](double n) {
    return std::max<std::int64_t>(100, static_cast<std::int64_t>(n * scale) / 100 * 100);
  };
  Plan plans[] = {{"mlp", 20, round100(1000)}, {"cnn", 10, round100(400)}};
  const bench::Batches mlp = bench::mlp_batches(), cnn = bench::cnn_batches();
  check_probed_forward<demo::Mlp>(mlp);
  check_probed_forward<bench::SmallCnn>(cnn);

  BenchDir scratch;
  std::map<std::string, std::int64_t> step_bytes{
      {"mlp", bytes_per_step<demo::Mlp>(mlp, scratch.path + "/calib-mlp")},
      {"cnn", bytes_per_step<bench::SmallCnn>(cnn, scratch.path + "/calib-cnn")}};
  const auto staging = static_cast<std::int64_t>(tensortap::Options("").buffer_bytes());
  for (Plan& plan : plans) plan.staging_warmup = 2 * staging / step_bytes[plan.model] + 1;
  std::map<std::string, std::map<Mode, Result>> results;
  int run_id = 0;
  for (int rep = 0; rep < reps; ++rep) {
    for (const Plan& plan : plans) {
      if (!only.empty() && plan.model != only) continue;
      for (std::size_t k = 0; k < kModes.size(); ++k) {
        const Mode mode = kModes[(k + static_cast<std::size_t>(rep)) % kModes.size()];
        if (!only_mode.empty() && only_mode != mode_name(mode) && mode != Mode::Off) continue;
        Result& r = results[plan.model][mode];
        const std::string dir = fmt::format("{}/run{}", scratch.path, run_id++);
        double* first = rep == 0 ? &r.first_loss : nullptr;
        r.runs.push_back(plan.model == "mlp" ? train<demo::Mlp>(plan, mode, mlp, dir, first)
                                             : train<bench::SmallCnn>(plan, mode, cnn, dir, first));
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    }
  }

  std::printf("bench_training: intra-op threads %d (LibTorch's default here: %d), %d repetitions, files in %s\n",
              threads, default_threads, reps, scratch.path.c_str());
  const auto med = [&](const std::string& model, Mode m, double Timing::*field) {
    std::vector<double> v;
    for (const Timing& t : results[model][m].runs) v.push_back(t.*field);
    return median(v);
  };
  std::printf(
      "| model | mode | steps | ms per step (median) | overhead vs off | training thread CPU ms | process CPU ms |\n"
      "|---|---|---|---|---|---|---|\n");
  for (const Plan& plan : plans) {
    if (!only.empty() && plan.model != only) continue;
    const double off = med(plan.model, Mode::Off, &Timing::wall);
    for (Mode m : kModes) {
      if (results[plan.model][m].runs.empty()) continue;
      const double t = med(plan.model, m, &Timing::wall);
      std::printf("| %s | %s | %lld | %.4f | %+.1f%% | %.4f | %.4f |\n", plan.model.c_str(), mode_name(m),
                  static_cast<long long>(plan.steps), t * 1e3, (t / off - 1) * 100,
                  med(plan.model, m, &Timing::thread_cpu) * 1e3, med(plan.model, m, &Timing::process_cpu) * 1e3);
    }
  }

  if (!json_path.empty()) {
    std::string out = fmt::format("{{\"threads\": {}, \"default_threads\": {}, \"reps\": {}, \"models\": {{", threads,
                                  default_threads, reps);
    bool first_model = true;
    for (const Plan& plan : plans) {
      const std::int64_t batch = plan.model == "mlp" ? bench::kMlpBatch : bench::kCnnBatch;
      out += fmt::format(
          "{}\"{}\": {{\"batch\": {}, \"warmup\": {}, \"staging_warmup\": {}, \"steps\": {}, "
          "\"bytes_per_step\": {}, \"first_loss\": {:.8f}, \"step_s\": {{",
          first_model ? "" : ", ", plan.model, batch, plan.warmup, plan.staging_warmup, plan.steps,
          step_bytes[plan.model], results[plan.model][Mode::Off].first_loss);
      first_model = false;
      bool first_mode = true;
      for (Mode m : kModes) {
        std::vector<double> v;
        for (const Timing& t : results[plan.model][m].runs) v.push_back(t.wall);
        out += fmt::format("{}\"{}\": [{:.9f}]", first_mode ? "" : ", ", mode_name(m), fmt::join(v, ", "));
        first_mode = false;
      }
      out += "}, \"thread_cpu_s\": {";
      first_mode = true;
      for (Mode m : kModes) {
        std::vector<double> v;
        for (const Timing& t : results[plan.model][m].runs) v.push_back(t.thread_cpu);
        out += fmt::format("{}\"{}\": [{:.9f}]", first_mode ? "" : ", ", mode_name(m), fmt::join(v, ", "));
        first_mode = false;
      }
      out += "}}";
    }
    out += "}}\n";
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr || std::fputs(out.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "bench_training: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
