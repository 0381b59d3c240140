#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tensortap::detail::tb {

/// A histogram as TensorBoard's HistogramProto holds it (EVENTS.md):
/// figures over the finite values, and (limit, count) buckets.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> limits, counts;
};

/// The serialized `Event`s tensortap writes (EVENTS.md), each ready for
/// `append_framed`. The protobuf types stay inside events.cpp, which is
/// compiled apart from LibTorch (whose wheels ship protobuf headers of
/// another version).
std::string file_version_event(double wall_time);
/// The first `n` of `values`.
std::string scalars_event(double wall_time, std::int64_t step, const std::pair<std::string, float>* values,
                          std::size_t n);
inline std::string scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<std::pair<std::string, float>>& values) {
  return scalars_event(wall_time, step, values.data(), values.size());
}
std::string histogram_event(double wall_time, std::int64_t step, const std::string& tag, const Histogram& h);
/// A text-plugin event: one string tensor.
std::string text_event(double wall_time, std::int64_t step, const std::string& tag, const std::string& text);

/// A chart of TensorBoard's custom scalars tab: one line per scalar tag
/// matching any of `tags` (regular expressions, matched from the tag's
/// start by TensorBoard's Python `re.match`).
struct LayoutChart {
  std::string title;
  std::vector<std::string> tags;
};
/// A collapsible group of charts on the custom scalars tab.
struct LayoutCategory {
  std::string title;
  std::vector<LayoutChart> charts;
};
/// The custom scalars plugin's layout, in the tensor its plugin reads
/// (EVENTS.md): tag "custom_scalars__config__". TensorBoard shows a run's
/// latest: the highest step.
std::string custom_scalars_event(double wall_time, std::int64_t step, const std::vector<LayoutCategory>& layout);

/// The layout of EVENTS.md, "The layout": a chart per 0-d tensor name in
/// `scalars` (the loss's first), and charts of at most 16 series per
/// top-level module for the `grad` names in `norms` and the `activation`
/// names in `stds` (empty: no such category). Names as in the tags (UTF-8).
std::vector<LayoutCategory> custom_layout(std::vector<std::string> scalars, std::vector<std::string> norms,
                                          std::vector<std::string> stds);
/// `s` with a backslash before each character Python's `re.escape` escapes.
std::string regex_escape(const std::string& s);

/// Appends `event` to `out` in TFRecord framing: length, its masked CRC-32C,
/// the bytes, their masked CRC-32C.
void append_framed(std::string& out, const std::string& event);

}  // namespace tensortap::detail::tb
