// An LSTM sequence classifier trained with gradient accumulation (4
// micro-batches per optimizer step), watched by tensortap. The tensortap
// lines are marked:
// - Tapped<LSTM> called as lstm->forward(x), its initial state left out:
//   the tuple it returns is recorded as lstm.0 (the output), lstm.1.0 (h_n)
//   and lstm.1.1 (c_n);
// - one rec->step() per optimizer step: the LSTM runs 4 times a step, so its
//   records are lstm.0, lstm.0#1, lstm.0#2, lstm.0#3 in call order;
// - the grad record is the default one: the sum of the step's 4 backward
//   passes, which is the .grad() Adam applies (no clipping here).
// At every captured step the program also takes its own copies of what
// tensortap records (.detach().clone(), gradients through register_hook) and
// writes them to REF_DIR/<kind>/<name>/<step>.npy;
// tests/python/check_real_programs.py compares the two, bit for bit.
//
//   train_lstm [run_dir=runs/lstm] [steps=40] [every=10] [ref_dir=<run_dir>_ref]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>  // tensortap

namespace nn = torch::nn;
using tensortap::Tapped;  // tensortap

namespace {

constexpr int64_t kFeatures = 8, kLen = 12, kClasses = 4, kHidden = 16;
constexpr int64_t kMicroBatch = 16, kMicroBatches = 4;

// [kMicroBatch, kLen, kFeatures] noise; class k's feature k ramps up over
// the sequence, so the class shows only to something that integrates.
std::pair<torch::Tensor, torch::Tensor> micro_batch() {
  const auto y = torch::randint(0, kClasses, {kMicroBatch}, torch::kLong);
  const auto ramp = torch::linspace(0.0, 1.0, kLen).view({1, kLen, 1});
  const auto x = torch::randn({kMicroBatch, kLen, kFeatures}) * 0.5 +
                 torch::one_hot(y, kFeatures).to(torch::kFloat).unsqueeze(1) * ramp;
  return {x, y};
}

struct ClassifierImpl : nn::Module {
  ClassifierImpl()
      : lstm(Tapped<nn::LSTM>(nn::LSTMOptions(kFeatures, kHidden).batch_first(true))),  // tensortap: "lstm"
        head(2 * kHidden, kClasses) {
    register_module("lstm", lstm);
    register_module("head", head);
  }
  Tapped<nn::LSTM> lstm;  // tensortap: instead of nn::LSTM
  nn::Linear head;
};
TORCH_MODULE(Classifier);

// The program's own copies of what tensortap records at a captured step,
// taken where the loop can see them and written once the step is done.
class Reference {
 public:
  explicit Reference(std::string dir) : dir_(std::move(dir)) {
    // Only the kinds' folders: a copy left by an earlier run would be compared too.
    for (const char* kind : {"activation", "activation_grad", "grad", "tensor"})
      std::filesystem::remove_all(std::filesystem::path(dir_) / kind);
  }
  void keep(const std::string& kind, const std::string& name, const torch::Tensor& t) {
    kept_.push_back({kind, name, t.detach().clone()});
  }
  // The gradient flowing back into `out`, when backward reaches it.
  void keep_grad(torch::Tensor out, const std::string& name) {
    out.register_hook([this, name](const torch::Tensor& grad) { keep("activation_grad", name, grad); });
  }
  void write(int64_t step) {
    for (const auto& k : kept_) {
      const auto folder = std::filesystem::path(dir_) / k.kind / k.name;
      std::filesystem::create_directories(folder);
      tensortap::save_npy((folder / (std::to_string(step) + ".npy")).string(), k.tensor);
    }
    kept_.clear();
  }

 private:
  struct Kept {
    std::string kind, name;
    torch::Tensor tensor;
  };
  std::string dir_;
  std::vector<Kept> kept_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/lstm";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 40;
  const int64_t every = argc > 3 ? std::atoll(argv[3]) : 10;
  Reference ref(argc > 4 ? argv[4] : dir + "_ref");
  torch::manual_seed(1);
  Classifier model;
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));

  // tensortap: the LSTM's outputs and their gradients, the parameters'
  // gradients and the loss, every `every` steps.
  auto rec = tensortap::watch(*model, tensortap::Options(dir).every(every).overwrite(true));

  for (int64_t step = 0; step < steps; ++step) {
    rec->step(step);  // tensortap: one step per optimizer step, not per micro-batch
    // The steps Options::every samples: the program's own copies are taken there.
    const bool captured = every > 0 && step % every == 0;
    opt.zero_grad();
    torch::Tensor step_loss;  // the sum of the micro-batches' (scaled) losses
    for (int64_t m = 0; m < kMicroBatches; ++m) {
      // tensortap names a module's second run in a step name#1, and so on.
      const std::string rep = m == 0 ? "" : "#" + std::to_string(m);
      const auto [x, y] = micro_batch();
      auto [out, state] = model->lstm->forward(x);  // tensortap: lstm.0, lstm.1.0, lstm.1.1
      auto [h, c] = state;
      if (captured) {
        ref.keep("activation", "lstm.0" + rep, out);
        ref.keep("activation", "lstm.1.0" + rep, h);
        ref.keep("activation", "lstm.1.1" + rep, c);
        ref.keep_grad(out, "lstm.0" + rep);
        ref.keep_grad(h, "lstm.1.0" + rep);
        // c_n is not used below: no gradient reaches it, so neither tensortap
        // nor a hook has an activation_grad to record for lstm.1.1.
      }
      const auto logits = model->head(torch::cat({out.mean(1), h[0]}, 1));
      // Scaled so that the 4 passes sum to the gradient of the mean loss.
      const auto loss = nn::functional::cross_entropy(logits, y) / kMicroBatches;
      loss.backward();
      step_loss = m == 0 ? loss.detach() : step_loss + loss.detach();
    }
    rec->capture("loss", step_loss);  // tensortap: the step's mean loss, once
    if (captured) {
      // What tensortap records as grad: the sum of the step's backward
      // passes, here what accumulated in .grad().
      for (const auto& p : model->named_parameters())
        if (p.value().grad().defined()) ref.keep("grad", p.key(), p.value().grad());
      ref.keep("tensor", "loss", step_loss);
      ref.write(step);
    }
    opt.step();
    if (step % 10 == 0 || step == steps - 1)
      std::printf("step %3lld  loss %.4f\n", static_cast<long long>(step), step_loss.item<double>());
  }
  rec->close();  // tensortap
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld records, %lld errors, run directory %s\n", static_cast<long long>(s.records),
              static_cast<long long>(s.errors), dir.c_str());
  return s.errors == 0 ? 0 : 1;
}
