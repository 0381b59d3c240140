#include <algorithm>
#include <cstdlib>
#include <map>
#include <new>
#include <thread>

#include <fmt/format.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/serialize.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "tests/support/net.h"
#include "sdk/src/front/front_end.h"
#include "writers/src/paths.h"

using tensortap::Kind;
using tensortap::Options;
using tt_test::TempDir;

// Counts heap allocations on this thread while `g_counting` is set, to show
// that a step that is not sampled costs no allocation.
namespace {
thread_local bool g_counting = false;
thread_local std::size_t g_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// out = fc(x), watched as "fc.weight", "fc.bias" and the Tap "out".
using tt_test::Net;

// The record's file, its name encoded as the writers encode it.
at::Tensor load(const std::string& run, const std::string& kind, const std::string& name, std::int64_t step) {
  return tensortap::load_npy(tt_test::npy(run, kind, tensortap::detail::encode_name(name), step));
}

// loss = sum(out * c): d loss / d out = c, d loss / d W = c^T x, d loss / d b = sum_rows(c).
torch::Tensor loss_of(Net& net, const torch::Tensor& x, const torch::Tensor& c) { return (net->forward(x) * c).sum(); }

}  // namespace

TEST_CASE("watch() records each parameter's gradient, exact for a linear layer", "[hooks]") {
  TempDir dir;
  torch::manual_seed(1);
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
  const torch::Tensor x = torch::randn({4, 3}), c = torch::randn({4, 2});
  rec->step(0);
  loss_of(net, x, c).backward();
  rec->close();
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight", 0), c.t().mm(x), 1e-6, 1e-6));
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.bias", 0), c.sum(0), 1e-6, 1e-6));
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 2);
}

TEST_CASE("a step's gradient record sums its backward passes, whatever zero_grad does", "[hooks]") {
  for (const char* order : {"zero_grad first", "zero_grad last", "never zero_grad"}) {
    CAPTURE(order);
    TempDir dir;
    torch::manual_seed(2);
    Net net;
    torch::optim::SGD opt(net->parameters(), 0.1);
    auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
    std::vector<torch::Tensor> expected_w, expected_b;
    for (std::int64_t s = 0; s < 3; ++s) {
      rec->step(s);
      if (std::string(order) == "zero_grad first") opt.zero_grad();
      torch::Tensor ew = torch::zeros({2, 3}), eb = torch::zeros({2});
      for (int micro = 0; micro < 3; ++micro) {  // gradient accumulation
        const torch::Tensor x = torch::randn({5, 3}), c = torch::randn({5, 2});
        loss_of(net, x, c).backward();
        ew += c.t().mm(x);
        eb += c.sum(0);
      }
      opt.step();
      if (std::string(order) == "zero_grad last") opt.zero_grad();
      expected_w.push_back(ew);
      expected_b.push_back(eb);
    }
    rec->close();
    for (std::int64_t s = 0; s < 3; ++s) {
      REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight", s), expected_w[s], 1e-5, 1e-5));
      REQUIRE(torch::allclose(load(dir.path, "grad", "fc.bias", s), expected_b[s], 1e-5, 1e-5));
    }
  }
}

TEST_CASE("a Tap captures its activation and the gradient flowing back through it", "[hooks]") {
  TempDir dir;
  torch::manual_seed(3);
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path));
  const torch::Tensor x = torch::randn({4, 3}), c = torch::randn({4, 2});
  rec->step(0);
  loss_of(net, x, c).backward();
  rec->close();
  const torch::Tensor expected = x.mm(net->fc->weight.detach().t()) + net->fc->bias.detach();
  REQUIRE(torch::allclose(load(dir.path, "activation", "out", 0), expected, 1e-6, 1e-6));
  REQUIRE(torch::equal(load(dir.path, "activation_grad", "out", 0), c));
}

TEST_CASE("a Tap run twice in a step gives name and name#1, each with its own gradient", "[hooks]") {
  TempDir dir;
  torch::manual_seed(4);
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path));
  const torch::Tensor x1 = torch::randn({2, 3}), x2 = torch::randn({2, 3});
  const torch::Tensor c1 = torch::randn({2, 2}), c2 = torch::randn({2, 2});
  rec->step(0);
  // Backward visits the second use first; the suffixes still follow the forward order.
  const torch::Tensor first = loss_of(net, x1, c1);
  const torch::Tensor second = loss_of(net, x2, c2);
  (first + 10 * second).backward();
  rec->close();
  const torch::Tensor w = net->fc->weight.detach(), b = net->fc->bias.detach();
  REQUIRE(torch::allclose(load(dir.path, "activation", "out", 0), x1.mm(w.t()) + b, 1e-6, 1e-6));
  REQUIRE(torch::allclose(load(dir.path, "activation", "out#1", 0), x2.mm(w.t()) + b, 1e-6, 1e-6));
  REQUIRE(torch::equal(load(dir.path, "activation_grad", "out", 0), c1));
  REQUIRE(torch::allclose(load(dir.path, "activation_grad", "out#1", 0), 10 * c2));
}

TEST_CASE("kind param holds the values a sampled step begins with", "[hooks]") {
  TempDir dir;
  torch::manual_seed(5);
  Net net;
  torch::optim::SGD opt(net->parameters(), 0.5);
  auto rec = tensortap::watch(*net, Options(dir.path).kinds(tensortap::KindSet::all()));
  std::vector<torch::Tensor> weights;
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);
    weights.push_back(net->fc->weight.detach().clone());
    opt.zero_grad();
    loss_of(net, torch::randn({4, 3}), torch::randn({4, 2})).backward();
    opt.step();
  }
  rec->close();
  for (std::int64_t s = 0; s < 3; ++s) REQUIRE(torch::equal(load(dir.path, "param", "fc.weight", s), weights[s]));
  // The update between two records is the recorded gradient times the rate.
  const torch::Tensor update = weights[0] - 0.5 * load(dir.path, "grad", "fc.weight", 0);
  REQUIRE(torch::allclose(load(dir.path, "param", "fc.weight", 1), update, 1e-6, 1e-6));
}

TEST_CASE("closing removes the hooks, and the model can be watched again", "[hooks]") {
  TempDir a, b;
  Net net;
  const torch::Tensor x = torch::randn({4, 3}), c = torch::randn({4, 2});
  {
    auto rec = tensortap::watch(*net, Options(a.path));
    rec->step(0);
    loss_of(net, x, c).backward();
    rec->close();
  }
  const size_t lines_a = tt_test::read_lines(a / "index.jsonl").size();
  REQUIRE(lines_a == 4);          // two grads, one activation, one activation gradient
  loss_of(net, x, c).backward();  // no recorder: nothing recorded, nothing breaks
  auto rec2 = tensortap::watch(*net, Options(b.path));
  rec2->step(7);
  loss_of(net, x, c).backward();
  rec2.reset();  // the destructor closes it
  REQUIRE(tt_test::read_lines(a / "index.jsonl").size() == lines_a);
  REQUIRE(tt_test::read_lines(b / "index.jsonl").size() == 4);
  REQUIRE(torch::equal(load(b.path, "activation_grad", "out", 7), c));
}

TEST_CASE("two recorders watching two models do not mix", "[hooks]") {
  TempDir a, b;
  Net n1, n2;
  auto r1 = tensortap::watch(*n1, Options(a.path));
  auto r2 = tensortap::watch(*n2, Options(b.path).every(2));
  for (std::int64_t s = 0; s < 4; ++s) {
    r1->step(s);
    r2->step(s);
    loss_of(n1, torch::randn({2, 3}), torch::ones({2, 2})).backward();
    loss_of(n2, torch::randn({2, 3}), torch::full({2, 2}, 2.0)).backward();
  }
  r1->close();
  r2->close();
  REQUIRE(tt_test::read_lines(a / "index.jsonl").size() == 4 * 4);
  REQUIRE(tt_test::read_lines(b / "index.jsonl").size() == 2 * 4);
  REQUIRE(torch::equal(load(a.path, "activation_grad", "out", 3), torch::ones({2, 2})));
  REQUIRE(torch::equal(load(b.path, "activation_grad", "out", 2), torch::full({2, 2}, 2.0)));
}

TEST_CASE("Taps inside a Sequential are named by their path, and selection applies", "[hooks]") {
  TempDir dir;
  torch::nn::Sequential seq(torch::nn::Linear(3, 4), tensortap::Tap(), torch::nn::ReLU(), torch::nn::Linear(4, 1),
                            tensortap::Tap());
  auto rec = tensortap::watch(*seq, Options(dir.path).exclude("^4$|^3\\."));
  rec->step(0);
  seq->forward(torch::randn({2, 3})).sum().backward();
  rec->close();
  REQUIRE(tt_test::index_lines_with(dir.path, "\"kind\":\"activation\",\"name\":\"1\"").size() == 1);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"4\"").empty());
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"0.weight\"").size() == 1);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"3.weight\"").empty());
}

TEST_CASE("on a step that is not sampled, Tap and capture() allocate nothing", "[hooks]") {
  TempDir dir;
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path).every(100));
  const torch::Tensor x = torch::randn({4, 2});
  rec->step(1);
  REQUIRE_FALSE(rec->sampled());
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 100; ++i) {
    const torch::Tensor y = net->out->forward(x);
    rec->capture("x", x);
  }
  g_counting = false;
  REQUIRE(g_allocations == 0);
  rec->close();
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").empty());
}

TEST_CASE("an unbound Tap is the identity", "[hooks]") {
  tensortap::Tap tap;
  const torch::Tensor x = torch::randn({3});
  REQUIRE(tap->forward(x).is_same(x));
  auto clone = std::dynamic_pointer_cast<tensortap::TapImpl>(tap->clone());
  REQUIRE(clone != nullptr);
  REQUIRE(clone->forward(x).is_same(x));
}

TEST_CASE("a sparse gradient is recorded dense", "[hooks]") {
  TempDir dir;
  torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  auto rec = tensortap::watch(*emb, Options(dir.path));
  rec->step(0);
  const torch::Tensor idx = torch::tensor({1, 4, 4}, torch::kLong);
  emb->forward(idx).sum().backward();
  rec->step(1);
  emb->forward(idx).sum().backward();
  rec->close();
  torch::Tensor expected = torch::zeros({10, 3});
  expected[1] = 1;
  expected[4] = 2;
  REQUIRE(torch::equal(load(dir.path, "grad", "weight", 0), expected));
  REQUIRE(torch::equal(load(dir.path, "grad", "weight", 1), expected));
}

namespace {

// fc1 is a Linear whose output is a tap point, without a Tap in forward().
struct TappedNetImpl : torch::nn::Module {
  tensortap::Tapped<torch::nn::Linear> fc1{nullptr};
  TappedNetImpl() { fc1 = register_module("fc1", tensortap::Tapped<torch::nn::Linear>(3, 2)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc1(x); }
};
TORCH_MODULE(TappedNet);

std::vector<std::int64_t> steps_of(const std::string& run, const std::string& kind, const std::string& name) {
  std::vector<std::int64_t> out;
  for (const auto& l : tt_test::index_lines_with(run, fmt::format("\"kind\":\"{}\",\"name\":\"{}\"", kind, name)))
    out.push_back(std::stoll(l.substr(8, l.find(',') - 8)));
  return out;
}

}  // namespace

TEST_CASE("Tapped<M> captures a submodule's output and keeps its parameter names", "[hooks]") {
  TempDir dir;
  TappedNet net;
  auto rec = tensortap::watch(*net, Options(dir.path));
  const torch::Tensor x = torch::randn({4, 3}), c = torch::randn({4, 2});
  rec->step(0);
  (net->forward(x) * c).sum().backward();
  rec->close();
  const torch::Tensor w = net->fc1->inner().weight.detach(), b = net->fc1->inner().bias.detach();
  REQUIRE(torch::allclose(load(dir.path, "activation", "fc1", 0), x.mm(w.t()) + b, 1e-6, 1e-6));
  REQUIRE(torch::equal(load(dir.path, "activation_grad", "fc1", 0), c));
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc1.weight", 0), c.t().mm(x), 1e-6, 1e-6));
}

TEST_CASE("Sequential children become tap points, by option or by one call", "[hooks]") {
  const torch::Tensor x = torch::randn({5, 3});
  SECTION("every child, through Options::tap_sequential") {
    TempDir dir;
    torch::nn::Sequential seq(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
    auto rec = tensortap::watch(*seq, Options(dir.path).tap_sequential("."));
    rec->step(0);
    seq->forward(x).sum().backward();
    rec->close();
    // seq[0] is now the tap wrapper; the registered child is unchanged.
    const torch::Tensor h = seq->named_children()["0"]->as<torch::nn::Linear>()->forward(x).detach();
    REQUIRE(torch::allclose(load(dir.path, "activation", "0", 0), h));
    REQUIRE(torch::allclose(load(dir.path, "activation", "1", 0), torch::relu(h)));
    REQUIRE(load(dir.path, "activation_grad", "2", 0).sizes() == torch::IntArrayRef{5, 2});
    // Parameter names are those of the plain Sequential.
    REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"0.weight\"").size() == 1);
    REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"2.bias\"").size() == 1);
  }
  SECTION("the children whose path matches a regex") {
    TempDir dir;
    torch::nn::Sequential seq(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
    auto rec = tensortap::watch(*seq, Options(dir.path).tap_sequential("^[02]$").kinds({Kind::Activation}));
    rec->step(0);
    seq->forward(x);
    rec->close();
    REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 2);
    REQUIRE(steps_of(dir.path, "activation", "1").empty());
  }
  SECTION("tap_sequential(), then watch() of the model that holds it") {
    TempDir dir;
    struct HolderImpl : torch::nn::Module {
      torch::nn::Sequential enc{torch::nn::Linear(3, 4), torch::nn::Tanh()};
      HolderImpl() { register_module("enc", enc); }
      torch::Tensor forward(const torch::Tensor& in) { return enc->forward(in); }
    };
    auto holder = std::make_shared<HolderImpl>();
    tensortap::tap_sequential(*holder->enc);
    tensortap::tap_sequential(*holder->enc);  // again: harmless
    auto rec = tensortap::watch(*holder, Options(dir.path).kinds({Kind::Activation}));
    rec->step(0);
    const torch::Tensor y = holder->forward(x);
    rec->close();
    REQUIRE(torch::allclose(load(dir.path, "activation", "enc.1", 0), y.detach()));
    REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 2);
  }
}

TEST_CASE("op-level capture records each top-level op inside a tap point", "[hooks]") {
  TempDir dir;
  TappedNet net;
  torch::nn::Sequential seq{torch::nn::ReLU()};
  auto rec = tensortap::watch(*net, Options(dir.path).capture_ops(true).kinds({Kind::Activation}));
  auto rec2 =
      tensortap::watch(*seq, Options(dir / "seq").capture_ops(true).tap_sequential(".").kinds({Kind::Activation}));
  const torch::Tensor x = torch::randn({4, 3});
  rec->step(0);
  rec2->step(0);
  const torch::Tensor y = net->forward(x).detach();
  seq->forward(x);
  rec->step(1);
  rec->close();
  rec2->close();
  // LinearImpl::forward runs aten::t (the weight, transposed) and aten::addmm.
  REQUIRE(torch::equal(load(dir.path, "activation", "fc1/aten::addmm", 0), y));
  REQUIRE(torch::equal(load(dir.path, "activation", "fc1/aten::t", 0), net->fc1->inner().weight.detach().t()));
  REQUIRE(torch::equal(load(dir / "seq", "activation", "0/aten::relu", 0), torch::relu(x)));
  // Only top-level ops: aten::t's own internals are not recorded.
  const auto lines = tt_test::read_lines(dir / "index.jsonl");
  for (const auto& l : lines) REQUIRE(l.find("as_strided") == std::string::npos);
  // Nothing is recorded outside a tap point's scope, or after close.
  torch::relu(x);
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == lines.size());
}

TEST_CASE("each kind has its own period, and explicit step lists work", "[hooks]") {
  TempDir a, b;
  Net net;
  auto run = [&](const std::string& dir, Options o) {
    auto rec = tensortap::watch(*net, std::move(o));
    for (std::int64_t s = 0; s < 7; ++s) {
      rec->step(s);
      loss_of(net, torch::randn({2, 3}), torch::randn({2, 2})).backward();
    }
    rec->close();
    (void)dir;
  };
  run(a.path, Options(a.path).every(Kind::Grad, 2).every(Kind::Activation, 3).every(100));
  REQUIRE(steps_of(a.path, "grad", "fc.weight") == std::vector<std::int64_t>{0, 2, 4, 6});
  REQUIRE(steps_of(a.path, "activation", "out") == std::vector<std::int64_t>{0, 3, 6});
  REQUIRE(steps_of(a.path, "activation_grad", "out") == std::vector<std::int64_t>{0});
  run(b.path, Options(b.path).steps({1, 5, 6}).stop(6));
  REQUIRE(steps_of(b.path, "grad", "fc.weight") == std::vector<std::int64_t>{1, 5});
}

TEST_CASE("every(kind, 0) switches that kind off while the others keep every()", "[sdk][hooks]") {
  TempDir dir;
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path).every(1).every(Kind::Activation, 0));
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);
    loss_of(net, torch::randn({2, 3}), torch::randn({2, 2})).backward();
  }
  rec->close();
  REQUIRE(steps_of(dir.path, "grad", "fc.weight") == std::vector<std::int64_t>{0, 1, 2});
  REQUIRE(steps_of(dir.path, "grad", "fc.bias") == std::vector<std::int64_t>{0, 1, 2});
  REQUIRE(steps_of(dir.path, "activation_grad", "out") == std::vector<std::int64_t>{0, 1, 2});
  REQUIRE(steps_of(dir.path, "activation", "out").empty());
  const auto lines = tt_test::read_lines(dir / "index.jsonl");
  REQUIRE(lines.size() == 9);
  for (const auto& l : lines) REQUIRE(l.find("\"kind\":\"activation\"") == std::string::npos);
  // run.json says the effective periods.
  REQUIRE_THAT(tt_test::read_file(dir / "run.json"),
               Catch::Contains("\"activation\": 0, \"activation_grad\": 1, \"param\": 1, \"buffer\": 1, \"grad\": 1"));
}

TEST_CASE("eval forward passes are not recorded unless asked, and then as eval/<name>", "[hooks]") {
  for (bool capture_eval : {false, true}) {
    TempDir dir;
    Net net;
    auto rec = tensortap::watch(*net, Options(dir.path).capture_eval(capture_eval).kinds({Kind::Activation}));
    rec->step(0);
    const torch::Tensor train_x = torch::randn({2, 3}), eval_x = torch::randn({2, 3});
    net->forward(train_x);  // training
    net->eval();
    const torch::Tensor eval_out = net->forward(eval_x);  // validation inside the step
    net->train();
    rec->close();
    REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == (capture_eval ? 2u : 1u));
    REQUIRE(steps_of(dir.path, "activation", "out") == std::vector<std::int64_t>{0});
    // Never "out#1", which would read as a second training pass.
    REQUIRE(tt_test::index_lines_with(dir.path, "out#1").empty());
    if (capture_eval) REQUIRE(torch::equal(load(dir.path, "activation", "eval/out", 0), eval_out));
  }
}

TEST_CASE("eval passes of a Tapped<M> inside a training step are named eval/<name>, apart from its repeats",
          "[hooks]") {
  TempDir dir;
  TappedNet net;
  auto rec = tensortap::watch(*net, Options(dir.path).capture_eval(true).kinds({Kind::Activation}));
  rec->step(0);
  net->forward(torch::randn({2, 3}));
  net->forward(torch::randn({2, 3}));  // a second training pass: fc1#1
  net->eval();
  {
    torch::NoGradGuard no_grad;
    net->forward(torch::randn({2, 3}));
    net->forward(torch::randn({2, 3}));  // a second eval pass: eval/fc1#1
  }
  net->train();
  rec->close();
  REQUIRE(steps_of(dir.path, "activation", "fc1") == std::vector<std::int64_t>{0});
  REQUIRE(steps_of(dir.path, "activation", "fc1#1") == std::vector<std::int64_t>{0});
  REQUIRE(steps_of(dir.path, "activation", "eval/fc1") == std::vector<std::int64_t>{0});
  REQUIRE(steps_of(dir.path, "activation", "eval/fc1#1") == std::vector<std::int64_t>{0});
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 4);
}

TEST_CASE("load_checkpoint loads a checkpoint saved before tensortap was added, where torch::load refuses it",
          "[hooks]") {
  TempDir dir;
  // The program before tensortap: the same layer, no Tap.
  struct PlainImpl : torch::nn::Module {
    torch::nn::Linear fc{nullptr};
    torch::nn::ReLU act;
    PlainImpl() {
      fc = register_module("fc", torch::nn::Linear(3, 2));
      register_module("act", act);
    }
  };
  auto plain = std::make_shared<PlainImpl>();
  torch::save(plain, dir / "before.pt");
  Net net;  // fc and the Tap "out"; no "act"
  REQUIRE_THROWS(torch::load(net, dir / "before.pt"));
  tensortap::load_checkpoint(net, dir / "before.pt");
  REQUIRE(torch::equal(net->fc->weight, plain->fc->weight));
  REQUIRE(torch::equal(net->fc->bias, plain->fc->bias));
  // The reverse, and a Tapped<M> model from the plain checkpoint.
  torch::save(net, dir / "after.pt");
  auto again = std::make_shared<PlainImpl>();
  tensortap::load_checkpoint(again, dir / "after.pt");
  REQUIRE(torch::equal(again->fc->weight, plain->fc->weight));
  // A missing submodule that has state is named, with the file.
  struct OtherImpl : torch::nn::Module {
    torch::nn::Linear fc{nullptr}, head{nullptr};
    OtherImpl() {
      fc = register_module("fc", torch::nn::Linear(3, 2));
      head = register_module("head", torch::nn::Linear(2, 2));
    }
  };
  auto other = std::make_shared<OtherImpl>();
  REQUIRE_THAT(tt_test::error_of([&] { tensortap::load_checkpoint(other, dir / "before.pt"); }),
               Catch::Contains("'head'") && Catch::Contains("before.pt"));
  REQUIRE_THAT(tt_test::error_of([&] { tensortap::load_checkpoint(other, dir / "missing.pt"); }),
               Catch::Contains("missing.pt"));
}

TEST_CASE("load_checkpoint checks every name, shape and dtype before it sets anything (round 4)", "[hooks]") {
  TempDir dir;
  torch::nn::Linear small(3, 2);
  torch::save(small, dir / "small.pt");
  // Another shape: the weight silently became [2, 3].
  torch::nn::Linear big(4, 5);
  const torch::Tensor weight = big->weight.clone(), bias = big->bias.clone();
  REQUIRE_THAT(tt_test::error_of([&] { tensortap::load_checkpoint(big, dir / "small.pt"); }),
               Catch::Contains("parameter 'weight'") && Catch::Contains("[2, 3]") && Catch::Contains("[5, 4]") &&
                   Catch::Contains("small.pt"));
  CHECK(big->weight.sizes() == weight.sizes());
  CHECK(torch::equal(big->weight, weight));
  CHECK(torch::equal(big->bias, bias));
  // Another dtype.
  torch::nn::Linear doubles(3, 2);
  doubles->to(torch::kDouble);
  torch::save(doubles, dir / "doubles.pt");
  torch::nn::Linear floats(3, 2);
  REQUIRE_THAT(tt_test::error_of([&] { tensortap::load_checkpoint(floats, dir / "doubles.pt"); }),
               Catch::Contains("Double") && Catch::Contains("Float"));
  CHECK(floats->weight.scalar_type() == torch::kFloat);
  // A submodule missing from the checkpoint: the ones before it keep their values.
  struct TwoImpl : torch::nn::Module {
    torch::nn::Linear a{nullptr}, b{nullptr};
    TwoImpl() {
      a = register_module("a", torch::nn::Linear(3, 2));
      b = register_module("b", torch::nn::Linear(2, 2));
    }
  };
  struct ThreeImpl : TwoImpl {
    torch::nn::Linear c{nullptr};
    ThreeImpl() { c = register_module("c", torch::nn::Linear(2, 2)); }
  };
  torch::save(std::make_shared<TwoImpl>(), dir / "two.pt");
  auto three = std::make_shared<ThreeImpl>();
  const torch::Tensor a = three->a->weight.clone();
  REQUIRE_THAT(tt_test::error_of([&] { tensortap::load_checkpoint(three, dir / "two.pt"); }),
               Catch::Contains("submodule 'c'") && Catch::Contains("nothing was loaded"));
  CHECK(torch::equal(three->a->weight, a));
  // And the right checkpoint loads, values and all.
  torch::nn::Linear same(3, 2);
  tensortap::load_checkpoint(same, dir / "small.pt");
  CHECK(torch::equal(same->weight, small->weight));
}

TEST_CASE("grad_per_backward records every micro-batch's gradient on its own", "[hooks]") {
  TempDir dir;
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path).grad_per_backward(true).kinds({Kind::Grad}));
  std::vector<torch::Tensor> expected;
  rec->step(0);
  for (int micro = 0; micro < 3; ++micro) {
    const torch::Tensor x = torch::randn({5, 3}), c = torch::randn({5, 2});
    loss_of(net, x, c).backward();
    expected.push_back(c.t().mm(x));
  }
  rec->close();
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight", 0), expected[0], 1e-5, 1e-5));
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight#1", 0), expected[1], 1e-5, 1e-5));
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight#2", 0), expected[2], 1e-5, 1e-5));
}

namespace {

// FrontEnd::gather_on_cpu_for_tests for a scope.
struct GatherOnCpu {
  explicit GatherOnCpu(bool on) { tensortap::detail::FrontEnd::gather_on_cpu_for_tests(on); }
  ~GatherOnCpu() { tensortap::detail::FrontEnd::gather_on_cpu_for_tests(false); }
};

}  // namespace

TEST_CASE("gradients read from .grad at each backward pass's end write what the hooks' sums write", "[hooks][gather]") {
  // TENSORTAP_CUDA_BATCH=on's way for CUDA gradients (hooks/src/params.cpp),
  // run here on CPU tensors: the same hooks, passes and callbacks, the copy
  // by ATen. Every case that could part the two: .grad none (LibTorch 2.x's
  // zero_grad) or zeros (1.13's) at a step's start, two micro-batches, a
  // .grad scaled between them (that step's sum is the hooks' all the same),
  // torch::autograd::grad over the parameters (not summed into .grad), a
  // layer frozen then unfrozen, a parameter with no gradient, clipping
  // after backward, gradients every other step and statistics every step,
  // and grad_per_backward. Every file of the two runs, byte for byte.
  TempDir dir;
  const auto train = [&](const std::string& run, bool per_backward) {
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16),
                              torch::nn::ReLU(), torch::nn::Linear(16, 4));
    torch::nn::Linear unused(3, 3);  // registered, never used: no gradient
    net->register_module("unused", unused);
    torch::optim::SGD opt(net->parameters(), 0.01);
    auto rec = tensortap::watch(
        *net, Options(run).every(2).stats_every(1).kinds({Kind::Grad, Kind::Param}).grad_per_backward(per_backward));
    for (std::int64_t step = 0; step < 8; ++step) {
      net[2]->as<torch::nn::Linear>()->weight.set_requires_grad(step >= 3);
      rec->step(step);
      for (auto& p : net->parameters()) {
        if (step % 3 != 0)
          p.mutable_grad() = at::Tensor();
        else if (p.grad().defined())
          p.mutable_grad().zero_();
      }
      for (int micro = 0; micro < 2; ++micro) {
        const torch::Tensor x = torch::randn({8, 6});
        const torch::Tensor loss = net->forward(x).pow(2).mean();
        if (step == 5 && micro == 1) {
          const auto grads = torch::autograd::grad({loss}, net->parameters(), {}, /*retain_graph=*/true,
                                                   /*create_graph=*/false, /*allow_unused=*/true);
          CHECK(grads.size() == net->parameters().size());
        }
        loss.backward();
        if (step == 4 && micro == 0) net[0]->as<torch::nn::Linear>()->weight.mutable_grad().mul_(0.5);
      }
      torch::nn::utils::clip_grad_norm_(net->parameters(), 0.5);
      opt.step();
    }
    rec->close();
    CHECK(rec->counters().errors == 0);
    CHECK(rec->counters().dropped == 0);
  };
  for (const bool per_backward : {false, true}) {
    CAPTURE(per_backward);
    std::string runs[2];
    for (int on = 0; on < 2; ++on) {
      const GatherOnCpu gather(on != 0);
      runs[on] = dir / fmt::format("{}-{}", per_backward ? "per-backward" : "per-step", on ? "on" : "off");
      const std::uint64_t gathered = tensortap::detail::FrontEnd::gathered();
      train(runs[on], per_backward);
      // The gather ran, in the steps that start with .grad none only.
      CHECK((tensortap::detail::FrontEnd::gathered() > gathered) == (on && !per_backward));
    }
    CHECK(tt_test::check_same_records(runs[0], runs[1]) > 10);
  }
}

TEST_CASE("a gathered gradient is taken by autograd without a copy, and passes on several threads sum", "[hooks][gather]") {
  const GatherOnCpu gather(true);
  TempDir dir;
  Net net;
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
  // Registered after watch()'s: sees the gradient autograd then accumulates.
  const void* incoming = nullptr;
  net->fc->weight.register_hook([&](const at::Tensor& g) { incoming = g.data_ptr(); });
  const std::uint64_t gathered = tensortap::detail::FrontEnd::gathered();
  rec->step(0);
  const torch::Tensor x = torch::randn({4, 3}), c = torch::randn({4, 2});
  loss_of(net, x, c).backward();
  // The hook held no reference to it: autograd stole it into .grad.
  CHECK(net->fc->weight.grad().data_ptr() == incoming);
  CHECK(tensortap::detail::FrontEnd::gathered() - gathered == 2);
  // Passes on four threads at once, in one step: the sum of all.
  constexpr int kThreads = 4, kEach = 20;
  net->fc->weight.mutable_grad() = at::Tensor();
  net->fc->bias.mutable_grad() = at::Tensor();
  rec->step(1);
  std::vector<torch::Tensor> sums(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      torch::Tensor sum = torch::zeros({2, 3});
      for (int i = 0; i < kEach; ++i) {
        const torch::Tensor xi = torch::randn({3, 3}), ci = torch::randn({3, 2});
        loss_of(net, xi, ci).backward();
        sum += ci.t().mm(xi);
      }
      sums[t] = sum;
    });
  for (auto& th : threads) th.join();
  rec->close();
  CHECK(rec->counters().errors == 0);
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight", 0), c.t().mm(x), 1e-6, 1e-6));
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight", 1), sums[0] + sums[1] + sums[2] + sums[3], 1e-4, 1e-4));
}

TEST_CASE("a backward pass that throws after some gradients were left to .grad: said by name, the next steps whole",
          "[hooks][gather]") {
  // A hook of the user's on the activation throws at step 1: the last
  // layer's parameters got their gradients (and their hooks noted them),
  // the pass never reaches its end, so its final callback never runs.
  const GatherOnCpu gather(true);
  TempDir dir;
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
  std::vector<at::Tensor> expected;
  for (std::int64_t step = 0; step < 4; ++step) {
    rec->step(step);
    for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
    const torch::Tensor x = torch::randn({5, 4});
    torch::Tensor hidden = net[1]->as<torch::nn::ReLU>()->forward(net[0]->as<torch::nn::Linear>()->forward(x));
    if (step == 1) hidden.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("boom"); });
    const torch::Tensor loss = net[2]->as<torch::nn::Linear>()->forward(hidden).pow(2).sum();
    if (step == 1) {
      CHECK_THROWS(loss.backward());
      continue;
    }
    loss.backward();
    expected.push_back(net[0]->as<torch::nn::Linear>()->weight.grad().clone());
  }
  // Step 1's last layer (weight and bias) is said lost, by name; nothing else.
  CHECK_THROWS_WITH(rec->close(), Catch::Contains("2 record(s) failed") &&
                                      Catch::Contains("'2.weight' in step 1 is not recorded"));
  CHECK(rec->counters().errors == 2);
  CHECK(tt_test::index_lines_with(dir.path, "\"step\":1,").empty());
  CHECK(torch::equal(load(dir.path, "grad", "0.weight", 0), expected[0]));
  CHECK(torch::equal(load(dir.path, "grad", "0.weight", 2), expected[1]));
  CHECK(torch::equal(load(dir.path, "grad", "0.weight", 3), expected[2]));
  CHECK(tt_test::index_lines_with(dir.path, "\"kind\":\"grad\"").size() == 3 * 4);
}

TEST_CASE("concurrent forward and backward passes on several threads lose nothing", "[hooks]") {
  TempDir dir;
  Net net;
  constexpr int kThreads = 4, kEach = 25;
  auto rec = tensortap::watch(*net, Options(dir.path).buffer_bytes(8192));
  std::vector<torch::Tensor> sums(kThreads);
  rec->step(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      torch::Tensor sum = torch::zeros({2, 3});
      for (int i = 0; i < kEach; ++i) {
        const torch::Tensor x = torch::randn({3, 3}), c = torch::randn({3, 2});
        loss_of(net, x, c).backward();
        sum += c.t().mm(x);
      }
      sums[t] = sum;
    });
  for (auto& th : threads) th.join();
  rec->close();
  REQUIRE(rec->counters().dropped == 0);
  REQUIRE(rec->counters().errors == 0);
  // One activation and one activation gradient per pass, each under its own name...
  REQUIRE(tt_test::index_lines_with(dir.path, "\"kind\":\"activation\",").size() == kThreads * kEach);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"kind\":\"activation_grad\",").size() == kThreads * kEach);
  // ... and the step's gradient is the sum over every thread's passes.
  const torch::Tensor total = sums[0] + sums[1] + sums[2] + sums[3];
  REQUIRE(torch::allclose(load(dir.path, "grad", "fc.weight", 0), total, 1e-4, 1e-4));
}

TEST_CASE("two recorders on one model both get activations and gradients", "[hooks][multi]") {
  TempDir full_dir, stats_dir;
  Net net;
  auto full = tensortap::watch(*net, Options(full_dir.path));
  // A statistics-only recorder beside the full one: a natural pair.
  auto stats = tensortap::watch(*net, Options(stats_dir.path).every(0).stats_every(1));
  const auto x = torch::randn({4, 3});
  const auto c = torch::randn({4, 2});
  for (std::int64_t step = 0; step < 2; ++step) {
    full->step(step);
    stats->step(step);
    loss_of(net, x, c).backward();
  }
  full->close();
  stats->close();
  // The full run has the activation, its gradient and the parameters' gradients, once each.
  REQUIRE(at::equal(load(full_dir.path, "activation", "out", 1), net->fc->forward(x).detach()));
  REQUIRE(at::allclose(load(full_dir.path, "activation_grad", "out", 1), c));
  REQUIRE(tt_test::index_lines_with(full_dir.path, "out#1").empty());
  // The statistics run has a row for each of them every step, and no tensor.
  REQUIRE(stats->counters().records == 0);
  REQUIRE(stats->counters().stats_rows == 2 * 4);
  const std::string series = tt_test::read_file(stats_dir / "stats_series.jsonl");
  for (const char* want : {"\"kind\":\"activation\",\"name\":\"out\"", "\"kind\":\"activation_grad\",\"name\":\"out\"",
                           "\"kind\":\"grad\",\"name\":\"fc.weight\"", "\"kind\":\"grad\",\"name\":\"fc.bias\""})
    REQUIRE_THAT(series, Catch::Contains(want));
}

TEST_CASE("watch() refuses a module it watches already, a closed recorder and a colliding name", "[hooks][multi]") {
  TempDir dir;
  Net net, other;
  auto rec = tensortap::watch(*net, Options(dir.path));
  std::string err;
  try {
    tensortap::watch(*net, *rec);
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  REQUIRE_THAT(err, Catch::Contains("already watched by this recorder") && Catch::Contains("twice"));
  // Another model with the same names needs a prefix; with one, it is watched.
  err.clear();
  try {
    tensortap::watch(*other, *rec);
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  REQUIRE_THAT(err, Catch::Contains("give the second module a prefix"));
  tensortap::watch(*other, *rec, "G");
  const auto x = torch::randn({4, 3});
  const auto c = torch::randn({4, 2});
  rec->step(0);
  loss_of(net, x, c).backward();
  loss_of(other, x, c).backward();
  rec->close();
  // Each model's gradient under its own name, once: no "#1" from a double hook.
  REQUIRE(at::allclose(load(dir.path, "grad", "fc.weight", 0), net->fc->weight.grad()));
  REQUIRE(at::allclose(load(dir.path, "grad", "G/fc.weight", 0), other->fc->weight.grad()));
  REQUIRE(at::equal(load(dir.path, "activation", "G/out", 0), other->fc->forward(x).detach()));
  REQUIRE(tt_test::index_lines_with(dir.path, "#1").empty());
  err.clear();
  try {
    Net third;
    tensortap::watch(*third, *rec, "H");
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  REQUIRE_THAT(err, Catch::Contains("closed recorder"));
}

TEST_CASE("a closed recorder lets go of the model's tap points", "[hooks][multi]") {
  TempDir dir;
  Net net;
  std::weak_ptr<tensortap::detail::FrontEnd> core;
  {
    auto rec = tensortap::watch(*net, Options(dir.path));
    core = tensortap::detail::RecorderAccess::front_end(*rec);
    rec->step(0);
    net->forward(torch::randn({2, 3}));
    rec->close();
  }
  // The model (and its Tap) lives on; the recorder's state does not.
  REQUIRE(core.expired());
  net->forward(torch::randn({2, 3}));
}

TEST_CASE("watch() of a TorchScript module records its gradients by name, by default and through record_grads",
          "[hooks][jit]") {
  // watch(torch::jit::Module&) did not compile: a user fine-tuning a
  // scripted model had only capture() by hand, and record_grads(opt)
  // silently recorded nothing. A module scripted here without Python
  // (Module::define), with a submodule and a buffer.
  TempDir dir;
  torch::manual_seed(7);
  torch::jit::Module head("Head");
  head.register_parameter("w", torch::randn({4, 2}, torch::requires_grad()), /*is_buffer=*/false);
  head.define(R"JIT(
def forward(self, x):
    return torch.mm(x, self.w)
)JIT");
  torch::jit::Module net("Net");
  net.register_parameter("w", torch::randn({3, 4}, torch::requires_grad()), /*is_buffer=*/false);
  net.register_buffer("scale", torch::full({1}, 2.0));
  net.register_module("head", head);
  net.define(R"JIT(
def forward(self, x):
    return self.head.forward(torch.relu(torch.mm(x, self.w)) * self.scale)
)JIT");
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : net.parameters()) params.push_back(p);
  REQUIRE(params.size() == 2);
  torch::optim::SGD opt(params, 0.1);
  auto rec = tensortap::watch(net, Options(dir.path).kinds({Kind::Grad, Kind::Buffer}));
  std::vector<torch::Tensor> want_w, want_head;
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);
    opt.zero_grad();
    net.forward({torch::randn({5, 3})}).toTensor().pow(2).sum().backward();
    want_w.push_back(net.attr("w").toTensor().grad().clone());
    want_head.push_back(head.attr("w").toTensor().grad().clone());
    if (s == 2) rec->record_grads(opt);  // what opt applies: the same here
    opt.step();
  }
  rec->close();
  REQUIRE(rec->counters().errors == 0);
  for (std::int64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    CHECK(torch::equal(load(dir.path, "grad", "w", s), want_w[static_cast<std::size_t>(s)]));
    CHECK(torch::equal(load(dir.path, "grad", "head.w", s), want_head[static_cast<std::size_t>(s)]));
    CHECK(torch::equal(load(dir.path, "buffer", "scale", s), torch::full({1}, 2.0)));
  }
  // A second watch of the same module is refused, as for an nn::Module.
  tensortap::Recorder other{Options(dir / "other")};
  tensortap::watch(net, other, "A");
  CHECK_THAT(tt_test::error_of([&] { tensortap::watch(net, other, "B"); }), Catch::Contains("already watched"));
}

TEST_CASE("a tensor registered under two names is recorded once, its other names in run.json", "[hooks][tied]") {
  // Tied weights (an embedding and the output layer sharing a matrix) were
  // recorded once per name, the same bytes twice, and nothing said so.
  TempDir dir;
  auto net = std::make_shared<torch::nn::Module>();
  auto a = net->register_module("a", std::make_shared<torch::nn::Module>());
  auto b = net->register_module("b", std::make_shared<torch::nn::Module>());
  const torch::Tensor shared = a->register_parameter("w", torch::randn({3}));
  b->register_parameter("w", shared);
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad, Kind::Param}));
  rec->step(0);
  ((shared * 2).sum() + (shared * 3).sum()).backward();
  rec->close();
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"a.w\"").size() == 2);  // grad and param
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"b.w\"").empty());
  CHECK(torch::equal(load(dir.path, "grad", "a.w", 0), torch::full({3}, 5.0)));
  CHECK_THAT(tt_test::read_file(dir / "run.json"), Catch::Contains("\"aliases\": {\"a.w\": [\"b.w\"]}"));
}

TEST_CASE("a module registered under two names is bound once, under its first name, the other an alias",
          "[hooks][tied]") {
  // Issue 58: one Tapped<Linear> registered as `enc` and `dec` and called
  // twice a step wrote enc, dec, enc#1 and dec#1; the Python twin (PyTorch's
  // named_modules keeps the first name) writes enc and enc#1.
  TempDir dir;
  auto net = std::make_shared<torch::nn::Module>();
  tensortap::Tapped<torch::nn::Linear> shared(3, 3);
  net->register_module("enc", shared);
  net->register_module("dec", shared);
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Activation, Kind::Grad}));
  rec->step(0);
  const torch::Tensor x = torch::randn({2, 3});
  const torch::Tensor y1 = shared(x);
  const torch::Tensor y2 = shared(y1);
  y2.sum().backward();
  rec->close();
  CHECK(tt_test::index_lines_with(dir.path, "\"kind\":\"activation\",\"name\":\"enc\"").size() == 1);
  CHECK(tt_test::index_lines_with(dir.path, "\"kind\":\"activation\",\"name\":\"enc#1\"").size() == 1);
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"dec").empty());
  CHECK(torch::equal(load(dir.path, "activation", "enc#1", 0), y2));
  // Its parameters, tied the same way, are enc's.
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"enc.weight\"").size() == 1);
  CHECK_THAT(tt_test::read_file(dir / "run.json"), Catch::Contains("\"enc\": [\"dec\"]"));
}

TEST_CASE("a parameter left behind by a reassigned member is named once, at the first step with gradients",
          "[hooks][tied]") {
  // A literal port of Python's `lm_head.weight = tok.weight`: the member
  // now points at another tensor, the registered one is never used, so it
  // was hooked and never recorded, without a word.
  TempDir dir;
  torch::nn::Sequential net(torch::nn::Linear(3, 3), torch::nn::Linear(3, 2));
  auto second = net[1]->as<torch::nn::Linear>();
  second->weight = torch::randn({2, 3}, torch::requires_grad());  // the registered weight is orphaned
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
  const std::string err = tt_test::stderr_of(dir / "stderr", [&] {
    for (std::int64_t s = 0; s < 3; ++s) {
      rec->step(s);
      net->forward(torch::randn({4, 3})).sum().backward();
    }
    rec->close();
  });
  CHECK_THAT(err, Catch::Contains("1 watched parameter(s) got no gradient in step 0 while others did: '1.weight'"));
  CHECK(err.find("got no gradient") == err.rfind("got no gradient"));  // once
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"1.weight\"").empty());
}

namespace {

// The activation records of `dir` at `step`, in index order, by name.
std::vector<std::string> activation_names(const std::string& dir, std::int64_t step) {
  std::vector<std::string> names;
  const std::string at = fmt::format("{{\"step\":{},\"kind\":\"activation\",\"name\":\"", step);
  for (const std::string& line : tt_test::read_lines(dir + "/index.jsonl"))
    if (line.rfind(at, 0) == 0) names.push_back(line.substr(at.size(), line.find('"', at.size()) - at.size()));
  return names;
}

}  // namespace

TEST_CASE("capture_ops records a watched TorchScript module's ops, from step() to the step's backward",
          "[hooks][jit]") {
  // Issue 58: Options::capture_ops(true) recorded nothing for a watched
  // torch::jit::Module (op capture ran only inside a tap point's scope,
  // and a scripted module has none), though README promised its ops.
  TempDir dir;
  torch::manual_seed(7);
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module net("Net");
  net.register_parameter("w", torch::randn({3, 4}, torch::requires_grad()), /*is_buffer=*/false);
  net.register_parameter("v", torch::randn({4, 2}, torch::requires_grad()), /*is_buffer=*/false);
  net.define(R"JIT(
def forward(self, x):
    return torch.mm(torch.relu(torch.mm(x, self.w)), self.v)
)JIT");
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : net.parameters()) params.push_back(p);
  torch::optim::SGD opt(params, 0.1);
  tensortap::Recorder rec{Options(dir.path).capture_ops(true).kinds({Kind::Activation})};
  tensortap::watch(net, rec, "ts");
  std::vector<torch::Tensor> outputs, losses;
  for (std::int64_t s = 0; s < 2; ++s) {
    // Before step(): not the step's (zero_grad()'s aten::zero_, the batch's
    // aten::randn would be, after it).
    opt.zero_grad();
    const torch::Tensor x = torch::randn({5, 3});
    rec.step(s);
    const torch::Tensor out = net.forward({x}).toTensor();
    const torch::Tensor loss = out.pow(2).sum();  // the loop's ops: recorded too
    loss.backward();                              // from its first node on, none
    opt.step();
    outputs.push_back(out.detach().clone());
    losses.push_back(loss.detach().clone());
  }
  rec.close();
  torch::jit::setGraphExecutorOptimize(true);
  for (std::int64_t s = 0; s < 2; ++s) {
    INFO("step " << s);
    std::vector<std::string> got = activation_names(dir.path, s);
    // backward() makes the seed gradient (ones) itself before autograd's
    // first node runs: the last op of the span.
    if (!got.empty() && got.back() == "ts/aten::ones_like") got.pop_back();
    const std::vector<std::string> want{"ts/aten::mm", "ts/aten::relu", "ts/aten::mm#1", "ts/aten::pow",
                                        "ts/aten::sum"};
    CHECK(got == want);
    CHECK(torch::equal(load(dir.path, "activation", "ts/aten::mm#1", s), outputs[static_cast<std::size_t>(s)]));
    CHECK(torch::equal(load(dir.path, "activation", "ts/aten::sum", s), losses[static_cast<std::size_t>(s)]));
  }
}

TEST_CASE("watch() of a TorchScript module saved by Python (torch.jit.save) and loaded in C++", "[hooks][jit]") {
  // tests/python/save_jit_module.py writes it; the ctest jit.saved_by_python
  // (a tree whose LibTorch has a Python torch of its version) sets
  // TT_JIT_MODEL. Elsewhere there is no model to load.
  const char* path = std::getenv("TT_JIT_MODEL");
  if (path == nullptr) {
    SUCCEED("TT_JIT_MODEL unset: no module saved by Python to load (ctest jit.saved_by_python sets it)");
    return;
  }
  TempDir dir;
  torch::jit::Module net = torch::jit::load(path);
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : net.parameters()) params.push_back(p);
  REQUIRE(params.size() == 4);
  torch::optim::SGD opt(params, 0.1);
  auto rec = tensortap::watch(net, Options(dir.path).kinds({Kind::Grad, Kind::Buffer}));
  std::map<std::string, std::vector<torch::Tensor>> want;
  for (std::int64_t s = 0; s < 2; ++s) {
    rec->step(s);
    opt.zero_grad();
    net.forward({torch::randn({5, 3})}).toTensor().pow(2).sum().backward();
    for (const auto& item : net.named_parameters()) want[item.name].push_back(item.value.grad().clone());
    rec->record_grads(opt);
    opt.step();
  }
  rec->close();
  REQUIRE(rec->counters().errors == 0);
  REQUIRE(want.size() == 4);  // fc.weight, fc.bias, out.weight, out.bias
  for (const auto& [name, grads] : want)
    for (std::int64_t s = 0; s < 2; ++s) {
      INFO(name << " step " << s);
      CHECK(torch::equal(load(dir.path, "grad", name, s), grads[static_cast<std::size_t>(s)]));
    }
  CHECK(torch::equal(load(dir.path, "buffer", "scale", 1), torch::full({1}, 2.0)));

  // Its ops, with capture_ops: the model's forward, then the loss. Loaded
  // again: setGraphExecutorOptimize(false) must come before a module's
  // first forward (the docs say so), or its optimized plan stays.
  TempDir ops_dir;
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module fresh = torch::jit::load(path);
  tensortap::Recorder ops_rec{Options(ops_dir.path).capture_ops(true).kinds({Kind::Activation})};
  tensortap::watch(fresh, ops_rec);
  const torch::Tensor x = torch::randn({5, 3});
  ops_rec.step(0);
  const torch::Tensor out = fresh.forward({x}).toTensor();
  out.pow(2).sum().backward();
  ops_rec.close();
  torch::jit::setGraphExecutorOptimize(true);
  const std::vector<std::string> got = activation_names(ops_dir.path, 0);
  CAPTURE(got);
  REQUIRE(got.size() >= 5);
  CHECK(got.front() == "aten::linear");
  CHECK(std::count(got.begin(), got.end(), "aten::linear#1") == 1);
  CHECK((got.back() == "aten::sum" || (got.back() == "aten::ones_like" && got[got.size() - 2] == "aten::sum")));
  CHECK(torch::equal(load(ops_dir.path, "activation", "aten::linear#1", 0), out));
}
