// Trains a little and checks what it captured, through the public API only.
#include <cstdio>

#include <torch/nn/modules/linear.h>
#include <torch/version.h>

#include <tensortap/tensortap.h>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  torch::nn::Linear fc(4, 2);
  auto rec = tensortap::watch(*fc, tensortap::Options(argv[1]).overwrite(true));
  rec->step(0);
  const torch::Tensor x = torch::randn({3, 4});
  fc(x).sum().backward();
  rec->close();
  const torch::Tensor g = tensortap::load_npy(std::string(argv[1]) + "/npy/grad/weight/00000000.npy");
  const bool ok = g.sizes() == torch::IntArrayRef{2, 4} && torch::allclose(g, x.sum(0).expand({2, 4}));
  std::printf("consumer (LibTorch %s, C++ %ld): %lld records, gradient %s\n", TORCH_VERSION, __cplusplus,
              static_cast<long long>(rec->counters().records), ok ? "exact" : "WRONG");
  return ok ? 0 : 1;
}
