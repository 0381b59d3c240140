// Writes the runs test_analysis.py reads through pandas, xarray, dask and the
// report page: a small network trained 60 steps, every tensor kind, full
// tensors every 3rd step, statistics every step, and a loss spike at step 40
// that the spike trigger marks in run.json.
//   analysis_runs OUT [hdf5]   writes OUT/npy and OUT/ranks (two ranks,
//                              rank<r>/ each); with hdf5 also OUT/hdf5, the
//                              same training as OUT/npy in HDF5
#include <cstdio>
#include <string>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  tensortap::Tap hidden, out;
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(12, 16));
    norm = register_module("norm", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    hidden = register_module("hidden", tensortap::Tap());
    out = register_module("out", tensortap::Tap());
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(fc2(hidden(torch::relu(norm(fc1(x)))))); }
};
TORCH_MODULE(Net);

static void train(const std::string& dir, tensortap::Format format, int64_t rank, int64_t world) {
  torch::manual_seed(7 + rank);
  Net model;
  torch::optim::SGD opt(model->parameters(), 0.05);
  tensortap::Options options(dir);
  options.every(3)
      .stats_every(1)
      .kinds(tensortap::KindSet::all())
      .format(format)
      .overwrite(true)
      .dump_on(tensortap::Trigger::spike("loss", 5.0, 20));
  if (world > 1) options.rank(rank).world_size(world);
  auto rec = tensortap::watch(*model, options);
  for (int64_t step = 0; step < 60; ++step) {
    rec->step(step);
    const torch::Tensor x = torch::randn({32, 12});
    const torch::Tensor y = torch::randint(0, 4, {32}, torch::kLong);
    torch::Tensor logits = model->forward(x);
    if (step == 40) logits = logits * 40.0;  // the spike (batch norm would undo one in x)
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
    rec->capture("loss", loss);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  rec->close();
  std::printf("%s: %lld records, %lld statistics rows, %lld dumps\n", dir.c_str(),
              static_cast<long long>(rec->counters().records), static_cast<long long>(rec->counters().stats_rows),
              static_cast<long long>(rec->counters().dumps));
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "hdf5")) {
    std::fprintf(stderr, "usage: analysis_runs OUT [hdf5]\n");
    return 2;
  }
  const std::string out = argv[1];
  train(out + "/npy", tensortap::Format::Npy, 0, 1);
  if (argc == 3) train(out + "/hdf5", tensortap::Format::Hdf5, 0, 1);
  for (int64_t r = 0; r < 2; ++r) train(out + "/ranks", tensortap::Format::Npy, r, 2);
  return 0;
}
