#include "writers/src/tensorboard/events.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>

#include "event.pb.h"
#include "writers/src/tensorboard/crc32c.h"

namespace tensortap::detail::tb {
namespace {

namespace pb = ::tensortap::tb;

std::string serialized(const pb::Event& e) {
  std::string out;
  e.SerializeToString(&out);
  return out;
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

}  // namespace

std::string file_version_event(double wall_time) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(0);
  e.set_file_version("brain.Event:2");
  return serialized(e);
}

std::string scalars_event(double wall_time, std::int64_t step, const std::pair<std::string, float>* values,
                          std::size_t n) {
  // The most frequent event (one per statistics row): one message kept per
  // thread and cleared, which keeps its values' memory for the next.
  thread_local pb::Event e;
  e.Clear();
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary* s = e.mutable_summary();
  for (std::size_t i = 0; i < n; ++i) {
    const auto& [tag, value] = values[i];
    pb::Summary::Value* v = s->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  return serialized(e);
}

std::string histogram_event(double wall_time, std::int64_t step, const std::string& tag, const Histogram& h) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  pb::HistogramProto* p = v->mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sum_squares);
  for (double l : h.limits) p->add_bucket_limit(l);
  for (double c : h.counts) p->add_bucket(c);
  return serialized(e);
}

std::string text_event(double wall_time, std::int64_t step, const std::string& tag, const std::string& text) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  pb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape();
  t->add_string_val(text);
  return serialized(e);
}

std::string custom_scalars_event(double wall_time, std::int64_t step, const std::vector<LayoutCategory>& layout) {
  pb::Layout l;
  for (const LayoutCategory& category : layout) {
    pb::Category* c = l.add_category();
    c->set_title(category.title);
    for (const LayoutChart& chart : category.charts) {
      pb::Chart* ch = c->add_chart();
      ch->set_title(chart.title);
      for (const std::string& tag : chart.tags) ch->mutable_multiline()->add_tag(tag);
    }
  }
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag("custom_scalars__config__");
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("custom_scalars");
  pb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape();
  t->add_string_val(l.SerializeAsString());
  return serialized(e);
}

std::string regex_escape(const std::string& s) {
  static constexpr std::string_view kSpecial = "()[]{}?*+-|^$\\.&~# \t\n\r\v\f";
  std::string out;
  out.reserve(s.size() + 8);
  for (const char c : s) {
    if (kSpecial.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

namespace {

constexpr std::size_t kSeriesPerChart = 16;

// The end of a name's first component: its first '.' or '/' at or after
// `from` (npos: none).
std::size_t component_end(const std::string& name, std::size_t from) { return name.find_first_of("./", from); }

// Charts of at most kSeriesPerChart series for `names` (sorted), grouped by
// top-level module, each series `^<kind>/<name>/<stat>$` escaped.
std::vector<LayoutChart> module_charts(const std::vector<std::string>& names, const std::string& kind,
                                       const std::string& stat) {
  // The first component, unless all names share it and one has more: then
  // up to the second.
  bool one_first = true, deeper = false;
  for (const std::string& n : names) {
    const std::size_t e = component_end(n, 0);
    one_first = one_first && n.compare(0, e, names.front(), 0, component_end(names.front(), 0)) == 0;
    deeper = deeper || e != std::string::npos;
  }
  const bool second = one_first && deeper;
  const auto module_of = [&](const std::string& n) {
    std::size_t e = component_end(n, 0);
    if (second && e != std::string::npos) e = component_end(n, e + 1);
    return n.substr(0, e);
  };
  // Each module's names (in name order), the modules in name order: a
  // name sorting between two of a module's ("enc-dec.w" between "enc" and
  // "enc.w") must not split it.
  std::map<std::string, std::vector<const std::string*>> groups;
  for (const std::string& n : names) groups[module_of(n)].push_back(&n);
  std::vector<LayoutChart> charts;
  for (const auto& [module, members] : groups) {
    const std::size_t parts = (members.size() + kSeriesPerChart - 1) / kSeriesPerChart;
    for (std::size_t p = 0; p < parts; ++p) {
      LayoutChart chart;
      chart.title = parts == 1 ? module : module + " (" + std::to_string(p + 1) + "/" + std::to_string(parts) + ")";
      for (std::size_t k = p * kSeriesPerChart; k < std::min(members.size(), (p + 1) * kSeriesPerChart); ++k)
        chart.tags.push_back("^" + regex_escape(kind + "/" + *members[k] + "/" + stat) + "$");
      charts.push_back(std::move(chart));
    }
  }
  return charts;
}

}  // namespace

std::vector<LayoutCategory> custom_layout(std::vector<std::string> scalars, std::vector<std::string> norms,
                                          std::vector<std::string> stds) {
  for (auto* names : {&scalars, &norms, &stds}) {
    std::sort(names->begin(), names->end());
    names->erase(std::unique(names->begin(), names->end()), names->end());
  }
  std::vector<LayoutCategory> out;
  if (!scalars.empty()) {
    // The loss first, the others in name order.
    const auto loss = std::find(scalars.begin(), scalars.end(), "loss");
    if (loss != scalars.end()) std::rotate(scalars.begin(), loss, loss + 1);
    LayoutCategory c{"tensortap: 0-d tensors (loss, learning rate)", {}};
    for (const std::string& n : scalars) c.charts.push_back({n, {"^" + regex_escape("tensor/" + n) + "$"}});
    out.push_back(std::move(c));
  }
  if (!norms.empty()) out.push_back({"tensortap: gradient norms", module_charts(norms, "grad", "norm")});
  if (!stds.empty()) out.push_back({"tensortap: activations' std", module_charts(stds, "activation", "std")});
  return out;
}

void append_framed(std::string& out, const std::string& event) {
  std::string length;
  put_le(length, event.size(), 8);
  out += length;
  put_le(out, masked_crc32c(length.data(), length.size()), 4);
  out += event;
  put_le(out, masked_crc32c(event.data(), event.size()), 4);
}

}  // namespace tensortap::detail::tb
