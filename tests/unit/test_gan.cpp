// Loops with several optimizers (a GAN): record_grads() records exactly what
// each optimizer applies, buffers are recorded when steps begin, two models
// share one run under prefixes, and scopes tell apart a module run three
// times per step. Checked bit for bit, in .npy and in HDF5.
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#ifdef TENSORTAP_HAVE_HDF5
#include <H5Cpp.h>
#endif

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "writers/src/paths.h"

using tensortap::Format;
using tensortap::Kind;
using tensortap::Options;
using tt_test::TempDir;
namespace nn = torch::nn;

namespace {

// The value of a JSON member in an index line (numbers and strings only).
std::string member(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const auto at = line.find(k);
  if (at == std::string::npos) return "";
  auto start = at + k.size();
  if (line[start] == '"') {
    const auto end = line.find('"', start + 1);
    return line.substr(start + 1, end - start - 1);
  }
  auto end = line.find_first_of(",}", start);
  return line.substr(start, end - start);
}

// The record of `name` (kind `kind`) at `step`, read from whichever format
// the run has; undefined if there is none.
torch::Tensor read_record(const std::string& run, const std::string& kind, const std::string& name, std::int64_t step) {
  for (const auto& line : tt_test::read_lines(run + "/index.jsonl")) {
    if (line.find(fmt::format("{{\"step\":{},\"kind\":\"{}\",\"name\":\"{}\",", step, kind, name)) != 0) continue;
    const std::string file = member(line, "file");
    if (file != "tensors.h5") return tensortap::load_npy(run + "/" + file);
#ifdef TENSORTAP_HAVE_HDF5
    H5::H5File f(run + "/tensors.h5", H5F_ACC_RDONLY);
    H5::DataSet ds = f.openDataSet(member(line, "dataset"));
    H5::DataSpace space = ds.getSpace();
    std::vector<hsize_t> dims(static_cast<std::size_t>(space.getSimpleExtentNdims()));
    space.getSimpleExtentDims(dims.data());
    std::vector<std::int64_t> shape(dims.begin() + 1, dims.end());
    const bool is_long = member(line, "dtype") == "int64";
    auto t = torch::empty(shape, is_long ? torch::kLong : torch::kFloat);
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = std::stoull(member(line, "row"));
    count[0] = 1;
    space.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
    H5::DataSpace mem(static_cast<int>(count.size()), count.data());
    ds.read(t.data_ptr(), is_long ? H5::PredType::NATIVE_INT64 : H5::PredType::NATIVE_FLOAT, mem, space);
    return t;
#endif
  }
  return {};
}

struct Gan {
  nn::Sequential gen{nn::Linear(4, 8), nn::BatchNorm1d(8), nn::ReLU(), nn::Linear(8, 6)};
  nn::Sequential disc{nn::Linear(6, 8), nn::LeakyReLU(), nn::Linear(8, 1)};
};

void run_gan(Format format) {
  INFO("format " << (format == Format::Npy ? "npy" : "hdf5"));
  TempDir dir;
  torch::manual_seed(0);
  Gan gan;
  torch::optim::Adam d_opt(gan.disc->parameters(), 1e-2), g_opt(gan.gen->parameters(), 1e-2);
  // The discriminator's run; the generator joins it under "G".
  auto rec = tensortap::watch(*gan.disc,
                              Options(dir.path).format(format).kinds(tensortap::KindSet::all()).tap_sequential("."));
  tensortap::watch(*gan.gen, *rec, "G");

  const int steps = 4;
  std::map<std::pair<std::string, std::int64_t>, torch::Tensor> applied, buffers;
  for (std::int64_t s = 0; s < steps; ++s) {
    rec->step(s);
    for (const auto& b : gan.gen->named_buffers()) buffers[{"G/" + b.key(), s}] = b.value().clone();
    const auto real = torch::randn({5, 6}), noise = torch::randn({5, 4});
    d_opt.zero_grad();
    torch::Tensor d_real, d_fake, fake = gan.gen->forward(noise);
    {
      auto scope = rec->scope("real");
      d_real = gan.disc->forward(real);
    }
    {
      auto scope = rec->scope("fake");
      d_fake = gan.disc->forward(fake.detach());
    }
    (torch::binary_cross_entropy_with_logits(d_real, torch::ones_like(d_real)) +
     torch::binary_cross_entropy_with_logits(d_fake, torch::zeros_like(d_fake)))
        .backward();
    for (const auto& p : gan.disc->named_parameters()) applied[{p.key(), s}] = p.value().grad().clone();
    rec->record_grads(d_opt);
    d_opt.step();

    g_opt.zero_grad();
    torch::Tensor d_gen;
    {
      auto scope = rec->scope("gen");
      d_gen = gan.disc->forward(fake);
    }
    // Flows through the discriminator into its parameters' .grad() again:
    // not what d_opt applied, and not to be added to its record.
    torch::binary_cross_entropy_with_logits(d_gen, torch::ones_like(d_gen)).backward();
    for (const auto& p : gan.gen->named_parameters()) applied[{"G/" + p.key(), s}] = p.value().grad().clone();
    rec->record_grads(g_opt);
    g_opt.step();
  }
  rec->close();
  REQUIRE(rec->counters().errors == 0);

  for (const auto& [key, want] : applied) {
    INFO("grad " << key.first << " step " << key.second);
    const auto got = read_record(dir.path, "grad", key.first, key.second);
    REQUIRE(got.defined());
    REQUIRE(torch::equal(got, want));  // bit for bit
  }
  // One record per parameter and step: no end-of-step sum beside it.
  REQUIRE(tt_test::index_lines_with(dir.path, "\"kind\":\"grad\"").size() == applied.size());
  for (const auto& [key, want] : buffers) {
    INFO("buffer " << key.first << " step " << key.second);
    REQUIRE(torch::equal(read_record(dir.path, "buffer", key.first, key.second), want));
  }
  REQUIRE(buffers.size() == 3 * steps);  // running_mean, running_var, num_batches_tracked
  // The discriminator's three runs per step, told apart by their scopes.
  for (const char* scope : {"real", "fake", "gen"}) {
    REQUIRE(read_record(dir.path, "activation", fmt::format("{}/0", scope), 2).defined());
    REQUIRE(read_record(dir.path, "activation_grad", fmt::format("{}/2", scope), 2).defined());
  }
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"0#1\"").empty());
  REQUIRE(read_record(dir.path, "activation", "G/0", 1).defined());
}

}  // namespace

TEST_CASE("a GAN loop records what each optimizer applies, bit for bit, with buffers and scopes", "[hooks][gan]") {
  run_gan(Format::Npy);
#ifdef TENSORTAP_HAVE_HDF5
  run_gan(Format::Hdf5);
#endif
}

TEST_CASE("record_grads() needs a step and an open recorder, and skips steps that are not sampled", "[hooks][gan]") {
  TempDir dir;
  nn::Linear fc(3, 2);
  torch::optim::SGD opt(fc->parameters(), 0.1);
  auto rec = tensortap::watch(*fc, Options(dir.path).every(2));
  std::string err;
  try {
    rec->record_grads(opt);
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  REQUIRE_THAT(err, Catch::Contains("before the first step()"));
  for (std::int64_t s = 0; s < 4; ++s) {
    rec->step(s);
    fc->forward(torch::randn({2, 3})).sum().backward();
    rec->record_grads(opt);
    opt.step();
    opt.zero_grad();
  }
  rec->close();
  // Steps 0 and 2 only, one record each.
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"weight\"").size() == 2);
  err.clear();
  try {
    rec->record_grads(opt);
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  REQUIRE_THAT(err, Catch::Contains("after close()"));
}

TEST_CASE("record_grads() of an optimizer that trains nothing watched says so, once", "[hooks][gan]") {
  // It recorded nothing, silently (an optimizer of a module never watched,
  // or of a TorchScript module's parameters).
  TempDir dir;
  nn::Linear watched(3, 2), other(3, 2);
  torch::optim::SGD stray(other->parameters(), 0.1), right(watched->parameters(), 0.1);
  auto rec = tensortap::watch(*watched, Options(dir.path));
  const std::string err = tt_test::stderr_of(dir / "stderr", [&] {
    for (std::int64_t s = 0; s < 3; ++s) {
      rec->step(s);
      watched->forward(torch::randn({2, 3})).sum().backward();
      rec->record_grads(stray);
      rec->record_grads(right);
    }
    rec->close();
  });
  const std::string said =
      "record_grads(): none of the optimizer's 2 parameters is one this recorder watches (it watches 2)";
  CHECK(err.find(said) != std::string::npos);
  CHECK(err.find("record_grads()") == err.rfind("record_grads()"));  // once, and not for `right`
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"weight\"").size() == 3);
}

TEST_CASE("a layer frozen at watch() and unfrozen later gets its end-of-step grad records", "[hooks][gan]") {
  // register_hook refuses a tensor that does not require grad, so a layer
  // frozen when watch() ran was never hooked: after it was unfrozen (a
  // fine-tuning schedule), record_grads recorded it and the default grad
  // record never did. The watched parameters are checked again at step().
  TempDir dir;
  torch::manual_seed(5);
  nn::Sequential net(nn::Linear(3, 3), nn::Linear(3, 2));
  const torch::Tensor w0 = net->named_parameters()["0.weight"];
  for (auto& p : net[0]->parameters()) p.requires_grad_(false);
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
  std::vector<torch::Tensor> want;
  for (std::int64_t s = 0; s < 4; ++s) {
    if (s == 2)
      for (auto& p : net[0]->parameters()) p.requires_grad_(true);
    rec->step(s);
    net->forward(torch::randn({4, 3})).pow(2).sum().backward();
    if (s >= 2) want.push_back(w0.grad().clone());
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  }
  rec->close();
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"0.weight\"").size() == 2);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"1.weight\"").size() == 4);
  CHECK(torch::equal(read_record(dir.path, "grad", "0.weight", 2), want[0]));
  CHECK(torch::equal(read_record(dir.path, "grad", "0.weight", 3), want[1]));
}

TEST_CASE("a layer unfrozen during a step is recorded from that step, whatever the order of zero_grad()",
          "[hooks][gan]") {
  // Issue 58: set_requires_grad(true) after step(2) and before the forward
  // and backward: the layer trained in step 2, .grad() held its gradient,
  // and the hook came only at step(3). The hook now comes as step 2's
  // backward begins, before the gradient is accumulated, so the record is
  // the gradient itself, whether the loop zeroes before or after.
  for (const int order : {0, 1, 2}) {  // zero_grad before backward, after opt.step, none (set to None)
    CAPTURE(order);
    TempDir dir;
    torch::manual_seed(7);
    nn::Sequential net(nn::Linear(3, 3), nn::Linear(3, 2));
    const torch::Tensor w0 = net->named_parameters()["0.weight"];
    for (auto& p : net[0]->parameters()) p.set_requires_grad(false);
    torch::optim::SGD opt(net->parameters(), 0.1);
    auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
    std::vector<torch::Tensor> want;
    for (std::int64_t s = 0; s < 4; ++s) {
      rec->step(s);
      if (s == 2)
        for (auto& p : net[0]->parameters()) p.set_requires_grad(true);  // during the step
      if (order == 0) opt.zero_grad();
      const torch::Tensor before = w0.grad().defined() ? w0.grad().clone() : torch::zeros_like(w0);
      net->forward(torch::randn({4, 3})).pow(2).sum().backward();
      if (s >= 2) want.push_back(w0.grad() - (order == 0 ? torch::zeros_like(w0) : before));
      opt.step();
      if (order == 1) opt.zero_grad();
      if (order == 2)
        for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    }
    const std::string err = tt_test::stderr_of(dir / "stderr", [&] { rec->close(); });
    CHECK(err.find("started training") == std::string::npos);
    REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"0.weight\"").size() == 2);
    CHECK(torch::allclose(read_record(dir.path, "grad", "0.weight", 2), want[0], 0, 0));
    CHECK(torch::allclose(read_record(dir.path, "grad", "0.weight", 3), want[1], 0, 0));
  }
}

TEST_CASE("a layer unfrozen between two backward passes of a step is said to have trained unrecorded",
          "[hooks][gan]") {
  // The hook comes as a step's first backward pass begins: a layer
  // unfrozen after it (between micro-batches) is hooked at the next step(),
  // which says that its gradient of the step before was not recorded.
  TempDir dir;
  torch::manual_seed(7);
  nn::Sequential net(nn::Linear(3, 3), nn::Linear(3, 2));
  for (auto& p : net[0]->parameters()) p.set_requires_grad(false);
  auto rec = tensortap::watch(*net, Options(dir.path).kinds({Kind::Grad}));
  rec->step(0);
  net->forward(torch::randn({4, 3})).pow(2).sum().backward();
  for (auto& p : net[0]->parameters()) p.set_requires_grad(true);
  net->forward(torch::randn({4, 3})).pow(2).sum().backward();
  const std::string err = tt_test::stderr_of(dir / "stderr", [&] {
    rec->step(1);
    net->forward(torch::randn({4, 3})).pow(2).sum().backward();
    rec->step(2);
  });
  CHECK_THAT(err, Catch::Contains("tensortap: warning: 0.weight started training during step 0; its gradient at "
                                  "step 0 was not recorded"));
  CHECK(err.find("started training") == err.rfind("started training"));  // once
  rec->close();
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"0.weight\"").size() == 1);  // step 1
}

TEST_CASE("record_grads() before backward() loses nothing: the step's sum is recorded at its end", "[hooks][gan]") {
  TempDir dir;
  torch::manual_seed(3);
  nn::Linear fc(3, 2);
  torch::optim::SGD opt(fc->parameters(), 0.1);
  auto rec = tensortap::watch(*fc, Options(dir.path));
  std::vector<torch::Tensor> want_weight;
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);
    // Gradients set to none (LibTorch 2.x's zero_grad default, or never
    // computed yet): nothing for record_grads to take here.
    for (auto& p : fc->parameters()) p.mutable_grad() = torch::Tensor();
    rec->record_grads(opt);  // too early: before backward()
    fc->forward(torch::randn({4, 3})).pow(2).sum().backward();
    want_weight.push_back(fc->weight.grad().clone());
    opt.step();
  }
  rec->close();
  // Every step's gradient of both parameters, as the optimizer applied it.
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"weight\"").size() == 3);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"bias\"").size() == 3);
  for (std::int64_t s = 0; s < 3; ++s)
    CHECK(torch::equal(read_record(dir.path, "grad", "weight", s), want_weight[static_cast<std::size_t>(s)]));
}

TEST_CASE("with gradient clipping, grad is the backward sum and record_grads() what the optimizer applies",
          "[hooks][gan]") {
  // One loop twice, from the same weights and batches: once with the default
  // record, once with record_grads(). Each against copies the loop takes.
  const auto train = [](const std::string& run, bool record_grads, std::vector<torch::Tensor>& before_clip,
                        std::vector<torch::Tensor>& after_clip) {
    torch::manual_seed(11);
    nn::Linear fc(6, 3);
    torch::optim::SGD opt(fc->parameters(), 0.1);
    auto rec = tensortap::watch(*fc, Options(run));
    for (std::int64_t s = 0; s < 4; ++s) {
      rec->step(s);
      opt.zero_grad();
      (fc->forward(torch::randn({8, 6})) * 10).pow(2).sum().backward();
      before_clip.push_back(fc->weight.grad().clone());
      torch::nn::utils::clip_grad_norm_(fc->parameters(), 0.5);
      after_clip.push_back(fc->weight.grad().clone());
      if (record_grads) rec->record_grads(opt);
      opt.step();
    }
    rec->close();
  };
  TempDir dir;
  std::vector<torch::Tensor> a_before, a_after, b_before, b_after;
  train(dir / "default", false, a_before, a_after);
  train(dir / "record_grads", true, b_before, b_after);
  for (std::size_t s = 0; s < 4; ++s) {
    INFO("step " << s);
    // Clipping changed something, or the test would prove nothing.
    REQUIRE_FALSE(torch::equal(a_before[s], a_after[s]));
    CHECK(torch::equal(read_record(dir / "default", "grad", "weight", static_cast<std::int64_t>(s)), a_before[s]));
    CHECK(torch::equal(read_record(dir / "record_grads", "grad", "weight", static_cast<std::int64_t>(s)), b_after[s]));
  }
}
