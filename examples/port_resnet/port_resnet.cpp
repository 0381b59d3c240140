// The C++ port of examples/port_resnet/resnet.py: the same small ResNet (a
// conv-BN-ReLU stem, a max-pool, two BasicBlocks, the second with a
// `downsample`, average pooling, a linear head) and the same loop (SGD with
// momentum, Nesterov and weight decay, a MultiStepLR schedule, label
// smoothing, an evaluation pass every few steps), started from the Python
// run's initial weights with tensortap::load_params and recorded by
// tensortap under the names and steps the Python twin gives the original.
// examples/port_resnet/check.py runs both and `tensortap diff`.
//
//   port_resnet PYTHON_RUN RUN [--bug BUG] [--threads N] [--channels-last] [RUN [options]]...
//
// Each RUN is one run of the port, with the options after it.
// --threads and --channels-last run the faithful port another way (intra-op
// threads, the NHWC memory format for the weights and the images): its
// rounding changes, its result must not.
//
// BUG plants one port bug, each a convention a real port gets wrong:
//   bn_eps            layer1.0.bn2's eps 1e-3 (Keras's default; PyTorch's is 1e-5)
//   bn_momentum       every BatchNorm's momentum 0.9: TF's decay, which is PyTorch's 0.1
//   no_nesterov       SGD without Nesterov
//   no_decay_norm     no weight decay on BatchNorm parameters and biases (a common
//                     recipe, but not the original's)
//   same_padding      TF's "SAME" padding on layer2.0.conv1 (stride 2): all of it
//                     after the image, none before
//   sched_first       the scheduler stepped before the optimizer
//   bgr               the images in BGR order (OpenCV's)
//   no_eval           eval() forgotten in the evaluation passes
//   frozen_conv1      the stem's conv frozen (requires_grad false)
//   no_smoothing      the loss without label smoothing
//   relu_before_add   layer1.0's ReLU applied before the residual add too
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

namespace {

// As resnet.py.
constexpr std::int64_t kSteps = 16, kBatch = 8, kChannels = 3, kSize = 8, kWidth = 8, kClasses = 4;
constexpr double kLr = 0.05, kMomentum = 0.9, kWeightDecay = 1e-3, kLabelSmoothing = 0.1, kGamma = 0.1;
const std::vector<std::int64_t> kMilestones{6, 11}, kEvalSteps{3, 7, 11, 15}, kRecorded{0, 1, 2, 3, 4, 5, 6, 7, 11, 15};

const std::vector<std::string> kBugs{"bn_eps",         "bn_momentum", "no_nesterov", "no_decay_norm", "same_padding",
                                     "sched_first",    "bgr",         "no_eval",     "frozen_conv1",  "no_smoothing",
                                     "relu_before_add"};

template <class M>
using T = tensortap::Tapped<M>;

bool has(const std::vector<std::int64_t>& v, std::int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The port bug of a run, or none (an empty name); the modules' constructors
// plant it where it belongs.
struct Bug {
  std::string name;
  bool is(const char* n) const { return name == n; }
};

T<torch::nn::BatchNorm2d> batch_norm(std::int64_t channels, const Bug& bug, bool eps_here = false) {
  // PyTorch's momentum is the weight of the new batch statistic; TF's (and
  // Keras's) 0.9 is the weight of the old running value.
  return T<torch::nn::BatchNorm2d>(torch::nn::BatchNormOptions(channels)
                                       .eps(eps_here && bug.is("bn_eps") ? 1e-3 : 1e-5)
                                       .momentum(bug.is("bn_momentum") ? 0.9 : 0.1));
}

T<torch::nn::Conv2d> conv(std::int64_t cin, std::int64_t cout, std::int64_t k, std::int64_t stride, std::int64_t pad) {
  return T<torch::nn::Conv2d>(torch::nn::Conv2dOptions(cin, cout, k).stride(stride).padding(pad).bias(false));
}

// resnet.py's BasicBlock: its modules registered under Python's attribute
// names in Python's order, each tapped, so that records have the same names
// on both sides (the ReLU module used twice: `relu` and `relu#1`).
struct BasicBlockImpl : torch::nn::Module {
  T<torch::nn::Conv2d> conv1{nullptr}, conv2{nullptr};
  T<torch::nn::BatchNorm2d> bn1{nullptr}, bn2{nullptr};
  T<torch::nn::ReLU> relu{nullptr};
  torch::nn::Sequential downsample{nullptr};
  bool same_padding, relu_before_add;

  BasicBlockImpl(std::int64_t cin, std::int64_t cout, std::int64_t stride, const Bug& bug, const std::string& path)
      : same_padding(bug.is("same_padding") && path == "layer2.0"),
        relu_before_add(bug.is("relu_before_add") && path == "layer1.0") {
    // TF's "SAME" on an even size with stride 2 pads one row and column,
    // after the image: the conv itself pads nothing then.
    conv1 = register_module("conv1", conv(cin, cout, 3, stride, same_padding ? 0 : 1));
    bn1 = register_module("bn1", batch_norm(cout, bug));
    relu = register_module("relu", T<torch::nn::ReLU>());
    conv2 = register_module("conv2", conv(cout, cout, 3, 1, 1));
    bn2 = register_module("bn2", batch_norm(cout, bug, path == "layer1.0"));
    if (stride != 1 || cin != cout) {
      downsample =
          register_module("downsample", torch::nn::Sequential(conv(cin, cout, 1, stride, 0), batch_norm(cout, bug)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor in =
        same_padding ? torch::nn::functional::pad(x, torch::nn::functional::PadFuncOptions({0, 1, 0, 1})) : x;
    torch::Tensor out = relu(bn1(conv1(in)));
    out = bn2(conv2(out));
    if (relu_before_add) out = relu(out);
    const torch::Tensor identity = downsample ? downsample->forward(x) : x;
    return relu(out + identity);
  }
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : torch::nn::Module {
  T<torch::nn::Conv2d> conv1{nullptr};
  T<torch::nn::BatchNorm2d> bn1{nullptr};
  T<torch::nn::ReLU> relu{nullptr};
  T<torch::nn::MaxPool2d> maxpool{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr};
  T<torch::nn::AdaptiveAvgPool2d> avgpool{nullptr};
  T<torch::nn::Linear> fc{nullptr};

  explicit ResNetImpl(const Bug& bug) {
    conv1 = register_module("conv1", conv(kChannels, kWidth, 3, 1, 1));
    bn1 = register_module("bn1", batch_norm(kWidth, bug));
    relu = register_module("relu", T<torch::nn::ReLU>());
    maxpool = register_module("maxpool", T<torch::nn::MaxPool2d>(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
    layer1 = register_module("layer1", torch::nn::Sequential(BasicBlock(kWidth, kWidth, 1, bug, "layer1.0")));
    layer2 = register_module("layer2", torch::nn::Sequential(BasicBlock(kWidth, 2 * kWidth, 2, bug, "layer2.0")));
    avgpool = register_module("avgpool", T<torch::nn::AdaptiveAvgPool2d>(torch::nn::AdaptiveAvgPool2dOptions(1)));
    fc = register_module("fc", T<torch::nn::Linear>(2 * kWidth, kClasses));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = maxpool(relu(bn1(conv1(x))));
    h = layer2->forward(layer1->forward(h));
    return fc(torch::flatten(avgpool(h), 1));
  }
};
TORCH_MODULE(ResNet);

// resnet.py's wave(): sines of a ramp in float64, then float32.
torch::Tensor wave(std::int64_t n, std::int64_t cols, double phase, std::int64_t step) {
  const torch::Tensor t = torch::arange(n * cols, torch::kDouble).reshape({n, cols});
  return torch::sin(t * 0.29 + phase + static_cast<double>(step)).to(torch::kFloat);
}

// resnet.py's batch(): the images (RGB) and the labels.
std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t step) {
  const torch::Tensor x = wave(kBatch, kChannels * kSize * kSize, 0.0, step).reshape({kBatch, kChannels, kSize, kSize});
  const torch::Tensor y = (torch::arange(kBatch, torch::kLong) * 3 + step) % kClasses;
  return {x, y};
}

// torch.optim.lr_scheduler.MultiStepLR, which LibTorch's C++ API lacks:
// after the milestone's step(), each group's rate times gamma, in float64
// on the group's current rate, as Python's get_lr() computes it.
struct MultiStepLR {
  torch::optim::Optimizer& opt;
  std::int64_t epoch = 0;
  void step() {
    ++epoch;
    if (!has(kMilestones, epoch)) return;
    for (auto& group : opt.param_groups()) {
      auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
      options.lr(options.lr() * kGamma);
    }
  }
};

// One run of the port: where it goes, and how it runs.
struct Job {
  std::string run;
  Bug bug;
  int threads = 1;
  bool channels_last = false;
};

void run(const Job& job, const std::string& python_run) {
  const auto start = std::chrono::steady_clock::now();
  at::set_num_threads(job.threads);
  ResNet model(job.bug);
  // The Python original's initial weights and buffers: its run's step 0.
  tensortap::load_params(model, python_run, 0);
  const auto memory_format = job.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (job.channels_last) {
    // What Python's model.to(memory_format=torch.channels_last) does: the
    // 4-d weights in NHWC, the same tensors (the optimizer is made after).
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(memory_format));
  }
  if (job.bug.is("frozen_conv1")) model->conv1->weight.requires_grad_(false);

  // One group with the weight decay, as the original; the bug's second
  // group holds the BatchNorm parameters and the biases, without it.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : model->named_parameters()) {
    const bool norm_or_bias = item.key().find("bn") != std::string::npos ||
                              item.key().find("downsample.1") != std::string::npos ||
                              (item.key().size() >= 4 && item.key().compare(item.key().size() - 4, 4, "bias") == 0);
    (job.bug.is("no_decay_norm") && norm_or_bias ? no_decay : decay).push_back(item.value());
  }
  const auto sgd =
      torch::optim::SGDOptions(kLr).momentum(kMomentum).nesterov(!job.bug.is("no_nesterov")).weight_decay(kWeightDecay);
  std::vector<torch::optim::OptimizerParamGroup> groups{torch::optim::OptimizerParamGroup(decay)};
  if (!no_decay.empty()) {
    auto options = std::make_unique<torch::optim::SGDOptions>(sgd);
    options->weight_decay(0.0);
    groups.emplace_back(no_decay, std::move(options));
  }
  torch::optim::SGD opt(groups, sgd);
  MultiStepLR sched{opt};

  // Packed: a run is a few files, made durable about once a second, where
  // .npy makes a file per record durable; a check of fourteen runs on a
  // busy disk waited seconds for those flushes.
  auto rec = tensortap::watch(*model, tensortap::Options(job.run)
                                          .overwrite(true)
                                          .kinds(tensortap::KindSet::all())
                                          .steps(kRecorded)
                                          .format(tensortap::Format::Packed));
  const auto [xe, ye] = batch(100);
  const auto eval_images = xe.contiguous(memory_format);
  for (std::int64_t step = 0; step < kSteps; ++step) {
    rec->step(step);
    auto [x, y] = batch(step);
    if (job.bug.is("bgr")) x = x.flip({1});
    x = x.contiguous(memory_format);
    opt.zero_grad();
    auto ce = torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(
        job.bug.is("no_smoothing") ? 0.0 : kLabelSmoothing);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y, ce);
    rec->capture("loss", loss);
    loss.backward();
    rec->record_grads(opt);
    if (job.bug.is("sched_first")) sched.step();
    // The rate this step's update uses.
    rec->capture("lr", torch::tensor(static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options()).lr(),
                                     torch::kDouble));
    opt.step();
    if (!job.bug.is("sched_first")) sched.step();
    if (has(kEvalSteps, step)) {
      if (!job.bug.is("no_eval")) model->eval();
      torch::NoGradGuard no_grad;
      const torch::Tensor logits = model->forward(eval_images);
      rec->capture("eval_logits", logits);
      rec->capture("eval_loss", torch::nn::functional::cross_entropy(logits, ye));
      model->train();
    }
  }
  rec->close();
  std::printf("port_resnet: %s: %lld records, LibTorch %s, %d thread(s)%s%s, %.2f s\n", job.run.c_str(),
              static_cast<long long>(rec->counters().records), TORCH_VERSION, job.threads,
              job.channels_last ? ", channels-last" : "",
              job.bug.name.empty() ? "" : (", with the port bug " + job.bug.name).c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  // Several runs in one process: a check of eleven bugs loads LibTorch
  // once (0.6 s a process on the project's machine) rather than twelve times.
  std::vector<Job> jobs;
  bool ok = argc >= 3;
  for (int i = 2; i < argc && ok; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      jobs.emplace_back();
      jobs.back().run = a;
    } else if (jobs.empty()) {
      ok = false;
    } else if (a == "--bug" && i + 1 < argc) {
      jobs.back().bug.name = argv[++i];
      ok = std::find(kBugs.begin(), kBugs.end(), jobs.back().bug.name) != kBugs.end();
    } else if (a == "--threads" && i + 1 < argc) {
      jobs.back().threads = std::atoi(argv[++i]);
      ok = jobs.back().threads >= 1;
    } else if (a == "--channels-last") {
      jobs.back().channels_last = true;
    } else {
      ok = false;
    }
  }
  if (!ok) {
    std::string names;
    for (const auto& b : kBugs) names += (names.empty() ? "" : "|") + b;
    std::fprintf(stderr,
                 "usage: port_resnet PYTHON_RUN RUN [--bug %s] [--threads N] [--channels-last] [RUN [options]]...\n",
                 names.c_str());
    return 2;
  }
  for (const Job& job : jobs) run(job, argv[1]);
  return 0;
}
