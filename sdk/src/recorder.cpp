#include <tensortap/recorder.h>

#include <cstdio>
#include <unordered_set>

#include <torch/optim/optimizer.h>

#include "sdk/src/front/front_end.h"

namespace tensortap {

namespace {

// Hooks and the Recorder share the front end; whoever lets go of it last
// deletes it, except in a fork() child: there its threads do not exist and
// its mutexes and condition variables may be held by them forever, so
// destroying it could wait forever. It is left to the process's end.
void delete_front_end(detail::FrontEnd* front) noexcept {
  if (!front->inert()) delete front;
}

}  // namespace

Recorder::Recorder(Options options) : front_(new detail::FrontEnd(std::move(options)), delete_front_end) {}

Recorder::~Recorder() {
  try {
    front_->close();
  } catch (const std::exception& e) {
    // A destructor must not throw; the writer thread already printed the
    // first error, this says the run ended with it.
    std::fprintf(stderr, "tensortap: run closed with errors: %s\n", e.what());
  }
}

void Recorder::step(std::int64_t step) { front_->step(step); }

void Recorder::capture(const std::string& name, const at::Tensor& tensor) { front_->capture(name, tensor); }

bool Recorder::sampled(Kind kind) const { return front_->active(kind); }

std::int64_t Recorder::current_step() const { return front_->current_step(); }

void Recorder::record_grads(const torch::optim::Optimizer& optimizer) {
  std::unordered_set<const void*> params;
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params()) params.insert(p.unsafeGetTensorImpl());
  front_->record_grads(params, &optimizer);
}

Recorder::Scope Recorder::scope(const std::string& name) {
  front_->push_scope(name);
  return Scope(front_.get());
}

Recorder::Scope::~Scope() {
  if (front_ != nullptr) front_->pop_scope();
}

void Recorder::flush() { front_->flush(); }

void Recorder::close() { front_->close(); }

void Recorder::dump() { front_->dump(); }

Counters Recorder::counters() const { return front_->counters(); }

std::vector<Dump> Recorder::dumps() const { return front_->dumps(); }

const Options& Recorder::options() const { return front_->options(); }

const std::string& Recorder::run_dir() const { return front_->placement().run_dir; }

std::int64_t Recorder::rank() const { return front_->placement().rank; }

std::int64_t Recorder::world_size() const { return front_->placement().world_size; }

bool Recorder::capturing() const { return front_->capturing(); }

const std::shared_ptr<detail::FrontEnd>& detail::RecorderAccess::front_end(const Recorder& recorder) {
  return recorder.front_;
}

}  // namespace tensortap
