// Staging's hooks for the CUDA engine, tested on the CPU: buffers from a
// caller's allocator (pinned memory, with CUDA), and reservations that do
// not wait.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "sdk/src/staging.h"

namespace {

using tensortap::Overflow;
using tensortap::detail::HostMemory;
using tensortap::detail::Slot;
using tensortap::detail::Staging;

std::atomic<int> g_allocated{0};
std::atomic<int> g_released{0};

void* counting_allocate(std::size_t bytes) {
  ++g_allocated;
  return std::aligned_alloc(4096, bytes);
}
void counting_release(void* p) {
  ++g_released;
  std::free(p);
}

HostMemory counting_memory() {
  HostMemory memory;
  memory.allocate = counting_allocate;
  memory.release = counting_release;
  return memory;
}

Slot slot_of(std::size_t nbytes, std::uint64_t record) {
  Slot s;
  s.id = record;
  s.nbytes = nbytes;
  return s;
}

}  // namespace

TEST_CASE("staging buffers come from the HostMemory hook and go back to it", "[sdk][staging]") {
  g_allocated = 0;
  g_released = 0;
  {
    Staging staging(8192, Overflow::Block, counting_memory());
    CHECK(g_allocated == 0);  // taken on first use, not before
    auto t = staging.reserve(slot_of(100, 1), false);
    REQUIRE(t);
    CHECK(g_allocated == 1);
    staging.commit(*t, true);
    Staging::Buffer* b = staging.take();
    REQUIRE(b != nullptr);
    staging.release(b);
    auto u = staging.reserve(slot_of(100, 2), false);  // the other buffer
    REQUIRE(u);
    CHECK(g_allocated == 2);
    staging.commit(*u, true);
    staging.stop();
    while (Staging::Buffer* rest = staging.take()) staging.release(rest);
    staging.free_memory();
    CHECK(g_released == 2);
  }
  CHECK(g_released == 2);  // not twice
}

TEST_CASE("reserve without waiting returns nullopt where it would wait", "[sdk][staging]") {
  Staging staging(8192, Overflow::Block);
  auto a = staging.reserve(slot_of(6000, 1), false);
  REQUIRE(a);
  // No room, and the policy is Block: it would wait, so it returns at once.
  CHECK_FALSE(staging.reserve(slot_of(6000, 2), false, 0, /*wait=*/false));
  // As much of a chunked record as fits is still granted.
  auto c = staging.reserve(slot_of(6000, 3), false, 4, /*wait=*/false);
  CHECK_FALSE(c);  // 2 KiB of room is under the 64 KiB / rest minimum chunk
  staging.commit(*a, true);
  Staging::Buffer* b = staging.take();
  REQUIRE(b != nullptr);
  auto d = staging.reserve(slot_of(6000, 2), false, 0, /*wait=*/false);
  REQUIRE(d);  // the other buffer is empty
  staging.commit(*d, true);
  staging.release(b);
  staging.stop();
  while (Staging::Buffer* rest = staging.take()) staging.release(rest);
}

TEST_CASE("adopt() moves an idle buffer at once, one in use when the writer gives it back", "[sdk][staging]") {
  g_allocated = 0;
  g_released = 0;
  const HostMemory memory = counting_memory();
  Staging staging(8192, Overflow::Block);  // heap memory to begin with
  auto t = staging.reserve(slot_of(100, 1), false);
  REQUIRE(t);
  std::memset(t->dst, 'a', 100);
  char* const heap = t->dst;
  // Both buffers allocated by adopt(), before it takes the lock.
  REQUIRE(staging.adopt(memory));
  CHECK(g_allocated == 2);
  CHECK_FALSE(staging.adopt(memory));  // once: the second gives its memory back
  CHECK(g_allocated == 4);
  CHECK(g_released == 2);
  staging.commit(*t, true);
  // The reservation made before is intact in the buffer it was made in.
  Staging::Buffer* b = staging.take();
  REQUIRE(b != nullptr);
  CHECK(b->data == heap);
  CHECK(std::string(b->data, 100) == std::string(100, 'a'));
  // The other buffer, idle at adopt(), is the adopted memory already.
  auto u = staging.reserve(slot_of(100, 2), false);
  REQUIRE(u);
  CHECK(u->dst != heap);
  staging.commit(*u, true);
  staging.release(b);  // now the first one moves too
  Staging::Buffer* c = staging.take();
  REQUIRE(c != nullptr);
  staging.release(c);
  auto v = staging.reserve(slot_of(100, 3), false);
  REQUIRE(v);
  CHECK(v->dst != heap);
  staging.commit(*v, true);
  staging.stop();
  while (Staging::Buffer* rest = staging.take()) staging.release(rest);
  CHECK(g_released == 2);  // the heap buffer went back to the heap, not here
  staging.free_memory();
  CHECK(g_released == 4);
}
