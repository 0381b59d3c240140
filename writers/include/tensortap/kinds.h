#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace tensortap {

namespace detail {
struct KindSetAccess;
}  // namespace detail

/// What a record is.
enum class Kind : std::uint8_t {
  /// What flows through a `Tap`.
  Activation = 0,
  /// The gradient of what flows through a `Tap`.
  ActivationGrad = 1,
  /// A parameter's values when a step begins.
  Param = 2,
  /// A parameter's gradient, accumulated over the step's backward passes.
  Grad = 3,
  /// Any tensor given to `Recorder::capture()`.
  Tensor = 4,
  /// A module's buffer (`named_buffers()`, e.g. BatchNorm's `running_mean`)
  /// when a step begins.
  Buffer = 5,
};

/// How many kinds there are.
constexpr std::size_t kKindCount = 6;

/// Every kind, in the order tensortap lists them.
constexpr Kind kAllKinds[kKindCount] = {Kind::Activation, Kind::ActivationGrad, Kind::Param,
                                        Kind::Buffer,     Kind::Grad,           Kind::Tensor};

/// The name of a kind as it appears on disk: "activation", "activation_grad",
/// "param", "buffer", "grad", "tensor".
const char* kind_name(Kind kind);

/// A set of kinds.
///
/// Example:
/// ```
/// tensortap::KindSet only_grads{tensortap::Kind::Grad};
/// ```
class KindSet {
 public:
  /// The default set, `defaults()`: every kind but `Param` and `Buffer`
  /// (weights are large and wanted rarely). So `KindSet{}` is that set, not
  /// an empty one: `none()` is the empty set.
  KindSet() : KindSet{Kind::Activation, Kind::ActivationGrad, Kind::Grad, Kind::Tensor} {}
  /// Every kind but `Param` and `Buffer`: what `Options::kinds` starts as.
  static KindSet defaults() { return KindSet(); }
  /// No kind.
  static KindSet none() {
    KindSet s;
    s.bits_ = 0;
    return s;
  }
  KindSet(std::initializer_list<Kind> kinds) {
    for (Kind k : kinds) bits_ |= bit(k);
  }
  /// Every kind, `Param` and `Buffer` included.
  static KindSet all() {
    KindSet s = none();
    for (Kind k : kAllKinds) s.bits_ |= bit(k);
    return s;
  }
  /// Whether `k` is in the set.
  bool contains(Kind k) const { return (bits_ & bit(k)) != 0; }
  /// The set with `k` too: for sets made at run time (TENSORTAP_OPTIONS'
  /// `kinds=grad+activation`).
  KindSet with(Kind k) const {
    KindSet s = *this;
    s.bits_ |= bit(k);
    return s;
  }

 private:
  // The bit layout is the sampling plan's (sdk/src/select/sampling.h), not a
  // promise to users: only the sdk reads it, through detail::KindSetAccess.
  friend struct detail::KindSetAccess;
  static std::uint32_t bit(Kind k) { return 1u << static_cast<unsigned>(k); }

  std::uint32_t bits_ = 0;
};

}  // namespace tensortap
