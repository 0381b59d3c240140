#include <tensortap/watch.h>

#include <algorithm>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

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
    // The step in which record_grads() recorded this parameter: its
    // end-of-step record is not written, and later passes are not added.
    std::int64_t taken_step = -1;
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

  // Registers the gradient hooks; `self` is this watcher.
  void hook_all(const std::shared_ptr<ParamWatcher>& self) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (!e.param.requires_grad()) continue;
      e.hook = e.param.register_hook([self, i](const at::Tensor& grad) {
        if (!self->front().active(Kind::Grad)) return;
        try {
          self->accumulate(i, grad);
        } catch (...) {
          self->front_->hook_failed(std::current_exception());
        }
      });
      e.hooked = true;
    }
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
    if (!params && !buffers) return;
    std::lock_guard<std::mutex> lock(mu_);
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
    // One parameter that cannot be recorded must not cost the others theirs.
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
  }

 private:
  std::shared_ptr<FrontEnd> front_;
  const bool per_backward_;
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, at::Tensor>> buffers_;
  bool any_pending_ = false;
};

// Unbinds the tap points of one watch() call on close.
class TapWatcher final : public Watcher {
 public:
  explicit TapWatcher(bool ops) : ops_(ops) {
    if (ops_) op_capture_acquire();
  }
  ~TapWatcher() override { detach(); }

  void add(const std::shared_ptr<torch::nn::Module>& owner, TapPoint& point, std::shared_ptr<TapBinding> binding) {
    points_.push_back({owner, &point, binding.get()});
    TapPointAccess::bind(point, std::move(binding));
  }
  void detach() noexcept override {
    for (auto& p : points_)
      if (auto alive = p.owner.lock()) TapPointAccess::unbind(*p.point, p.binding);
    points_.clear();
    if (ops_) op_capture_release();
    ops_ = false;
  }

 private:
  struct Bound {
    std::weak_ptr<torch::nn::Module> owner;  // keeps `point` valid while it lives
    TapPoint* point;
    const TapBinding* binding;
  };
  std::vector<Bound> points_;
  bool ops_;
};

std::string child_path(const std::string& parent, std::size_t i) {
  return parent.empty() ? std::to_string(i) : parent + "." + std::to_string(i);
}

// The name a recorder knows a parameter or tap point by.
std::string full_name(const std::string& prefix, const std::string& path) {
  return prefix.empty() ? path : prefix + "/" + path;
}

void attach(torch::nn::Module& module, const std::shared_ptr<FrontEnd>& front, const std::string& prefix) {
  const KindSet kinds = front->options().kinds();
  const bool want_params = kinds.contains(Kind::Grad) || kinds.contains(Kind::Param);
  const bool want_buffers = kinds.contains(Kind::Buffer);
  const bool want_taps = kinds.contains(Kind::Activation) || kinds.contains(Kind::ActivationGrad);

  // First find everything, and claim it, so that a watch() that fails
  // (the module is watched already, a name collides) changes nothing.
  std::vector<std::pair<std::string, at::Tensor>> params;
  if (want_params)
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      std::string name = full_name(prefix, item.key());
      if (front->selected(name)) params.emplace_back(std::move(name), item.value());
    }
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  if (want_buffers)
    for (const auto& item : module.named_buffers(/*recurse=*/true)) {
      std::string name = full_name(prefix, item.key());
      if (front->selected(name)) buffers.emplace_back(std::move(name), item.value());
    }
  struct Point {
    std::shared_ptr<torch::nn::Module> owner;
    TapPoint* point;
    std::string name;
  };
  std::vector<Point> points;
  if (want_taps) {
    // Without include_self: named_modules() needs shared_from_this() for the
    // root, and a root on the stack has none.
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules{{"", nullptr}};
    for (const auto& item : module.named_modules("", /*include_self=*/false))
      modules.emplace_back(item.key(), item.value());
    const auto add = [&](const std::shared_ptr<torch::nn::Module>& owner, TapPoint& point, const std::string& path) {
      std::string name = full_name(prefix, path);
      if (front->selected(name)) points.push_back({owner, &point, std::move(name)});
    };
    for (const auto& [path, ptr] : modules) {
      torch::nn::Module& m = ptr ? *ptr : module;
      if (auto* point = dynamic_cast<TapPoint*>(&m); point != nullptr && ptr) add(ptr, *point, path);
      auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m);
      if (seq == nullptr) continue;
      std::size_t i = 0;
      for (torch::nn::AnyModule& child : *seq) {
        const std::string path_i = child_path(path, i++);
        // A child that is a tap point itself (a Tap, a Tapped<M>) is bound above.
        if (dynamic_cast<TapPoint*>(child.ptr().get()) == nullptr &&
            front->taps_sequential_child(full_name(prefix, path_i)))
          child = make_sequential_tap(std::move(child));
        if (auto wrapper = child.ptr(); wrapper && dynamic_cast<TapPoint*>(wrapper.get()) != nullptr &&
                                        std::find_if(modules.begin(), modules.end(), [&](const auto& mm) {
                                          return mm.second == wrapper;
                                        }) == modules.end())
          add(wrapper, *dynamic_cast<TapPoint*>(wrapper.get()), path_i);
      }
    }
  }
  std::vector<FrontEnd::Claim> claims;
  for (const auto& [name, t] : params) claims.push_back({t.unsafeGetTensorImpl(), Kind::Grad, name});
  for (const auto& [name, t] : buffers) claims.push_back({t.unsafeGetTensorImpl(), Kind::Buffer, name});
  for (const Point& p : points) claims.push_back({p.point, Kind::Activation, p.name});
  front->claim(claims);

  if (want_params || want_buffers) {
    auto watcher = std::make_shared<ParamWatcher>(front);
    for (auto& [name, t] : params) watcher->add(std::move(name), std::move(t));
    for (auto& [name, t] : buffers) watcher->add_buffer(std::move(name), std::move(t));
    if (kinds.contains(Kind::Grad)) watcher->hook_all(watcher);
    front->add_watcher(watcher);
  }
  if (want_taps) {
    auto taps = std::make_shared<TapWatcher>(front->options().capture_ops() && kinds.contains(Kind::Activation));
    for (Point& p : points) taps->add(p.owner, *p.point, std::make_shared<TapBinding>(TapBinding{front, p.name}));
    front->add_watcher(taps);
  }
}

}  // namespace
}  // namespace detail

std::shared_ptr<Recorder> watch(torch::nn::Module& module, Options options) {
  auto recorder = std::make_shared<Recorder>(std::move(options));
  watch(module, *recorder);
  return recorder;
}

void watch(torch::nn::Module& module, Recorder& recorder, const std::string& prefix) {
  detail::attach(module, detail::RecorderAccess::front_end(recorder), prefix);
}

}  // namespace tensortap
