// The C++ half of tests/python/torch_reference.py: the same three-layer model,
// initial weights and batches, trained with tensortap recording every
// activation (Tapped<Linear>), its gradient, every parameter's gradient and
// the loss at every step.
//
//   torch_reference WORK RUN          reads WORK/init and WORK/data, writes RUN
//   torch_reference WORK RUN --cuda   the same on the GPU; and, since PyTorch's
//       own copies (made on the CPU) need not equal the GPU's arithmetic bit
//       for bit, this process takes its own: `.cpu()` of every tensor
//       tensortap captures, at the moment it captures it (a forward value, a
//       tensor hook on it, a hook on each parameter), into WORK/ref-cuda in
//       the layout of WORK/ref. `torch_reference.py check WORK RUN ref-cuda`
//       compares them.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>

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

// The `.cpu()` copies of the --cuda mode, taken where tensortap takes its
// snapshots, keyed as torch_reference.py's: (kind, name, step).
struct References {
  std::map<std::tuple<std::string, std::string, int>, torch::Tensor> copies;
  int step = 0;
  void keep(const std::string& kind, const std::string& name, const torch::Tensor& t) {
    copies[{kind, name, step}] = t.detach().cpu();
  }
  // A layer's output and, through a hook on it, the gradient flowing back.
  torch::Tensor activation(const std::string& name, torch::Tensor out) {
    keep("activation", name, out);
    out.register_hook([this, name](const torch::Tensor& g) { keep("activation_grad", name, g); });
    return out;
  }
  void save(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    for (const auto& [key, t] : copies)
      tensortap::save_npy(
          dir + "/" + std::get<0>(key) + "__" + std::get<1>(key) + "__" + std::to_string(std::get<2>(key)) + ".npy",
          t);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool cuda = argc == 4 && std::string(argv[3]) == "--cuda";
  if (argc != 3 && !cuda) {
    std::fprintf(stderr, "usage: %s WORK RUN [--cuda]\n", argv[0]);
    return 2;
  }
  const std::string work = argv[1], run = argv[2];
  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU);
  at::set_num_threads(1);
  Net model;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) p.value().copy_(tensortap::load_npy(work + "/init/" + p.key() + ".npy"));
  }
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto rec = tensortap::watch(*model, tensortap::Options(run).overwrite(true));
  References refs;
  if (cuda) {
    // Registered after watch()'s: each runs on the gradient tensortap's saw.
    for (auto& p : model->named_parameters()) {
      const std::string name = p.key();
      p.value().register_hook([&refs, name](const torch::Tensor& g) { refs.keep("grad", name, g); });
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    const torch::Tensor x = tensortap::load_npy(work + "/data/x" + std::to_string(step) + ".npy").to(device);
    const torch::Tensor y = tensortap::load_npy(work + "/data/y" + std::to_string(step) + ".npy").to(device);
    rec->step(step);
    refs.step = step;
    opt.zero_grad();
    torch::Tensor out;
    if (cuda) {
      // forward() spelled out, so that each layer's output is copied here.
      out = refs.activation("fc1", model->fc1(x));
      out = refs.activation("fc2", model->fc2(torch::relu(out)));
      out = refs.activation("fc3", model->fc3(torch::tanh(out)));
    } else {
      out = model->forward(x);
    }
    const torch::Tensor loss = torch::nn::functional::mse_loss(out, y);
    rec->capture("loss", loss);
    if (cuda) refs.keep("tensor", "loss", loss);
    loss.backward();
    opt.step();
  }
  rec->close();
  if (cuda) {
    refs.save(work + "/ref-cuda");
    std::printf("torch_reference: %zu .cpu() copies taken at capture in %s/ref-cuda\n", refs.copies.size(),
                work.c_str());
  }
  std::printf("torch_reference: %s trained %d steps with LibTorch %s on %s\n", run.c_str(), kSteps, TORCH_VERSION,
              device.str().c_str());
  return 0;
}
