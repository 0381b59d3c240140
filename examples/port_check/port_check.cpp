// The C++ port of examples/port_check/model.py: the same small network,
// trained 5 steps, recorded by tensortap: the parameters as each step
// begins (step 0's are the initial weights the Python side loads), each
// layer's output and its gradient, the parameter gradients, the batches and
// the loss.
// examples/port_check/check.py trains the Python original on the same
// weights and batches with the Python twin and runs `tensortap diff`.
//
//   port_check RUN              the faithful port
//   port_check RUN gelu-tanh    a port bug: GELU's tanh approximation, where
//                               PyTorch's nn.GELU() is the exact (erf) one
//   port_check RUN layernorm-eps
//                               a port bug: LayerNorm's eps 1e-6, where
//                               PyTorch's default is 1e-5
#include <cmath>
#include <cstdio>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

namespace {

constexpr int64_t kSteps = 5, kBatch = 16, kIn = 8, kHidden = 16, kOut = 4;

// As model.py's Net: fc2(act(norm(fc1(x)))). Registered under Python's
// attribute names, so that each record has the same name on both sides.
struct NetImpl : torch::nn::Module {
  tensortap::Tapped<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  tensortap::Tapped<torch::nn::LayerNorm> norm{nullptr};
  tensortap::Tapped<torch::nn::GELU> act{nullptr};
  explicit NetImpl(const std::string& bug) {
    fc1 = register_module("fc1", tensortap::Tapped<torch::nn::Linear>(kIn, kHidden));
    norm = register_module("norm", tensortap::Tapped<torch::nn::LayerNorm>(torch::nn::LayerNormOptions({kHidden}).eps(
                                       bug == "layernorm-eps" ? 1e-6 : 1e-5)));
    act = register_module(
        "act", tensortap::Tapped<torch::nn::GELU>(torch::nn::GELUOptions().approximate(bug == "gelu-tanh" ? "tanh" : "none")));
    fc2 = register_module("fc2", tensortap::Tapped<torch::nn::Linear>(kHidden, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(act(norm(fc1(x)))); }
};
TORCH_MODULE(Net);

// Deterministic batches, the same whatever the seed: both sides take them
// from this run (the "x" and "y" tensor records), so they are the same bytes.
torch::Tensor batch(int64_t step, int64_t cols, double phase) {
  return torch::sin(torch::arange(kBatch * cols, torch::kDouble).reshape({kBatch, cols}) * 0.37 + phase +
                    static_cast<double>(step))
      .to(torch::kFloat);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: port_check RUN [gelu-tanh|layernorm-eps]\n");
    return 2;
  }
  const std::string bug = argc == 3 ? argv[2] : "";
  if (!bug.empty() && bug != "gelu-tanh" && bug != "layernorm-eps") {
    std::fprintf(stderr, "port_check: unknown bug '%s' (gelu-tanh, layernorm-eps)\n", bug.c_str());
    return 2;
  }
  at::set_num_threads(1);
  torch::manual_seed(2026);
  Net model(bug);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  // Every kind every step; step 0's parameters are the initial weights
  // model.py loads.
  auto rec = tensortap::watch(*model, tensortap::Options(argv[1]).overwrite(true).kinds(tensortap::KindSet::all()));
  for (int64_t step = 0; step < kSteps; ++step) {
    rec->step(step);
    const torch::Tensor x = batch(step, kIn, 0.0), y = batch(step, kOut, 1.5);
    rec->capture("x", x);
    rec->capture("y", y);
    opt.zero_grad();
    const torch::Tensor loss = torch::nn::functional::mse_loss(model->forward(x), y);
    rec->capture("loss", loss);
    loss.backward();
    opt.step();
  }
  rec->close();
  std::printf("port_check: %s: %lld records, LibTorch %s%s\n", argv[1], static_cast<long long>(rec->counters().records),
              TORCH_VERSION, bug.empty() ? "" : (", with the port bug " + bug).c_str());
  return 0;
}
