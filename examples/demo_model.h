// The demo model and task, shared by the example programs.
#pragma once

#include <cstdlib>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <tensortap/tensortap.h>

namespace demo {

/// A 3-layer MLP with a Tap after each hidden ReLU.
struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  tensortap::Tap hidden1, hidden2;  // tensortap: activations to capture

  MlpImpl(int64_t in, int64_t h1, int64_t h2, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, h1));
    // A ReLU's output: the health rules (dead_relu) judge it so, whatever its name.
    hidden1 = register_module("hidden1", tensortap::Tap(tensortap::Nonlinearity::ReLU));
    fc2 = register_module("fc2", torch::nn::Linear(h1, h2));
    hidden2 = register_module("hidden2", tensortap::Tap(tensortap::Nonlinearity::ReLU));
    fc3 = register_module("fc3", torch::nn::Linear(h2, out));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = hidden1(torch::relu(fc1(x)));
    x = hidden2(torch::relu(fc2(x)));
    return fc3(x);
  }
};
TORCH_MODULE(Mlp);

constexpr int64_t kInputs = 32, kClasses = 10;

/// Where the examples train: the device TENSORTAP_DEMO_DEVICE names ("cuda",
/// "cuda:1"), the CPU without it. The task is made on the CPU either way, so
/// every device starts from the same data.
inline torch::Device device() {
  const char* name = std::getenv("TENSORTAP_DEMO_DEVICE");
  return torch::Device(name != nullptr && *name != '\0' ? name : "cpu");
}

/// 4096 points labelled by a fixed random two-layer "teacher": a task an MLP
/// can learn, generated here so nothing is downloaded. Seeded: every process
/// gets the same task.
inline std::pair<torch::Tensor, torch::Tensor> make_task() {
  torch::manual_seed(0);
  const torch::Tensor data = torch::randn({4096, kInputs});
  torch::NoGradGuard no_grad;
  const torch::Tensor w1 = torch::randn({kInputs, 64}), w2 = torch::randn({64, kClasses});
  return {data, torch::relu(data.mm(w1)).mm(w2).argmax(1)};
}

}  // namespace demo
