#pragma once

// The parameters and buffers of a watched module (params.cpp).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <tensortap/kinds.h>

#include "sdk/src/front/front_end.h"

namespace tensortap::detail {

/// Tensors by the names the recorder knows them by.
using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The name a recorder knows a parameter or tap point by.
inline std::string full_name(const std::string& prefix, const std::string& path) {
  return prefix.empty() ? path : prefix + "/" + path;
}

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

/// Claims `params`, `buffers` and `more_claims` for the recorder (throws,
/// changing nothing, on a collision) and watches the tensors: parameter and
/// buffer records at step starts and, if the recorder takes gradients,
/// gradient hooks (the end-of-step sum of the backward passes, or what
/// `record_grads()` takes). A tensor under several names (tied weights) is
/// kept once, under its first name, the others its aliases in run.json. A
/// parameter frozen now is hooked once it requires grad, from the step in
/// which it starts training.
void watch_tensors(const std::shared_ptr<FrontEnd>& front, Named params, Named buffers,
                   std::vector<FrontEnd::Claim> more_claims = {});

}  // namespace tensortap::detail
