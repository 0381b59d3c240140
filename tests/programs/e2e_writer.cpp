// Writes the runs that check_e2e.py verifies with NumPy:
//   <out>/train   a linear layer trained with MSE; parameters, gradients,
//                 inputs and targets captured so NumPy can recompute the
//                 gradients in closed form; plus a snapshot probe
//   <out>/dtypes  every dtype, and views, 0-d, empty and non-finite tensors
// Both take statistics of every tensor at every step (check_e2e.py compares
// them with NumPy's on the written tensors).
// and with the argument `hdf5`, the same as <out>/train_h5 and <out>/dtypes_h5
// in Format::Hdf5, plus <out>/shapes_h5, a tensor whose shape changes.
// Always also <out>/train_packed and <out>/dtypes_packed in Format::Packed
// (the latter in small segments, so its records span several).
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

// This target has no include root of the repository: the header by its path
// from this file.
#include "../support/net.h"

static void train(const std::string& dir, tensortap::Format format) {
  torch::manual_seed(42);
  tt_test::Net model(5, 3);  // out = fc(x), fc a Linear(5, 3): check_e2e.py's shapes
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto rec = tensortap::watch(
      *model,
      tensortap::Options(dir).every(2).stats_every(1).kinds(tensortap::KindSet::all()).format(format).overwrite(true));
  for (int64_t step = 0; step < 9; ++step) {
    rec->step(step);
    const torch::Tensor x = torch::randn({8, 5}), y = torch::randn({8, 3});
    rec->capture("x", x);
    rec->capture("y", y);
    const torch::Tensor loss = (model->forward(x) - y).pow(2).mean();
    rec->capture("loss", loss);
    opt.zero_grad();
    loss.backward();
    opt.step();
    // The snapshot probe: changed in place right after its capture.
    torch::Tensor probe = torch::full({16}, static_cast<double>(step));
    rec->capture("probe", probe);
    probe.add_(1000);
  }
  rec->close();
}

static void dtypes(const std::string& dir, tensortap::Format format) {
  tensortap::Recorder rec(tensortap::Options(dir)
                              .format(format)
                              .packed(tensortap::PackedOptions().segment_bytes(4096))
                              .stats_every(1)
                              .overwrite(true));
  rec.step(0);
  const torch::Tensor base = torch::arange(12, torch::kDouble).reshape({3, 4}) - 5;
  const std::pair<const char*, torch::Dtype> all[] = {{"bool", torch::kBool},
                                                      {"uint8", torch::kUInt8},
                                                      {"int8", torch::kInt8},
                                                      {"int16", torch::kInt16},
                                                      {"int32", torch::kInt32},
                                                      {"int64", torch::kInt64},
                                                      {"float16", torch::kFloat16},
                                                      {"float32", torch::kFloat32},
                                                      {"float64", torch::kFloat64},
                                                      {"complex64", torch::kComplexFloat},
                                                      {"complex128", torch::kComplexDouble},
                                                      {"bfloat16", torch::kBFloat16}};
  for (const auto& [name, dtype] : all) {
    torch::Tensor t;
    if (dtype == torch::kBool)
      t = (base.remainder(2) == 0);
    else if (dtype == torch::kUInt8)
      t = (base + 5).to(dtype);
    else if (torch::isComplexType(dtype))
      t = torch::complex(base, -0.5 * base).to(dtype);
    else
      t = (base * 0.5).to(dtype);
    rec.capture(std::string("dtype_") + name, t);
    rec.capture(std::string("transposed_") + name, t.t());
  }
  rec.capture("scalar", torch::scalar_tensor(3.5, torch::kDouble));
  rec.capture("empty", torch::empty({0, 3}));
  const double inf = std::numeric_limits<double>::infinity();
  rec.capture("nonfinite", torch::tensor({1.5, std::nan(""), inf, -inf, 0.0, -2.5}, torch::kFloat));
  rec.close();
}

// Steps 0..3 of "x" have batch sizes 4, 4, 2 (a smaller last batch) and 5 rows
// of 3 columns, then step 4 has 7 columns: values are step * 100 + index.
static void shapes(const std::string& dir) {
  tensortap::Recorder rec(tensortap::Options(dir).format(tensortap::Format::Hdf5).overwrite(true));
  const int64_t rows[] = {4, 4, 2, 5, 5}, cols[] = {3, 3, 3, 3, 7};
  for (int64_t s = 0; s < 5; ++s) {
    rec.step(s);
    rec.capture("x", torch::arange(rows[s] * cols[s], torch::kFloat).reshape({rows[s], cols[s]}) + 100 * s);
  }
  rec.close();
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: e2e_writer OUT_DIR [hdf5]\n");
    return 2;
  }
  const std::string out = argv[1];
  train(out + "/train", tensortap::Format::Npy);
  dtypes(out + "/dtypes", tensortap::Format::Npy);
  train(out + "/train_packed", tensortap::Format::Packed);
  dtypes(out + "/dtypes_packed", tensortap::Format::Packed);
  if (argc > 2 && std::string(argv[2]) == "hdf5") {
    train(out + "/train_h5", tensortap::Format::Hdf5);
    dtypes(out + "/dtypes_h5", tensortap::Format::Hdf5);
    shapes(out + "/shapes_h5");
  }
  return 0;
}
