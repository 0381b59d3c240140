#include <tensortap/tap.h>

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/modules/activation.h>
#include <torch/version.h>

#include <tensortap/error.h>

#include "hooks/src/binding.h"
#include "writers/src/check.h"

namespace tensortap {
namespace detail {

at::Tensor tap_capture(const TapBinding& b, at::Tensor x, const std::string& suffix) {
  // An output a module leaves undefined (MultiheadAttention's weights with
  // need_weights=false) is no tensor to record, and no error.
  if (!x.defined()) return x;
  FrontEnd& front = *b.front;
  const bool want_act = front.active(Kind::Activation);
  const bool want_grad = front.active(Kind::ActivationGrad) && x.requires_grad() && c10::GradMode::is_enabled();
  if (!want_act && !want_grad) return x;
  const std::int64_t step = front.current_step();
  // Built only for a tuple's element: a plain output allocates nothing here.
  std::string with_suffix;
  if (!suffix.empty()) with_suffix = b.name + suffix;
  const std::string& full = suffix.empty() ? b.name : with_suffix;
  if (want_act) front.record(Kind::Activation, full, x, step);
  if (!want_grad) return x;
  // The hook goes on a view, not on x: x may be a leaf or be used elsewhere,
  // and what we want is the gradient of what flows on from the tap point.
  at::Tensor y = x.view_as(x);
  y.register_hook(
      [front = b.front, name = front.repeat_name(Kind::ActivationGrad, full, step), step](const at::Tensor& grad) {
        try {
          front->record_as(Kind::ActivationGrad, name, grad, step);
        } catch (...) {
          front->hook_failed(std::current_exception());
        }
      });
  return y;
}

namespace {

// A child of an instrumented Sequential: calls the child, taps its output.
// It replaces the child only in the Sequential's list of modules to run, not
// among its registered children, so parameter names do not change.
class SequentialTapImpl : public torch::nn::Module, public TapPoint {
 public:
  explicit SequentialTapImpl(torch::nn::AnyModule inner) : inner_(std::move(inner)) {}
  std::shared_ptr<torch::nn::Module> clone(const torch::optional<torch::Device>& = torch::nullopt) const override {
    // SequentialImpl::clone() would register this wrapper as the child and
    // drop the layer's parameters from the copy: refuse rather than do that.
    detail::fail(
        "a Sequential tapped by tap_sequential() or Options::tap_sequential cannot be cloned; clone the model before "
        "watching it");
  }
  torch::Tensor forward(torch::Tensor x) {
    OpScope scope(*this);
    // The wrapper is not a registered child: eval() reaches the child only.
    return tap_output(inner_.forward(std::move(x)), inner_.ptr()->is_training());
  }

 private:
  torch::nn::AnyModule inner_;
};

}  // namespace
}  // namespace detail

namespace detail {
namespace {

// Holds a tap point's reader count while a forward reads its bindings.
class Reading {
 public:
  explicit Reading(std::atomic<int>& readers) : readers_(readers) { readers_.fetch_add(1, std::memory_order_seq_cst); }
  ~Reading() { readers_.fetch_sub(1, std::memory_order_release); }
  Reading(const Reading&) = delete;
  Reading& operator=(const Reading&) = delete;

 private:
  std::atomic<int>& readers_;
};

// Recorder::scope("eval") around an eval-mode pass's records.
class EvalScope {
 public:
  EvalScope(FrontEnd& front, bool on) {
    if (!on) return;
    front.push_scope("eval");
    front_ = &front;
  }
  ~EvalScope() {
    if (front_ != nullptr) front_->pop_scope();
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  FrontEnd* front_ = nullptr;
};

bool wants_ops(const TapBindings& list) {
  for (const auto& b : list.items)
    if (b->front->options().capture_ops() && b->front->active(Kind::Activation)) return true;
  return false;
}

}  // namespace

bool TapPointAccess::bound_to(const TapPoint& point, const FrontEnd& front) {
  std::lock_guard<std::mutex> lock(const_cast<TapPoint&>(point).lists_mu_);
  const TapBindings* list = point.bindings_.load(std::memory_order_relaxed);
  if (list == nullptr) return false;
  for (const auto& b : list->items)
    if (b->front.get() == &front) return true;
  return false;
}

namespace {

// Publishes `items` as the point's list; lists_mu_ is held.
void publish(std::atomic<const TapBindings*>& current, std::atomic<int>& readers,
             std::vector<std::unique_ptr<const TapBindings>>& lists, std::vector<std::shared_ptr<TapBinding>> items) {
  std::unique_ptr<const TapBindings> fresh;
  if (!items.empty()) fresh = std::make_unique<const TapBindings>(TapBindings{std::move(items)});
  current.store(fresh.get(), std::memory_order_seq_cst);
  if (fresh) lists.push_back(std::move(fresh));
  // A forward that counted itself in before the store above may still read
  // an old list; one that counts itself in after it reads the new one. So
  // with no reader now, every old list can go (and with it, the recorders
  // that closed). Otherwise they go at a later bind or unbind.
  if (readers.load(std::memory_order_seq_cst) != 0) return;
  const TapBindings* keep = current.load(std::memory_order_relaxed);
  lists.erase(std::remove_if(lists.begin(), lists.end(), [&](const auto& l) { return l.get() != keep; }), lists.end());
}

}  // namespace

void TapPointAccess::bind(TapPoint& point, std::shared_ptr<TapBinding> binding) {
  std::lock_guard<std::mutex> lock(point.lists_mu_);
  std::vector<std::shared_ptr<TapBinding>> items;
  if (const TapBindings* list = point.bindings_.load(std::memory_order_relaxed)) items = list->items;
  items.push_back(std::move(binding));
  publish(point.bindings_, point.readers_, point.lists_, std::move(items));
}

void TapPointAccess::unbind(TapPoint& point, const TapBinding* binding) noexcept {
  std::lock_guard<std::mutex> lock(point.lists_mu_);
  const TapBindings* list = point.bindings_.load(std::memory_order_relaxed);
  if (list == nullptr) return;
  std::vector<std::shared_ptr<TapBinding>> items;
  for (const auto& b : list->items)
    if (b.get() != binding) items.push_back(b);
  try {
    publish(point.bindings_, point.readers_, point.lists_, std::move(items));
  } catch (...) {
    // Out of memory: the binding stays, and its closed recorder does nothing.
  }
}

}  // namespace detail

TapPoint::TapPoint() = default;

TapPoint::TapPoint(const TapPoint& other) : nonlinearity_(other.nonlinearity_) {}

TapPoint::~TapPoint() = default;

torch::Tensor TapPoint::tap_output(torch::Tensor out, bool training, const std::string& suffix) const {
  // Unbound: the one load.
  if (bindings_.load(std::memory_order_relaxed) == nullptr) return out;
  const detail::Reading reading(readers_);
  const detail::TapBindings* list = bindings_.load(std::memory_order_seq_cst);
  if (list == nullptr) return out;
  for (const auto& bp : list->items) {
    const detail::TapBinding* b = bp.get();
    if (!(b->front->active(Kind::Activation) || b->front->active(Kind::ActivationGrad))) continue;
    if (!training && !b->front->options().capture_eval()) continue;
    try {
      const detail::OpQuiet quiet;
      // An eval-mode pass is named as if in a scope "eval" (eval/<name>):
      // inside a sampled step it is not a second training pass (name#1).
      const detail::EvalScope eval(*b->front, !training);
      // Each recorder hooks the view the previous one returned: every one
      // gets the gradient of what flows on.
      out = detail::tap_capture(*b, out, suffix);
    } catch (...) {
      b->front->hook_failed(std::current_exception());
    }
  }
  return out;
}

TapPoint::OpScope::OpScope(const TapPoint& point) {
  if (point.bindings_.load(std::memory_order_relaxed) == nullptr) return;
  point.readers_.fetch_add(1, std::memory_order_seq_cst);
  const detail::TapBindings* list = point.bindings_.load(std::memory_order_seq_cst);
  if (list == nullptr || !detail::wants_ops(*list)) {
    point.readers_.fetch_sub(1, std::memory_order_release);
    return;
  }
  // The reader count stays up until the scope ends: the list is in use.
  detail::op_scope_push(list);
  point_ = &point;
}

TapPoint::OpScope::~OpScope() {
  if (point_ == nullptr) return;
  detail::op_scope_pop();
  point_->readers_.fetch_sub(1, std::memory_order_release);
}

// Cloneable derives from Module virtually up to LibTorch 2.1 (the most
// derived class initializes a virtual base) and directly from 2.2 on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
TapImpl::TapImpl(const TapImpl& other) : torch::nn::Cloneable<TapImpl>(other), TapPoint(other) {}
#else
TapImpl::TapImpl(const TapImpl& other)
    : torch::nn::Module(other), torch::nn::Cloneable<TapImpl>(other), TapPoint(other) {}
#endif

TapImpl& TapImpl::operator=(const TapImpl& other) {
  torch::nn::Cloneable<TapImpl>::operator=(other);
  return *this;
}

torch::Tensor TapImpl::forward(torch::Tensor x) { return tap_output(std::move(x), is_training()); }

void TapImpl::pretty_print(std::ostream& stream) const { stream << "tensortap::Tap"; }

torch::nn::AnyModule detail::make_sequential_tap(torch::nn::AnyModule inner) {
  if (dynamic_cast<TapPoint*>(inner.ptr().get()) != nullptr) return inner;  // already one
  // A child that is an activation module says what its output is.
  const Nonlinearity after = module_nonlinearity(*inner.ptr());
  auto tap = std::make_shared<SequentialTapImpl>(std::move(inner));
  tap->set_nonlinearity(after);
  return torch::nn::AnyModule(std::move(tap));
}

Nonlinearity detail::module_nonlinearity(const torch::nn::Module& m) {
  using namespace torch::nn;  // NOLINT(google-build-using-namespace): the list reads as LibTorch's names
  if (dynamic_cast<const ReLUImpl*>(&m)) return Nonlinearity::ReLU;
  if (dynamic_cast<const ReLU6Impl*>(&m)) return Nonlinearity::ReLU6;
  if (dynamic_cast<const LeakyReLUImpl*>(&m)) return Nonlinearity::LeakyReLU;
  if (dynamic_cast<const ELUImpl*>(&m)) return Nonlinearity::ELU;
  if (dynamic_cast<const GELUImpl*>(&m)) return Nonlinearity::GELU;
  if (dynamic_cast<const SiLUImpl*>(&m)) return Nonlinearity::SiLU;
  if (dynamic_cast<const SoftplusImpl*>(&m)) return Nonlinearity::Softplus;
  if (dynamic_cast<const TanhImpl*>(&m)) return Nonlinearity::Tanh;
  if (dynamic_cast<const SigmoidImpl*>(&m)) return Nonlinearity::Sigmoid;
  if (dynamic_cast<const HardtanhImpl*>(&m)) return Nonlinearity::Hardtanh;
  return Nonlinearity::None;
}

const char* detail::nonlinearity_word(Nonlinearity n) {
  // torch.nn.functional's names: what the twin writes for the same modules.
  switch (n) {
    case Nonlinearity::None: return "";
    case Nonlinearity::ReLU: return "relu";
    case Nonlinearity::ReLU6: return "relu6";
    case Nonlinearity::LeakyReLU: return "leaky_relu";
    case Nonlinearity::ELU: return "elu";
    case Nonlinearity::GELU: return "gelu";
    case Nonlinearity::SiLU: return "silu";
    case Nonlinearity::Softplus: return "softplus";
    case Nonlinearity::Tanh: return "tanh";
    case Nonlinearity::Sigmoid: return "sigmoid";
    case Nonlinearity::Hardtanh: return "hardtanh";
  }
  return "";
}

void tap_sequential(torch::nn::SequentialImpl& seq) {
  for (torch::nn::AnyModule& m : seq) m = detail::make_sequential_tap(std::move(m));
}

}  // namespace tensortap
