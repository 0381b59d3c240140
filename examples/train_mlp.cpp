// A small MLP learns a synthetic classification task (labels from a fixed,
// random "teacher" network), watched by tensortap. Copy it as a starting
// point: the tensortap lines are marked.
//
//   train_mlp [run_dir=runs/demo] [steps=300] [every=10]
//
// On a GPU: TENSORTAP_DEMO_DEVICE=cuda in the environment.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>  // tensortap

#include "demo_model.h"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/demo";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 300;
  const int64_t every = argc > 3 ? std::atoll(argv[3]) : 10;
  constexpr int64_t kBatch = 128;
  const torch::Device device = demo::device();
  const auto [cpu_data, cpu_labels] = demo::make_task();
  const torch::Tensor data = cpu_data.to(device), labels = cpu_labels.to(device);
  demo::Mlp model(demo::kInputs, 128, 64, demo::kClasses);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // tensortap: the one line. Gradients of every parameter and the two Taps'
  // activations and their gradients, every `every` steps.
  auto rec = tensortap::watch(*model, tensortap::Options(dir).every(every).overwrite(true));

  for (int64_t step = 0; step < steps; ++step) {
    rec->step(step);  // tensortap: mark the iteration
    const torch::Tensor idx = torch::randint(0, data.size(0), {kBatch}, labels.options());
    const torch::Tensor x = data.index_select(0, idx), y = labels.index_select(0, idx);
    const torch::Tensor logits = model->forward(x);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    rec->capture("loss", loss);  // tensortap: any tensor, by name
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step % 50 == 0 || step == steps - 1) {
      const double acc = (logits.argmax(1) == y).to(torch::kFloat).mean().item<double>();
      std::printf("step %4lld  loss %.4f  batch accuracy %.3f\n", static_cast<long long>(step), loss.item<double>(),
                  acc);
    }
  }

  rec->close();  // tensortap: drain, finalize, rethrow
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld records, %lld bytes, %lld dropped, run directory %s\n",
              static_cast<long long>(s.records), static_cast<long long>(s.bytes), static_cast<long long>(s.dropped),
              dir.c_str());
  return 0;
}
