#include <tensortap/recorder.h>

#include <cstdio>
#include <unordered_set>

#include <torch/optim/optimizer.h>

#include "sdk/src/core.h"

namespace tensortap {

Recorder::Recorder(Options options) : core_(std::make_shared<detail::Core>(std::move(options))) {}

Recorder::~Recorder() {
  try {
    core_->close();
  } catch (const std::exception& e) {
    // A destructor must not throw; the writer thread already printed the
    // first error, this says the run ended with it.
    std::fprintf(stderr, "tensortap: run closed with errors: %s\n", e.what());
  }
}

void Recorder::step(std::int64_t step) { core_->step(step); }

void Recorder::capture(const std::string& name, const at::Tensor& tensor) { core_->capture(name, tensor); }

bool Recorder::sampled(Kind kind) const { return core_->active(kind); }

std::int64_t Recorder::current_step() const { return core_->current_step(); }

void Recorder::record_grads(const torch::optim::Optimizer& optimizer) {
  std::unordered_set<const void*> params;
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params()) params.insert(p.unsafeGetTensorImpl());
  core_->record_grads(params);
}

Recorder::Scope Recorder::scope(const std::string& name) {
  core_->push_scope(name);
  return Scope(core_.get());
}

Recorder::Scope::~Scope() {
  if (core_ != nullptr) core_->pop_scope();
}

void Recorder::flush() { core_->flush(); }

void Recorder::close() { core_->close(); }

void Recorder::dump() { core_->dump(); }

Stats Recorder::stats() const { return core_->stats(); }

std::vector<DumpRecord> Recorder::dumps() const { return core_->dumps(); }

const Options& Recorder::options() const { return core_->options(); }

const std::string& Recorder::run_dir() const { return core_->info().run_dir; }

std::int64_t Recorder::rank() const { return core_->info().rank; }

std::int64_t Recorder::world_size() const { return core_->info().world_size; }

bool Recorder::capturing() const { return core_->capturing(); }

}  // namespace tensortap
