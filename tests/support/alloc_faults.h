#pragma once

// Allocation failures on demand, for the paths that must survive running
// out of memory (tests/support/alloc_faults.cpp replaces the global operator new of
// the test binary that links it).

namespace tt_test {

/// The next `n` allocations through operator new on the calling thread
/// throw std::bad_alloc; 0 ends it. Other threads are unaffected.
void fail_allocations(int n) noexcept;

}  // namespace tt_test
