// Issue 55: a C++ port starts from a run's weights (tensortap::load_params),
// load_checkpoint names a Python state_dict for what it is, and
// tensortap::perturb moves weights bit for bit as the Python twin does.
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <caffe2/serialize/inline_container.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"

namespace fs = std::filesystem;
using tensortap::Kind;
using tensortap::Options;
using tt_test::TempDir;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
    half = register_parameter("half", torch::randn({2, 2}).to(torch::kBFloat16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::Tensor half;
};
TORCH_MODULE(Net);

// A run of `net`'s parameters and buffers at steps 0 and 1, trained between.
void record(Net& net, const std::string& dir, tensortap::Format format) {
  auto rec = tensortap::watch(*net, Options(dir).format(format).kinds({Kind::Param, Kind::Buffer}));
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (std::int64_t s = 0; s < 2; ++s) {
    rec->step(s);
    net->forward(torch::randn({8, 4})).pow(2).sum().backward();
    opt.step();
    opt.zero_grad();
  }
  rec->close();
}

std::vector<torch::Tensor> state(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.value().detach().clone());
  for (const auto& b : m.named_buffers()) out.push_back(b.value().detach().clone());
  return out;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].scalar_type() != b[i].scalar_type() || !torch::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("load_params sets a module's parameters and buffers from a run's records at a step, in every format",
          "[hooks][load_params]") {
  std::vector<tensortap::Format> formats{tensortap::Format::Npy, tensortap::Format::Packed};
#ifdef TENSORTAP_HAVE_HDF5
  formats.push_back(tensortap::Format::Hdf5);
#endif
  for (const tensortap::Format format : formats) {
    CAPTURE(static_cast<int>(format));
    TempDir dir;
    torch::manual_seed(1);
    Net source;
    const std::vector<torch::Tensor> at0 = state(*source);
    record(source, dir.path, format);
    const std::vector<torch::Tensor> at2 = state(*source);  // trained twice
    torch::manual_seed(2);
    Net port;
    REQUIRE_FALSE(same(state(*port), at0));
    tensortap::load_params(port, dir.path, 0);
    CHECK(same(state(*port), at0));  // bfloat16 and the int64 counter exactly
    tensortap::load_params(port, dir.path, 1);
    CHECK_FALSE(same(state(*port), at0));
    CHECK_FALSE(same(state(*port), at2));  // step 1's values: after one update
  }
}

TEST_CASE("load_params checks every name, shape and dtype first and sets nothing when one is wrong",
          "[hooks][load_params]") {
  TempDir dir;
  torch::manual_seed(1);
  Net source;
  record(source, dir.path, tensortap::Format::Npy);
  // A module with a parameter the run lacks and one of another shape.
  auto other = std::make_shared<torch::nn::Module>();
  other->register_module("fc", torch::nn::Linear(4, 5));
  other->register_parameter("extra", torch::zeros({3}));
  const std::vector<torch::Tensor> before = state(*other);
  const std::string err = tt_test::error_of([&] { tensortap::load_params(other, dir.path, 0); });
  CHECK_THAT(err, Catch::Contains("load_params: run '" + dir.path + "' step 0") &&
                      Catch::Contains("nothing was set") && Catch::Contains("param 'extra'") &&
                      Catch::Contains("param 'fc.weight' is float32 [3, 4] in the run and float32 [5, 4] in the "
                                      "module") &&
                      Catch::Contains("recorded but not in the module") && Catch::Contains("param 'half'"));
  CHECK(same(state(*other), before));
  // A step the run has no records of.
  Net port;
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(port, dir.path, 7); }),
             Catch::Contains("not recorded at that step (record kinds param and buffer)"));
  // Records the module lacks: refused by default, left alone with strict=false.
  auto part = std::make_shared<torch::nn::Module>();
  part->register_module("fc", torch::nn::Linear(4, 3));
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(part, dir.path, 0); }),
             Catch::Contains("recorded but not in the module (strict=false loads the rest)"));
  tensortap::load_params(part, dir.path, 0, /*rank=*/0, /*strict=*/false);
  torch::manual_seed(1);
  Net fresh;  // the source's weights at step 0
  CHECK(torch::equal(part->named_parameters()["fc.weight"], fresh->fc->weight));
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(part, dir.path, 0, /*rank=*/1); }),
             Catch::Contains("has one rank, not a rank 1"));
}

TEST_CASE("load_params reads nothing outside the run, whatever its index says", "[hooks][load_params][hostile]") {
  TempDir dir;
  torch::manual_seed(1);
  Net source;
  record(source, dir.path, tensortap::Format::Npy);
  Net port;
  const auto with_index = [&](const std::string& from, const std::string& to) {
    std::string index = tt_test::read_file(dir / "index.jsonl");
    const std::size_t at = index.find(from);
    REQUIRE(at != std::string::npos);
    index.replace(at, from.size(), to);
    std::ofstream(dir / "index.jsonl", std::ios::trunc) << index;
  };
  const std::string original = tt_test::read_file(dir / "index.jsonl");
  with_index("\"file\":\"npy/param/fc.weight/00000000.npy\"", "\"file\":\"../../../etc/passwd\"");
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(port, dir.path, 0); }),
             Catch::Contains("the file '../../../etc/passwd' is not a path inside the run"));
  std::ofstream(dir / "index.jsonl", std::ios::trunc) << original;
  // A link planted at a record's file is refused, not followed.
  fs::remove(dir / "npy/param/fc.weight/00000000.npy");
  fs::create_symlink("/etc/hostname", dir / "npy/param/fc.weight/00000000.npy");
  CHECK_FALSE(tt_test::error_of([&] { tensortap::load_params(port, dir.path, 0); }).empty());
  // A line it does not understand names the file, the line and the member.
  std::ofstream(dir / "index.jsonl", std::ios::app) << "{\"step\":0,\"kind\":\"param\",\"evil\":1}\n{}\n";
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(port, dir.path, 0); }),
             Catch::Contains("index.jsonl' line") && Catch::Contains("a member the index does not have: 'evil'"));
}

TEST_CASE("load_checkpoint names a Python state_dict for what it is", "[hooks][load_params]") {
  // torch::load of a torch.save(model.state_dict()) file said "constants.pkl
  // ... your checkpoint file is corrupted", and load_checkpoint passed it on.
  // A zip of Python's form: data.pkl, and no constants.pkl.
  TempDir dir;
  {
    caffe2::serialize::PyTorchStreamWriter writer(dir / "sd.pt");
    const std::string pickle = "\x80\x02}q\x00.";  // an empty dict
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeEndOfFile();
  }
  torch::nn::Linear fc(2, 2);
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_checkpoint(fc, dir / "sd.pt"); }),
             Catch::Contains("is a Python state_dict (torch.save of a dict)") &&
                 Catch::Contains("torch::pickle_load") && Catch::Contains("tensortap::load_params"));
}

namespace {

// The bit patterns of `values` (unsigned, of the dtype's width) as `dtype`.
torch::Tensor from_bits(const std::vector<std::uint64_t>& values, const std::string& dtype,
                        const std::vector<std::int64_t>& shape) {
  const auto as = [&](auto zero, torch::ScalarType bits, torch::ScalarType to) {
    std::vector<decltype(zero)> v;
    for (std::uint64_t x : values) v.push_back(static_cast<decltype(zero)>(x));
    return torch::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, bits).clone().view(to).reshape(shape);
  };
  if (dtype == "float64") return as(std::int64_t{0}, torch::kLong, torch::kDouble);
  if (dtype == "float32") return as(std::int32_t{0}, torch::kInt, torch::kFloat);
  if (dtype == "float16") return as(std::int16_t{0}, torch::kShort, torch::kHalf);
  if (dtype == "bfloat16") return as(std::int16_t{0}, torch::kShort, torch::kBFloat16);
  return as(std::int64_t{0}, torch::kLong, torch::kLong);
}

std::vector<std::uint64_t> numbers(const std::string& list) {
  std::vector<std::uint64_t> out;
  std::size_t i = 0;
  while (i < list.size()) {
    std::size_t end = list.find(',', i);
    if (end == std::string::npos) end = list.size();
    out.push_back(std::stoull(list.substr(i, end - i)));
    i = end + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("perturb moves each weight bit for bit as the Python twin's perturb does", "[hooks][load_params]") {
  // tests/python/perturb_vectors.json: tensortap.torch.perturb's bit
  // patterns before and after, for every dtype, zeros, the largest finite
  // values, infinities and NaN, two seeds, one and three ulps (test_twin.py
  // checks the file against the Python side).
  // From <build>/tests, as ctest runs it, or from the source tree's root.
  std::ifstream in("../../tests/python/perturb_vectors.json");
  if (!in.good()) in = std::ifstream("tests/python/perturb_vectors.json");
  REQUIRE(in.good());
  const std::regex entry(
      R"re(\{"name": "([^"]*)", "dtype": "(\w+)", "shape": \[([^\]]*)\], "seed": (\d+), "ulps": (\d+), "values_before": \[([^\]]*)\], "values_after": \[([^\]]*)\]\})re");
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, entry)) continue;
    const std::string name = m[1], dtype = m[2];
    CAPTURE(name, dtype, std::string(m[4]), std::string(m[5]));
    std::vector<std::int64_t> shape;
    for (std::uint64_t d : numbers(m[3])) shape.push_back(static_cast<std::int64_t>(d));
    // A module whose named_parameters() give `name` (a submodule's, "enc.weight").
    auto root = std::make_shared<torch::nn::Module>();
    torch::nn::Module* owner = root.get();
    std::string leaf = name;
    std::shared_ptr<torch::nn::Module> sub;
    if (const std::size_t dot = name.find('.'); dot != std::string::npos) {
      sub = root->register_module(name.substr(0, dot), std::make_shared<torch::nn::Module>());
      owner = sub.get();
      leaf = name.substr(dot + 1);
    }
    const torch::Tensor before = from_bits(numbers(m[6]), dtype, shape);
    owner->register_parameter(leaf, before.clone(), /*requires_grad=*/before.is_floating_point());
    tensortap::perturb(root, std::stoll(m[5]), std::stoull(m[4]));
    const torch::Tensor want = from_bits(numbers(m[7]), dtype, shape);
    const torch::Tensor got = root->named_parameters()[name];
    // Bits, not values: NaN and -0 must match too.
    CHECK(torch::equal(got.view(torch::kByte), want.view(torch::kByte)));
    ++checked;
  }
  CHECK(checked >= 32);
  CHECK_THAT(tt_test::error_of([] {
               auto m = std::make_shared<torch::nn::Module>();
               tensortap::perturb(m, 0);
             }),
             Catch::Contains("ulps must be 1 to 1024, not 0"));
}
