#pragma once

// Part of <tensortap/tap.h>, which includes it at its end, once TappedImpl is
// complete. Not an interface: names here may change in any release.

#ifndef TENSORTAP_TAP_H_INCLUDED
#error "include <tensortap/tap.h>, not <tensortap/detail/tapped_calls.h>"
#endif

namespace tensortap {

namespace detail {

// The one class of TappedImpl object ever built: TappedImpl itself keeps a
// single forward() (Sequential's AnyModule takes its address), and this
// adds what `m->forward(x)` needs when M's forward has defaulted arguments:
// an overload taking fewer.
template <class Impl>
class TappedCalls final : public TappedImpl<Impl> {
  using Tapped = TappedImpl<Impl>;
  using R = typename Tapped::Result;

 public:
  template <class... Args>
  explicit TappedCalls(Args&&... args) : Tapped(std::forward<Args>(args)...) {}

  using Tapped::forward;
  template <class... Given, class = std::enable_if_t<(sizeof...(Given) < Tapped::kArity)>>
  R forward(Given&&... given) {
    return this->call(std::forward<Given>(given)...);
  }

  static std::shared_ptr<torch::nn::Module> copy_of(const TappedCalls& self, std::shared_ptr<Impl> plain) {
    if constexpr (Derivable<Impl>::value) {
      // A copy of this module (a copied tap point is unbound), then the deep
      // copy's values, as Cloneable<Impl>::clone_ assigns them.
      auto copy = std::make_shared<TappedCalls>(self);
      static_cast<Impl&>(*copy) = *plain;
      return copy;
    } else {
      return std::make_shared<TappedCalls>(FromPlain{}, std::move(plain));
    }
  }
};

}  // namespace detail

}  // namespace tensortap
