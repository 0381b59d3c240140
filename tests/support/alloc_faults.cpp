// The global operator new of a test binary, with failures on demand
// (tt_test::fail_allocations). Otherwise what the default one does: malloc,
// and std::bad_alloc when it returns null. The other forms (arrays,
// nothrow) come to this one in libstdc++; the matching deletes free().
#include "tests/support/alloc_faults.h"

#include <cstdlib>
#include <new>

namespace {

// Per thread: the engine's threads are told apart by where the failure is
// armed (the training thread, or the copier through a callback it runs).
thread_local int t_failures = 0;

}  // namespace

namespace tt_test {

void fail_allocations(int n) noexcept { t_failures = n; }

}  // namespace tt_test

void* operator new(std::size_t size) {
  if (t_failures > 0) {
    --t_failures;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

void operator delete(void* p) noexcept { std::free(p); }

void operator delete(void* p, std::size_t) noexcept { std::free(p); }
