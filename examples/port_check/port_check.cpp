// The C++ port of examples/port_check/model.py: the same network (a Conv1d
// stem with BatchNorm, one pre-norm transformer block, a linear head) and
// the same loop (AdamW, gradient clipping, a cosine schedule), started from
// the Python run's initial weights with tensortap::load_params and recorded
// by tensortap with the same names and steps as the Python twin records the
// original. examples/port_check/check.py runs both and `tensortap diff`.
//
//   port_check RUN PYTHON_RUN [BUG]
//
// BUG plants one port bug, each of a kind a real port has:
//   layernorm-eps     forward: ln1's eps 1e-6 (PyTorch's default is 1e-5)
//   detach-residual   backward only: the attention's residual branch detached
//   loss-sum          the loss: mse_loss summed, not averaged
//   adamw-decay       the optimizer: AdamW without its weight decay
//   schedule          the learning-rate schedule, one step ahead
//   bn-momentum       a buffer: BatchNorm's momentum 0.01 (PyTorch's is 0.1)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

namespace {

constexpr std::int64_t kSteps = 30, kBatch = 8, kChannels = 4, kLength = 12, kWidth = 16, kOut = 3;
constexpr double kLr = 3e-3, kWeightDecay = 0.01, kClip = 1.0;
const std::vector<std::int64_t> kRecorded{0, 1, 2, 3, 4, 9, 14, 19, 24, 29};

template <class M>
using T = tensortap::Tapped<M>;

// As model.py's Net, each module registered under Python's attribute name
// and tapped, so that each record has the same name on both sides.
struct NetImpl : torch::nn::Module {
  T<torch::nn::Conv1d> conv{nullptr};
  T<torch::nn::BatchNorm1d> bn{nullptr};
  T<torch::nn::LayerNorm> ln1{nullptr}, ln2{nullptr};
  T<torch::nn::Linear> qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr}, head{nullptr};
  T<torch::nn::GELU> act{nullptr};
  bool detach_residual;

  explicit NetImpl(const std::string& bug) : detach_residual(bug == "detach-residual") {
    conv = register_module("conv", T<torch::nn::Conv1d>(torch::nn::Conv1dOptions(kChannels, kWidth, 3).padding(1)));
    bn = register_module("bn", T<torch::nn::BatchNorm1d>(
                                   torch::nn::BatchNormOptions(kWidth).momentum(bug == "bn-momentum" ? 0.01 : 0.1)));
    ln1 = register_module("ln1", T<torch::nn::LayerNorm>(
                                     torch::nn::LayerNormOptions({kWidth}).eps(bug == "layernorm-eps" ? 1e-6 : 1e-5)));
    qkv = register_module("qkv", T<torch::nn::Linear>(kWidth, 3 * kWidth));
    proj = register_module("proj", T<torch::nn::Linear>(kWidth, kWidth));
    ln2 = register_module("ln2", T<torch::nn::LayerNorm>(torch::nn::LayerNormOptions({kWidth})));
    fc1 = register_module("fc1", T<torch::nn::Linear>(kWidth, 2 * kWidth));
    act = register_module("act", T<torch::nn::GELU>());
    fc2 = register_module("fc2", T<torch::nn::Linear>(2 * kWidth, kWidth));
    head = register_module("head", T<torch::nn::Linear>(kWidth, kOut));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = bn(conv(x)).transpose(1, 2);
    const auto qkv_out = qkv(ln1(h)).chunk(3, -1);
    const torch::Tensor attn =
        torch::softmax(torch::matmul(qkv_out[0], qkv_out[1].transpose(1, 2)) / std::sqrt(double{kWidth}), -1);
    const torch::Tensor branch = proj(torch::matmul(attn, qkv_out[2]));
    h = h + (detach_residual ? branch.detach() : branch);
    h = h + fc2(act(fc1(ln2(h))));
    return head(h.mean(1));
  }
};
TORCH_MODULE(Net);

// model.py's batch(): sines of a ramp in float64, then float32.
torch::Tensor wave(std::int64_t step, std::int64_t n, std::int64_t cols, double phase) {
  const torch::Tensor t = torch::arange(n * cols, torch::kDouble).reshape({n, cols});
  return torch::sin(t * 0.37 + phase + static_cast<double>(step)).to(torch::kFloat);
}

double lr_at(std::int64_t step) { return kLr * 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(step) / kSteps)); }

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> bugs{"layernorm-eps", "detach-residual", "loss-sum", "adamw-decay", "schedule",
                                      "bn-momentum"};
  const std::string bug = argc == 4 ? argv[3] : "";
  if (argc < 3 || argc > 4 || (!bug.empty() && std::find(bugs.begin(), bugs.end(), bug) == bugs.end())) {
    std::fprintf(stderr,
                 "usage: port_check RUN PYTHON_RUN [layernorm-eps|detach-residual|loss-sum|adamw-decay|schedule|"
                 "bn-momentum]\n");
    return 2;
  }
  at::set_num_threads(1);
  Net model(bug);
  // The Python original's initial weights and buffers: its run's step 0.
  tensortap::load_params(model, argv[2], 0);
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(kLr).weight_decay(bug == "adamw-decay" ? 0.0 : kWeightDecay));
  // What the twin records by default, and the parameters: the update.
  auto rec = tensortap::watch(*model, tensortap::Options(argv[1])
                                          .overwrite(true)
                                          .kinds(tensortap::KindSet::all())
                                          .steps(kRecorded));
  for (std::int64_t step = 0; step < kSteps; ++step) {
    rec->step(step);
    const torch::Tensor x = wave(step, kBatch, kChannels * kLength, 0.0).reshape({kBatch, kChannels, kLength});
    const torch::Tensor y = wave(step, kBatch, kOut, 1.5);
    const double lr = lr_at(bug == "schedule" ? step + 1 : step);
    for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    rec->capture("lr", torch::tensor(lr, torch::kDouble));
    opt.zero_grad();
    torch::nn::functional::MSELossFuncOptions reduction;
    if (bug == "loss-sum") reduction.reduction(torch::kSum);
    const torch::Tensor loss = torch::nn::functional::mse_loss(model->forward(x), y, reduction);
    rec->capture("loss", loss);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
    rec->record_grads(opt);  // the clipped gradients, as AdamW applies them
    opt.step();
  }
  rec->close();
  std::printf("port_check: %s: %lld records, LibTorch %s%s\n", argv[1], static_cast<long long>(rec->counters().records),
              TORCH_VERSION, bug.empty() ? "" : (", with the port bug " + bug).c_str());
  return 0;
}
