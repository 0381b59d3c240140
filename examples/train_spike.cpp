// A loss spike that recovers, caught by a trigger. The demo MLP trains on a
// clean task; for three steps from `bad_step` on, a corrupted batch comes in
// (inputs scaled 30x, as a broken augmentation or a bad shard would make
// them), the loss jumps, and training recovers. Nothing turns NaN, so the
// default NaN trigger would see nothing: Trigger::spike("loss", 5, 50) fires
// when the loss passes 5x its median over the last 50 steps, and the flight
// recorder writes the 20 steps before it with their full tensors. The loop
// itself sees the dump at the next step() (Recorder::dumps()) and says so.
// plot_spike.py shows the steps before the spike.
//
//   train_spike [run_dir=runs/spike] [steps=300] [bad_step=200]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>  // tensortap

#include "demo_model.h"

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "runs/spike";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 300;
  const int64_t bad_step = argc > 3 ? std::atoll(argv[3]) : 200;
  constexpr int64_t kBatch = 128;
  torch::manual_seed(0);
  const auto [data, labels] = demo::make_task();
  demo::Mlp model(demo::kInputs, 128, 64, demo::kClasses);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // tensortap: statistics of everything every step, full tensors of the
  // last 20 steps held in memory, written when the loss spikes.
  auto rec = tensortap::watch(*model, tensortap::Options(dir)
                                          .stats_every(1)
                                          .flight_recorder(20)
                                          .dump_on(tensortap::Trigger::spike("loss", 5.0, 50))
                                          .dump_on(tensortap::Trigger::non_finite())
                                          .overwrite(true));

  std::size_t dumps_seen = 0;
  for (int64_t step = 0; step < steps; ++step) {
    rec->step(step);
    // tensortap: the loop learns of a dump at the next step(), and could
    // checkpoint or lower the learning rate here.
    const auto dumps = rec->dumps();
    for (; dumps_seen < dumps.size(); ++dumps_seen)
      std::printf("step %4lld: tensortap dumped steps %lld..%lld: %s of '%s' was %.3g against a median of %.3g\n",
                  static_cast<long long>(step), static_cast<long long>(dumps[dumps_seen].steps.front()),
                  static_cast<long long>(dumps[dumps_seen].steps.back()), dumps[dumps_seen].trigger.c_str(),
                  dumps[dumps_seen].name.c_str(), dumps[dumps_seen].value, dumps[dumps_seen].median);
    const torch::Tensor idx = torch::randint(0, data.size(0), {kBatch}, torch::kLong);
    torch::Tensor x = data.index_select(0, idx);
    const torch::Tensor y = labels.index_select(0, idx);
    if (step >= bad_step && step < bad_step + 3) x = x * 30.0;  // the corrupted batches
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    rec->capture("loss", loss);  // tensortap: what the spike rule watches
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step % 25 == 0 || (step >= bad_step && step < bad_step + 5))
      std::printf("step %4lld  loss %.4f\n", static_cast<long long>(step), loss.item<double>());
  }
  rec->close();
  const tensortap::Counters s = rec->counters();
  std::printf("tensortap: %lld statistics rows, %lld records written by %lld dump(s), run directory %s\n",
              static_cast<long long>(s.stats_rows), static_cast<long long>(s.records), static_cast<long long>(s.dumps),
              dir.c_str());
  return s.dumps == 1 ? 0 : 1;
}
