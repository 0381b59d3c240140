#include "sdk/src/sinks/tensorboard.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>

#include <tensortap/kinds.h>

#include "sdk/src/core/stats.h"
#include "writers/src/json.h"
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
// every step's histogram of a tensor has the same buckets. Leaked, never
// destroyed: a recorder held in a static closes at exit, possibly after
// this table's destructor would have run.
const std::vector<double>& bucket_limits() {
  static const std::vector<double>* const limits = new std::vector<double>([] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    pos.push_back(std::numeric_limits<double>::max());
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }());
  return *limits;
}

// A tag is a protobuf string, which must be UTF-8: TensorBoard's parser
// refuses the whole event otherwise. A name's bytes that are not become
// U+FFFD each, as the reader's export writes them (EVENTS.md).
std::string utf8_tag(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence_length(s, i);
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

namespace {

// How many positive limits are at or below a >= 0, in a few instructions:
// a table over the doubles' exponents and top 7 bits of mantissa. A cell
// spans 1/128 of its octave, less than the limits' 10% steps, so it holds
// at most one limit: the count at the cell's low end, plus one if `a` is
// past the first limit above it. std::upper_bound's binary search cost
// 57 ns a value (bench_tensorboard), a logarithm's guess 30.
class PositiveCount {
 public:
  PositiveCount() {
    const std::vector<double>& limits = bucket_limits();
    const std::size_t zero = (limits.size() - 1) / 2;
    pos_.assign(limits.begin() + static_cast<std::ptrdiff_t>(zero) + 1, limits.end());
    for (int e = kMinExponent; e < kMaxExponent; ++e)
      for (int m = 0; m < kCells; ++m) {
        const double low = std::ldexp(1.0 + m / static_cast<double>(kCells), e);
        base_.push_back(static_cast<std::uint16_t>(std::upper_bound(pos_.begin(), pos_.end(), low) - pos_.begin()));
      }
  }
  std::size_t operator()(double a) const {
    if (a < pos_.front()) return 0;
    // Past 2^67 every limit but the largest double (1e20 < 2^67) is below.
    if (a >= kTop) return a >= pos_.back() ? pos_.size() : pos_.size() - 1;
    std::uint64_t bits;
    std::memcpy(&bits, &a, sizeof bits);
    const int e = static_cast<int>(bits >> 52) - 1023;
    const auto m = static_cast<std::size_t>((bits >> (52 - kMantissaBits)) & (kCells - 1));
    const std::size_t b = base_[static_cast<std::size_t>(e - kMinExponent) * kCells + m];
    return b + static_cast<std::size_t>(a >= pos_[b]);
  }
  bool is_limit(std::size_t count, double a) const {
    return static_cast<bool>(static_cast<int>(count > 0) & static_cast<int>(pos_[count - (count > 0)] == a));
  }

 private:
  static constexpr int kMantissaBits = 7, kCells = 1 << kMantissaBits;
  // 2^-41 < 1e-12 and 1e20 < 2^67: the octaves the limits fall in.
  static constexpr int kMinExponent = -41, kMaxExponent = 67;
  static constexpr double kTop = 147573952589676412928.0;  // 2^67
  std::vector<double> pos_;
  std::vector<std::uint16_t> base_;
};

// The bucket of a value (histogram_bucket), with the tables looked up once
// per record rather than once per value.
class Buckets {
 public:
  Buckets() : count_(positive_count()), n_(bucket_limits().size()), zero_((n_ - 1) / 2) {}
  std::size_t operator()(double x) const {
    const double a = std::fabs(x);
    const std::size_t c = count_(a);
    // x >= 0: the first limit above it is the (c+1)-th positive one; the
    // largest double itself, above none, goes in the last bucket. x < 0:
    // the negated limits below |x| in magnitude are above x. Chosen without
    // a branch: the sign of a value is a coin toss the CPU cannot predict.
    const std::size_t above = std::min(zero_ + 1 + c, n_ - 1);
    const std::size_t below = zero_ - c + static_cast<std::size_t>(count_.is_limit(c, a));
    const auto negative = static_cast<std::size_t>(x < 0);
    return above + negative * (below - above);  // unsigned: wraps back to `below`
  }

 private:
  // Never destroyed, as bucket_limits(): a recorder held in a static closes
  // at exit, after a function-local static made later is gone,
  // and its writer thread still fills histograms then.
  static const PositiveCount& positive_count() {
    static const PositiveCount* const count = new PositiveCount;
    return *count;
  }
  const PositiveCount& count_;
  const std::size_t n_, zero_;
};

}  // namespace

std::size_t histogram_bucket(double x) { return Buckets()(x); }

struct HistogramAccumulator::State {
  std::vector<double> counts = std::vector<double>(bucket_limits().size(), 0.0);
  double min = std::numeric_limits<double>::infinity(), max = -min;
  double num = 0, sum = 0, sum_squares = 0;
};

HistogramAccumulator::HistogramAccumulator(Element stored) : stored_(stored), state_(std::make_unique<State>()) {}
HistogramAccumulator::~HistogramAccumulator() = default;

double HistogramAccumulator::count() const { return state_->num; }

void HistogramAccumulator::add(const void* data, std::size_t nbytes) {
  State& s = *state_;
  const Buckets bucket;
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
      s.counts[bucket(x)] += 1;
    }
    done += k;
  }
}

namespace {

bool is_scalar(const RecordDesc& desc) { return desc.kind == Kind::Tensor && desc.shape.empty(); }

bool is_complex(Element e) { return e == Element::C64 || e == Element::C128; }

// A statistic's index in the schema (kStatsFields: none).
std::size_t field_index(const std::string& name) {
  return static_cast<std::size_t>(std::find(kStatsFieldNames.begin(), kStatsFieldNames.end(), name) -
                                  kStatsFieldNames.begin());
}

// The tag suffixes a tensor's statistics may write: the chosen fields, and
// `nonfinite` (whether it was written yet does not matter: the charts mix
// from the first NaN on).
template <typename F>
void for_each_suffix(const std::array<bool, kStatsFields>& written, bool nonfinite, F&& f) {
  for (std::size_t i = 0; i < written.size(); ++i)
    if (written[i]) f(kStatsFieldNames[i]);
  if (nonfinite) f("nonfinite");
}

}  // namespace

TensorBoard::TensorBoard(const Dir& dir, const TensorBoardOptions& options)
    : dir_(dir), file_(std::make_unique<EventFile>(dir)), histograms_every_(options.histograms_every()) {
  for (const std::string& name : options.stats()) {
    const std::size_t i = field_index(name);
    if (i < written_.size()) written_[i] = true;  // Settings refused any other name
  }
  nonfinite_ = !written_[field_index("nan")] && !written_[field_index("posinf")] && !written_[field_index("neginf")];
  charts_norm_ = written_[field_index("norm")];
  charts_std_ = written_[field_index("std")];
}

void TensorBoard::chart(std::size_t category, const std::string& name) {
  // A name first seen: the layout is written again at the batch's end.
  if (charted_[category].insert(name).second) layout_due_ = true;
}

void TensorBoard::append(std::int64_t step, const std::string& event) {
  std::exception_ptr rolled;
  // At a step's first event, in the order they come: not only at a step
  // above the file's highest. A dump's line comes at the training thread's
  // step, often far ahead of the records the writer has reached: the file
  // then never rolled again, and grew past the budget (the soak check).
  if (file_bytes_ > 0 && max_step_ >= 0 && step != prev_step_ && file_->size() + file_->buffered() >= file_bytes_) {
    try {
      roll();
    } catch (...) {
      rolled = std::current_exception();
    }
  }
  file_->append(event);
  prev_step_ = step;
  last_step_ = std::max(last_step_, step);
  if (max_step_ < 0) min_step_ = step;
  min_step_ = std::min(min_step_, step);
  max_step_ = std::max(max_step_, step);
  if (rolled) std::rethrow_exception(rolled);
}

void TensorBoard::roll() {
  // The next file first: if it cannot be made (a full disk), the events
  // stay in this one.
  auto next = std::make_unique<EventFile>(dir_, file_->seconds());
  std::exception_ptr first;
  try {
    write_layout();
    file_->flush(/*durable=*/false);
  } catch (...) {
    first = std::current_exception();
  }
  try {
    file_->close();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  files_.add(StepFiles::Entry{file_->name(), min_step_, max_step_, file_->size() + file_->buffered(), 0});
  file_ = std::move(next);
  max_step_ = -1;
  // The custom scalars layout again in the new file: the old one may go.
  layout_due_ = !charted_[kScalars].empty() || !charted_[kNorms].empty() || !charted_[kStds].empty();
  if (first) std::rethrow_exception(first);
}

void TensorBoard::write_layout() {
  if (!layout_due_) return;
  // The names: kept as "<kind>/<name>/" for grad and activation (chart()).
  const auto names = [&](std::size_t c, std::size_t kind_chars) {
    std::vector<std::string> out;
    for (const std::string& n : charted_[c]) out.push_back(kind_chars == 0 ? n : n.substr(kind_chars, n.size() - kind_chars - 1));
    return out;
  };
  // At the highest step the file holds: TensorBoard purges a tag's later
  // events when one comes at an earlier step, and shows the latest layout.
  file_->append(tb::custom_scalars_event(wall_seconds(), last_step_,
                                         tb::custom_layout(names(kScalars, 0), names(kNorms, std::strlen("grad/")),
                                                           names(kStds, std::strlen("activation/")))));
  layout_due_ = false;
}

TensorBoard::~TensorBoard() = default;

bool TensorBoard::histogram_step(std::int64_t step) const {
  return histograms_every_ > 0 && step % histograms_every_ == 0;
}

void TensorBoard::say_tags_collide(const std::string& scalar, const std::string& statistics) const {
  std::fprintf(stderr,
               "tensortap: warning: the 0-d tensor '%s' and the statistics of the tensor '%s' both write the "
               "TensorBoard tag 'tensor/%s' (the tag scheme: README, \"Live in TensorBoard\"): their charts mix; rename one "
               "of them to tell them apart\n",
               scalar.c_str(), statistics.c_str(), scalar.c_str());
}

void TensorBoard::check_tag_of_scalar(const std::string& name) {
  if (scalar_names_.count(name) != 0) return;
  scalar_names_.insert(name);
  const std::size_t slash = name.rfind('/');
  if (slash == std::string::npos) return;
  const std::string base = name.substr(0, slash);
  if (statistics_names_.count(base) == 0) return;
  for_each_suffix(written_, nonfinite_, [&](const char* field) {
    if (name.compare(slash + 1, std::string::npos, field) == 0) say_tags_collide(name, base);
  });
}

void TensorBoard::check_tags_of_statistics(const std::string& name) {
  if (statistics_names_.count(name) != 0) return;
  statistics_names_.insert(name);
  for_each_suffix(written_, nonfinite_, [&](const char* field) {
    const std::string scalar = name + "/" + field;
    if (scalar_names_.count(scalar) != 0) say_tags_collide(scalar, name);
  });
}

void TensorBoard::scalar(const RecordDesc& desc, double value) {
  check_tag_of_scalar(desc.name);
  chart(kScalars, utf8_tag(desc.name));
  append(desc.step,
         tb::scalars_event(wall_seconds(), desc.step, {{utf8_tag("tensor/" + desc.name), static_cast<float>(value)}}));
}

void TensorBoard::statistics(const RecordDesc& desc, const TensorStats& stats) {
  if (is_scalar(desc)) return;  // its one scalar: values()
  if (desc.kind == Kind::Tensor) check_tags_of_statistics(desc.name);
  std::array<double, kStatsFields> values{};
  std::size_t k = 0;
#define TENSORTAP_FIELD_(name) values[k++] = static_cast<double>(stats.name);
  TENSORTAP_STATS_FIELDS(TENSORTAP_FIELD_, TENSORTAP_FIELD_)
#undef TENSORTAP_FIELD_
  const std::string prefix = kind_prefix(desc) + "/";
  // By the prefix itself: a name seen before costs a lookup, no string.
  if (desc.kind == Kind::Grad && charts_norm_) chart(kNorms, prefix);
  if (desc.kind == Kind::Activation && charts_std_) chart(kStds, prefix);
  // The tags' strings are assigned in place, keeping their memory.
  if (scalars_.size() < kStatsFields + 1) scalars_.resize(kStatsFields + 1);
  std::size_t n = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!written_[i]) continue;
    scalars_[n].first.assign(prefix).append(kStatsFieldNames[i]);
    scalars_[n++].second = static_cast<float>(values[i]);
  }
  if (nonfinite_) {
    // From the first row with a NaN or an Inf on, 0 too: a chart that
    // appears only once something went wrong, and shows when it stopped.
    const std::int64_t bad = stats.nan + stats.posinf + stats.neginf;
    if (bad != 0) gone_nonfinite_.insert(prefix);
    if (bad != 0 || (!gone_nonfinite_.empty() && gone_nonfinite_.count(prefix) != 0)) {
      scalars_[n].first.assign(prefix).append("nonfinite");
      scalars_[n++].second = static_cast<float>(bad);
    }
  }
  if (n == 0) return;
  append(desc.step, tb::scalars_event(wall_seconds(), desc.step, scalars_.data(), n));
}

void TensorBoard::values(const RecordDesc& desc, const void* data, std::size_t nbytes) {
  const Element e = desc.dtype.element;
  if (is_scalar(desc)) {
    // The one scalar `tensor/<name>`; no histogram of one value.
    if (nbytes == element_size(e) && !is_complex(e)) {
      double v = 0;
      values_of(e, data, nbytes, &v);
      scalar(desc, v);
    }
    return;
  }
  if (auto h = histogram_for(desc)) {
    h->add(data, nbytes);
    histogram_done(desc, *h);
  }
}

std::unique_ptr<HistogramAccumulator> TensorBoard::histogram_for(const RecordDesc& desc) const {
  if (!histogram_step(desc.step) || is_scalar(desc)) return nullptr;
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
  append(desc.step, tb::histogram_event(wall_seconds(), desc.step, kind_prefix(desc), h));
}

void TensorBoard::text(std::int64_t step, const std::string& tag, const std::string& text) {
  append(step, tb::text_event(wall_seconds(), step, tag, text));
}

void TensorBoard::flush(bool durable) {
  write_layout();
  file_->flush(durable);
}

void TensorBoard::close() {
  write_layout();
  file_->close();
}

}  // namespace tensortap::detail
