// A training run that blows up on purpose, caught by the flight recorder.
//
// The demo MLP trains well for 100 steps at a learning rate of 0.05, then is
// switched to one far too high (as when a run is resumed with the wrong
// setting). tensortap takes
// statistics of every gradient and activation at every step (cheap: a row of
// ten numbers each), and holds the full tensors of the last `k` steps in
// memory instead of writing them. The first NaN or Inf in any captured
// tensor writes those `k` steps and the step it appeared in, and full
// capture stops (AfterDump::StopCapture, the default). plot_blowup.py then
// shows the steps that led there.
//
//   train_blowup [run_dir=runs/blowup] [bad_lr=100] [k=10] [max_steps=500]
//
// On a GPU: TENSORTAP_DEMO_DEVICE=cuda in the environment.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>  // tensortap

#include "demo_model.h"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/blowup";
  const double bad_lr = argc > 2 ? std::atof(argv[2]) : 100.0;
  constexpr int64_t kGoodSteps = 100;
  const int64_t k = argc > 3 ? std::atoll(argv[3]) : 10;
  const int64_t max_steps = argc > 4 ? std::atoll(argv[4]) : 500;
  constexpr int64_t kBatch = 128;
  const torch::Device device = demo::device();
  const auto [cpu_data, cpu_labels] = demo::make_task();
  const torch::Tensor data = cpu_data.to(device), labels = cpu_labels.to(device);
  demo::Mlp model(demo::kInputs, 128, 64, demo::kClasses);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // tensortap: statistics every step; full tensors of every step held for the
  // last k steps, written only when something goes wrong.
  auto rec = tensortap::watch(
      *model,
      tensortap::Options(dir).stats_every(1).flight_recorder(k).kinds(tensortap::KindSet::all()).overwrite(true));

  int64_t nan_step = -1;
  for (int64_t step = 0; step < max_steps; ++step) {
    rec->step(step);
    const double lr = step < kGoodSteps ? 0.05 : bad_lr;
    static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options()).lr(lr);
    const torch::Tensor idx = torch::randint(0, data.size(0), {kBatch}, labels.options());
    const torch::Tensor x = data.index_select(0, idx), y = labels.index_select(0, idx);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    rec->capture("loss", loss);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const double l = loss.item<double>();
    if (step % 10 == 0 || !std::isfinite(l))
      std::printf("step %4lld  lr %8.2f  loss %g\n", static_cast<long long>(step), lr, l);
    if (!std::isfinite(l) && nan_step < 0) nan_step = step;
    // A few steps past the first non-finite loss are enough to show that
    // full capture stopped while statistics went on.
    if (nan_step >= 0 && step >= nan_step + 5) break;
  }

  rec->close();
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld statistics rows, %lld records written by %lld dump(s), run directory %s\n",
              static_cast<long long>(s.stats_rows), static_cast<long long>(s.records), static_cast<long long>(s.dumps),
              dir.c_str());
  return s.dumps > 0 ? 0 : 1;
}
