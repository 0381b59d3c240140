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
/// (EVENTS.md): tag "custom_scalars__config__", step 0.
std::string custom_scalars_event(double wall_time, const std::vector<LayoutCategory>& layout);

/// Appends `event` to `out` in TFRecord framing: length, its masked CRC-32C,
/// the bytes, their masked CRC-32C.
void append_framed(std::string& out, const std::string& event);

}  // namespace tensortap::detail::tb
