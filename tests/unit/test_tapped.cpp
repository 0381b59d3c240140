// Tapped<M> over every torch::nn module whose forward returns a tensor (or a
// tuple of them): same parameter and buffer names, same outputs, same
// gradients as the plain module, and the output captured.
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"

using tensortap::Options;
using tt_test::TempDir;
namespace nn = torch::nn;

namespace {

std::vector<std::string> keys(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  std::vector<std::string> out;
  for (const auto& item : d) out.push_back(item.key());
  return out;
}

// Every floating-point tensor in `out`, flattened (tuples included).
void tensors_of(const torch::Tensor& t, std::vector<torch::Tensor>& out) { out.push_back(t); }
template <class... T>
void tensors_of(const std::tuple<T...>& t, std::vector<torch::Tensor>& out) {
  std::apply([&](const auto&... e) { (tensors_of(e, out), ...); }, t);
}

// The sum of every floating output times fixed weights: a loss whose
// gradient reaches each output differently.
torch::Tensor loss_of(const std::vector<torch::Tensor>& outs) {
  torch::Tensor loss = torch::zeros({});
  for (const auto& o : outs)
    if (o.defined() && o.is_floating_point() && o.requires_grad())
      loss = loss + (o * torch::linspace(-1, 1, o.numel()).reshape(o.sizes())).sum();
  return loss;
}

// Inputs: fresh leaves each call, float ones requiring grad.
using Inputs = std::function<std::vector<torch::Tensor>()>;

torch::Tensor leaf(std::vector<std::int64_t> shape) { return torch::randn(shape).requires_grad_(true); }

struct Parent : nn::Module {};

template <class M, std::size_t... I>
auto call_with(M& module, std::vector<torch::Tensor>& in, std::index_sequence<I...>) {
  return module(in[I]...);
}

// `m->forward(...)` with the inputs only: trailing defaulted arguments left
// out, as LibTorch code calls a plain module.
template <class M, std::size_t... I>
auto forward_with(M& module, std::vector<torch::Tensor>& in, std::index_sequence<I...>) {
  return module->forward(in[I]...);
}

template <class Out>
void require_same_outputs(const Out& a, const Out& b) {
  std::vector<torch::Tensor> ta, tb;
  tensors_of(a, ta);
  tensors_of(b, tb);
  REQUIRE(ta.size() == tb.size());
  for (std::size_t i = 0; i < ta.size(); ++i) REQUIRE(torch::allclose(ta[i], tb[i], 1e-6, 1e-6, /*equal_nan=*/true));
}

template <class M>
std::string printed(const M& module) {
  std::ostringstream out;
  out << module;
  return out.str();
}

// LibTorch 1.13's Module is a virtual base: the name a module's constructor
// gives it (MultiheadAttention's) is the most derived class's to give, so a
// Tapped one prints under its class's name ("...Impl(") instead.
std::string comparable(std::string text) {
#if TORCH_VERSION_MAJOR < 2
  for (std::size_t at; (at = text.find("Impl(")) != std::string::npos;) text.erase(at, 4);
#endif
  return text;
}

template <class Holder, std::size_t N, class... Ctor>
void check(const std::string& label, const Inputs& make_inputs, Ctor... ctor) {
  INFO("module " << label);
  torch::manual_seed(1);
  Holder plain(ctor...);
  torch::manual_seed(1);
  tensortap::Tapped<Holder> tapped(ctor...);
  // Same names, so a checkpoint of one loads into the other.
  REQUIRE(keys(plain->named_parameters()) == keys(tapped->named_parameters()));
  REQUIRE(keys(plain->named_buffers()) == keys(tapped->named_buffers()));
  for (const auto& p : plain->named_parameters()) REQUIRE(torch::equal(p.value(), tapped->named_parameters()[p.key()]));

  TempDir dir;
  auto parent = std::make_shared<Parent>();
  parent->register_module("m", tapped.ptr());
  auto rec = tensortap::watch(*parent, Options(dir.path));
  rec->step(0);

  torch::manual_seed(2);
  auto in_plain = make_inputs();
  torch::manual_seed(2);
  auto in_tapped = make_inputs();
  const auto call = [](auto& module, std::vector<torch::Tensor>& in) {
    return call_with(module, in, std::make_index_sequence<N>{});
  };
  torch::manual_seed(3);  // dropout and friends draw the same numbers
  auto out_plain = call(plain, in_plain);
  torch::manual_seed(3);
  auto out_tapped = call(tapped, in_tapped);
  std::vector<torch::Tensor> op, ot;
  tensors_of(out_plain, op);
  tensors_of(out_tapped, ot);
  REQUIRE(op.size() == ot.size());
  for (std::size_t i = 0; i < op.size(); ++i) REQUIRE(torch::allclose(op[i], ot[i], 1e-6, 1e-6, /*equal_nan=*/true));
  for (const auto& b : plain->named_buffers()) REQUIRE(torch::allclose(b.value(), tapped->named_buffers()[b.key()]));

  const auto lp = loss_of(op), lt = loss_of(ot);
  if (lp.requires_grad()) {
    lp.backward();
    lt.backward();
    for (std::size_t i = 0; i < in_plain.size(); ++i)
      if (in_plain[i].grad().defined()) REQUIRE(torch::allclose(in_plain[i].grad(), in_tapped[i].grad(), 1e-5, 1e-6));
    for (const auto& p : plain->named_parameters())
      if (p.value().grad().defined())
        REQUIRE(torch::allclose(p.value().grad(), tapped->named_parameters()[p.key()].grad(), 1e-5, 1e-6));
  }
  rec->close();
  // The output is captured: one record per tensor of the output, named
  // "m", or "m.0", "m.1.0"... for a tuple.
  const auto lines = tt_test::read_lines(dir / "index.jsonl");
  std::size_t activations = 0;
  for (const auto& l : lines) activations += l.find("\"kind\":\"activation\"") != std::string::npos;
  REQUIRE(activations == ot.size());
  REQUIRE(rec->counters().errors == 0);

  // Wherever LibTorch's code looks, it is the plain module: printed the
  // same, found by as<M>() in apply(), cloned with its values.
  using Impl = typename Holder::ContainedType;
  REQUIRE(comparable(printed(*tapped)) == comparable(printed(*plain)));
  if constexpr (tensortap::detail::Derivable<Impl>::value) {
    int found = 0;
    parent->apply([&](nn::Module& m) { found += m.as<Holder>() != nullptr; });
    REQUIRE(found == 1);
  }
  auto copy = std::dynamic_pointer_cast<tensortap::TappedImpl<Impl>>(tapped->clone());
  REQUIRE(copy != nullptr);
  REQUIRE(keys(copy->named_parameters()) == keys(tapped->named_parameters()));
  for (const auto& p : tapped->named_parameters()) {
    REQUIRE(torch::equal(p.value(), copy->named_parameters()[p.key()]));
    REQUIRE(p.value().data_ptr() != copy->named_parameters()[p.key()].data_ptr());
  }
  for (const auto& b : tapped->named_buffers()) REQUIRE(torch::equal(b.value(), copy->named_buffers()[b.key()]));

  // m->forward(...) takes what M's forward takes, defaulted trailing
  // arguments left out (LSTM's state, MultiheadAttention's masks,
  // ConvTranspose's output size...).
  torch::manual_seed(4);
  auto again_plain = make_inputs();
  torch::manual_seed(4);
  auto again_tapped = make_inputs();
  torch::manual_seed(5);
  auto fwd_plain = forward_with(plain, again_plain, std::make_index_sequence<N>{});
  torch::manual_seed(5);
  auto fwd_tapped = forward_with(tapped, again_tapped, std::make_index_sequence<N>{});
  require_same_outputs(fwd_plain, fwd_tapped);
}

}  // namespace

TEST_CASE("Tapped<M> wraps every torch::nn module that returns a tensor", "[hooks][tapped]") {
  const Inputs x4 = [] { return std::vector<torch::Tensor>{leaf({2, 3, 4, 4})}; };
  const Inputs x3 = [] { return std::vector<torch::Tensor>{leaf({2, 3, 6})}; };
  const Inputs x5 = [] { return std::vector<torch::Tensor>{leaf({2, 3, 4, 4, 4})}; };
  const Inputs x2 = [] { return std::vector<torch::Tensor>{leaf({4, 3})}; };

  // Activations.
  check<nn::ELU, 1>("ELU", x4);
  check<nn::SELU, 1>("SELU", x4);
  check<nn::Hardshrink, 1>("Hardshrink", x4);
  check<nn::Hardtanh, 1>("Hardtanh", x4);
  check<nn::LeakyReLU, 1>("LeakyReLU", x4);
  check<nn::LogSigmoid, 1>("LogSigmoid", x4);
  check<nn::Softmax, 1>("Softmax", x4, 1);
  check<nn::Softmin, 1>("Softmin", x4, 1);
  check<nn::LogSoftmax, 1>("LogSoftmax", x4, 1);
  check<nn::Softmax2d, 1>("Softmax2d", x4);
  check<nn::PReLU, 1>("PReLU", x4);
  check<nn::ReLU, 1>("ReLU", x4);
  check<nn::ReLU6, 1>("ReLU6", x4);
  check<nn::RReLU, 1>("RReLU", x4);
  check<nn::CELU, 1>("CELU", x4);
  check<nn::GLU, 1>("GLU", x4);
  check<nn::GELU, 1>("GELU", x4);
  check<nn::SiLU, 1>("SiLU", x4);
  check<nn::Mish, 1>("Mish", x4);
  check<nn::Sigmoid, 1>("Sigmoid", x4);
  check<nn::Softplus, 1>("Softplus", x4);
  check<nn::Softshrink, 1>("Softshrink", x4);
  check<nn::Softsign, 1>("Softsign", x4);
  check<nn::Tanh, 1>("Tanh", x4);
  check<nn::Tanhshrink, 1>("Tanhshrink", x4);
  check<nn::Threshold, 1>("Threshold", x4, 0.1, 20.0);
  check<nn::Identity, 1>("Identity", x4);

  // Convolutions, 1-3 d, plain and transposed (whose forward has a default argument).
  check<nn::Conv1d, 1>("Conv1d", x3, 3, 2, 3);
  check<nn::Conv2d, 1>("Conv2d", x4, 3, 2, 3);
  check<nn::Conv3d, 1>("Conv3d", x5, 3, 2, 3);
  check<nn::ConvTranspose1d, 1>("ConvTranspose1d", x3, 3, 2, 3);
  check<nn::ConvTranspose2d, 1>("ConvTranspose2d", x4, 3, 2, 3);
  check<nn::ConvTranspose3d, 1>("ConvTranspose3d", x5, 3, 2, 3);

  // Normalization (training mode: running statistics move, and must move alike).
  check<nn::BatchNorm1d, 1>("BatchNorm1d", x2, 3);
  check<nn::BatchNorm2d, 1>("BatchNorm2d", x4, 3);
  check<nn::BatchNorm3d, 1>("BatchNorm3d", x5, 3);
  check<nn::InstanceNorm1d, 1>("InstanceNorm1d", x3,
                               nn::InstanceNorm1dOptions(3).affine(true).track_running_stats(true));
  check<nn::InstanceNorm2d, 1>("InstanceNorm2d", x4,
                               nn::InstanceNorm2dOptions(3).affine(true).track_running_stats(true));
  check<nn::InstanceNorm3d, 1>("InstanceNorm3d", x5,
                               nn::InstanceNorm3dOptions(3).affine(true).track_running_stats(true));
  check<nn::LayerNorm, 1>("LayerNorm", x4, nn::LayerNormOptions({4}));
  check<nn::GroupNorm, 1>("GroupNorm", x4, 1, 3);
  check<nn::LocalResponseNorm, 1>("LocalResponseNorm", x4, 2);
  check<nn::CrossMapLRN2d, 1>("CrossMapLRN2d", x4, 3);

  // Dropout.
  check<nn::Dropout, 1>("Dropout", x4, 0.5);
  check<nn::Dropout2d, 1>("Dropout2d", x4, 0.5);
  check<nn::Dropout3d, 1>("Dropout3d", x5, 0.5);
  check<nn::AlphaDropout, 1>("AlphaDropout", x4, 0.5);
  check<nn::FeatureAlphaDropout, 1>("FeatureAlphaDropout", x4, 0.5);

  // Embeddings (integer input).
  const Inputs ids = [] { return std::vector<torch::Tensor>{torch::randint(0, 10, {2, 3})}; };
  check<nn::Embedding, 1>("Embedding", ids, 10, 4);
  check<nn::EmbeddingBag, 1>("EmbeddingBag", ids, 10, 4);  // offsets and weights by default

  // Linear and friends.
  const Inputs x24 = [] { return std::vector<torch::Tensor>{leaf({2, 4})}; };
  check<nn::Linear, 1>("Linear", x24, 4, 2);
  check<nn::Bilinear, 2>(
      "Bilinear",
      [] {
        return std::vector<torch::Tensor>{leaf({2, 4}), leaf({2, 3})};
      },
      4, 3, 2);
  check<nn::Flatten, 1>("Flatten", x4);
  check<nn::Unflatten, 1>("Unflatten", x2, nn::UnflattenOptions(1, {3, 1}));

  // Pooling.
  check<nn::AvgPool1d, 1>("AvgPool1d", x3, 2);
  check<nn::AvgPool2d, 1>("AvgPool2d", x4, 2);
  check<nn::AvgPool3d, 1>("AvgPool3d", x5, 2);
  check<nn::MaxPool1d, 1>("MaxPool1d", x3, 2);
  check<nn::MaxPool2d, 1>("MaxPool2d", x4, 2);
  check<nn::MaxPool3d, 1>("MaxPool3d", x5, 2);
  check<nn::AdaptiveAvgPool1d, 1>("AdaptiveAvgPool1d", x3, 2);
  check<nn::AdaptiveAvgPool2d, 1>("AdaptiveAvgPool2d", x4, 2);
  check<nn::AdaptiveAvgPool3d, 1>("AdaptiveAvgPool3d", x5, 2);
  check<nn::AdaptiveMaxPool1d, 1>("AdaptiveMaxPool1d", x3, 2);
  check<nn::AdaptiveMaxPool2d, 1>("AdaptiveMaxPool2d", x4, 2);
  check<nn::AdaptiveMaxPool3d, 1>("AdaptiveMaxPool3d", x5, 2);
  check<nn::LPPool1d, 1>("LPPool1d", x3, nn::LPPool1dOptions(2, 2));
  check<nn::LPPool2d, 1>("LPPool2d", x4, nn::LPPool2dOptions(2, 2));
  check<nn::FractionalMaxPool2d, 1>("FractionalMaxPool2d", x4, nn::FractionalMaxPool2dOptions(2).output_size(2));
  check<nn::FractionalMaxPool3d, 1>("FractionalMaxPool3d", x5, nn::FractionalMaxPool3dOptions(2).output_size(2));
  // Unpooling takes the indices (and a defaulted output size).
  check<nn::MaxUnpool1d, 2>(
      "MaxUnpool1d",
      [] {
        auto [v, i] = torch::max_pool1d_with_indices(torch::randn({2, 3, 6}), {2});
        return std::vector<torch::Tensor>{v.detach().requires_grad_(true), i};
      },
      2);
  check<nn::MaxUnpool2d, 2>(
      "MaxUnpool2d",
      [] {
        auto [v, i] = torch::max_pool2d_with_indices(torch::randn({2, 3, 4, 4}), {2, 2});
        return std::vector<torch::Tensor>{v.detach().requires_grad_(true), i};
      },
      2);
  check<nn::MaxUnpool3d, 2>(
      "MaxUnpool3d",
      [] {
        auto [v, i] = torch::max_pool3d_with_indices(torch::randn({2, 3, 4, 4, 4}), {2, 2, 2});
        return std::vector<torch::Tensor>{v.detach().requires_grad_(true), i};
      },
      2);

  // Padding.
  check<nn::ReflectionPad1d, 1>("ReflectionPad1d", x3, 1);
  check<nn::ReflectionPad2d, 1>("ReflectionPad2d", x4, 1);
  check<nn::ReflectionPad3d, 1>("ReflectionPad3d", x5, 1);
  check<nn::ReplicationPad1d, 1>("ReplicationPad1d", x3, 1);
  check<nn::ReplicationPad2d, 1>("ReplicationPad2d", x4, 1);
  check<nn::ReplicationPad3d, 1>("ReplicationPad3d", x5, 1);
  check<nn::ZeroPad2d, 1>("ZeroPad2d", x4, 1);
  check<nn::ConstantPad1d, 1>("ConstantPad1d", x3, nn::ConstantPad1dOptions(1, 0.5));
  check<nn::ConstantPad2d, 1>("ConstantPad2d", x4, nn::ConstantPad2dOptions(1, 0.5));
  check<nn::ConstantPad3d, 1>("ConstantPad3d", x5, nn::ConstantPad3dOptions(1, 0.5));

  // Shape shuffles, folds, upsampling, distances.
  check<nn::PixelShuffle, 1>(
      "PixelShuffle",
      [] {
        return std::vector<torch::Tensor>{leaf({1, 4, 2, 2})};
      },
      nn::PixelShuffleOptions(2));
  check<nn::PixelUnshuffle, 1>(
      "PixelUnshuffle",
      [] {
        return std::vector<torch::Tensor>{leaf({1, 1, 4, 4})};
      },
      nn::PixelUnshuffleOptions(2));
  check<nn::Unfold, 1>("Unfold", x4, nn::UnfoldOptions({2, 2}));
  check<nn::Fold, 1>(
      "Fold",
      [] {
        return std::vector<torch::Tensor>{leaf({1, 12, 9})};
      },
      nn::FoldOptions({4, 4}, {2, 2}));
  check<nn::Upsample, 1>("Upsample", x4,
                         nn::UpsampleOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
  const Inputs pair = [] { return std::vector<torch::Tensor>{leaf({4, 3}), leaf({4, 3})}; };
  check<nn::CosineSimilarity, 2>("CosineSimilarity", pair);
  check<nn::PairwiseDistance, 2>("PairwiseDistance", pair);

  // Recurrent cells and layers; tuples are captured element by element.
  const Inputs seq = [] { return std::vector<torch::Tensor>{leaf({5, 2, 4})}; };
  check<nn::RNNCell, 1>(
      "RNNCell",
      [] {
        return std::vector<torch::Tensor>{leaf({2, 4})};
      },
      4, 3);
  check<nn::GRUCell, 1>(
      "GRUCell",
      [] {
        return std::vector<torch::Tensor>{leaf({2, 4})};
      },
      4, 3);
  check<nn::LSTMCell, 1>(
      "LSTMCell",
      [] {
        return std::vector<torch::Tensor>{leaf({2, 4})};
      },
      4, 3);
  check<nn::RNN, 1>("RNN", seq, 4, 3);
  check<nn::GRU, 1>("GRU", seq, 4, 3);
  check<nn::LSTM, 1>("LSTM", seq, 4, 3);
  check<nn::MultiheadAttention, 3>(
      "MultiheadAttention",
      [] {
        return std::vector<torch::Tensor>{leaf({5, 2, 4}), leaf({5, 2, 4}), leaf({5, 2, 4})};
      },
      4, 2);

  // Transformers.
  check<nn::TransformerEncoderLayer, 1>("TransformerEncoderLayer", seq,
                                        nn::TransformerEncoderLayerOptions(4, 2).dim_feedforward(8));
  check<nn::TransformerDecoderLayer, 2>(
      "TransformerDecoderLayer",
      [] {
        return std::vector<torch::Tensor>{leaf({5, 2, 4}), leaf({3, 2, 4})};
      },
      nn::TransformerDecoderLayerOptions(4, 2).dim_feedforward(8));
  check<nn::TransformerEncoder, 1>(
      "TransformerEncoder", seq,
      nn::TransformerEncoderOptions(nn::TransformerEncoderLayerOptions(4, 2).dim_feedforward(8), 2));
  check<nn::TransformerDecoder, 2>(
      "TransformerDecoder",
      [] {
        return std::vector<torch::Tensor>{leaf({5, 2, 4}), leaf({3, 2, 4})};
      },
      nn::TransformerDecoderOptions(nn::TransformerDecoderLayerOptions(4, 2).dim_feedforward(8), 2));
  check<nn::Transformer, 2>(
      "Transformer",
      [] {
        return std::vector<torch::Tensor>{leaf({5, 2, 4}), leaf({3, 2, 4})};
      },
      nn::TransformerOptions(4, 2, 1, 1).dim_feedforward(8));

  // Losses: a tensor from several inputs.
  const Inputs reg = [] { return std::vector<torch::Tensor>{leaf({4, 3}), torch::randn({4, 3})}; };
  check<nn::L1Loss, 2>("L1Loss", reg);
  check<nn::MSELoss, 2>("MSELoss", reg);
  check<nn::SmoothL1Loss, 2>("SmoothL1Loss", reg);
  check<nn::HuberLoss, 2>("HuberLoss", reg);
  check<nn::SoftMarginLoss, 2>("SoftMarginLoss", reg);
  check<nn::KLDivLoss, 2>("KLDivLoss", reg);
  check<nn::PoissonNLLLoss, 2>("PoissonNLLLoss", reg);
  check<nn::BCEWithLogitsLoss, 2>("BCEWithLogitsLoss", [] {
    return std::vector<torch::Tensor>{leaf({4, 3}), torch::rand({4, 3})};
  });
  check<nn::MultiLabelSoftMarginLoss, 2>("MultiLabelSoftMarginLoss", [] {
    return std::vector<torch::Tensor>{leaf({4, 3}), torch::randint(0, 2, {4, 3}).to(torch::kFloat)};
  });
  check<nn::BCELoss, 2>("BCELoss", [] {
    return std::vector<torch::Tensor>{torch::rand({4, 3}).clamp(0.05, 0.95).requires_grad_(true), torch::rand({4, 3})};
  });
  check<nn::HingeEmbeddingLoss, 2>("HingeEmbeddingLoss", [] {
    return std::vector<torch::Tensor>{leaf({4, 3}), torch::randint(0, 2, {4, 3}).to(torch::kFloat) * 2 - 1};
  });
  const Inputs classes = [] { return std::vector<torch::Tensor>{leaf({4, 3}), torch::randint(0, 3, {4})}; };
  check<nn::CrossEntropyLoss, 2>("CrossEntropyLoss", classes);
  check<nn::MultiMarginLoss, 2>("MultiMarginLoss", classes);
  check<nn::NLLLoss, 2>("NLLLoss", [] {
    return std::vector<torch::Tensor>{torch::log_softmax(torch::randn({4, 3}), 1).detach().requires_grad_(true),
                                      torch::randint(0, 3, {4})};
  });
  check<nn::MultiLabelMarginLoss, 2>("MultiLabelMarginLoss", [] {
    return std::vector<torch::Tensor>{leaf({2, 4}), torch::tensor({{3, 0, -1, 1}, {0, 1, 2, 3}}, torch::kLong)};
  });
  const Inputs triple = [] { return std::vector<torch::Tensor>{leaf({4, 3}), leaf({4, 3}), leaf({4, 3})}; };
  check<nn::TripletMarginLoss, 3>("TripletMarginLoss", triple);
  check<nn::TripletMarginWithDistanceLoss, 3>("TripletMarginWithDistanceLoss", triple);
  check<nn::CosineEmbeddingLoss, 3>("CosineEmbeddingLoss", [] {
    return std::vector<torch::Tensor>{leaf({4, 3}), leaf({4, 3}), torch::tensor({1.0f, -1.0f, 1.0f, -1.0f})};
  });
  check<nn::MarginRankingLoss, 3>("MarginRankingLoss", [] {
    return std::vector<torch::Tensor>{leaf({4}), leaf({4}), torch::tensor({1.0f, -1.0f, 1.0f, -1.0f})};
  });
  check<nn::CTCLoss, 4>("CTCLoss", [] {
    return std::vector<torch::Tensor>{torch::log_softmax(torch::randn({6, 2, 4}), 2).detach().requires_grad_(true),
                                      torch::randint(1, 4, {2, 3}), torch::full({2}, 6, torch::kLong),
                                      torch::full({2}, 3, torch::kLong)};
  });
}

TEST_CASE("Tapped<M> keeps the module's behaviour in a Sequential, with eval(), clone() and a checkpoint",
          "[hooks][tapped]") {
  // A transposed convolution has a defaulted forward argument: inside a
  // Sequential, it must still be callable with one.
  nn::Sequential seq(tensortap::Tapped<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(3, 2, 3)),
                     tensortap::Tapped<nn::BatchNorm2d>(2), nn::ReLU());
  auto out = seq->forward(torch::randn({2, 3, 4, 4}));
  REQUIRE(out.sizes() == torch::IntArrayRef({2, 2, 6, 6}));
  // eval() reaches the wrapped BatchNorm: its running statistics stop moving.
  auto bn = seq->ptr<tensortap::TappedImpl<nn::BatchNorm2dImpl>>(1);
  seq->eval();
  REQUIRE_FALSE(bn->inner().is_training());
  const auto mean = bn->named_buffers()["running_mean"].clone();
  seq->forward(torch::randn({2, 3, 4, 4}));
  REQUIRE(torch::equal(mean, bn->named_buffers()["running_mean"]));
  // A checkpoint of the tapped model loads into a plain one.
  TempDir dir;
  torch::save(seq, dir / "ckpt.pt");
  nn::Sequential plain(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(3, 2, 3)), nn::BatchNorm2d(2), nn::ReLU());
  torch::load(plain, dir / "ckpt.pt");
  for (const auto& p : seq->named_parameters()) REQUIRE(torch::equal(p.value(), plain->named_parameters()[p.key()]));
  for (const auto& b : seq->named_buffers()) REQUIRE(torch::equal(b.value(), plain->named_buffers()[b.key()]));
  // A clone is a tapped module with the same values, printed as the plain one.
  auto copy = std::dynamic_pointer_cast<tensortap::TappedImpl<nn::BatchNorm2dImpl>>(bn->clone());
  REQUIRE(copy != nullptr);
  REQUIRE(torch::equal(copy->inner().running_mean, bn->named_buffers()["running_mean"]));
  REQUIRE(printed(*bn).find("torch::nn::BatchNorm2d(2") == 0);
  // A cloned Sequential has every child (a Tapped one was null: its
  // forward crashed) and computes the same.
  auto seq_copy = std::dynamic_pointer_cast<nn::SequentialImpl>(seq->clone());
  REQUIRE(seq_copy != nullptr);
  REQUIRE(seq_copy->size() == 3);
  for (std::size_t i = 0; i < seq_copy->size(); ++i) REQUIRE(seq_copy->ptr(i) != nullptr);
  const torch::Tensor x = torch::randn({2, 3, 4, 4});
  REQUIRE(torch::equal(seq->forward(x), seq_copy->forward(x)));
  REQUIRE(printed(*seq_copy) == printed(*seq));
}

namespace {

struct CloneNetImpl : nn::Cloneable<CloneNetImpl> {
  tensortap::Tapped<nn::Linear> fc{nullptr};
  tensortap::Tapped<nn::BatchNorm1d> bn{nullptr};
  tensortap::Tapped<nn::LSTM> lstm{nullptr};
  nn::Linear head{nullptr};
  CloneNetImpl() { reset(); }
  void reset() override {
    fc = register_module("fc", tensortap::Tapped<nn::Linear>(4, 4));
    bn = register_module("bn", tensortap::Tapped<nn::BatchNorm1d>(4));
    lstm = register_module("lstm", tensortap::Tapped<nn::LSTM>(4, 3));
    head = register_module("head", nn::Linear(3, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    // lstm->forward(x) leaves out the state, as with a plain LSTM.
    return head(std::get<0>(lstm->forward(bn(fc(x)).unsqueeze(0))));
  }
};
TORCH_MODULE(CloneNet);

}  // namespace

TEST_CASE("a clone of a model holding Tapped<M> layers copies their weights and is bound to no recorder",
          "[hooks][tapped]") {
  CloneNet net;
  TempDir dir;
  auto rec = tensortap::watch(*net, Options(dir.path));
  rec->step(0);
  net->forward(torch::randn({5, 4}));  // the BatchNorm's running statistics move
  // A common init pattern: apply() with as<Linear>() finds the tapped layer.
  int linears = 0;
  net->apply([&](nn::Module& m) {
    if (auto* l = m.as<nn::Linear>()) {
      ++linears;
      nn::init::constant_(l->weight, 0.25);
    }
  });
  CHECK(linears == 2);
  CHECK(torch::all(net->fc->weight == 0.25).item<bool>());

  auto copy = std::dynamic_pointer_cast<CloneNetImpl>(net->clone());
  REQUIRE(copy != nullptr);
  // Every value copied (the tapped layers had fresh random weights), into
  // tensors of the copy's own.
  for (const auto& p : net->named_parameters()) {
    INFO(p.key());
    CHECK(torch::equal(p.value(), copy->named_parameters()[p.key()]));
    CHECK(p.value().data_ptr() != copy->named_parameters()[p.key()].data_ptr());
  }
  for (const auto& b : net->named_buffers()) {
    INFO(b.key());
    CHECK(torch::equal(b.value(), copy->named_buffers()[b.key()]));
  }
  // The copy's members are its registered children.
  CHECK(copy->fc.ptr().get() == copy->named_children()["fc"].get());
  CHECK(copy->lstm.ptr().get() == copy->named_children()["lstm"].get());
  net->eval();
  copy->eval();
  const torch::Tensor x = torch::randn({5, 4});
  CHECK(torch::equal(net->forward(x), copy->forward(x)));

  // The recorder watches the original only.
  copy->train();
  rec->step(1);
  copy->forward(torch::randn({5, 4}));
  rec->close();
  CHECK(tt_test::index_lines_with(dir.path, "\"step\":1,\"kind\":\"activation\"").empty());
  CHECK_FALSE(tt_test::index_lines_with(dir.path, "\"name\":\"fc\"").empty());
}

TEST_CASE("Tapped<MultiheadAttention> with need_weights=false records its output and skips the undefined weights",
          "[hooks][tapped]") {
  struct AttnImpl : nn::Module {
    tensortap::Tapped<nn::MultiheadAttention> attn{nullptr};
    AttnImpl() { attn = register_module("attn", tensortap::Tapped<nn::MultiheadAttention>(4, 2)); }
  };
  TempDir dir;
  auto model = std::make_shared<AttnImpl>();
  auto rec = tensortap::watch(*model, Options(dir.path).on_error(tensortap::OnError::Stop));
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);  // Stop would throw here after an error
    const torch::Tensor x = torch::randn({5, 2, 4}, torch::requires_grad());
    auto [out, weights] = model->attn(x, x, x, torch::Tensor(), /*need_weights=*/false);
    CHECK_FALSE(weights.defined());
    out.sum().backward();
  }
  rec->close();
  CHECK(rec->counters().errors == 0);
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"attn.0\"").size() == 6);  // activation and its gradient
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"attn.1\"").empty());
}

namespace {

// A user's module that cannot be copied (LibTorch's Cloneable modules can).
struct LockedImpl : nn::Module {
  nn::Linear fc{nullptr};
  std::unique_ptr<int> calls = std::make_unique<int>(0);
  LockedImpl() { fc = register_module("fc", nn::Linear(3, 2)); }
  torch::Tensor forward(torch::Tensor x) {
    ++*calls;
    return fc(x);
  }
};
TORCH_MODULE(Locked);

}  // namespace

TEST_CASE("Tapped<M> of a module that cannot be copied wraps it, and records its output", "[hooks][tapped]") {
  static_assert(!tensortap::detail::Derivable<LockedImpl>::value);
  TempDir dir;
  auto parent = std::make_shared<Parent>();
  tensortap::Tapped<Locked> locked;
  parent->register_module("m", locked.ptr());
  REQUIRE(keys(locked->named_parameters()) == std::vector<std::string>{"fc.weight", "fc.bias"});
  auto rec = tensortap::watch(*parent, Options(dir.path));
  rec->step(0);
  const torch::Tensor x = torch::randn({4, 3});
  const torch::Tensor out = locked(x);
  rec->close();
  CHECK(*locked->inner().calls == 1);
  CHECK(torch::equal(out, locked->inner().fc(x)));
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"m\"").size() == 1);
  // Like the plain module, it cannot be cloned: LibTorch says so.
  CHECK_THROWS(locked->clone());
}

struct HoldsRootImpl : nn::Module {
  tensortap::Tapped<nn::Linear> inner{nullptr};
  HoldsRootImpl() { inner = register_module("root", tensortap::Tapped<nn::Linear>(3, 3)); }
  torch::Tensor forward(const torch::Tensor& x) { return inner(x); }
};
TORCH_MODULE(HoldsRoot);

TEST_CASE("a Tapped<M> that is the watched module itself is bound: 'root', or the prefix", "[hooks][tapped]") {
  // Issue 47: watch(*tapped) left the root's tap point silently unbound;
  // only tap points below it were recorded.
  TempDir dir;
  tensortap::Tapped<nn::Linear> root(3, 2);
  tensortap::Tapped<nn::Linear> other(3, 2);
  {
    auto rec = tensortap::watch(*root, Options(dir.path + "/a"));
    tensortap::watch(*other, *rec, "head");
    rec->step(0);
    const torch::Tensor x = torch::ones({4, 3});
    const torch::Tensor y = root(x);
    const torch::Tensor z = other(x);
    (y.sum() + z.sum()).backward();
    rec->close();
    const std::string run = dir.path + "/a";
    CHECK(torch::equal(tensortap::load_npy(tt_test::npy(run, "activation", "root", 0)), y.detach()));
    CHECK(torch::equal(tensortap::load_npy(tt_test::npy(run, "activation", "head", 0)), z.detach()));
    CHECK(torch::equal(tensortap::load_npy(tt_test::npy(run, "activation_grad", "root", 0)), torch::ones({4, 2})));
    CHECK(std::filesystem::exists(tt_test::npy(run, "grad", "weight", 0)));
    CHECK(tt_test::index_lines_with(run, "\"head/weight\"").size() == 1);
  }
  // A root no shared_ptr holds cannot be unbound safely later: said, not bound.
  {
    const std::string err = tt_test::stderr_of(dir.path + "/stderr", [&] {
      tensortap::TapImpl on_stack;
      auto rec = tensortap::watch(on_stack, Options(dir.path + "/b"));
      rec->step(0);
      on_stack.forward(torch::ones({1, 3}));
      rec->close();
    });
    CHECK(tt_test::index_lines_with(dir.path + "/b", "\"activation\"").empty());
    CHECK(err.find("the watched module is a tap point") != std::string::npos);
  }
  // The root module gone before close(): nothing to unbind, nothing hangs.
  {
    std::shared_ptr<tensortap::Recorder> rec;
    {
      tensortap::Tapped<nn::Linear> gone(3, 2);
      rec = tensortap::watch(*gone, Options(dir.path + "/e"));
      rec->step(0);
      gone(torch::ones({1, 3}));
    }
    rec->close();
    CHECK(rec->counters().errors == 0);
    CHECK(tt_test::index_lines_with(dir.path + "/e", "\"root\"").size() == 1);
  }
  // A submodule called "root" would record over the root's own output:
  // refused, naming it, and with a prefix it goes.
  {
    tensortap::Tapped<HoldsRoot> net;
    const std::string err = tt_test::error_of([&] { tensortap::watch(*net, Options(dir.path + "/c")); });
    CHECK(err.find("two tap points would both be recorded as 'root'") != std::string::npos);
    tensortap::Recorder rec(Options(dir.path + "/d"));
    tensortap::watch(*net, rec, "net");  // "net" and "net/root"
    rec.step(0);
    net(torch::ones({2, 3}));
    rec.close();
    CHECK(tt_test::index_lines_with(dir.path + "/d", "\"net/root\"").size() == 1);
    CHECK(tt_test::index_lines_with(dir.path + "/d", "\"net\"").size() == 1);
  }
}

namespace {

// A Tap declared a ReLU's output under a name no rule's pattern finds, a
// Tapped<Sigmoid>, and an instrumented Sequential whose child is a Tanh.
struct DeclaredNetImpl : nn::Module {
  nn::Linear fc{nullptr};
  tensortap::Tap hidden{nullptr}, plain{nullptr};
  tensortap::Tapped<nn::Sigmoid> gate{nullptr};
  nn::Sequential head{nullptr};
  DeclaredNetImpl() {
    fc = register_module("fc", nn::Linear(8, 8));
    hidden = register_module("hidden", tensortap::Tap(tensortap::Nonlinearity::ReLU));
    plain = register_module("plain", tensortap::Tap());
    gate = register_module("gate", tensortap::Tapped<nn::Sigmoid>());
    head = register_module("head", nn::Sequential(nn::Linear(8, 8), nn::Tanh()));
  }
  torch::Tensor forward(torch::Tensor x) {
    // Every unit dead: the ReLU's input far below zero.
    const torch::Tensor h = hidden(torch::relu(fc(x) - 100));
    return head->forward(gate(plain(h)));
  }
};
TORCH_MODULE(DeclaredNet);

}  // namespace

TEST_CASE("a tap's declared nonlinearity: run.json's taps, and the live rules judge it whatever its name",
          "[hooks][tap]") {
  TempDir dir;
  const std::string run = dir / "run";
  // With the rule's own include, or one the user narrowed.
  const bool own_include = GENERATE(true, false);
  DeclaredNet net;
  std::vector<tensortap::Dump> dumps;
  {
    auto rec = tensortap::watch(*net, Options(run)
                                          .every(1000)
                                          .stats_every(1)
                                          .tap_sequential("head")
                                          .dump_on(own_include ? tensortap::Trigger::dead_relu()
                                                               : tensortap::Trigger::dead_relu().include("fc")));
    for (std::int64_t s = 0; s < 6; ++s) {
      rec->step(s);
      net->forward(torch::randn({4, 8})).sum().backward();
    }
    rec->close();
    dumps = rec->dumps();
  }
  const std::string json = tt_test::read_file(run + "/run.json");
  CHECK_THAT(json, Catch::Contains(R"("taps": {"hidden": "relu", "gate": "sigmoid", "head.1": "tanh"})"));
  std::vector<std::string> fired;
  for (const auto& d : dumps) fired.push_back(d.trigger + " " + d.name);
  if (own_include)
    CHECK(fired == std::vector<std::string>{"dead_relu hidden"});
  else
    CHECK(fired.empty());
}
