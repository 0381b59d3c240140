#pragma once

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
std::string scalars_event(double wall_time, std::int64_t step, const std::vector<std::pair<std::string, float>>& values);
std::string histogram_event(double wall_time, std::int64_t step, const std::string& tag, const Histogram& h);
/// A text-plugin event: one string tensor.
std::string text_event(double wall_time, std::int64_t step, const std::string& tag, const std::string& text);

/// Appends `event` to `out` in TFRecord framing: length, its masked CRC-32C,
/// the bytes, their masked CRC-32C.
void append_framed(std::string& out, const std::string& event);

}  // namespace tensortap::detail::tb
