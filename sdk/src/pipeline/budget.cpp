#include "sdk/src/pipeline/budget.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdio>

namespace tensortap::detail {
namespace {

// What a record adds besides its bytes: its .npy header (64 to a few
// hundred bytes), alignment, its index line.
constexpr std::uint64_t kRecordOverhead = 512;

}  // namespace

DiskBudget::DiskBudget(const Options& options, std::string run_dir, const Dir& dir, const Writer& writer)
    : max_(options.max_bytes()),
      reserve_(options.max_bytes() / 20),
      policy_(options.on_budget()),
      run_dir_(std::move(run_dir)),
      dir_(dir),
      writer_(writer) {}

void DiskBudget::measure() {
  if (!on()) return;
  const Dir& dir = dir_;
  // The top of the run directory holds a dozen of tensortap's files (run.json,
  // the lines files, stats.npy, events, tensors.h5): their sizes, and the
  // directories' own. What lies below (npy/, packed/) the writer counts as
  // it writes, without a walk over millions of files.
  std::uint64_t used = 0;
  for (const std::string& name : dir.list()) {
    struct stat st {};
    if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) used += static_cast<std::uint64_t>(st.st_size);
  }
  struct stat self {};
  if (::fstat(dir.fd(), &self) == 0) used += static_cast<std::uint64_t>(self.st_size);
  used_ = used + writer_.disk_bytes();
}

bool DiskBudget::admit(std::uint64_t nbytes, std::int64_t step) {
  if (!on()) return true;
  const std::uint64_t need = nbytes + kRecordOverhead;
  if (!reached() && used_ + need <= max_) {
    used_ += need;
    return true;
  }
  refused_records_.fetch_add(1, std::memory_order_relaxed);
  refused_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
  if (!reached_.exchange(true)) {
    reached_at_step_.store(step, std::memory_order_relaxed);
    std::fprintf(stderr,
                 "tensortap: warning: run '%s' reached its disk budget of %llu bytes (Options::max_bytes) at step "
                 "%lld: full tensors stop (Budget::StopCapture); statistics, TensorBoard and the rules go on within "
                 "5%% more\n",
                 run_dir_.c_str(), static_cast<unsigned long long>(max_), static_cast<long long>(step));
  }
  return false;
}

bool DiskBudget::side_files_allowed() {
  if (!on() || used_ <= max_ + reserve_) return true;
  if (!said_reserve_) {
    said_reserve_ = true;
    std::fprintf(stderr,
                 "tensortap: warning: run '%s' used its disk budget and its reserve of 5%% (%llu bytes in all): "
                 "statistics, TensorBoard's events and dumps stop too\n",
                 run_dir_.c_str(), static_cast<unsigned long long>(max_ + reserve_));
  }
  return false;
}

BudgetState DiskBudget::state() const {
  BudgetState s;
  s.max_bytes = max_;
  s.policy = policy_;
  s.reached_at_step = reached_at_step_.load(std::memory_order_relaxed);
  s.refused_records = refused_records_.load(std::memory_order_relaxed);
  s.refused_bytes = refused_bytes_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tensortap::detail
