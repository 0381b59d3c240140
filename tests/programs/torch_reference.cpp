// The C++ half of tests/python/torch_reference.py: the same three-layer model,
// initial weights and batches, trained with tensortap recording every
// activation (Tapped<Linear>), its gradient, every parameter's gradient and
// the loss at every step.
//
//   torch_reference WORK RUN      reads WORK/init and WORK/data, writes RUN
#include <cstdio>
#include <string>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <tensortap/tensortap.h>

namespace {

constexpr int kSteps = 6;

struct NetImpl : torch::nn::Module {
  tensortap::Tapped<torch::nn::Linear> fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", tensortap::Tapped<torch::nn::Linear>(12, 32));
    fc2 = register_module("fc2", tensortap::Tapped<torch::nn::Linear>(32, 32));
    fc3 = register_module("fc3", tensortap::Tapped<torch::nn::Linear>(32, 5));
  }
  // As the Python side: fc3(tanh(fc2(relu(fc1(x))))).
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::tanh(fc2(torch::relu(fc1(x))))); }
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s WORK RUN\n", argv[0]);
    return 2;
  }
  const std::string work = argv[1], run = argv[2];
  at::set_num_threads(1);
  Net model;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) p.value().copy_(tensortap::load_npy(work + "/init/" + p.key() + ".npy"));
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto rec = tensortap::watch(*model, tensortap::Options(run).overwrite(true));
  for (int step = 0; step < kSteps; ++step) {
    const torch::Tensor x = tensortap::load_npy(work + "/data/x" + std::to_string(step) + ".npy");
    const torch::Tensor y = tensortap::load_npy(work + "/data/y" + std::to_string(step) + ".npy");
    rec->step(step);
    opt.zero_grad();
    const torch::Tensor loss = torch::nn::functional::mse_loss(model->forward(x), y);
    rec->capture("loss", loss);
    loss.backward();
    opt.step();
  }
  rec->close();
  std::printf("torch_reference: %s trained %d steps with LibTorch %s\n", run.c_str(), kSteps, TORCH_VERSION);
  return 0;
}
