// A training job for `tensortap ctl` to steer (tests/python/test_ctl.py):
// an MLP with tap points, trained step by step, slowly enough for requests
// to land between steps.
//
//   ctl_target RUN [--steps N] [--step-ms MS] [--flight K] [--max-bytes B]
//                  [--ranks W] [--hold-at S --release PATH] [--fork]
//
// Statistics every step; no full tensors unless asked (every 0). Each rank
// of --ranks W is a recorder of its own (Options::rank), stepped in turn in
// one process. --hold-at S: after step(S), waits (a job paused between
// steps) until the file PATH exists. --fork: a fork() child that inherits the
// recorders and lives as long as the parent; it must never answer. Prints
// "step S" after each step, and the counters at the end.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

namespace {

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  tensortap::Tap relu1{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    relu1 = register_module("relu1", tensortap::Tap());
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(relu1(torch::relu(fc1(x)))); }
};
TORCH_MODULE(Net);

long arg(int argc, char** argv, const std::string& name, long fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == name) return std::strtol(argv[i + 1], nullptr, 10);
  return fallback;
}

std::string text_arg(int argc, char** argv, const std::string& name) {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return "";
}

bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 2; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ctl_target RUN [--steps N] [--step-ms MS] [--flight K] [--max-bytes B] [--ranks W] "
                         "[--hold-at S --release PATH] [--fork]\n");
    return 2;
  }
  const std::string run = argv[1];
  const long steps = arg(argc, argv, "--steps", 40), step_ms = arg(argc, argv, "--step-ms", 100);
  const long flight = arg(argc, argv, "--flight", 0), max_bytes = arg(argc, argv, "--max-bytes", 0);
  const long ranks = arg(argc, argv, "--ranks", 1), hold_at = arg(argc, argv, "--hold-at", -1);
  const std::string release = text_arg(argc, argv, "--release");
  torch::manual_seed(0);
  std::vector<Net> nets;
  std::vector<std::shared_ptr<tensortap::Recorder>> recs;
  for (long r = 0; r < ranks; ++r) {
    tensortap::Options o(run);
    o.overwrite(true).every(0).stats_every(1).kinds(
        tensortap::KindSet{tensortap::Kind::Grad, tensortap::Kind::Activation, tensortap::Kind::Tensor});
    if (ranks > 1) o.rank(r).world_size(ranks);
    if (flight > 0) o.flight_recorder(flight);
    if (max_bytes > 0) o.max_bytes(static_cast<std::size_t>(max_bytes));
    nets.emplace_back();
    recs.push_back(tensortap::watch(*nets.back(), o));
  }
  pid_t child = -1;
  if (flag(argc, argv, "--fork")) {
    const pid_t parent = ::getpid();
    child = ::fork();
    if (child == 0) {
      // The child's recorders are inert: no thread, no answer. It lives on
      // until the parent ends, so a request could only reach it meanwhile.
      while (::getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ::_exit(0);
    }
  }
  std::vector<std::unique_ptr<torch::optim::SGD>> opts;
  for (auto& net : nets) opts.push_back(std::make_unique<torch::optim::SGD>(net->parameters(), 0.01));
  const torch::Tensor x = torch::randn({8, 16}), y = torch::randn({8, 4});
  for (long s = 0; s < steps; ++s) {
    for (long r = 0; r < ranks; ++r) {
      recs[r]->step(s);
      const torch::Tensor loss = torch::mse_loss(nets[r]->forward(x), y);
      recs[r]->capture("loss", loss);
      opts[r]->zero_grad();
      loss.backward();
      opts[r]->step();
    }
    std::printf("step %ld\n", s);
    std::fflush(stdout);
    if (s == hold_at)
      while (!std::filesystem::exists(release)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  for (auto& rec : recs) {
    rec->close();
    const auto c = rec->counters();
    std::printf("records %lld, dumps %lld\n", static_cast<long long>(c.records), static_cast<long long>(c.dumps));
  }
  if (child > 0) {
    ::kill(child, SIGTERM);
    ::waitpid(child, nullptr, 0);
  }
  return 0;
}
