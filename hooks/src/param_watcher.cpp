// Parameters and buffers of a watched module: gradient hooks, the
// end-of-step gradient record, record_grads(), and parameter and buffer
// records at step starts.
#include "hooks/src/param_watcher.h"

#include "writers/src/check.h"

#include <cstdio>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace tensortap::detail {

void ParamWatcher::add(std::string name, at::Tensor param) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.name = std::move(name);
  e.param = std::move(param);
  entries_.push_back(std::move(e));
}

void ParamWatcher::add_buffer(std::string name, at::Tensor buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  buffers_.emplace_back(std::move(name), std::move(buffer));
}

void ParamWatcher::hook_all(const std::shared_ptr<ParamWatcher>& self) {
  std::lock_guard<std::mutex> lock(mu_);
  self_ = self;
  hooks_grads_ = true;
  for (std::size_t i = 0; i < entries_.size(); ++i) hooked_ += hook(i, self) ? 1 : 0;
  unhooked_hint_.store(unhooked_, std::memory_order_relaxed);
  if (unhooked_ > 0 && hooked_ == 0) {
    listening_ = true;
    backward_listen(self);
  }
}

ParamWatcher::~ParamWatcher() {
  if (listening_) backward_unlisten(this);
}

void ParamWatcher::look_for_unfrozen() noexcept {
  if (unhooked_hint_.load(std::memory_order_relaxed) == 0) return;
  const std::int64_t step = front_->current_step();
  if (rechecked_step_.exchange(step, std::memory_order_relaxed) == step) return;
  std::lock_guard<std::mutex> lock(mu_);
  try {
    rehook(/*say_missed=*/false);
  } catch (...) {
    front_->hook_failed(std::current_exception());
  }
}

bool ParamWatcher::hook(std::size_t i, const std::shared_ptr<ParamWatcher>& self) {
  Entry& e = entries_[i];
  if (e.hooked) return false;
  if (!e.param.requires_grad()) {
    ++unhooked_;
    if (e.frozen_grad_version == -2) e.frozen_grad_version = grad_version(e.param);
    return false;
  }
  e.hook = e.param.register_hook([self, i](const at::Tensor& grad) {
    self->look_for_unfrozen();
    if (!self->front().active(Kind::Grad)) return;
    try {
      self->accumulate(i, grad);
    } catch (...) {
      self->front_->hook_failed(std::current_exception());
    }
  });
  e.hooked = true;
  return true;
}

std::int64_t ParamWatcher::grad_version(const at::Tensor& param) {
  const at::Tensor& g = param.grad();
  return g.defined() ? static_cast<std::int64_t>(g._version()) : -1;
}

void ParamWatcher::rehook(bool say_missed) {
  if (unhooked_ == 0) return;
  const std::shared_ptr<ParamWatcher> self = self_.lock();
  if (!self) return;
  unhooked_ = 0;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const std::int64_t version = entries_[i].frozen_grad_version;
    if (!hook(i, self)) continue;
    ++hooked_;
    if (!say_missed || said_missed_) continue;
    const at::Tensor& g = entries_[i].param.grad();
    if (g.defined() && grad_version(entries_[i].param) != version && g.count_nonzero().item<std::int64_t>() > 0) {
      said_missed_ = true;
      std::fprintf(stderr,
                   "tensortap: warning: %s started training during step %lld; its gradient at step %lld was not "
                   "recorded (nothing of tensortap's ran in that step's backward before it: unfreeze layers at "
                   "the start of a step, or below layers that train)\n",
                   entries_[i].name.c_str(), static_cast<long long>(front_->current_step() - 1),
                   static_cast<long long>(front_->current_step() - 1));
    }
  }
  unhooked_hint_.store(unhooked_, std::memory_order_relaxed);
  // A hooked parameter's hook looks from now on: no callback needed.
  if (listening_ && hooked_ > 0) {
    listening_ = false;
    backward_unlisten(this);
  }
}

std::pair<std::size_t, std::size_t> ParamWatcher::watched_among(const std::unordered_set<const void*>& params) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t among = 0;
  for (const Entry& e : entries_) among += params.count(e.param.unsafeGetTensorImpl());
  return {among, entries_.size()};
}

void ParamWatcher::accumulate(std::size_t i, const at::Tensor& sparse_or_dense) {
  c10::NoGradGuard no_grad;
  // A sparse gradient (an Embedding with sparse=true) is recorded dense:
  // that is what .npy holds and what a user compares against.
  const at::Tensor grad = sparse_or_dense.is_sparse() ? sparse_or_dense.to_dense() : sparse_or_dense;
  const std::int64_t step = front_->current_step();
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= entries_.size()) return;  // detached meanwhile
  Entry& e = entries_[i];
  // record_grads() took this step's gradient as the optimizer applied it.
  if (e.taken_step == step) return;
  if (per_backward_) {
    // One record per backward pass (micro-batch): name, name#1, ...
    front_->record(Kind::Grad, e.name, grad, step);
    return;
  }
  if (gather_ && gathered(e, i, grad, step)) return;
  e.gathering = false;
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

void ParamWatcher::on_step_begin(std::int64_t step) {
  const bool params = front_->active(Kind::Param), buffers = front_->active(Kind::Buffer);
  std::lock_guard<std::mutex> lock(mu_);
  const bool grads_were_sampled = grads_sampled_;
  grads_sampled_ = front_->active(Kind::Grad);
  if (hooks_grads_) rehook(/*say_missed=*/grads_were_sampled);
  if (!params && !buffers) return;
  std::exception_ptr first;
  const auto record = [&](Kind kind, const std::string& name, const at::Tensor& t) {
    try {
      front_->record(kind, name, t, step);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  };
  if (params)
    for (const Entry& e : entries_) record(Kind::Param, e.name, e.param);
  if (buffers)
    for (const auto& [name, b] : buffers_)
      if (b.defined()) record(Kind::Buffer, name, b);
  if (first) std::rethrow_exception(first);
}

void ParamWatcher::record_grads(const std::unordered_set<const void*>& params, std::int64_t step) {
  if (!front_->active(Kind::Grad)) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::exception_ptr first;
  for (Entry& e : entries_) {
    if (params.count(e.param.unsafeGetTensorImpl()) == 0) continue;
    const at::Tensor& grad = e.param.grad();
    // No gradient yet (record_grads before backward(), or after a
    // zero_grad that set it to none): nothing to take now. The parameter
    // stays with the end-of-step record, the sum of the step's backward
    // passes, so nothing is lost; it was taken and dropped before.
    if (!grad.defined()) continue;
    // Exactly what the optimizer is about to apply.
    try {
      front_->record(Kind::Grad, e.name, grad.is_sparse() ? grad.to_dense() : grad, step);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    e.taken_step = step;
    e.pending = false;
  }
  if (first) std::rethrow_exception(first);
}

void ParamWatcher::on_step_end() {
  std::lock_guard<std::mutex> lock(mu_);
  // Most steps are not sampled: skip the walk over every parameter.
  if (!any_pending_) return;
  any_pending_ = false;
  if (!looked_for_gradless_) say_gradless();
  // A pass that never ended is forgotten with its marks (below): its
  // graph task's address may come back as a later pass's.
  for (Pass& p : passes_) {
    p.token = nullptr;
    p.entries.clear();
  }
  // One parameter that cannot be recorded must not cost the others theirs.
  // On CUDA with TENSORTAP_CUDA_BATCH=on, the step's gradients go as one
  // batch: their copies and statistics in one launch, not one each.
  front_->batched([&] {
    std::exception_ptr first;
    for (Entry& e : entries_) {
      if (!e.pending) continue;
      e.pending = false;
      // Left to a pass whose end never came (backward threw): nothing
      // was copied into the accumulator, so no record; said, by name.
      if (e.marks > 0) {
        e.marks = 0;
        try {
          fail("the gradient of '{}' in step {} is not recorded: the backward pass that produced it did not end "
               "(it threw), so its .grad was never read (TENSORTAP_CUDA_BATCH=on)",
               e.name, e.acc_step);
        } catch (...) {
          front_->hook_failed(std::current_exception());
        }
        continue;
      }
      try {
        front_->record(Kind::Grad, e.name, e.acc, e.acc_step);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  });
}

void ParamWatcher::say_gradless() {
  std::int64_t step = -1;
  for (const Entry& e : entries_)
    if (e.pending) step = e.acc_step;
  // Every gradient of the step was taken by record_grads: look at the next.
  if (step < 0) return;
  looked_for_gradless_ = true;
  std::vector<std::string> none;
  for (const Entry& e : entries_)
    if (e.hooked && !e.pending && e.taken_step != step) none.push_back(e.name);
  if (none.empty()) return;
  std::string names;
  for (std::size_t i = 0; i < none.size() && i < 5; ++i) names += (i ? ", '" : "'") + none[i] + "'";
  if (none.size() > 5) names += " and " + std::to_string(none.size() - 5) + " more";
  std::fprintf(stderr,
               "tensortap: warning: run '%s': %zu watched parameter(s) got no gradient in step %lld while others "
               "did: %s. If forward does not use one on purpose, ignore this; if it should, it may be left "
               "behind by a member reassigned after registration (`lm_head->weight = tok->weight` keeps the "
               "registered tensor, which forward no longer uses: tie with register_parameter(\"weight\", "
               "tok->weight) instead)\n",
               front_->placement().run_dir.c_str(), none.size(), static_cast<long long>(step), names.c_str());
}

void ParamWatcher::detach() noexcept {
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
  buffers_.clear();
  unhooked_ = 0;
  unhooked_hint_.store(0, std::memory_order_relaxed);
  if (listening_) {
    listening_ = false;
    backward_unlisten(this);
  }
}

}  // namespace tensortap::detail
