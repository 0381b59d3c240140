#pragma once

// The watcher of a module's parameters and buffers (param_watcher.cpp; its
// gradients gathered at a backward pass's end, param_gather.cpp).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "hooks/src/backward.h"
#include "sdk/src/front/front_end.h"

namespace tensortap::detail {

// Gradient hooks on parameters, and parameter snapshots at step starts.
//
// A parameter hook fires once per backward pass with that pass's gradient,
// before it is accumulated into `.grad`. The record the user wants is what
// the optimizer sees, the sum over the step's passes, whatever the loop does
// with zero_grad(): so the hooks sum into an accumulator of their own,
// committed when the step ends. The accumulator is allocated once per
// parameter and reused, so sampled steps do not allocate after the first.
//
// With TENSORTAP_CUDA_BATCH=on (FrontEnd::gathers), a CUDA parameter
// whose `.grad` is none at the step's first pass (zero_grad's default in
// LibTorch 2.x) costs its hook no copy: autograd's own sum into `.grad`
// (the first pass's gradient taken as it is, then `+=`, the same
// operations as the accumulator's, so the same bits) is gathered into the
// accumulators at the end of each backward pass, every parameter of the
// pass in one launch (FrontEnd::gather), before anything the user does
// after backward (clipping). The hook holds no reference to the gradient,
// so autograd still takes it without a copy. A pass that does not
// accumulate (torch::autograd::grad) and a `.grad` changed between passes
// go the accumulator's way.
class ParamWatcher final : public Watcher, public BackwardListener {
 public:
  explicit ParamWatcher(std::shared_ptr<FrontEnd> front)
      : front_(std::move(front)), per_backward_(front_->options().grad_per_backward()) {}

  const FrontEnd& front() const { return *front_; }

  void add(std::string name, at::Tensor param);

  void add_buffer(std::string name, at::Tensor buffer);

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
  void hook_all(const std::shared_ptr<ParamWatcher>& self);

  ~ParamWatcher() override;

  // In a backward pass, from a hook or the first node: a parameter
  // unfrozen since step() gets its hook now. Once a step: a layer unfrozen
  // between two backward passes of one step, after this looked, is hooked
  // at the next step(), which says what was missed.
  void look_for_unfrozen() noexcept;

  void backward_node() noexcept override { look_for_unfrozen(); }

  std::pair<std::size_t, std::size_t> watched_among(const std::unordered_set<const void*>& params) const override;

  void on_step_begin(std::int64_t step) override;

  void record_grads(const std::unordered_set<const void*>& params, std::int64_t step) override;

  void on_step_end() override;

  void detach() noexcept override;


 private:
  // A parameter's `.grad` by identity and version: changed by every
  // accumulation (taken, `+=`, or replaced) and by anything else that
  // writes it.
  struct GradState {
    const void* impl = nullptr;
    std::int64_t version = -1;
    bool operator==(const GradState& o) const { return impl == o.impl && version == o.version; }
    bool operator!=(const GradState& o) const { return !(*this == o); }
  };
  static GradState grad_state(const at::Tensor& param);

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
    // Gathered (TENSORTAP_CUDA_BATCH=on): the step's sum is `.grad`,
    // copied into `acc` at each backward pass's end; `marks`, the passes
    // running that left it there; `seen`, `.grad` before the first of them
    // accumulated, or after the last copy.
    bool gathering = false;
    int marks = 0;
    GradState seen;
  };

  // A hook: this pass's gradient of entry `i`, summed into its accumulator
  // or left to `.grad` (gathered).
  void accumulate(std::size_t i, const at::Tensor& sparse_or_dense);

  // mu_ is held. Whether `i` was hooked now.
  bool hook(std::size_t i, const std::shared_ptr<ParamWatcher>& self);

  static std::int64_t grad_version(const at::Tensor& param);

  // Hooks the parameters that have started to require grad. mu_ is held.
  // Nothing to walk in the common case, no frozen parameter. With
  // `say_missed` (at step(), after a step that recorded gradients), a
  // parameter that got a gradient while it was not hooked trained
  // unrecorded in the step before: said once.
  void rehook(bool say_missed);

  // Once, at the first sampled step in which watched parameters got
  // gradients: those hooked that got none. A parameter whose module member
  // was reassigned after it was registered (a literal port of Python's
  // `lm_head.weight = tok.weight`) is such an orphan: registered, hooked,
  // never used by forward, so never recorded, and nothing said so.
  void say_gradless();

  // mu_ is held. Whether this pass's gradient of `e` (entry `i`) is left
  // to autograd's sum in `.grad`, gathered at the pass's end (the class's
  // comment); false: the accumulator takes it.
  bool gathered(Entry& e, std::size_t i, const at::Tensor& grad, std::int64_t step);

  // A backward pass whose end gathers (its graph task's table, `token`),
  // and the entries it left to `.grad`. Kept, with their memory, for the
  // next passes: no allocation a pass once warm.
  struct Pass {
    const void* token = nullptr;
    std::vector<std::size_t> entries;
  };

  // mu_ is held. The pass `token`'s, made (its final callback queued) at
  // its first entry; null if autograd refuses the callback.
  Pass* pass_of(const void* token);


  // Autograd's final callback of pass `token`: each entry it left to
  // `.grad`, once no other pass running has it, is copied into its
  // accumulator, every one in one launch a device.
  void pass_ended(const void* token) noexcept;

  // mu_ is held: entry `e`'s `.grad` at the end of the last pass that left
  // its gradient there; throws, giving up the step's record of it, when
  // that is not its sum.
  at::Tensor gather_source(Entry& e);

  static std::string describe_grad(const at::Tensor& g);

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
  // Gradients may be gathered at a pass's end (FrontEnd::gathers); off
  // for good once a pass's `.grad` was not its sum. The passes running.
  bool gather_ = true;
  std::vector<Pass> passes_;
};

}  // namespace tensortap::detail
