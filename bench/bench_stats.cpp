// What device statistics (sdk/src/core/stats.cpp, device_stats: the path of a
// CUDA tensor taken for statistics only) cost per tensor: the ATen ops it
// dispatches, those that pass over the whole tensor, and the bytes of
// temporaries it allocates, in all and at most at once. Run on CPU tensors
// (the same ops ATen would run on a GPU; a kernel launch there per op that
// computes).
//
//   bench_stats [numel]      (default 1048576)
//
// Counts, not times: a plain program, not Google Benchmark. Ops are counted
// with an ATen RecordFunction callback; bytes by interposing the C library's
// posix_memalign and free, which ATen's CPU allocator uses (glibc).
#include <malloc.h>

#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "sdk/src/core/stats.h"

extern "C" {
void* __libc_memalign(std::size_t alignment, std::size_t size);
void __libc_free(void* p);
}

namespace {

// What the allocation hooks count, for the thread that measures.
struct Bytes {
  bool on = false;
  bool busy = false;  // inside a hook: the set's own allocations are not counted
  std::unordered_set<void*>* live_set = nullptr;
  std::size_t total = 0, live = 0, peak = 0;
};
thread_local Bytes bytes;

}  // namespace

extern "C" int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  if (bytes.on && !bytes.busy) {
    bytes.busy = true;
    const std::size_t n = malloc_usable_size(p);
    bytes.total += n;
    bytes.live += n;
    if (bytes.live > bytes.peak) bytes.peak = bytes.live;
    bytes.live_set->insert(p);
    bytes.busy = false;
  }
  return 0;
}

extern "C" void free(void* p) {
  if (p != nullptr && bytes.on && !bytes.busy) {
    bytes.busy = true;
    if (bytes.live_set->erase(p) != 0) bytes.live -= malloc_usable_size(p);
    bytes.busy = false;
  }
  __libc_free(p);
}

namespace {

struct Ops {
  // Every op dispatched, nested ones included (aten::to calls aten::copy_).
  int all = 0;
  // The ops device_stats itself calls (depth 1), and of those, the ones
  // whose first input has as many elements as the tensor: full passes.
  int top = 0, full = 0;
  std::map<std::string, int> names;
  // Bytes allocated in each op device_stats calls, by name.
  std::map<std::string, std::size_t> name_bytes;
};
Ops* ops = nullptr;
std::int64_t full_numel = 0;
thread_local int depth = 0;
thread_local std::size_t bytes_at_start = 0;
thread_local const char* top_name = nullptr;

struct Cost {
  Ops ops;
  std::size_t total = 0, peak = 0;
};

Cost measure(const at::Tensor& t) {
  Cost c;
  std::unordered_set<void*> live;
  full_numel = t.numel();
  ops = &c.ops;
  depth = 0;
  bytes = Bytes{true, false, &live, 0, 0, 0};
  at::Tensor v = tensortap::detail::device_stats(t);
  bytes.on = false;
  ops = nullptr;
  // The result (ten doubles) is not a temporary.
  c.total = bytes.total;
  c.peak = bytes.peak;
  return c;
}

std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
  if (ops == nullptr) return nullptr;
  ++ops->all;
  if (++depth != 1) return nullptr;
  ++ops->top;
  ++ops->names[fn.name()];
  top_name = fn.name();
  bytes_at_start = bytes.total;
  const auto inputs = fn.inputs();
  if (!inputs.empty() && inputs[0].isTensor() && inputs[0].toTensor().numel() >= full_numel) ++ops->full;
  return nullptr;
}

void on_op_end(const at::RecordFunction&, at::ObserverContext*) {
  if (ops == nullptr) return;
  if (--depth == 0) ops->name_bytes[top_name] += bytes.total - bytes_at_start;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : (1 << 20);
  at::addGlobalCallback(
      at::RecordFunctionCallback(on_op, on_op_end).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  std::printf("device_stats of a tensor of %lld elements (CPU), per tensor:\n", static_cast<long long>(n));
  std::printf("%-10s %6s %6s %10s %12s %10s %12s %10s\n", "dtype", "ops", "nested", "full-size", "temp bytes",
              "B/element", "peak bytes", "B/element");
  at::Tensor base = at::randn({n}, at::kDouble);
  base[0] = std::numeric_limits<double>::quiet_NaN();
  base[1] = std::numeric_limits<double>::infinity();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kInt, at::kBool}) {
    const at::Tensor t = dtype == at::kBool ? base.gt(0) : base.to(dtype);
    tensortap::detail::device_stats(t);  // warm: first-call allocations are not the op's
    const Cost c = measure(t);
    const double elem = static_cast<double>(n);
    std::printf("%-10s %6d %6d %10d %12zu %10.1f %12zu %10.1f\n", c10::toString(dtype), c.ops.top, c.ops.all,
                c.ops.full, c.total, c.total / elem, c.peak, c.peak / elem);
    if (argc > 2) {
      for (const auto& [name, k] : c.ops.names)
        std::printf("    %3d %-22s %10.1f B/element\n", k, name.c_str(), c.ops.name_bytes.at(name) / elem);
    }
  }
  return 0;
}
