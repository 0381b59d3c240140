// watch_tensors(): a module's parameters and buffers claimed, once each,
// and handed to a ParamWatcher (param_watcher.h).
#include "hooks/src/params.h"

#include <unordered_map>

#include "hooks/src/param_watcher.h"

namespace tensortap::detail {
namespace {

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
