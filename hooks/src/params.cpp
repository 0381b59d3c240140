// Parameters and buffers of a watched module: gradient hooks, the
// end-of-step gradient record, record_grads(), and parameter and buffer
// records at step starts.
#include "hooks/src/params.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "hooks/src/backward.h"

namespace tensortap::detail {
namespace {

// Gradient hooks on parameters, and parameter snapshots at step starts.
//
// A parameter hook fires once per backward pass with that pass's gradient,
// before it is accumulated into `.grad`. The record the user wants is what
// the optimizer sees, the sum over the step's passes, whatever the loop does
// with zero_grad(): so the hooks sum into an accumulator of their own,
// committed when the step ends. The accumulator is allocated once per
// parameter and reused, so sampled steps do not allocate after the first.
class ParamWatcher final : public Watcher, public BackwardListener {
 public:
  struct Entry {
    std::string name;
    at::Tensor param;
    bool hooked = false;
    unsigned hook = 0;
    at::Tensor acc;
    std::int64_t acc_step = -1;
    bool pending = false;
    // The step in which record_grads() recorded this parameter: its
    // end-of-step record is not written, and later passes are not added.
    std::int64_t taken_step = -1;
    // While frozen (not hooked): the version of its `.grad()` then, or -1
    // without one, to tell at hooking whether it trained unseen.
    std::int64_t frozen_grad_version = -2;
  };

  explicit ParamWatcher(std::shared_ptr<FrontEnd> front)
      : front_(std::move(front)), per_backward_(front_->options().grad_per_backward()) {}

  const FrontEnd& front() const { return *front_; }

  void add(std::string name, at::Tensor param) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry e;
    e.name = std::move(name);
    e.param = std::move(param);
    entries_.push_back(std::move(e));
  }

  void add_buffer(std::string name, at::Tensor buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.emplace_back(std::move(name), std::move(buffer));
  }

  // Registers the gradient hooks; `self` is this watcher. A parameter that
  // does not require grad now (a frozen layer) cannot take a hook
  // (register_hook refuses it). A layer unfrozen during a step trains in
  // that step's backward, so it is hooked before its gradient is
  // accumulated: at the step's first gradient hook of a parameter already
  // hooked (autograd accumulates a layer's gradient before those of the
  // layers below it, so this is in time for a layer unfrozen below
  // trainable ones: a fine-tune's gradual unfreezing). When no watched
  // parameter is hooked (all frozen), nothing of ours runs in backward: the
  // first backward node of a step looks instead, through a RecordFunction
  // callback (backward.h), which costs every ATen op a check while it is
  // on, so only then. step() looks too, and says what was missed (rehook).
  void hook_all(const std::shared_ptr<ParamWatcher>& self) {
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

  ~ParamWatcher() override {
    if (listening_) backward_unlisten(this);
  }

  // In a backward pass, from a hook or the first node: a parameter
  // unfrozen since step() gets its hook now. Once a step: a layer unfrozen
  // between two backward passes of one step, after this looked, is hooked
  // at the next step(), which says what was missed.
  void look_for_unfrozen() noexcept {
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

  void backward_node() noexcept override { look_for_unfrozen(); }

  // mu_ is held. Whether `i` was hooked now.
  bool hook(std::size_t i, const std::shared_ptr<ParamWatcher>& self) {
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

  static std::int64_t grad_version(const at::Tensor& param) {
    const at::Tensor& g = param.grad();
    return g.defined() ? static_cast<std::int64_t>(g._version()) : -1;
  }

  // Hooks the parameters that have started to require grad. mu_ is held.
  // Nothing to walk in the common case, no frozen parameter. With
  // `say_missed` (at step(), after a step that recorded gradients), a
  // parameter that got a gradient while it was not hooked trained
  // unrecorded in the step before: said once.
  void rehook(bool say_missed) {
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

  std::pair<std::size_t, std::size_t> watched_among(const std::unordered_set<const void*>& params) const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t among = 0;
    for (const Entry& e : entries_) among += params.count(e.param.unsafeGetTensorImpl());
    return {among, entries_.size()};
  }

  void accumulate(std::size_t i, const at::Tensor& sparse_or_dense) {
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

  void record_grads(const std::unordered_set<const void*>& params, std::int64_t step) override {
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

  void on_step_end() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Most steps are not sampled: skip the walk over every parameter.
    if (!any_pending_) return;
    any_pending_ = false;
    if (!looked_for_gradless_) say_gradless();
    // One parameter that cannot be recorded must not cost the others theirs.
    // On CUDA with TENSORTAP_CUDA_BATCH=on, the step's gradients go as one
    // batch: their copies and statistics in one launch, not one each.
    front_->batched([&] {
      std::exception_ptr first;
      for (Entry& e : entries_) {
        if (!e.pending) continue;
        e.pending = false;
        try {
          front_->record(Kind::Grad, e.name, e.acc, e.acc_step);
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
      if (first) std::rethrow_exception(first);
    });
  }

  // Once, at the first sampled step in which watched parameters got
  // gradients: those hooked that got none. A parameter whose module member
  // was reassigned after it was registered (a literal port of Python's
  // `lm_head.weight = tok.weight`) is such an orphan: registered, hooked,
  // never used by forward, so never recorded, and nothing said so.
  void say_gradless() {
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
    buffers_.clear();
    unhooked_ = 0;
    unhooked_hint_.store(0, std::memory_order_relaxed);
    if (listening_) {
      listening_ = false;
      backward_unlisten(this);
    }
  }

 private:
  std::shared_ptr<FrontEnd> front_;
  const bool per_backward_;
  mutable std::mutex mu_;
  // This watcher, for the hooks rehook() registers; set by hook_all().
  std::weak_ptr<ParamWatcher> self_;
  // Whether gradients are hooked at all, and how many parameters were left
  // unhooked because they did not require grad (rehook() walks only then).
  bool hooks_grads_ = false;
  std::size_t unhooked_ = 0;
  // unhooked_ for backward_node(), read without the lock; the step it last
  // looked in.
  std::atomic<std::size_t> unhooked_hint_{0};
  std::atomic<std::int64_t> rechecked_step_{-1};
  // How many parameters are hooked; listening for backward passes (some
  // parameter is frozen and none hooked).
  std::size_t hooked_ = 0;
  bool listening_ = false;
  // Whether the current step records gradients (for what rehook says).
  bool grads_sampled_ = false;
  // A parameter that trained unrecorded was said (once).
  bool said_missed_ = false;
  // Whether say_gradless() has looked, once per watcher.
  bool looked_for_gradless_ = false;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, at::Tensor>> buffers_;
  bool any_pending_ = false;
};

// Claims `params` and `buffers` for the recorder (throws, changing nothing,
// on a collision) and hooks them: gradients, parameter and buffer records.
// One tensor under several names (tied weights: an embedding and the output
// layer sharing a matrix, registered in both): kept once, under its first
// name; `aliases` gets (first name, the others).
Named once_each(Named named, std::vector<std::pair<std::string, std::vector<std::string>>>& aliases) {
  std::unordered_map<const void*, std::size_t> first;
  Named kept;
  std::vector<std::vector<std::string>> others;
  for (auto& [name, t] : named) {
    const auto [it, fresh] = first.emplace(t.unsafeGetTensorImpl(), kept.size());
    if (fresh) {
      kept.emplace_back(std::move(name), std::move(t));
      others.emplace_back();
    } else {
      others[it->second].push_back(std::move(name));
    }
  }
  for (std::size_t i = 0; i < kept.size(); ++i)
    if (!others[i].empty()) aliases.emplace_back(kept[i].first, std::move(others[i]));
  return kept;
}

}  // namespace

void watch_tensors(const std::shared_ptr<FrontEnd>& front, Named params, Named buffers,
                   std::vector<FrontEnd::Claim> more_claims) {
  // A tied weight was recorded once per name, the same bytes twice, with
  // nothing saying they were one tensor.
  std::vector<std::pair<std::string, std::vector<std::string>>> aliases;
  params = once_each(std::move(params), aliases);
  buffers = once_each(std::move(buffers), aliases);
  std::vector<FrontEnd::Claim> claims;
  for (const auto& [name, t] : params) claims.push_back({t.unsafeGetTensorImpl(), Kind::Grad, name});
  for (const auto& [name, t] : buffers) claims.push_back({t.unsafeGetTensorImpl(), Kind::Buffer, name});
  claims.insert(claims.end(), more_claims.begin(), more_claims.end());
  front->claim(claims);
  for (const auto& [name, others] : aliases) front->add_aliases(name, others);
  const KindSet kinds = front->options().kinds();
  if (!kinds.contains(Kind::Grad) && !kinds.contains(Kind::Param) && !kinds.contains(Kind::Buffer)) return;
  auto watcher = std::make_shared<ParamWatcher>(front);
  for (auto& [name, t] : params) watcher->add(std::move(name), std::move(t));
  for (auto& [name, t] : buffers) watcher->add_buffer(std::move(name), std::move(t));
  if (kinds.contains(Kind::Grad)) watcher->hook_all(watcher);
  front->add_watcher(watcher);
}


}  // namespace tensortap::detail
