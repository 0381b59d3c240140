// Staging's hooks for the CUDA engine, tested on the CPU: buffers from a
// caller's allocator (pinned memory, with CUDA), and reservations that do
// not wait.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "sdk/src/core/staging.h"
#include "tests/support/helpers.h"

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
  s.record.desc.nbytes = nbytes;
  return s;
}

// What put() takes: the record of `s`, all of its bytes.
tensortap::detail::RecordSpec spec(const Slot& s) { return tensortap::detail::RecordSpec::of(s.record, s.id); }

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

TEST_CASE("a slot keeps its record's memory: a later record's name and shape reuse it", "[sdk][staging]") {
  Staging staging(1 << 16, Overflow::Block);
  const std::string long_name(200, 'n');  // past std::string's inline storage
  const auto pass = [&](const std::string& name, std::uint64_t id) {
    Slot s = slot_of(64, id);
    s.record.desc.name = name;
    s.record.desc.shape = {2, 8};
    auto t = staging.reserve(s, false);
    REQUIRE(t);
    staging.commit(*t, true);
    Staging::Buffer* b = staging.take();
    REQUIRE(b != nullptr);
    REQUIRE(b->slots.size() == 1);
    const tensortap::detail::RecordDesc& desc = b->slots[0].record.desc;
    CHECK(desc.name == name);
    CHECK(desc.shape.size() == 2);
    const char* where = desc.name.data();
    staging.release(b);
    return where;
  };
  // Buffers alternate: the third record lands in the first one's slot.
  const char* first = pass(long_name, 1);
  pass(long_name, 2);
  const char* third = pass(std::string(150, 'm'), 3);
  CHECK(third == first);
  staging.stop();
}

// Whether every page of [p, p + n) is resident: faulted in already.
bool resident(const char* p, std::size_t n) {
  std::vector<unsigned char> pages((n + 4095) / 4096);
  if (::mincore(const_cast<char*>(p), n, pages.data()) != 0) return false;
  return std::all_of(pages.begin(), pages.end(), [](unsigned char v) { return (v & 1) != 0; });
}

TEST_CASE("prepare() allocates and populates both default buffers: a capture touches no new page", "[sdk][staging]") {
  const std::size_t capacity = 8 << 20;
  Staging staging(capacity, Overflow::Block);
  staging.prepare();
  // 100 bytes in each buffer: without prepare() only their first page
  // would be resident.
  auto t = staging.reserve(slot_of(100, 1), false);
  REQUIRE(t);
  staging.commit(*t, true);
  Staging::Buffer* a = staging.take();
  REQUIRE(a != nullptr);
  auto u = staging.reserve(slot_of(100, 2), false);
  REQUIRE(u);
  staging.commit(*u, true);
  Staging::Buffer* b = staging.take();
  REQUIRE(b != nullptr);
  CHECK(a->data != b->data);
  CHECK(resident(a->data, capacity));
  CHECK(resident(b->data, capacity));
  staging.release(a);
  staging.release(b);
  staging.stop();
  staging.free_memory();
}

TEST_CASE("put() copies a small record and publishes it in one step, and after stop() it refuses", "[sdk][staging]") {
  Staging staging(1 << 16, Overflow::Block);
  const std::string bytes = "0123456789abcdef";
  Slot s = slot_of(bytes.size(), 7);
  s.record.desc.name = "small";
  REQUIRE(staging.put(spec(s), bytes.data(), false));
  Staging::Buffer* b = staging.take();  // published: no commit() to wait for
  REQUIRE(b != nullptr);
  REQUIRE(b->slots.size() == 1);
  const Slot& got = b->slots[0];
  CHECK(got.ok);
  CHECK(got.id == 7);
  CHECK(got.record.desc.name == "small");
  CHECK(std::string(b->data + got.offset, got.nbytes) == bytes);
  staging.release(b);
  staging.stop();
  CHECK_FALSE(staging.put(spec(s), bytes.data(), false));
}

TEST_CASE("put() under DropNewest drops when both buffers are full, and waits under Block", "[sdk][staging]") {
  Staging staging(8192, Overflow::DropNewest);
  const std::string bytes(6000, 'x');
  REQUIRE(staging.put(spec(slot_of(bytes.size(), 1)), bytes.data(), true));
  CHECK_FALSE(staging.put(spec(slot_of(bytes.size(), 2)), bytes.data(), true));  // no room, may drop
  Staging::Buffer* b = staging.take();
  REQUIRE(b != nullptr);
  REQUIRE(staging.put(spec(slot_of(bytes.size(), 3)), bytes.data(), true));  // the other buffer
  staging.release(b);
  staging.stop();
}

TEST_CASE("a kept slot a record is copied into keeps nothing of the record it held before", "[sdk][staging]") {
  // Slots keep their memory from one fill of a buffer to the next: every
  // member of the new record must replace the old one's, chunk flags and
  // a failed copy's mark included.
  Staging staging(1 << 16, Overflow::Block);
  Slot big = slot_of(1 << 20, 1);  // larger than a buffer: a first chunk, not the last
  big.record.desc.name = "a_long_name_that_does_not_fit_in_a_short_string";
  big.record.desc.shape = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  big.record.desc.kind = tensortap::Kind::Grad;
  big.record.op = tensortap::detail::Op::Hold;
  big.record.stats_row = true;
  auto t = staging.reserve(big, false, /*unit=*/4);
  REQUIRE(t);
  staging.commit(*t, false);
  Staging::Buffer* b = staging.take();
  REQUIRE(b != nullptr);
  REQUIRE(b->slots.size() == 1);
  CHECK_FALSE(b->slots[0].last);
  CHECK_FALSE(b->slots[0].ok);
  staging.release(b);
  // The other buffer, then this one again: its kept slot is reused.
  for (std::uint64_t id : {2, 3}) {
    Slot small = slot_of(8, id);
    small.record.desc.name = "x";
    small.record.desc.shape = {2};
    REQUIRE(staging.put(spec(small), "01234567", false));
    b = staging.take();
    REQUIRE(b != nullptr);
    REQUIRE(b->slots.size() == 1);
    const Slot& got = b->slots[0];
    CHECK(got.id == id);
    CHECK(got.first);
    CHECK(got.last);
    CHECK(got.ok);
    CHECK(got.nbytes == 8);
    CHECK(got.record.desc.name == "x");
    CHECK(std::vector<std::int64_t>(got.record.desc.shape.begin(), got.record.desc.shape.end()) ==
          std::vector<std::int64_t>{2});
    CHECK(got.record.desc.kind == tensortap::Kind::Tensor);
    CHECK(got.record.op == tensortap::detail::Op::Store);
    CHECK_FALSE(got.record.stats_row);
    CHECK(std::string(b->data + got.offset, 8) == "01234567");
    staging.release(b);
  }
  staging.stop();
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

TEST_CASE("Staging::copy copies every byte and no more, streamed or not, whatever the alignment", "[sdk][staging]") {
  // Sizes on both sides of the streaming threshold (32 KiB) and of the
  // 64-byte step, sources at every 16-byte misalignment and then some,
  // destinations aligned (streamed) and not (memcpy).
  const std::size_t sizes[] = {
      0, 1, 63, 4096, (32 << 10) - 1, 32 << 10, (32 << 10) + 1, (32 << 10) + 63, (1 << 20) + 17};
  std::vector<unsigned char> src((1 << 20) + 256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + (i >> 8));
  const std::size_t guard = 64;
  for (std::size_t n : sizes) {
    for (std::size_t src_off : {0, 1, 7, 16, 33}) {
      for (std::size_t dst_off : {0, 16, 3}) {
        CAPTURE(n, src_off, dst_off);
        auto* raw = static_cast<unsigned char*>(std::aligned_alloc(64, (n + dst_off + 2 * guard + 63) / 64 * 64));
        REQUIRE(raw != nullptr);
        std::memset(raw, 0xAB, n + dst_off + 2 * guard);
        unsigned char* dst = raw + guard + dst_off;
        Staging::copy(reinterpret_cast<char*>(dst), src.data() + src_off, n);
        CHECK(std::memcmp(dst, src.data() + src_off, n) == 0);
        // Nothing before or after the destination is written.
        CHECK(std::all_of(raw, dst, [](unsigned char c) { return c == 0xAB; }));
        CHECK(std::all_of(dst + n, dst + n + guard, [](unsigned char c) { return c == 0xAB; }));
        std::free(raw);
      }
    }
  }
}

TEST_CASE("a name kept by reference reaches the writer whole, and a kept slot's next record has its own again",
          "[sdk][staging]") {
  // The name table's copy of a name outlives the run: staging keeps a
  // pointer to it and name_slots() copies it in on the writer's side. The slot is
  // then reused by records whose names are their own, and the other way
  // round, over more slots than one block of the slot list holds.
  Staging staging(1 << 20, Overflow::Block);
  std::vector<std::string> kept;
  for (int i = 0; i < 600; ++i) kept.push_back("model.layers." + std::to_string(i) + ".a_name_longer_than_sso");
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 600; ++i) {
      Slot s = slot_of(4, static_cast<std::uint64_t>(round * 1000 + i));
      s.record.desc.name = "own" + std::to_string(i);
      tensortap::detail::RecordSpec r = spec(s);
      // Rounds 0 and 2 by reference; 1 and 3 the record's own (the kept
      // slot last held a reference).
      const bool by_ref = round % 2 == 0;
      tensortap::detail::RecordSpec with_ref{r.kind, by_ref ? kept[static_cast<std::size_t>(i)] : s.record.desc.name,
                                             r.step,  r.dtype, r.shape, r.nbytes, r.op, r.stats_row, r.scan, r.id,
                                             by_ref};
      REQUIRE(staging.put(with_ref, "abcd", false));
    }
    Staging::Buffer* b = staging.take();
    REQUIRE(b != nullptr);
    Staging::name_slots(*b);
    REQUIRE(b->slots.size() == 600);
    std::size_t i = 0;
    for (const Slot& got : b->slots) {
      const std::string want = round % 2 == 0 ? kept[i] : "own" + std::to_string(i);
      CHECK(got.record.desc.name == want);
      CHECK(got.id == static_cast<std::uint64_t>(round * 1000) + i);
      ++i;
    }
    staging.release(b);
  }
  staging.stop();
}

TEST_CASE("a capture that waits for room under Block is timed, and a step that waited long is said once",
          "[sdk][staging]") {
  // Issue 57: "the training thread never waits for the disk" was not true
  // of Overflow::Block while staging was full, and nothing said so.
  tt_test::TempDir dir;
  Staging staging(8192, Overflow::Block);
  const std::string bytes(6000, 'x');
  Slot s = slot_of(bytes.size(), 1);
  s.record.desc.step = 7;
  CHECK(staging.blocked_seconds() == 0.0);
  const std::string err = tt_test::stderr_of(dir.path + "/stderr", [&] {
    REQUIRE(staging.put(spec(s), bytes.data(), true));
    Staging::Buffer* a = staging.take();  // the writer holds one buffer
    REQUIRE(staging.put(spec(s), bytes.data(), true));  // the other fills
    std::thread capture([&] { CHECK(staging.put(spec(s), bytes.data(), true)); });  // waits
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    staging.release(a);                   // the writer is done with one buffer
    Staging::Buffer* b = staging.take();  // and takes the full one
    capture.join();
    // A second long wait in the same run is counted, not said again.
    std::thread again([&] { CHECK(staging.put(spec(s), bytes.data(), true)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    staging.release(b);
    Staging::Buffer* c = staging.take();
    again.join();
    staging.release(c);
    staging.stop();
    while (Staging::Buffer* rest = staging.take()) staging.release(rest);
  });
  CHECK(staging.blocked_seconds() >= 0.14);
  CHECK(staging.blocked_seconds() < 10.0);
  CHECK_THAT(err, Catch::Contains("tensortap: warning: step 7 waited ") &&
                      Catch::Contains(" s for staging room (Overflow::Block); Format::Packed, Overflow::DropNewest or "
                                      "a larger buffer_bytes avoid it"));
  CHECK(err.find("warning") == err.rfind("warning"));  // once
}
