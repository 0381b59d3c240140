// A step's parameter gradients read from `.grad` at the end of each
// backward pass, every one of the pass in one launch a device
// (TENSORTAP_CUDA_BATCH=on; ParamWatcher's comment, param_watcher.h).
#include "hooks/src/param_watcher.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

// Whether the pass whose table is `pass` sums `param`'s gradient into its
// `.grad`: every pass of backward() does, one of torch::autograd::grad
// (which takes the gradient instead) does not.
template <class Table>
bool accumulates(const Table& pass, const at::Tensor& param) {
  if (pass.empty()) return true;  // every node runs
  const std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::try_get_grad_accumulator(param);
  if (!node) return false;
  const auto it = pass.find(node.get());
  return it != pass.end() && it->second.needed_;
}

}  // namespace

ParamWatcher::GradState ParamWatcher::grad_state(const at::Tensor& param) {
  const at::Tensor& g = param.grad();
  if (!g.defined()) return {};
  return {g.unsafeGetTensorImpl(), static_cast<std::int64_t>(g._version())};
}

bool ParamWatcher::gathered(Entry& e, std::size_t i, const at::Tensor& grad, std::int64_t step) {
  // The running pass (its graph task), by the address of its own table.
  const auto* pass = torch::autograd::get_current_graph_task_exec_info();
  if (pass == nullptr || !front_->gathers(grad) || !accumulates(*pass, e.param)) return false;
  const GradState now = grad_state(e.param);
  if (e.pending && e.acc_step == step) {
    // A later pass of the step: `.grad` holds the sum so far only as the
    // last gather left it (else `acc` does, and takes this pass's), or
    // while passes overlap (backward on several threads), as the last of
    // them to end will find it.
    if (!e.gathering || (e.marks == 0 && now != e.seen)) return false;
  } else {
    // The step's first pass: `.grad` must start empty.
    if (now.impl != nullptr) return false;
    if (!(e.acc.defined() && e.acc.sizes() == grad.sizes() && e.acc.dtype() == grad.dtype() &&
          e.acc.device() == grad.device() && e.acc.is_contiguous()))
      e.acc = at::empty(grad.sizes(), grad.options().memory_format(at::MemoryFormat::Contiguous));
  }
  Pass* const running = pass_of(pass);
  if (running == nullptr) return false;
  if (!(e.pending && e.acc_step == step)) {
    e.acc_step = step;
    e.pending = true;
    any_pending_ = true;
  }
  if (e.marks++ == 0) e.seen = now;
  e.gathering = true;
  running->entries.push_back(i);
  return true;
}

ParamWatcher::Pass* ParamWatcher::pass_of(const void* token) {
  Pass* free = nullptr;
  for (Pass& p : passes_) {
    if (p.token == token) return &p;
    if (p.token == nullptr && free == nullptr) free = &p;
  }
  const std::shared_ptr<ParamWatcher> self = self_.lock();
  if (!self) return nullptr;
  // Queued before anything is left to it: without the callback, the
  // accumulator takes the gradient.
  torch::autograd::Engine::get_default_engine().queue_callback([self, token] { self->pass_ended(token); });
  if (free == nullptr) {
    passes_.emplace_back();
    free = &passes_.back();
  }
  free->token = token;
  return free;
}

void ParamWatcher::pass_ended(const void* token) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  Pass* pass = nullptr;
  for (Pass& p : passes_)
    if (p.token == token) pass = &p;
  if (pass == nullptr) return;  // the step ended meanwhile (on_step_end)
  std::vector<at::Tensor> from, into;
  for (const std::size_t k : pass->entries) {
    if (k >= entries_.size()) break;  // detached meanwhile
    Entry& e = entries_[k];
    if (e.marks == 0 || --e.marks > 0 || !e.pending) continue;
    try {
      from.push_back(gather_source(e));
      into.push_back(e.acc);
    } catch (...) {
      front_->hook_failed(std::current_exception());
    }
  }
  pass->token = nullptr;
  pass->entries.clear();
  try {
    if (!from.empty()) front_->gather(from, into);
  } catch (...) {
    front_->hook_failed(std::current_exception());
  }
}

at::Tensor ParamWatcher::gather_source(Entry& e) {
  const GradState now = grad_state(e.param);
  const at::Tensor& g = e.param.grad();
  const bool changed = now != e.seen;
  e.seen = now;
  if (changed && !g.is_sparse() && g.sizes() == e.acc.sizes() && g.scalar_type() == e.acc.scalar_type() &&
      g.device() == e.acc.device())
    return g;
  e.pending = false;
  e.gathering = false;
  // Nothing more of the step (as after record_grads()): a later pass's
  // gradient alone is not its sum.
  e.taken_step = e.acc_step;
  // The gradient its hook saw is gone: from the next step the hooks copy.
  gather_ = false;
  if (!changed)
    fail("the gradient of '{}' in step {} did not reach its .grad in its backward pass, where "
         "TENSORTAP_CUDA_BATCH=on reads it: not recorded in this step; from the next step the hooks copy every "
         "gradient",
         e.name, e.acc_step);
  fail("the gradient of '{}' in step {} cannot be read from its .grad ({}), which is not a dense tensor of its "
       "gradient's dtype and shape: not recorded in this step; from the next step the hooks copy every gradient",
       e.name, e.acc_step, describe_grad(g));
}

std::string ParamWatcher::describe_grad(const at::Tensor& g) {
  return g.defined() ? std::string(g.is_sparse() ? "sparse " : "") + c10::toString(g.scalar_type()) + " " +
                           c10::str(g.sizes())
                     : std::string("none");
}

}  // namespace tensortap::detail
