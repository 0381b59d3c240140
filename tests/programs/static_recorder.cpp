// A recorder held in a global, closed by its destructor at exit (issue 57):
//   static_recorder return|exit|quick_exit DIR
// trains a small model for 20 steps with statistics every step, TensorBoard
// (histograms every step) and every kind on, then leaves main by returning,
// by std::exit, or by std::quick_exit, without calling close(). The model is
// a global too, so close() frees tensors (its gradient accumulators) while
// the process is being torn down. Every function-local static the library
// first used after the globals were made (stats.npy's header fields,
// TensorBoard's bucket limits) is destroyed before them: round 4 aborted in
// fmt 4 times in 6, or lost the last step's statistics rows.
// tests/python/check_static_recorder.py checks what is left on disk.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Constant-initialized, so constructed before any static of the library and
// destroyed after all of them.
std::shared_ptr<Net> g_model;
std::shared_ptr<tensortap::Recorder> g_rec;

}  // namespace

int main(int argc, char** argv) {
  const std::string how = argc == 3 ? argv[1] : "";
  if (how != "return" && how != "exit" && how != "quick_exit") {
    std::fprintf(stderr, "usage: static_recorder return|exit|quick_exit DIR\n");
    return 2;
  }
  torch::manual_seed(0);
  g_model = std::make_shared<Net>();
  tensortap::Options options(argv[2]);
  options.kinds(tensortap::KindSet::all()).stats_every(1);
#ifdef TENSORTAP_HAVE_TENSORBOARD
  options.tensorboard(tensortap::TensorBoardOptions().histograms_every(1));
#endif
  g_rec = tensortap::watch(*g_model, options);
  torch::optim::SGD opt(g_model->parameters(), 0.01);
  const torch::Tensor x = torch::randn({32, 8});
  const torch::Tensor y = torch::randn({32, 1});
  for (std::int64_t step = 0; step < 20; ++step) {
    g_rec->step(step);
    auto loss = torch::mse_loss(g_model->forward(x), y);
    g_rec->capture("loss", loss);
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  std::printf("trained\n");
  std::fflush(stdout);
  // The last step's records are still in staging and the writer's hands.
  if (how == "exit") std::exit(0);
  if (how == "quick_exit") std::quick_exit(0);
  return 0;
}
