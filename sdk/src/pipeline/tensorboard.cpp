#include "sdk/src/pipeline/tensorboard.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>

#include <tensortap/kinds.h>

#include "sdk/src/pipeline/stats.h"
#include "writers/src/tensorboard/event_file.h"
#include "writers/src/tensorboard/events.h"

namespace tensortap::detail {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The fixed bucket limits (EVENTS.md): 1e-12 times powers of 1.1 below
// 1e20, then the largest double; the same negated, reversed; 0 between.
// Fixed, so one pass over the values bins them (a record in chunks too) and
// every step's histogram of a tensor has the same buckets.
const std::vector<double>& bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    pos.push_back(std::numeric_limits<double>::max());
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

// The length of the well-formed UTF-8 sequence at `p` (of `n` bytes left),
// or 0: the strict form (no overlong forms, no surrogates, nothing past
// U+10FFFF), as Python decodes it.
std::size_t utf8_length(const unsigned char* p, std::size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len || p[1] < lo || p[1] > hi) return 0;
  for (std::size_t i = 2; i < len; ++i)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return len;
}

// A tag is a protobuf string, which must be UTF-8: TensorBoard's parser
// refuses the whole event otherwise. A name's bytes that are not become
// U+FFFD each, as the reader's export writes them (EVENTS.md).
std::string utf8_tag(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_length(p + i, s.size() - i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  return out;
}

std::string kind_prefix(const RecordDesc& desc) { return utf8_tag(std::string(kind_name(desc.kind)) + "/" + desc.name); }

}  // namespace

bool tensorboard_built() noexcept { return true; }

struct HistogramAccumulator::State {
  std::vector<double> counts = std::vector<double>(bucket_limits().size(), 0.0);
  double min = std::numeric_limits<double>::infinity(), max = -min;
  double num = 0, sum = 0, sum_squares = 0;
};

HistogramAccumulator::HistogramAccumulator(Element stored) : stored_(stored), state_(std::make_unique<State>()) {}
HistogramAccumulator::~HistogramAccumulator() = default;

double HistogramAccumulator::count() const { return state_->num; }

void HistogramAccumulator::add(const void* data, std::size_t nbytes) {
  const std::vector<double>& limits = bucket_limits();
  State& s = *state_;
  const std::size_t size = element_size(stored_);
  // In blocks that stay in cache, through the statistics' own conversion.
  constexpr std::size_t kBlock = 1024;
  std::array<double, kBlock> v{};
  const auto* p = static_cast<const char*>(data);
  for (std::size_t done = 0, n = nbytes / size; done < n;) {
    const std::size_t k = std::min(kBlock, n - done);
    values_of(stored_, p + done * size, k * size, v.data());
    for (std::size_t i = 0; i < k; ++i) {
      const double x = v[i];
      if (!std::isfinite(x)) continue;
      s.min = std::min(s.min, x);
      s.max = std::max(s.max, x);
      s.num += 1;
      s.sum += x;
      s.sum_squares += x * x;
      // The first limit above x; the largest double itself, above none,
      // goes in the last bucket.
      const auto at = static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), x) - limits.begin());
      s.counts[std::min(at, limits.size() - 1)] += 1;
    }
    done += k;
  }
}

TensorBoard::TensorBoard(const Dir& dir, const TensorBoardOptions& options)
    : file_(std::make_unique<EventFile>(dir)), histograms_every_(options.histograms_every()) {}

TensorBoard::~TensorBoard() = default;

bool TensorBoard::histogram_step(std::int64_t step) const {
  return histograms_every_ > 0 && step % histograms_every_ == 0;
}

void TensorBoard::statistics(const RecordDesc& desc, const TensorStats& stats) {
  const std::string prefix = kind_prefix(desc) + "/";
  scalars_.clear();
#define TENSORTAP_FIELD_(name) scalars_.emplace_back(prefix + #name, static_cast<float>(stats.name));
  TENSORTAP_STATS_FIELDS(TENSORTAP_FIELD_, TENSORTAP_FIELD_)
#undef TENSORTAP_FIELD_
  file_->append(tb::scalars_event(wall_seconds(), desc.step, scalars_));
}

void TensorBoard::values(const RecordDesc& desc, const void* data, std::size_t nbytes) {
  const Element e = desc.dtype.element;
  if (desc.kind == Kind::Tensor && desc.shape.empty() && nbytes == element_size(e) && e != Element::C64 &&
      e != Element::C128) {
    double v = 0;
    values_of(e, data, nbytes, &v);
    scalars_.clear();
    scalars_.emplace_back(utf8_tag("tensor/" + desc.name), static_cast<float>(v));
    file_->append(tb::scalars_event(wall_seconds(), desc.step, scalars_));
  }
  if (auto h = histogram_for(desc)) {
    h->add(data, nbytes);
    histogram_done(desc, *h);
  }
}

std::unique_ptr<HistogramAccumulator> TensorBoard::histogram_for(const RecordDesc& desc) const {
  if (!histogram_step(desc.step)) return nullptr;
  return std::make_unique<HistogramAccumulator>(desc.dtype.element);
}

void TensorBoard::histogram_done(const RecordDesc& desc, const HistogramAccumulator& acc) {
  const HistogramAccumulator::State& s = *acc.state_;
  if (s.num == 0) return;  // nothing finite: no histogram
  tb::Histogram h;
  h.min = s.min;
  h.max = s.max;
  h.num = s.num;
  h.sum = s.sum;
  h.sum_squares = s.sum_squares;
  // Each nonempty bucket, and each run of empty ones as one (EVENTS.md).
  const std::vector<double>& limits = bucket_limits();
  for (std::size_t i = 0; i < limits.size();) {
    double limit = limits[i], count = s.counts[i];
    ++i;
    if (count == 0)
      while (i < limits.size() && s.counts[i] == 0) limit = limits[i++];
    h.limits.push_back(limit);
    h.counts.push_back(count);
  }
  file_->append(tb::histogram_event(wall_seconds(), desc.step, kind_prefix(desc), h));
}

void TensorBoard::text(std::int64_t step, const std::string& tag, const std::string& text) {
  file_->append(tb::text_event(wall_seconds(), step, tag, text));
}

void TensorBoard::flush(bool durable) { file_->flush(durable); }

void TensorBoard::close() { file_->close(); }

}  // namespace tensortap::detail
