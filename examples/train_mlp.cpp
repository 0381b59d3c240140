// A small MLP learns a synthetic classification task (labels from a fixed,
// random "teacher" network), watched by tensortap. Copy it as a starting
// point: the tensortap lines are marked.
//
//   train_mlp [run_dir=runs/demo] [steps=300] [every=10]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>  // tensortap

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  tensortap::Tap hidden1, hidden2;  // tensortap: activations to capture

  MlpImpl(int64_t in, int64_t h1, int64_t h2, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, h1));
    hidden1 = register_module("hidden1", tensortap::Tap());
    fc2 = register_module("fc2", torch::nn::Linear(h1, h2));
    hidden2 = register_module("hidden2", tensortap::Tap());
    fc3 = register_module("fc3", torch::nn::Linear(h2, out));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = hidden1(torch::relu(fc1(x)));
    x = hidden2(torch::relu(fc2(x)));
    return fc3(x);
  }
};
TORCH_MODULE(Mlp);

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/demo";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 300;
  const int64_t every = argc > 3 ? std::atoll(argv[3]) : 10;
  constexpr int64_t kIn = 32, kClasses = 10, kBatch = 128;

  torch::manual_seed(0);
  // The task: 4096 points labelled by a random two-layer teacher.
  const torch::Tensor data = torch::randn({4096, kIn});
  torch::Tensor labels;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor w1 = torch::randn({kIn, 64}), w2 = torch::randn({64, kClasses});
    labels = torch::relu(data.mm(w1)).mm(w2).argmax(1);
  }

  Mlp model(kIn, 128, 64, kClasses);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // tensortap: the one line. Gradients of every parameter and the two Taps'
  // activations and their gradients, every `every` steps.
  auto rec = tensortap::watch(*model, tensortap::Options(dir).every(every).overwrite(true));

  for (int64_t step = 0; step < steps; ++step) {
    rec->step(step);  // tensortap: mark the iteration
    const torch::Tensor idx = torch::randint(0, data.size(0), {kBatch}, torch::kLong);
    const torch::Tensor x = data.index_select(0, idx), y = labels.index_select(0, idx);
    const torch::Tensor logits = model->forward(x);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    rec->capture("loss", loss);  // tensortap: any tensor, by name
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step % 50 == 0 || step == steps - 1) {
      const double acc = (logits.argmax(1) == y).to(torch::kFloat).mean().item<double>();
      std::printf("step %4lld  loss %.4f  batch accuracy %.3f\n", static_cast<long long>(step),
                  loss.item<double>(), acc);
    }
  }

  rec->close();  // tensortap: drain, finalize, rethrow
  const tensortap::Stats s = rec->stats();
  std::printf("tensortap: %lld records, %lld bytes, %lld dropped, run directory %s\n",
              static_cast<long long>(s.records), static_cast<long long>(s.bytes),
              static_cast<long long>(s.dropped), dir.c_str());
  return 0;
}
