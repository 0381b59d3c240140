#pragma once

// The small network the tests and programs watch: out = fc(x), watched as
// "fc.weight", "fc.bias" and the Tap "out". Header-only and free of Catch2,
// so programs/ (which have no include root of the repository) can include it
// by its relative path, "../support/net.h".

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <tensortap/tap.h>

namespace tt_test {

/// Linear(in, out) named "fc", followed by the Tap "out". The unit tests use
/// the default 3 -> 2 (their expected values depend on it); e2e_writer, 5 -> 3.
struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  tensortap::Tap out;
  explicit NetImpl(std::int64_t in_features = 3, std::int64_t out_features = 2) {
    fc = register_module("fc", torch::nn::Linear(in_features, out_features));
    out = register_module("out", tensortap::Tap());
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(fc(x)); }
};
TORCH_MODULE(Net);

}  // namespace tt_test
