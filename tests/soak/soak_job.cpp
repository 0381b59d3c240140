// The soak check's training job (tests/soak/soak.py): the docs' leave-it-on
// settings, all at once, in one process that soak.py may kill.
//
//   soak_job RUN --steps N --first S --format npy|packed --policy keep_latest|stop_capture
//            [--budget BYTES] [--step-us U] [--stall-at STEP] [--model mlp|cnn]
//
// A 4-layer MLP (64 -> 64, batch 64: every weight, gradient and activation
// 16 KiB), or a small CNN (--model cnn, the long mode's), trained from step
// S to S+N-1 with: every 20th step and the flight recorder holding 10 of
// them, statistics every step, TensorBoard with histograms every 10th step,
// every live health rule, stall_after 300 ms (step --stall-at hangs 700 ms:
// one stall dump), a disk budget under --policy. The settings are the
// code's, as a user's program would set them; TENSORTAP_OPTIONS still
// overrides them. A health rule's dump does not stop capture (after_dump
// Continue): a job left on keeps its cadence. Prints "step S" every 100
// steps and the counters at the end.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

namespace {

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, fc4{nullptr};
  tensortap::Tap relu1{nullptr}, relu2{nullptr}, relu3{nullptr};
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 64));
    relu1 = register_module("relu1", tensortap::Tap());
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    relu2 = register_module("relu2", tensortap::Tap());
    fc3 = register_module("fc3", torch::nn::Linear(64, 64));
    relu3 = register_module("relu3", tensortap::Tap());
    fc4 = register_module("fc4", torch::nn::Linear(64, 64));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = relu1(torch::relu(fc1(x)));
    x = relu2(torch::relu(fc2(x)));
    x = relu3(torch::relu(fc3(x)));
    return fc4(x);
  }
};
TORCH_MODULE(Mlp);

// The long mode's model: two convolutions and a linear head on 16x16 images.
struct CnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear head{nullptr};
  tensortap::Tap relu1{nullptr}, relu2{nullptr};
  CnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 32, 3).padding(1)));
    relu1 = register_module("relu1", tensortap::Tap());
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3).padding(1)));
    relu2 = register_module("relu2", tensortap::Tap());
    head = register_module("head", torch::nn::Linear(32 * 4 * 4, 64));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(relu1(torch::relu(conv1(x))), 2);
    x = torch::max_pool2d(relu2(torch::relu(conv2(x))), 2);
    return head(x.flatten(1));
  }
};
TORCH_MODULE(Cnn);

std::string text_arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

long arg(int argc, char** argv, const std::string& name, long fallback) {
  const std::string text = text_arg(argc, argv, name, "");
  return text.empty() ? fallback : std::strtol(text.c_str(), nullptr, 10);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: soak_job RUN --steps N --first S --format npy|packed --policy keep_latest|stop_capture "
                 "[--budget BYTES] [--step-us U] [--stall-at STEP] [--model mlp|cnn]\n");
    return 2;
  }
  const std::string run = argv[1];
  const long steps = arg(argc, argv, "--steps", 2000), first = arg(argc, argv, "--first", 0);
  const long budget = arg(argc, argv, "--budget", 1 << 20), step_us = arg(argc, argv, "--step-us", 0);
  const long stall_at = arg(argc, argv, "--stall-at", -1);
  const std::string format = text_arg(argc, argv, "--format", "npy");
  const std::string policy = text_arg(argc, argv, "--policy", "keep_latest");
  const bool cnn = text_arg(argc, argv, "--model", "mlp") == "cnn";
  torch::manual_seed(first);
  torch::set_num_threads(1);

  using T = tensortap::Trigger;
  tensortap::Options o(run);
  o.overwrite(true)
      .format(format == "packed" ? tensortap::Format::Packed : tensortap::Format::Npy)
      .every(20)
      .kinds(tensortap::KindSet::all())
      .stats_every(1)
      .flight_recorder(10)
      .after_dump(tensortap::AfterDump::Continue)
      .max_bytes(static_cast<std::size_t>(budget))
      .on_budget(policy == "stop_capture" ? tensortap::Budget::StopCapture : tensortap::Budget::KeepLatest)
      .stall_after(std::chrono::milliseconds(300))
      .tensorboard(tensortap::TensorBoardOptions().histograms_every(10));
  for (T rule : {T::non_finite(), T::vanishing_gradient(), T::exploding_tensor(), T::all_zero(),
                 T::unchanged_tensor(), T::loss_not_decreasing(), T::dead_relu(), T::saturated_activation(),
                 T::tensor_variance(), T::poor_weight_initialization()})
    o.dump_on(rule);

  Mlp mlp;
  Cnn net;
  torch::nn::Module& model = cnn ? static_cast<torch::nn::Module&>(*net) : *mlp;
  auto rec = tensortap::watch(model, o);
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const torch::Tensor teacher = torch::randn({64, 64});
  for (long step = first; step < first + steps; ++step) {
    rec->step(step);
    const torch::Tensor x = cnn ? torch::randn({64, 4, 16, 16}) : torch::randn({64, 64});
    const torch::Tensor target = cnn ? torch::randn({64, 64}) : x.matmul(teacher).tanh();
    const torch::Tensor out = cnn ? net->forward(x) : mlp->forward(x);
    const torch::Tensor loss = torch::mse_loss(out, target);
    rec->capture("loss", loss);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == stall_at) std::this_thread::sleep_for(std::chrono::milliseconds(700));
    if (step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
    if ((step - first) % 100 == 0) {
      std::printf("step %ld\n", step);
      std::fflush(stdout);
    }
  }
  rec->close();
  const tensortap::Counters c = rec->counters();
  std::printf("done: %lld records, %lld bytes, %lld dropped, %lld errors, %lld budget refused\n",
              static_cast<long long>(c.records), static_cast<long long>(c.bytes),
              static_cast<long long>(c.dropped), static_cast<long long>(c.errors),
              static_cast<long long>(c.budget_refused));
  return 0;
}
