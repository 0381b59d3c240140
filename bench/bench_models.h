// The models and data of bench_training, and of its Python twin
// bench/peer_python.py, which must build the same ones in the same order so
// that both start from the same weights and see the same batches.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <tensortap/tensortap.h>

#include "demo_model.h"

namespace bench {

/// A small CNN for 28x28 single-channel images, with a Tap after each
/// convolution's ReLU.
struct SmallCnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
  tensortap::Tap act1, act2;

  SmallCnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    act1 = register_module("act1", tensortap::Tap());
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)));
    act2 = register_module("act2", tensortap::Tap());
    fc = register_module("fc", torch::nn::Linear(16 * 7 * 7, 10));
  }

  torch::Tensor forward(torch::Tensor x) {
    namespace F = torch::nn::functional;
    x = F::max_pool2d(act1(torch::relu(conv1(x))), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(act2(torch::relu(conv2(x))), F::MaxPool2dFuncOptions(2));
    return fc(x.flatten(1));
  }
};
TORCH_MODULE(SmallCnn);

/// The models as bench_training builds them: the MLP of examples/train_mlp.
template <class Model>
Model make_model();
template <>
inline demo::Mlp make_model<demo::Mlp>() {
  return demo::Mlp(demo::kInputs, 128, 64, demo::kClasses);
}
template <>
inline SmallCnn make_model<SmallCnn>() {
  return SmallCnn();
}

/// What the naive peer puts where a Tap is: it sees the tensor and returns
/// what flows on.
using Probe = std::function<torch::Tensor(const std::string& name, torch::Tensor x)>;

// The models' forward() with a probe in place of each Tap. LibTorch has no
// forward hooks, so a peer without tensortap needs its own marks; these
// must compute exactly what forward() does (checked at start-up).
inline torch::Tensor forward_probed(demo::MlpImpl& m, torch::Tensor x, const Probe& probe) {
  x = probe("hidden1", torch::relu(m.fc1(x)));
  x = probe("hidden2", torch::relu(m.fc2(x)));
  return m.fc3(x);
}

inline torch::Tensor forward_probed(SmallCnnImpl& m, torch::Tensor x, const Probe& probe) {
  namespace F = torch::nn::functional;
  x = F::max_pool2d(probe("act1", torch::relu(m.conv1(x))), F::MaxPool2dFuncOptions(2));
  x = F::max_pool2d(probe("act2", torch::relu(m.conv2(x))), F::MaxPool2dFuncOptions(2));
  return m.fc(x.flatten(1));
}

using Batches = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

constexpr int kBatches = 8;
constexpr std::int64_t kMlpBatch = 128, kCnnBatch = 32;

/// The demo task, cut into kBatches fixed batches of 128 rows.
inline Batches mlp_batches() {
  const auto [data, labels] = demo::make_task();
  Batches b;
  for (std::int64_t i = 0; i < kBatches; ++i)
    b.emplace_back(data.narrow(0, i * kMlpBatch, kMlpBatch).contiguous(),
                   labels.narrow(0, i * kMlpBatch, kMlpBatch).contiguous());
  return b;
}

/// Random images and labels (what the CNN learns does not matter here, only
/// what a step costs).
inline Batches cnn_batches() {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({kBatches * kCnnBatch, 1, 28, 28});
  const torch::Tensor y = torch::randint(0, 10, {kBatches * kCnnBatch}, torch::kLong);
  Batches b;
  for (std::int64_t i = 0; i < kBatches; ++i)
    b.emplace_back(x.narrow(0, i * kCnnBatch, kCnnBatch).contiguous(),
                   y.narrow(0, i * kCnnBatch, kCnnBatch).contiguous());
  return b;
}

}  // namespace bench
