// A convolutional classifier in the shape of PyTorch's C++ MNIST example
// (cpp/mnist): a torch::data dataset and data loader, epochs of batches,
// and a test pass after each epoch. The data is synthetic (28x28 images of
// one of ten bar patterns, with noise), so it needs no download. tensortap
// watches the training; the tensortap lines are marked:
// - Tapped<M> layers capture their outputs where they stand;
// - the test pass runs in eval mode and is not recorded;
// - a step is one batch, numbered across epochs.
//
//   train_mnist_style [run_dir=runs/mnist] [epochs=2] [every=5]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include <tensortap/tensortap.h>  // tensortap

namespace nn = torch::nn;

namespace {

// Ten classes: class k lights row band k (horizontal for even k, vertical
// for odd), plus noise.
class Bars : public torch::data::datasets::Dataset<Bars> {
 public:
  Bars(int64_t size, uint64_t seed) : size_(size) {
    auto gen = at::detail::createCPUGenerator(seed);
    labels_ = torch::randint(0, 10, {size}, gen, torch::kLong);
    images_ = torch::randn({size, 1, 28, 28}, gen) * 0.3;
    for (int64_t i = 0; i < size; ++i) {
      const int64_t k = labels_[i].item<int64_t>();
      auto band = k % 2 == 0 ? images_[i][0].narrow(0, 2 + 2 * k, 3) : images_[i][0].narrow(1, 2 * k, 3);
      band.add_(1.0);
    }
  }
  torch::data::Example<> get(size_t index) override {
    return {images_[static_cast<int64_t>(index)], labels_[static_cast<int64_t>(index)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(size_); }

 private:
  int64_t size_;
  torch::Tensor images_, labels_;
};

struct NetImpl : nn::Module {
  NetImpl()
      : conv1(tensortap::Tapped<nn::Conv2d>(nn::Conv2dOptions(1, 10, 5))),  // tensortap: captured as "conv1"
        conv2(tensortap::Tapped<nn::Conv2d>(nn::Conv2dOptions(10, 20, 5))),
        fc1(tensortap::Tapped<nn::Linear>(320, 50)),
        fc2(tensortap::Tapped<nn::Linear>(50, 10)) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1(x));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    return torch::log_softmax(fc2(x), /*dim=*/1);
  }
  tensortap::Tapped<nn::Conv2d> conv1, conv2;  // tensortap: instead of nn::Conv2d
  nn::Dropout2d conv2_drop;
  tensortap::Tapped<nn::Linear> fc1, fc2;  // tensortap: instead of nn::Linear
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/mnist";
  const int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 2;
  const int64_t every = argc > 3 ? std::atoll(argv[3]) : 5;
  torch::manual_seed(1);
  Net model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
  auto train_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      Bars(1280, 1).map(torch::data::transforms::Stack<>()), 64);
  auto test_loader = torch::data::make_data_loader(Bars(256, 2).map(torch::data::transforms::Stack<>()), 128);

  // tensortap: the one line. The test pass below is in eval mode: not recorded.
  auto rec = tensortap::watch(*model, tensortap::Options(dir).every(every).overwrite(true));

  int64_t step = 0;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    model->train();
    for (auto& batch : *train_loader) {
      rec->step(step++);  // tensortap: one step per batch
      optimizer.zero_grad();
      auto output = model->forward(batch.data);
      auto loss = torch::nll_loss(output, batch.target);
      rec->capture("loss", loss);  // tensortap
      loss.backward();
      optimizer.step();
    }
    model->eval();
    torch::NoGradGuard no_grad;
    double test_loss = 0;
    int64_t correct = 0, total = 0;
    for (const auto& batch : *test_loader) {
      auto output = model->forward(batch.data);
      test_loss += torch::nll_loss(output, batch.target, {}, at::Reduction::Sum).item<double>();
      correct += output.argmax(1).eq(batch.target).sum().item<int64_t>();
      total += batch.data.size(0);
    }
    std::printf("epoch %lld: test loss %.4f, accuracy %.3f\n", static_cast<long long>(epoch), test_loss / total,
                static_cast<double>(correct) / total);
  }
  rec->close();  // tensortap
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld records over %lld steps, %lld errors, run directory %s\n",
              static_cast<long long>(s.records), static_cast<long long>(step), static_cast<long long>(s.errors),
              dir.c_str());
  return s.errors == 0 ? 0 : 1;
}
