#include <tensortap/watch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <tensortap/tap.h>

#include "hooks/src/binding.h"
#include "hooks/src/params.h"
#include "writers/src/check.h"

namespace tensortap {
namespace detail {
namespace {

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

// A tap point that watch() binds.
struct Point {
  std::shared_ptr<torch::nn::Module> owner;
  TapPoint* point;
  std::string name;
  // What flows through it: declared, or said by the module's type.
  Nonlinearity after;
};

// The module's tap points that the selection takes, in named_modules()
// order, Sequential children wrapped in taps where the options ask for them.
// Tap points are found whatever the kinds: `tensortap ctl capture --kinds
// activation` may ask for them later, and an unsampled tap costs its
// forward one relaxed load.
std::vector<Point> find_points(torch::nn::Module& module, FrontEnd& front, const std::string& prefix) {
  std::vector<Point> points;
  // Without include_self: named_modules() needs shared_from_this() for the
  // root, and a root on the stack has none.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules{{"", nullptr}};
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    modules.emplace_back(item.key(), item.value());
  const auto add = [&](const std::shared_ptr<torch::nn::Module>& owner, TapPoint& point, const std::string& path) {
    // The watched module itself (`watch(*tapped_net)`) has no path: its
    // output is recorded under the prefix, or as "root".
    std::string name = path.empty() ? (prefix.empty() ? std::string(kRootTapName) : prefix) : full_name(prefix, path);
    if (!front.selected(name)) return;
    const Nonlinearity after = point.nonlinearity() != Nonlinearity::None
                                   ? point.nonlinearity()
                                   : module_nonlinearity(*owner);
    points.push_back({owner, &point, std::move(name), after});
  };
  for (const auto& [path, ptr] : modules) {
    torch::nn::Module& m = ptr ? *ptr : module;
    auto* point = dynamic_cast<TapPoint*>(&m);
    if (point != nullptr && ptr) add(ptr, *point, path);
    if (point != nullptr && !ptr && front.selected(prefix.empty() ? kRootTapName : prefix)) {
      // The root was once silently left unbound. Binding keeps a
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
          front.taps_sequential_child(full_name(prefix, path_i)))
        child = make_sequential_tap(std::move(child));
      if (auto wrapper = child.ptr(); wrapper && dynamic_cast<TapPoint*>(wrapper.get()) != nullptr &&
                                      std::find_if(modules.begin(), modules.end(), [&](const auto& mm) {
                                        return mm.second == wrapper;
                                      }) == modules.end())
        add(wrapper, *dynamic_cast<TapPoint*>(wrapper.get()), path_i);
    }
  }
  return points;
}

// One module registered under several names (`enc` and `dec` the same
// Tapped<Linear>): bound once, under its first name in named_modules()
// order, as PyTorch's named_modules() (and so the Python twin) keeps it;
// the others are its aliases in run.json, as tied parameters' are. It was
// recorded under every name at every call: one output, several records.
// Keeps each point's first in `points`; returns each kept name's aliases.
std::vector<std::pair<std::string, std::vector<std::string>>> keep_first_names(std::vector<Point>& points) {
  std::vector<std::pair<std::string, std::vector<std::string>>> point_aliases;
  std::unordered_map<const TapPoint*, std::size_t> first;
  std::vector<Point> kept;
  for (Point& p : points) {
    const auto [it, fresh] = first.emplace(p.point, kept.size());
    if (fresh) {
      kept.push_back(std::move(p));
      point_aliases.emplace_back(kept.back().name, std::vector<std::string>{});
    } else {
      point_aliases[it->second].second.push_back(std::move(p.name));
    }
  }
  points = std::move(kept);
  return point_aliases;
}

// Two tap points of one module under one name: the root's "root" (or the
// prefix) and a submodule registered so. Each would record over the other.
void check_point_names(const std::vector<Point>& points) {
  std::unordered_map<std::string, const TapPoint*> named_points;
  for (const Point& p : points) {
    const auto [it, fresh] = named_points.emplace(p.name, p.point);
    TENSORTAP_CHECK(fresh || it->second == p.point,
                    "watch(): two tap points would both be recorded as '{}' (the watched module's own output is "
                    "named by watch()'s prefix, or 'root'): give watch() a prefix, or rename the submodule",
                    p.name);
  }
}

void attach(torch::nn::Module& module, const std::shared_ptr<FrontEnd>& front, const std::string& prefix) {
  // TENSORTAP=off: no hook.
  if (front->off()) return;
  const KindSet kinds = front->options().kinds();

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
  std::vector<Point> points = find_points(module, *front, prefix);
  const auto point_aliases = keep_first_names(points);
  check_point_names(points);
  std::vector<FrontEnd::Claim> tap_claims;
  for (const Point& p : points) tap_claims.push_back({p.point, Kind::Activation, p.name});
  watch_tensors(front, std::move(params), std::move(buffers), std::move(tap_claims));
  for (const auto& [name, others] : point_aliases)
    if (!others.empty()) front->add_aliases(name, others);
  // run.json's "taps", which the health rules read, live and offline.
  std::vector<std::pair<std::string, std::string>> nonlinear;
  for (const Point& p : points)
    if (p.after != Nonlinearity::None) nonlinear.emplace_back(p.name, nonlinearity_word(p.after));
  if (!nonlinear.empty()) front->add_taps(nonlinear);
  auto taps = std::make_shared<TapWatcher>(front->options().capture_ops() && kinds.contains(Kind::Activation));
  for (Point& p : points) taps->add(p.owner, *p.point, std::make_shared<TapBinding>(TapBinding{front, p.name}));
  front->add_watcher(taps);
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
