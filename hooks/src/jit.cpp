// watch() of a TorchScript module (torch::jit::Module): its parameters and
// buffers like an nn::Module's, and op capture. A scripted module takes no
// forward hook from C++, so there is no tap point inside it; with
// Options::capture_ops its step's ops are recorded instead: every top-level
// ATen op the thread that called step() runs from step() to the step's
// first backward pass, named by the op (`aten::linear`, `aten::linear#1`),
// or `<prefix>/<op>` under a watch() prefix. The loss and whatever else the
// loop computes in that span are ops of that thread too, and recorded.
#include <atomic>
#include <memory>

#include <torch/csrc/jit/api/module.h>

#include <tensortap/watch.h>

#include "hooks/src/backward.h"
#include "hooks/src/binding.h"
#include "hooks/src/params.h"

namespace tensortap {
namespace detail {
namespace {

class JitOpWatcher final : public Watcher, public BackwardListener {
 public:
  JitOpWatcher(std::shared_ptr<FrontEnd> front, std::string prefix) : bindings_(std::make_shared<TapBindings>()) {
    bindings_->items.push_back(std::make_shared<TapBinding>(TapBinding{std::move(front), std::move(prefix), &open_}));
    op_capture_acquire();
  }
  ~JitOpWatcher() override { detach(); }

  void start(const std::shared_ptr<JitOpWatcher>& self) {
    backward_listen(self);
    listening_ = true;
  }

  // On the thread that called step(): its ops are the step's from now on.
  void on_step_begin(std::int64_t step) override {
    open_.store(step, std::memory_order_relaxed);
    op_step_scope(bindings_);
  }

  // Backward began: what runs after it (autograd's kernels, the optimizer)
  // is not the model's forward.
  void backward_node() noexcept override { open_.store(-1, std::memory_order_relaxed); }

  void detach() noexcept override {
    open_.store(-1, std::memory_order_relaxed);
    if (listening_) {
      listening_ = false;
      backward_unlisten(this);
    }
    if (acquired_) {
      acquired_ = false;
      op_capture_release();
    }
    // Another thread's scope, if step() was called from several, lets go
    // when this watcher does: it holds the bindings by a weak reference.
    bindings_.reset();
  }

 private:
  std::shared_ptr<TapBindings> bindings_;
  // The step whose ops are recorded, or -1 once its backward began.
  std::atomic<std::int64_t> open_{-1};
  bool listening_ = false;
  bool acquired_ = true;
};

}  // namespace
}  // namespace detail

std::shared_ptr<Recorder> watch(torch::jit::Module& module, Options options) {
  auto recorder = std::make_shared<Recorder>(std::move(options));
  watch(module, *recorder, "");
  return recorder;
}

void watch(torch::jit::Module& module, Recorder& recorder, const std::string& prefix) {
  const std::shared_ptr<detail::FrontEnd> front = detail::RecorderAccess::front_end(recorder);
  if (front->off()) return;  // TENSORTAP=off: no hook
  // Its parameters and buffers are leaf tensors like an nn::Module's: the
  // same hooks apply.
  auto [params, buffers] = detail::selected_tensors(
      *front, prefix,
      [&](auto&& f) {
        for (const auto& item : module.named_parameters(/*recurse=*/true)) f(item.name, item.value);
      },
      [&](auto&& f) {
        for (const auto& item : module.named_buffers(/*recurse=*/true)) f(item.name, item.value);
      });
  detail::watch_tensors(front, std::move(params), std::move(buffers));
  if (front->options().capture_ops() && front->options().kinds().contains(Kind::Activation)) {
    auto ops = std::make_shared<detail::JitOpWatcher>(front, prefix);
    ops->start(ops);
    front->add_watcher(ops);
  }
}

}  // namespace tensortap
