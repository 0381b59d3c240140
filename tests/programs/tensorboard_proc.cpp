// A training process with TensorBoard events on, for test_tensorboard.py.
//   tensorboard_proc run DIR STEPS
//       trains the demo MLP for STEPS steps with statistics of every tensor
//       every step, histograms every 5 steps, the loss and the learning rate
//       as 0-d tensors, and a dump at step STEPS/2 (a Trigger::when rule: no
//       flight recorder, so every record is written and the dump marks the
//       run); then closes.
//   tensorboard_proc live DIR STEPS
//       the same, but stops twice and waits for a line on stdin: after step
//       STEPS/2 - 1, without flush() (printing "half"), and after the last
//       step and flush() (printing "flushed"); then closes. The test reads
//       the events while it waits, or kills it with SIGKILL.
//   tensorboard_proc keep_npy|keep_packed DIR STEPS
//       issue 70's case: every step, four 16 KiB tensors and a 0-d loss,
//       statistics every step, histograms every step, a 1 MiB budget under
//       Budget::KeepLatest (events roll; statistics in segments); prints
//       "records R errors E refused B".
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

#include "../../examples/demo_model.h"

namespace {

void wait_for_line(const char* said) {
  std::printf("%s\n", said);
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tensorboard_proc run|live|keep_npy|keep_packed DIR STEPS\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const int64_t steps = std::atoll(argv[3]);
  const bool live = mode == "live";
  if (mode == "keep_npy" || mode == "keep_packed") {
    tensortap::Recorder rec{tensortap::Options(dir)
                                .format(mode == "keep_npy" ? tensortap::Format::Npy : tensortap::Format::Packed)
                                .every(1)
                                .stats_every(1)
                                .max_bytes(1 << 20)
                                .on_budget(tensortap::Budget::KeepLatest)
                                .tensorboard(tensortap::TensorBoardOptions().histograms_every(1))
                                .overwrite(true)};
    for (int64_t step = 0; step < steps; ++step) {
      rec.step(step);
      for (int k = 0; k < 4; ++k)
        rec.capture("t" + std::to_string(k), torch::randn({4096}) * static_cast<double>(step + k + 1));
      rec.capture("loss", torch::tensor(1.0 / static_cast<double>(step + 1)));
    }
    rec.close();
    const tensortap::Counters c = rec.counters();
    std::printf("records %lld errors %lld refused %lld\n", static_cast<long long>(c.records),
                static_cast<long long>(c.errors), static_cast<long long>(c.budget_refused));
    return 0;
  }
  const auto [data, labels] = demo::make_task();
  demo::Mlp model(demo::kInputs, 32, 16, demo::kClasses);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto rec = tensortap::watch(*model, tensortap::Options(dir)
                                          .stats_every(1)
                                          .tensorboard(tensortap::TensorBoardOptions().histograms_every(5))
                                          .after_dump(tensortap::AfterDump::Continue)
                                          .dump_on(tensortap::Trigger::when([steps](const tensortap::TensorSummary& t) {
                                            return t.name == "lr" && t.step == steps / 2;
                                          }))
                                          .overwrite(true));
  for (int64_t step = 0; step < steps; ++step) {
    if (live && step == steps / 2) wait_for_line("half");
    rec->step(step);
    const torch::Tensor idx = torch::randint(0, data.size(0), {64}, torch::kLong);
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(model->forward(data.index_select(0, idx)), labels.index_select(0, idx));
    rec->capture("loss", loss);
    rec->capture("lr", torch::tensor(0.05 / (1.0 + 0.01 * static_cast<double>(step))));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  if (live) {
    rec->flush();
    wait_for_line("flushed");
  }
  rec->close();
  const tensortap::Counters c = rec->counters();
  std::printf("records %lld errors %lld\n", static_cast<long long>(c.records), static_cast<long long>(c.errors));
  return 0;
}
