#include <tensortap/watch.h>

#include <ATen/ATen.h>

#include <tensortap/tap.h>

#include "hooks/src/binding.h"

namespace tensortap {
namespace detail {
namespace {

// Gradient hooks on parameters, and parameter snapshots at step starts.
//
// A parameter hook fires once per backward pass with that pass's gradient,
// before it is accumulated into `.grad`. The record the user wants is what
// the optimizer sees, the sum over the step's passes, whatever the loop does
// with zero_grad(): so the hooks sum into an accumulator of their own,
// committed when the step ends. The accumulator is allocated once per
// parameter and reused, so sampled steps do not allocate after the first.
class ParamWatcher final : public Watcher {
 public:
  struct Entry {
    std::string name;
    at::Tensor param;
    bool hooked = false;
    unsigned hook = 0;
    at::Tensor acc;
    std::int64_t acc_step = -1;
    bool pending = false;
  };

  explicit ParamWatcher(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  const Core& core() const { return *core_; }

  void add(std::string name, at::Tensor param) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry e;
    e.name = std::move(name);
    e.param = std::move(param);
    entries_.push_back(std::move(e));
  }

  // Registers the gradient hooks; `self` is this watcher.
  void hook_all(const std::shared_ptr<ParamWatcher>& self) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (!e.param.requires_grad()) continue;
      e.hook = e.param.register_hook([self, i](const at::Tensor& grad) {
        if (!self->core().active(Kind::Grad)) return;
        self->accumulate(i, grad);
      });
      e.hooked = true;
    }
  }

  void accumulate(std::size_t i, const at::Tensor& sparse_or_dense) {
    at::NoGradGuard no_grad;
    // A sparse gradient (an Embedding with sparse=true) is recorded dense:
    // that is what .npy holds and what a user compares against.
    const at::Tensor grad = sparse_or_dense.is_sparse() ? sparse_or_dense.to_dense() : sparse_or_dense;
    const std::int64_t step = core_->current_step();
    std::lock_guard<std::mutex> lock(mu_);
    if (i >= entries_.size()) return;  // detached meanwhile
    Entry& e = entries_[i];
    if (e.pending && e.acc_step == step) {
      e.acc.add_(grad);
      return;
    }
    if (e.acc.defined() && e.acc.sizes() == grad.sizes() && e.acc.dtype() == grad.dtype() &&
        e.acc.device() == grad.device() && e.acc.layout() == grad.layout() && e.acc.is_contiguous()) {
      e.acc.copy_(grad);
    } else {
      e.acc = grad.detach().clone(at::MemoryFormat::Contiguous);
    }
    e.acc_step = step;
    e.pending = true;
    any_pending_ = true;
  }

  void on_step_begin(std::int64_t step) override {
    if (!core_->active(Kind::Param)) return;
    std::lock_guard<std::mutex> lock(mu_);
    std::exception_ptr first;
    for (const Entry& e : entries_) {
      try {
        core_->record(Kind::Param, e.name, e.param, step);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  void on_step_end() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Most steps are not sampled: skip the walk over every parameter.
    if (!any_pending_) return;
    any_pending_ = false;
    // One parameter that cannot be recorded must not cost the others theirs.
    std::exception_ptr first;
    for (Entry& e : entries_) {
      if (!e.pending) continue;
      e.pending = false;
      try {
        core_->record(Kind::Grad, e.name, e.acc, e.acc_step);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  void detach() noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : entries_) {
      if (!e.hooked) continue;
      try {
        e.param.remove_hook(e.hook);
      } catch (...) {
        // The tensor's hook list is gone with its autograd state: nothing left to remove.
      }
    }
    // Dropping the entries frees the accumulators and the references to the
    // parameters; a hook still running sees the index out of range.
    entries_.clear();
  }

 private:
  std::shared_ptr<Core> core_;
  std::mutex mu_;
  std::vector<Entry> entries_;
  bool any_pending_ = false;
};

// Unbinds the Taps of one watch() call on close.
class TapWatcher final : public Watcher {
 public:
  void add(const std::shared_ptr<TapImpl>& tap, std::shared_ptr<TapBinding> binding) {
    taps_.emplace_back(tap, binding.get());
    tap->bind(std::move(binding));
  }
  void detach() noexcept override {
    for (auto& [tap, binding] : taps_)
      if (auto t = tap.lock()) t->unbind(binding);
    taps_.clear();
  }

 private:
  std::vector<std::pair<std::weak_ptr<TapImpl>, const TapBinding*>> taps_;
};

void attach(torch::nn::Module& module, const std::shared_ptr<Core>& core) {
  const KindSet kinds = core->options().kinds();
  if (kinds.contains(Kind::Grad) || kinds.contains(Kind::Param)) {
    auto params = std::make_shared<ParamWatcher>(core);
    for (const auto& item : module.named_parameters(/*recurse=*/true))
      if (core->selected(item.key())) params->add(item.key(), item.value());
    if (kinds.contains(Kind::Grad)) params->hook_all(params);
    core->add_watcher(params);
  }
  if (kinds.contains(Kind::Activation) || kinds.contains(Kind::ActivationGrad)) {
    auto taps = std::make_shared<TapWatcher>();
    // Without include_self: named_modules() needs shared_from_this() for
    // the root, and a root on the stack has none.
    for (const auto& item : module.named_modules("", /*include_self=*/false)) {
      auto tap = std::dynamic_pointer_cast<TapImpl>(item.value());
      if (tap && core->selected(item.key()))
        taps->add(tap, std::make_shared<TapBinding>(TapBinding{core, item.key()}));
    }
    core->add_watcher(taps);
  }
}

}  // namespace
}  // namespace detail

std::shared_ptr<Recorder> watch(torch::nn::Module& module, Options options) {
  auto recorder = std::make_shared<Recorder>(std::move(options));
  watch(module, *recorder);
  return recorder;
}

void watch(torch::nn::Module& module, Recorder& recorder) { detail::attach(module, recorder.core()); }

}  // namespace tensortap
