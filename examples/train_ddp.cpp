// Data-parallel training of the demo MLP over several processes on this
// machine, with c10d's Gloo process group and a FileStore. Every rank is
// watched by tensortap and writes <run_dir>/rank<r>/; the Python reader
// opens the run as one.
//
//   train_ddp [run_dir=runs/ddp] [world_size=2] [steps=100] [capture_ranks=all|0,1,...]
//
// Started by hand, it launches `world_size` copies of itself with RANK and
// WORLD_SIZE set (as torchrun would), waits for them, and fails if one does.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <tensortap/tensortap.h>

#include "demo_model.h"

namespace {

struct Args {
  std::string dir = "runs/ddp";
  int world = 2;
  int64_t steps = 100;
  std::vector<int64_t> capture_ranks;  // empty: all
};

Args parse(int argc, char** argv) {
  Args a;
  if (argc > 1) a.dir = argv[1];
  if (argc > 2) a.world = std::atoi(argv[2]);
  if (argc > 3) a.steps = std::atoll(argv[3]);
  if (argc > 4 && std::string(argv[4]) != "all") {
    std::stringstream ss(argv[4]);
    for (std::string r; std::getline(ss, r, ',');) a.capture_ranks.push_back(std::stoll(r));
  }
  return a;
}

int train(const Args& a, int rank, const std::string& store_path) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, a.world);
  auto pg_opts = c10d::ProcessGroupGloo::Options::create();
  pg_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  c10d::ProcessGroupGloo pg(store, rank, a.world, pg_opts);

  const auto [data, labels] = demo::make_task();
  demo::Mlp model(demo::kInputs, 128, 64, demo::kClasses);  // same seed: same initial weights on every rank
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // tensortap: rank and world size come from RANK and WORLD_SIZE.
  auto rec = tensortap::watch(*model, tensortap::Options(a.dir).every(10).ranks(a.capture_ranks).overwrite(true));

  torch::manual_seed(1000 + rank);  // each rank draws its own batches
  for (int64_t step = 0; step < a.steps; ++step) {
    rec->step(step);
    const torch::Tensor idx = torch::randint(0, data.size(0), {64}, torch::kLong);
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(model->forward(data.index_select(0, idx)), labels.index_select(0, idx));
    rec->capture("loss", loss);
    opt.zero_grad();
    loss.backward();  // tensortap's `grad` records: this rank's own gradients
    for (const auto& p : model->named_parameters()) {
      std::vector<torch::Tensor> g{p.value().grad()};
      pg.allreduce(g)->wait();
      g[0].div_(a.world);
      // What the optimizer steps with, the same on every rank.
      if (rec->sampled()) rec->capture("allreduced." + p.key(), g[0]);
    }
    opt.step();
  }
  rec->close();
  const tensortap::Counters s = rec->counters();
  std::printf("rank %d: %lld records, %lld bytes, %s\n", rank, static_cast<long long>(s.records),
              static_cast<long long>(s.bytes), rec->capturing() ? rec->run_dir().c_str() : "not capturing");
  return 0;
}

// Starts one copy of this program per rank, as a launcher would.
int launch(const Args& a, char** argv) {
  char tmpl[] = "/tmp/tensortap-ddp-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string store = std::string(tmpl) + "/store";
  std::vector<pid_t> children;
  for (int r = 0; r < a.world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(a.world).c_str(), 1);
      ::setenv("TENSORTAP_DDP_STORE", store.c_str(), 1);
      ::execv("/proc/self/exe", argv);
      std::perror("execv");
      std::_Exit(127);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  ::unlink(store.c_str());
  ::rmdir(tmpl);
  if (failed) std::fprintf(stderr, "train_ddp: %d rank(s) failed\n", failed);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const char* rank = std::getenv("RANK");
  const char* store = std::getenv("TENSORTAP_DDP_STORE");
  if (rank == nullptr || store == nullptr) return launch(a, argv);
  return train(a, std::atoi(rank), store);
}
