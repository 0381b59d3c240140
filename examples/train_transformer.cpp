// A small transformer language model on synthetic token sequences, watched
// by tensortap, with the parts of a real training loop that decide what a
// recorded gradient means: AdamW, gradient clipping, a learning-rate schedule.
// The tensortap lines are marked:
// - the encoder is a ModuleList of Tapped<TransformerEncoderLayer> called in
//   a loop, not a TransformerEncoder (which calls its layers itself, out of
//   any tap's reach): each layer's output and its gradient are recorded
//   under the layer's path, "layers.0", "layers.1";
// - record_grads(opt) after clipping: the gradients AdamW applies.
// At every captured step the program also takes its own copies of what
// tensortap records (.detach().clone(), gradients through register_hook) and
// writes them to REF_DIR/<kind>/<name>/<step>.npy;
// tests/python/check_real_programs.py compares the two, bit for bit.
//
//   train_transformer [run_dir=runs/transformer] [steps=20] [every=5] [ref_dir=<run_dir>_ref]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>  // tensortap

namespace nn = torch::nn;
using tensortap::Tapped;  // tensortap

namespace {

constexpr int64_t kVocab = 32, kLen = 16, kBatch = 8;
constexpr int64_t kDim = 32, kHeads = 4, kFeedForward = 64, kLayers = 2;

// Sequences t -> (a + b*t) mod kVocab, a and b drawn per sequence: the next
// token follows from the two before it, which attention has to find.
// [kLen + 1, kBatch], sequence first as LibTorch's transformer layers take it.
torch::Tensor token_batch() {
  const auto a = torch::randint(0, kVocab, {1, kBatch}, torch::kLong);
  const auto b = torch::randint(1, 8, {1, kBatch}, torch::kLong);
  const auto t = torch::arange(kLen + 1, torch::kLong).unsqueeze(1);
  return (a + b * t).remainder(kVocab);
}

struct LanguageModelImpl : nn::Module {
  LanguageModelImpl() {
    // tensortap: a TransformerEncoder calls its layers inside its own
    // forward, so a Tapped layer inside it would never be called through its
    // holder and never recorded. Instead a ModuleList of Tapped layers, called
    // below. TransformerEncoder builds its layers as copies of one layer
    // (clone()), all starting from the same values: so do we. A clone of a
    // Tapped module is a Tapped module.
    Tapped<nn::TransformerEncoderLayer> first(
        nn::TransformerEncoderLayerOptions(kDim, kHeads).dim_feedforward(kFeedForward));
    blocks.push_back(first);
    for (int64_t i = 1; i < kLayers; ++i)
      blocks.emplace_back(
          std::dynamic_pointer_cast<tensortap::TappedImpl<nn::TransformerEncoderLayerImpl>>(first->clone()));
    for (const auto& block : blocks) layers->push_back(block);  // "layers.0", "layers.1"
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("layers", layers);
    register_module("norm", norm);
    register_module("head", head);
  }

  // tokens [kLen, B] -> logits [kLen, B, kVocab]. `seen`, when given, gets
  // each tapped module's output, for the reference copies.
  torch::Tensor forward(const torch::Tensor& tokens, std::vector<torch::Tensor>* seen = nullptr) {
    const int64_t len = tokens.size(0);
    auto x = tok(tokens) + pos(torch::arange(len, torch::kLong)).unsqueeze(1);
    // Causal: position i attends to positions <= i only.
    const auto mask = torch::full({len, len}, -std::numeric_limits<float>::infinity()).triu(1);
    for (auto& block : blocks) {
      x = block(x, mask);  // tensortap: recorded as layers.<i> (src_key_padding_mask left out)
      if (seen != nullptr) seen->push_back(x);
    }
    auto logits = head(norm(x));  // tensortap: recorded as "head"
    if (seen != nullptr) seen->push_back(logits);
    return logits;
  }

  nn::Embedding tok{kVocab, kDim}, pos{kLen, kDim};
  nn::ModuleList layers;
  std::vector<Tapped<nn::TransformerEncoderLayer>> blocks;  // the same modules as `layers`, typed
  nn::LayerNorm norm{nn::LayerNormOptions({kDim})};
  Tapped<nn::Linear> head{kDim, kVocab};  // tensortap: instead of nn::Linear
};
TORCH_MODULE(LanguageModel);

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
  const std::string dir = argc > 1 ? argv[1] : "runs/transformer";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 20;
  const int64_t every = argc > 3 ? std::atoll(argv[3]) : 5;
  Reference ref(argc > 4 ? argv[4] : dir + "_ref");
  torch::manual_seed(1);
  LanguageModel model;
  const double peak_lr = 3e-3;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(peak_lr).weight_decay(0.01));

  // tensortap: activations and their gradients (the Tapped layers and head),
  // gradients and the loss, every `every` steps.
  auto rec = tensortap::watch(*model, tensortap::Options(dir).every(every).overwrite(true));

  // The names tensortap gives the tapped modules' outputs, in forward's order.
  std::vector<std::string> tapped;
  for (int64_t i = 0; i < kLayers; ++i) tapped.push_back("layers." + std::to_string(i));
  tapped.push_back("head");
  for (int64_t step = 0; step < steps; ++step) {
    rec->step(step);  // tensortap
    // The steps Options::every samples: the program's own copies are taken there.
    const bool captured = every > 0 && step % every == 0;
    // Linear warm-up over 4 steps, then cosine decay: set by hand each step.
    const double pi = std::acos(-1.0);
    const double lr = step < 4 ? peak_lr * (step + 1) / 4
                               : peak_lr * 0.5 * (1 + std::cos(pi * (step - 4) / std::max<int64_t>(1, steps - 4)));
    for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);

    opt.zero_grad();
    const auto seq = token_batch();
    std::vector<torch::Tensor> seen;
    const auto logits = model->forward(seq.narrow(0, 0, kLen), captured ? &seen : nullptr);
    const auto targets = seq.narrow(0, 1, kLen);  // the next token at each position
    const auto loss = nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
    rec->capture("loss", loss);  // tensortap
    if (captured) {
      for (size_t i = 0; i < seen.size(); ++i) {
        ref.keep("activation", tapped[i], seen[i]);
        ref.keep_grad(seen[i], tapped[i]);
      }
    }
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    rec->record_grads(opt);  // tensortap: the clipped gradients, as AdamW applies them
    if (captured) {
      for (const auto& p : model->named_parameters())
        if (p.value().grad().defined()) ref.keep("grad", p.key(), p.value().grad());
      ref.keep("tensor", "loss", loss);
      ref.write(step);
    }
    opt.step();
    if (step % 5 == 0 || step == steps - 1)
      std::printf("step %3lld  lr %.5f  loss %.4f\n", static_cast<long long>(step), lr, loss.item<double>());
  }
  rec->close();  // tensortap
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld records, %lld errors, run directory %s\n", static_cast<long long>(s.records),
              static_cast<long long>(s.errors), dir.c_str());
  return s.errors == 0 ? 0 : 1;
}
