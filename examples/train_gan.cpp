// A DCGAN in the shape of PyTorch's C++ example (cpp/dcgan), on synthetic
// 28x28 images (a bright square at a random place), watched by tensortap.
// It shows what loops with two models and two optimizers need:
// - one recorder for both models, the generator's names under "G/";
// - record_grads(): the gradient each optimizer applies, not the sum of the
//   step's backward passes (the generator's loss flows through the
//   discriminator's parameters after the discriminator stepped);
// - scopes: the discriminator runs three times a step (real, fake, for the
//   generator's loss), recorded as real/..., fake/..., gen/...;
// - buffers: BatchNorm's running statistics (kind buffer);
// - Tapped<ConvTranspose2d> inside a Sequential, and a tapped Sequential.
// The tensortap lines are marked.
//
//   train_gan [run_dir=runs/gan] [steps=60] [every=10]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include <tensortap/tensortap.h>  // tensortap

namespace nn = torch::nn;
using tensortap::Tapped;  // tensortap

namespace {

constexpr int64_t kNoise = 32;
constexpr int64_t kBatch = 32;

// 28x28 images in [-1, 1]: a 6x6 square of light on a dark field.
torch::Tensor real_batch() {
  auto images = torch::full({kBatch, 1, 28, 28}, -1.0);
  const auto at = torch::randint(0, 22, {kBatch, 2}, torch::kLong);
  for (int64_t i = 0; i < kBatch; ++i) {
    const int64_t r = at[i][0].item<int64_t>(), c = at[i][1].item<int64_t>();
    images[i].narrow(1, r, 6).narrow(2, c, 6).fill_(1.0);
  }
  return images;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/gan";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 60;
  const int64_t every = argc > 3 ? std::atoll(argv[3]) : 10;
  torch::manual_seed(1);

  // The generator: noise [B, kNoise, 1, 1] -> image [B, 1, 28, 28]. Its
  // transposed convolutions are tapped where they stand (tensortap).
  nn::Sequential generator(
      Tapped<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(kNoise, 64, 4).bias(false)),  // 4x4
      nn::BatchNorm2d(64), nn::ReLU(),
      Tapped<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(64, 32, 3).stride(2).padding(1).bias(false)),  // 7x7
      nn::BatchNorm2d(32), nn::ReLU(),
      Tapped<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(32, 16, 4).stride(2).padding(1).bias(false)),  // 14x14
      nn::BatchNorm2d(16), nn::ReLU(),
      Tapped<nn::ConvTranspose2d>(nn::ConvTranspose2dOptions(16, 1, 4).stride(2).padding(1).bias(false)),  // 28x28
      nn::Tanh());
  // The discriminator: image -> probability that it is real.
  nn::Sequential discriminator(nn::Conv2d(nn::Conv2dOptions(1, 16, 4).stride(2).padding(1).bias(false)),
                               nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                               nn::Conv2d(nn::Conv2dOptions(16, 32, 4).stride(2).padding(1).bias(false)),
                               nn::BatchNorm2d(32), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                               nn::Conv2d(nn::Conv2dOptions(32, 64, 3).stride(2).padding(1).bias(false)),
                               nn::BatchNorm2d(64), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                               nn::Conv2d(nn::Conv2dOptions(64, 1, 4).bias(false)), nn::Sigmoid());
  torch::optim::Adam g_opt(generator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  torch::optim::Adam d_opt(discriminator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));

  // tensortap: one recorder, both models. Every child of the discriminator's
  // Sequential is a tap point; parameters, buffers, activations and their
  // gradients every `every` steps.
  auto rec = tensortap::watch(
      *discriminator,
      tensortap::Options(dir).every(every).kinds(tensortap::KindSet::all()).tap_sequential(".").overwrite(true));
  tensortap::watch(*generator, *rec, "G");  // tensortap: names G/0.weight, G/1.running_mean, ...

  for (int64_t step = 0; step < steps; ++step) {
    rec->step(step);  // tensortap
    // Train the discriminator on real, then fake images.
    discriminator->zero_grad();
    const auto real = real_batch();
    torch::Tensor real_out, fake_out;
    {
      auto scope = rec->scope("real");  // tensortap
      real_out = discriminator->forward(real).reshape({-1});
    }
    const auto d_loss_real = torch::binary_cross_entropy(real_out, torch::full({kBatch}, 0.9));
    d_loss_real.backward();
    const auto fake = generator->forward(torch::randn({kBatch, kNoise, 1, 1}));
    {
      auto scope = rec->scope("fake");  // tensortap
      fake_out = discriminator->forward(fake.detach()).reshape({-1});
    }
    const auto d_loss_fake = torch::binary_cross_entropy(fake_out, torch::zeros({kBatch}));
    d_loss_fake.backward();
    rec->record_grads(d_opt);  // tensortap: what d_opt applies
    d_opt.step();

    // Train the generator: its loss flows through the discriminator again.
    generator->zero_grad();
    torch::Tensor gen_out;
    {
      auto scope = rec->scope("gen");  // tensortap
      gen_out = discriminator->forward(fake).reshape({-1});
    }
    const auto g_loss = torch::binary_cross_entropy(gen_out, torch::ones({kBatch}));
    g_loss.backward();
    rec->record_grads(g_opt);  // tensortap: what g_opt applies
    g_opt.step();

    const auto d_loss = d_loss_real + d_loss_fake;
    rec->capture("d_loss", d_loss);  // tensortap
    rec->capture("g_loss", g_loss);  // tensortap
    if (step % 20 == 0 || step == steps - 1)
      std::printf("step %3lld  d_loss %.4f  g_loss %.4f\n", static_cast<long long>(step), d_loss.item<double>(),
                  g_loss.item<double>());
  }
  rec->close();  // tensortap
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld records, %lld errors, run directory %s\n", static_cast<long long>(s.records),
              static_cast<long long>(s.errors), dir.c_str());
  return s.errors == 0 ? 0 : 1;
}
