#include <tensortap/watch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/api/module.h>

#include <tensortap/tap.h>

#include "hooks/src/binding.h"
#include "writers/src/check.h"

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

  // Registers the gradient hooks; `self` is this watcher. A parameter that
  // does not require grad now (a frozen layer) cannot take a hook
  // (register_hook refuses it): it is hooked at the first step() that finds
  // it requiring grad (rehook), so a layer unfrozen later is recorded too.
  void hook_all(const std::shared_ptr<ParamWatcher>& self) {
    std::lock_guard<std::mutex> lock(mu_);
    self_ = self;
    hooks_grads_ = true;
    for (std::size_t i = 0; i < entries_.size(); ++i) hook(i, self);
  }

  // mu_ is held.
  void hook(std::size_t i, const std::shared_ptr<ParamWatcher>& self) {
    Entry& e = entries_[i];
    if (e.hooked) return;
    if (!e.param.requires_grad()) {
      ++unhooked_;
      return;
    }
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

  // At step(): hooks the parameters that have started to require grad.
  // mu_ is held. Nothing to walk in the common case, no frozen parameter.
  void rehook() {
    if (unhooked_ == 0) return;
    const std::shared_ptr<ParamWatcher> self = self_.lock();
    if (!self) return;
    unhooked_ = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) hook(i, self);
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
    if (hooks_grads_) rehook();
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
  // Whether say_gradless() has looked, once per watcher.
  bool looked_for_gradless_ = false;
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

// The name of the watched module's own output when it is a tap point and
// watch() was given no prefix (tensortap/watch.h).
constexpr const char* kRootTapName = "root";

std::string child_path(const std::string& parent, std::size_t i) {
  return parent.empty() ? std::to_string(i) : parent + "." + std::to_string(i);
}

// The name a recorder knows a parameter or tap point by.
std::string full_name(const std::string& prefix, const std::string& path) {
  return prefix.empty() ? path : prefix + "/" + path;
}

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The parameters and buffers of a module tree the recorder selects, by
// their full names; `each_param` and `each_buffer` call their argument with
// (path, tensor) for every one the tree has.
template <class EachParam, class EachBuffer>
std::pair<Named, Named> selected_tensors(const FrontEnd& front, const std::string& prefix, EachParam&& each_param,
                                         EachBuffer&& each_buffer) {
  const KindSet kinds = front.options().kinds();
  Named params, buffers;
  const auto take = [&](Named& into) {
    return [&](const std::string& path, const at::Tensor& t) {
      std::string name = full_name(prefix, path);
      if (front.selected(name)) into.emplace_back(std::move(name), t);
    };
  };
  if (kinds.contains(Kind::Grad) || kinds.contains(Kind::Param)) each_param(take(params));
  if (kinds.contains(Kind::Buffer)) each_buffer(take(buffers));
  return {std::move(params), std::move(buffers)};
}

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

void watch_tensors(const std::shared_ptr<FrontEnd>& front, Named params, Named buffers,
                   std::vector<FrontEnd::Claim> more_claims = {}) {
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

void attach(torch::nn::Module& module, const std::shared_ptr<FrontEnd>& front, const std::string& prefix) {
  const KindSet kinds = front->options().kinds();
  const bool want_taps = kinds.contains(Kind::Activation) || kinds.contains(Kind::ActivationGrad);

  // First find everything, and claim it, so that a watch() that fails
  // (the module is watched already, a name collides) changes nothing.
  auto [params, buffers] = selected_tensors(
      *front, prefix,
      [&](auto&& f) {
        for (const auto& item : module.named_parameters(/*recurse=*/true)) f(item.key(), item.value());
      },
      [&](auto&& f) {
        for (const auto& item : module.named_buffers(/*recurse=*/true)) f(item.key(), item.value());
      });
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
      // The watched module itself (`watch(*tapped_net)`) has no path: its
      // output is recorded under the prefix, or as "root".
      std::string name = path.empty() ? (prefix.empty() ? std::string(kRootTapName) : prefix) : full_name(prefix, path);
      if (front->selected(name)) points.push_back({owner, &point, std::move(name)});
    };
    for (const auto& [path, ptr] : modules) {
      torch::nn::Module& m = ptr ? *ptr : module;
      auto* point = dynamic_cast<TapPoint*>(&m);
      if (point != nullptr && ptr) add(ptr, *point, path);
      if (point != nullptr && !ptr && front->selected(prefix.empty() ? kRootTapName : prefix)) {
        // The root was silently left unbound (issue 47). Binding keeps a
        // weak owner so that close() unbinds only a module still alive: a
        // root that no shared_ptr holds (a TappedImpl on the stack; a
        // Tapped<M> holder always does) cannot be bound safely, and says so.
        std::shared_ptr<torch::nn::Module> owner;
        try {
          owner = module.shared_from_this();
        } catch (const std::bad_weak_ptr&) {
        }
        if (owner)
          add(owner, *point, "");
        else
          std::fprintf(stderr,
                       "tensortap: warning: the watched module is a tap point (a Tapped<M>'s module) that no "
                       "std::shared_ptr holds, so its output is not recorded: watch it through its holder "
                       "(Tapped<M> m; watch(*m, ...)) or std::make_shared\n");
      }
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
  // Two tap points of one module under one name: the root's "root" (or the
  // prefix) and a submodule registered so. Each would record over the other.
  std::unordered_map<std::string, const TapPoint*> named_points;
  for (const Point& p : points) {
    const auto [it, fresh] = named_points.emplace(p.name, p.point);
    TENSORTAP_CHECK(fresh || it->second == p.point,
                    "watch(): two tap points would both be recorded as '{}' (the watched module's own output is "
                    "named by watch()'s prefix, or 'root'): give watch() a prefix, or rename the submodule",
                    p.name);
  }
  std::vector<FrontEnd::Claim> tap_claims;
  for (const Point& p : points) tap_claims.push_back({p.point, Kind::Activation, p.name});
  watch_tensors(front, std::move(params), std::move(buffers), std::move(tap_claims));
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

std::shared_ptr<Recorder> watch(torch::jit::Module& module, Options options) {
  auto recorder = std::make_shared<Recorder>(std::move(options));
  watch(module, *recorder, "");
  return recorder;
}

void watch(torch::jit::Module& module, Recorder& recorder, const std::string& prefix) {
  const std::shared_ptr<detail::FrontEnd> front = detail::RecorderAccess::front_end(recorder);
  // Its parameters and buffers are leaf tensors like an nn::Module's: the
  // same hooks apply. (A scripted module's submodules take no forward hook
  // from C++: no tap points.)
  auto [params, buffers] = detail::selected_tensors(
      *front, prefix,
      [&](auto&& f) {
        for (const auto& item : module.named_parameters(/*recurse=*/true)) f(item.name, item.value);
      },
      [&](auto&& f) {
        for (const auto& item : module.named_buffers(/*recurse=*/true)) f(item.name, item.value);
      });
  detail::watch_tensors(front, std::move(params), std::move(buffers));
}

}  // namespace tensortap
