// Writes the runs tests/python/check_health.py gives `tensortap doctor`: one
// training per planted problem, each at most 100 steps, statistics of every
// tensor every step (and full parameters every step where weight_update_ratio
// is to judge them: it needs their values), and healthy ones that must give
// no finding. Runs with statistics also have every live health rule on
// (Options::dump_on), whose dumps must agree with the doctor.
//
//   health_runs OUT [MODE...]     writes OUT/<mode> for each MODE (default: all)
//
// The model is an MLP on the demo's task (labels of a fixed random teacher).
// Each hidden layer k is fc<k>, then a Tap "<act><k>_input", the nonlinearity,
// a Tap "<act><k>": the names the rules' default include patterns find
// (relu1, tanh2, relu1_input...), as a user is told to name them.
//
// modes (docs/health.md tabulates them with the rule each plants):
//   healthy          ReLU, tanh and sigmoid layers, He and Xavier inits, SGD 0.02 with momentum 0.9
//   healthy_records  the same, 40 steps, without statistics: the doctor computes them from the records
//   vanishing        8 sigmoid layers, weights 1/100 of the default init
//   exploding        SGD at a learning rate of 20
//   dead_relu        relu2's bias -10
//   saturated        tanh2's inputs scaled by 100
//   saturated_records the same, 10 steps, without statistics (the saturated fraction from the values)
//   stuck            learning rate 0
//   frozen_zero      fc2 all zero and frozen (requires_grad false)
//   poor_init        weights scaled 1, 1/100, 1, 100 layer by layer
//   update_ratio     Adam at a learning rate of 0.1, 100x the usual 1e-3
//   variance         from step 60, inputs 1000x larger (a normalization dropped)
//   stall            stall_after 300 ms, and at step 20 no step() for 1.5 s (a data loader that hangs)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

namespace nn = torch::nn;

namespace {

constexpr int64_t kInputs = 32, kClasses = 10, kBatch = 128, kSteps = 100;

struct LayerSpec {
  std::string act;     // "relu", "tanh", "sigmoid"
  int64_t width;       // its output features
  double init = 1.0;   // its weights scaled by this after the default init
  double bias = 0.0;   // its bias filled with this, when `set_bias`
  bool set_bias = false;
  double scale = 1.0;  // its pre-activation multiplied by this
  bool frozen_zero = false;
};

struct NetImpl : nn::Module {
  std::vector<nn::Linear> fcs;
  std::vector<tensortap::Tap> inputs, outputs;
  std::vector<LayerSpec> specs;

  explicit NetImpl(const std::vector<LayerSpec>& layers) : specs(layers) {
    int64_t in = kInputs;
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& s = layers[i];
      const std::string k = std::to_string(i + 1);
      auto fc = register_module("fc" + k, nn::Linear(in, s.width));
      {
        torch::NoGradGuard no_grad;
        // Xavier for tanh and sigmoid, He for ReLU: the inits a healthy run uses.
        const double gain = s.act == "relu" ? std::sqrt(2.0) : 1.0;
        fc->weight.normal_(0.0, gain / std::sqrt(static_cast<double>(in)));
        fc->weight.mul_(s.init);
        if (s.set_bias) fc->bias.fill_(s.bias);
        if (s.frozen_zero) {
          fc->weight.zero_();
          fc->bias.zero_();
        }
      }
      if (s.frozen_zero) {
        fc->weight.set_requires_grad(false);
        fc->bias.set_requires_grad(false);
      }
      fcs.push_back(fc);
      inputs.push_back(register_module(s.act + k + "_input", tensortap::Tap()));
      outputs.push_back(register_module(s.act + k, tensortap::Tap()));
      in = s.width;
    }
    fcs.push_back(register_module("fc" + std::to_string(layers.size() + 1), nn::Linear(in, kClasses)));
  }

  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < specs.size(); ++i) {
      x = inputs[i](fcs[i](x) * specs[i].scale);
      const auto& act = specs[i].act;
      x = outputs[i](act == "relu" ? torch::relu(x) : act == "tanh" ? torch::tanh(x) : torch::sigmoid(x));
    }
    return fcs.back()(x);
  }
};
TORCH_MODULE(Net);

struct Mode {
  std::vector<LayerSpec> layers;
  std::string optimizer = "sgd";  // or "adam"
  double lr = 0.02;
  bool statistics = true;
  bool full_params = false;        // the parameters in full every step (weight_update_ratio)
  int64_t steps = kSteps;
  int64_t scale_inputs_from = -1;  // from this step on, inputs x1000
  int64_t stall_at = -1;           // this step hangs for 1.5 s, under stall_after 300 ms
};

std::map<std::string, Mode> modes() {
  std::map<std::string, Mode> m;
  const std::vector<LayerSpec> mixed = {{"relu", 64}, {"tanh", 64}, {"sigmoid", 64}};
  const std::vector<LayerSpec> relus = {{"relu", 64}, {"relu", 64}, {"relu", 64}};
  m["healthy"] = {mixed};
  m["healthy"].full_params = true;
  // Everything in full every step: 40 steps, the 2 windows loss_not_decreasing needs.
  m["healthy_records"] = {mixed};
  m["healthy_records"].statistics = false;
  m["healthy_records"].steps = 40;
  std::vector<LayerSpec> deep(8, LayerSpec{"sigmoid", 32, 0.01});
  m["vanishing"] = {deep};
  m["exploding"] = {relus, "sgd", 20.0};
  auto dead = relus;
  dead[1].set_bias = true;
  dead[1].bias = -10.0;
  m["dead_relu"] = {dead};
  auto saturated = mixed;
  saturated[1].scale = 100.0;
  m["saturated"] = {saturated};
  m["saturated_records"] = {saturated};
  m["saturated_records"].statistics = false;
  m["saturated_records"].steps = 10;
  m["stuck"] = {relus, "sgd", 0.0};
  m["stuck"].full_params = true;
  auto frozen = relus;
  frozen[1].frozen_zero = true;
  m["frozen_zero"] = {frozen};
  m["frozen_zero"].full_params = true;  // a frozen layer is never "too slow"
  auto poor = std::vector<LayerSpec>{{"relu", 64, 1.0}, {"relu", 64, 0.01}, {"relu", 64, 1.0}, {"relu", 64, 100.0}};
  m["poor_init"] = {poor};
  m["update_ratio"] = {relus, "adam", 0.1};
  m["update_ratio"].full_params = true;
  m["variance"] = {relus, "adam", 1e-3};
  m["variance"].scale_inputs_from = 60;
  m["stall"] = {relus};
  m["stall"].steps = 30;
  m["stall"].stall_at = 20;
  return m;
}

void train(const std::string& dir, const Mode& mode, uint64_t seed) {
  torch::manual_seed(0);
  const torch::Tensor data = torch::randn({4096, kInputs});
  torch::Tensor labels;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor w1 = torch::randn({kInputs, 64}), w2 = torch::randn({64, kClasses});
    labels = torch::relu(data.mm(w1)).mm(w2).argmax(1);
  }
  torch::manual_seed(seed);
  Net model(mode.layers);
  std::vector<torch::Tensor> trained;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) trained.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (mode.optimizer == "adam")
    opt = std::make_unique<torch::optim::Adam>(trained, torch::optim::AdamOptions(mode.lr));
  else
    opt = std::make_unique<torch::optim::SGD>(trained, torch::optim::SGDOptions(mode.lr).momentum(0.9));

  // Statistics of every kind every step; full tensors: the parameters every
  // step where weight_update_ratio is to judge them (it needs their values),
  // the rest never. Without statistics, everything in full every step.
  tensortap::Options options(dir);
  options.kinds(tensortap::KindSet::all()).overwrite(true);
  if (mode.statistics) {
    options.stats_every(1).every(0).every(tensortap::Kind::Param, mode.full_params ? 1 : 0);
    // Every rule that runs live (weight_update_ratio is offline only), each
    // firing at most once: check_health.py holds their dumps to the doctor's
    // findings over the same rows.
    using T = tensortap::Trigger;
    for (T rule : {T::vanishing_gradient(), T::exploding_tensor(), T::all_zero(), T::unchanged_tensor(),
                   T::loss_not_decreasing(), T::dead_relu(), T::saturated_activation(), T::tensor_variance(),
                   T::poor_weight_initialization()})
      options.dump_on(rule);
  } else
    options.every(1);
  if (mode.stall_at >= 0) options.stall_after(std::chrono::milliseconds(300));
  auto rec = tensortap::watch(*model, options);
  for (int64_t step = 0; step < mode.steps; ++step) {
    rec->step(step);
    if (step == mode.stall_at) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const torch::Tensor idx = torch::randint(0, data.size(0), {kBatch}, torch::kLong);
    torch::Tensor x = data.index_select(0, idx);
    if (mode.scale_inputs_from >= 0 && step >= mode.scale_inputs_from) x = x * 1000.0;
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), labels.index_select(0, idx));
    rec->capture("loss", loss);
    opt->zero_grad();
    loss.backward();
    opt->step();
  }
  rec->close();
  std::printf("%s: %lld records, %lld statistics rows\n", dir.c_str(),
              static_cast<long long>(rec->counters().records), static_cast<long long>(rec->counters().stats_rows));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: health_runs OUT [MODE...]\n");
    return 2;
  }
  const auto all = modes();
  std::vector<std::string> chosen(argv + 2, argv + argc);
  if (chosen.empty())
    for (const auto& [name, mode] : all) chosen.push_back(name);
  for (const auto& name : chosen) {
    const auto it = all.find(name);
    if (it == all.end()) {
      std::fprintf(stderr, "health_runs: no mode %s\n", name.c_str());
      return 2;
    }
    // The same seed for a mode and its _records twin: the same training.
    const std::string base = name.substr(0, name.find("_records"));
    uint64_t seed = 1;
    for (const char c : base) seed = seed * 31 + static_cast<unsigned char>(c);
    train(std::string(argv[1]) + "/" + name, it->second, seed % 1000);
  }
  return 0;
}
