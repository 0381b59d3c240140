// A build without protobuf: Options::tensorboard is refused when the recorder
// is made (settings.cpp), so nothing here is ever constructed.
#include "sdk/src/sinks/tensorboard.h"

#include "writers/src/check.h"
#include "writers/src/tensorboard/event_file.h"

namespace tensortap::detail {

bool tensorboard_built() noexcept { return false; }
std::size_t histogram_bucket(double) { return 0; }

struct HistogramAccumulator::State {};
HistogramAccumulator::HistogramAccumulator(Element stored) : stored_(stored) {}
HistogramAccumulator::~HistogramAccumulator() = default;
void HistogramAccumulator::add(const void*, std::size_t) {}
double HistogramAccumulator::count() const { return 0; }

TensorBoard::TensorBoard(const Dir& dir, const TensorBoardOptions& options)
    : dir_(dir), histograms_every_(options.histograms_every()) {
  fail("this tensortap was built without TensorBoard event files");
}
TensorBoard::~TensorBoard() = default;
bool TensorBoard::histogram_step(std::int64_t) const { return false; }
void TensorBoard::statistics(const RecordDesc&, const TensorStats&) {}
void TensorBoard::values(const RecordDesc&, const void*, std::size_t) {}
std::unique_ptr<HistogramAccumulator> TensorBoard::histogram_for(const RecordDesc&) const { return nullptr; }
void TensorBoard::histogram_done(const RecordDesc&, const HistogramAccumulator&) {}
void TensorBoard::text(std::int64_t, const std::string&, const std::string&) {}
void TensorBoard::flush(bool) {}
void TensorBoard::close() {}
void TensorBoard::roll() {}

}  // namespace tensortap::detail
