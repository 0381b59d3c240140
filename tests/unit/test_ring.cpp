// The CUDA engine's arena allocator, on its own: it needs no CUDA, so these
// run in every build.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "sdk/src/cuda/ring.h"

using tensortap::detail::RingAllocator;

namespace {

// Takes `size` bytes, which must fit, and returns the region.
RingAllocator::Region take(RingAllocator& ring, std::size_t size) {
  const auto region = ring.allocate(size);
  REQUIRE(region.has_value());
  return *region;
}

}  // namespace

TEST_CASE("ring regions follow one another, with ids counting from 1", "[sdk][ring]") {
  RingAllocator ring(1000);
  CHECK(ring.capacity() == 1000);
  const auto a = take(ring, 100);
  const auto b = take(ring, 300);
  const auto c = take(ring, 600);
  CHECK(a.id == 1);
  CHECK(a.offset == 0);
  CHECK(b.id == 2);
  CHECK(b.offset == 100);
  CHECK(c.id == 3);
  CHECK(c.offset == 400);
}

TEST_CASE("a full ring refuses until its front is freed", "[sdk][ring]") {
  RingAllocator ring(256);
  const auto a = take(ring, 128);
  const auto b = take(ring, 128);
  CHECK_FALSE(ring.allocate(1).has_value());
  ring.free(b.id);
  // b was the newest, but a is still live in front of it.
  CHECK_FALSE(ring.allocate(1).has_value());
  ring.free(a.id);
  const auto c = take(ring, 256);
  CHECK(c.offset == 0);
  CHECK(c.id == 3);
}

TEST_CASE("ring regions wrap to the start, never across the end", "[sdk][ring]") {
  RingAllocator ring(1000);
  const auto a = take(ring, 400);
  const auto b = take(ring, 400);
  ring.free(a.id);
  // 200 bytes left at the end: a region of 300 goes to the start instead.
  const auto c = take(ring, 300);
  CHECK(c.offset == 0);
  // Wrapped: the room is between the newest region and the oldest live one.
  const auto d = take(ring, 100);
  CHECK(d.offset == 300);
  CHECK_FALSE(ring.allocate(1).has_value());
  ring.free(b.id);
  // b's bytes and the 200 left at the end are free again: one span, after d.
  const auto e = take(ring, 600);
  CHECK(e.offset == 400);
  CHECK_FALSE(ring.allocate(1).has_value());
}

TEST_CASE("ring regions freed out of order come back once the front is free", "[sdk][ring]") {
  RingAllocator ring(400);
  const auto a = take(ring, 100);
  const auto b = take(ring, 100);
  const auto c = take(ring, 100);
  const auto d = take(ring, 100);
  ring.free(c.id);
  ring.free(b.id);
  ring.free(d.id);
  // Only a holds room now, but b, c and d are reclaimed from the front,
  // after a: none of their bytes is reused yet.
  CHECK_FALSE(ring.allocate(100).has_value());
  ring.free(a.id);
  const auto e = take(ring, 400);
  CHECK(e.offset == 0);
  CHECK(e.id == 5);
}

TEST_CASE("ring reclaims from the front only: a hole in the middle stays taken", "[sdk][ring]") {
  RingAllocator ring(300);
  const auto a = take(ring, 100);
  const auto b = take(ring, 100);
  take(ring, 100);
  ring.free(b.id);
  CHECK_FALSE(ring.allocate(100).has_value());
  ring.free(a.id);
  // a and b are reclaimed together, and one region takes both.
  const auto d = take(ring, 200);
  CHECK(d.offset == 0);
}

TEST_CASE("a region larger than the ring never fits, and an empty one is refused", "[sdk][ring]") {
  RingAllocator ring(256);
  CHECK_FALSE(ring.allocate(257).has_value());
  CHECK_FALSE(ring.allocate(0).has_value());
  // Refusals take nothing: the whole ring is still there.
  const auto a = take(ring, 256);
  CHECK(a.offset == 0);
  CHECK(a.id == 1);
  RingAllocator none;
  CHECK(none.capacity() == 0);
  CHECK_FALSE(none.allocate(1).has_value());
}

TEST_CASE("a ring keeps its bytes disjoint over many wrap-arounds", "[sdk][ring]") {
  // Regions of varied sizes, freed a few at a time in shuffled order: every
  // live region must lie inside the ring and overlap no other.
  constexpr std::size_t kCapacity = 4096;
  RingAllocator ring(kCapacity);
  struct Live {
    std::uint64_t id;
    std::size_t offset;
    std::size_t size;
  };
  std::vector<Live> live;
  std::uint64_t x = 88172645463325252ull;
  const auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  std::size_t wraps = 0;
  std::size_t last_offset = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::size_t size = 1 + next() % 700;
    if (const auto r = ring.allocate(size)) {
      REQUIRE(r->offset + size <= kCapacity);
      for (const Live& l : live) REQUIRE((r->offset + size <= l.offset || l.offset + l.size <= r->offset));
      if (r->offset < last_offset) ++wraps;
      last_offset = r->offset;
      live.push_back(Live{r->id, r->offset, size});
    } else if (!live.empty()) {
      // No room: free one live region, any of them.
      const std::size_t k = next() % live.size();
      ring.free(live[k].id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      FAIL("an empty ring refused " << size << " bytes");
    }
  }
  CHECK(wraps > 100);
}
