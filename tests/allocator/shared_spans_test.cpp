// Shared spans (Config::shared_spans, docs/design-notes.md "Shared spans"):
// a class of slots up to 32 KiB takes its spans as 256 KiB slots of a host
// span (a span of the 256 KiB class) until it holds a granule of them, so
// that classes of a few blocks share one granule instead of a granule each.
// On a simulated H200: what they hold, how frees find them, what bad frees
// get, that they all go back, and what memory_map says of them.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "sim_allocator_fixture.hpp"

namespace gvm::test {
namespace {

using vmm::Result;
using vmm::SimDriver;
using vmm::StreamHandle;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * kKiB;
constexpr std::size_t kGranuleBytes = 2 * kMiB;

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

class SharedSpans : public SimAllocatorFixture {
 protected:
  Allocator& make(bool shared = true) {
    Config c;
    c.span_warmup_allocations = 0;  // spans from the first allocation
    c.shared_spans = shared;
    return SimAllocatorFixture::make(c);
  }
  // Eight classes of up to 32 KiB, `per_class` blocks each.
  std::vector<std::pair<void*, std::size_t>> eight_classes(Allocator& a, int per_class) {
    std::vector<std::pair<void*, std::size_t>> out;
    for (std::size_t n : {kKiB / 2, kKiB, 2 * kKiB, 4 * kKiB, 6 * kKiB, 8 * kKiB, 16 * kKiB,
                          32 * kKiB})
      for (int i = 0; i < per_class; ++i) out.emplace_back(a.allocate(n, 0, nullptr), n);
    return out;
  }
};

TEST_F(SharedSpans, EightClassesOfAFewBlocksShareOneGranule) {
  Allocator& a = make();
  auto blocks = eight_classes(a, 3);
  std::set<std::uintptr_t> granules;
  for (auto& [p, n] : blocks) granules.insert(addr(p) & ~(kGranuleBytes - 1));
  EXPECT_EQ(granules.size(), 1u);
  EXPECT_EQ(stats().reserved_bytes, kGranuleBytes);
  EXPECT_EQ(stats().live_bytes, [&] {
    std::size_t sum = 0;
    for (auto& [p, n] : blocks) sum += n;
    return sum;
  }());
  // A class's blocks are consecutive slots of its span, 512-aligned.
  for (std::size_t i = 0; i < blocks.size(); i += 3) {
    EXPECT_EQ(addr(blocks[i].first) % 512, 0u);
    EXPECT_EQ(addr(blocks[i + 1].first) - addr(blocks[i].first), blocks[i].second);
    EXPECT_EQ(addr(blocks[i + 2].first) - addr(blocks[i + 1].first), blocks[i].second);
  }
  EXPECT_TRUE(invariants());
  for (auto& [p, n] : blocks) a.deallocate(p, n, 0, nullptr);
  EXPECT_EQ(stats().live_bytes, 0u);
  EXPECT_TRUE(invariants());
  a.trim();
  EXPECT_EQ(stats().reserved_bytes, 0u);
  EXPECT_EQ(sim_->physical_used(0), 0u);
}

TEST_F(SharedSpans, WithoutThemEachClassTakesAGranule) {
  Allocator& a = make(false);
  auto blocks = eight_classes(a, 3);
  EXPECT_EQ(stats().reserved_bytes, 8 * kGranuleBytes);
  for (auto& [p, n] : blocks) a.deallocate(p, n, 0, nullptr);
  EXPECT_TRUE(invariants());
}

TEST_F(SharedSpans, TheHostsOwnSlotsServeItsClassBesideThem) {
  Allocator& a = make();
  void* small = a.allocate(4096, 0, nullptr);  // a shared span in slot 0 of a host
  void* own = a.allocate(256 * kKiB, 0, nullptr);  // the host's class: its next slot
  EXPECT_EQ(addr(own) & ~(kGranuleBytes - 1), addr(small) & ~(kGranuleBytes - 1));
  EXPECT_EQ(addr(own) - addr(small), 256 * kKiB);
  EXPECT_EQ(stats().reserved_bytes, kGranuleBytes);
  EXPECT_EQ(stats().live_bytes, 4096 + 256 * kKiB);
  EXPECT_TRUE(invariants());
  a.deallocate(small, 4096, 0, nullptr);
  a.deallocate(own, 256 * kKiB, 0, nullptr);
  EXPECT_TRUE(invariants());
  a.trim();
  EXPECT_EQ(stats().reserved_bytes, 0u);
}

TEST_F(SharedSpans, AClassPastAGranuleOfSharedSpansTakesWholeGranules) {
  Allocator& a = make();
  // 4 KiB slots: 64 in a shared span, eight shared spans fill a granule of
  // them, and the class's next span is a granule of its own.
  std::vector<void*> p;
  for (int i = 0; i < 8 * 64; ++i) p.push_back(a.allocate(4096, 0, nullptr));
  EXPECT_EQ(stats().reserved_bytes, kGranuleBytes);
  p.push_back(a.allocate(4096, 0, nullptr));
  EXPECT_EQ(stats().reserved_bytes, 2 * kGranuleBytes);
  EXPECT_EQ(addr(p.back()) % kGranuleBytes, 0u) << "a granule span starts at its granule";
  for (int i = 0; i < 511; ++i) p.push_back(a.allocate(4096, 0, nullptr));
  EXPECT_EQ(stats().reserved_bytes, 2 * kGranuleBytes);
  EXPECT_TRUE(invariants());
  for (void* q : p) a.deallocate(q, 4096, 0, nullptr);
  EXPECT_TRUE(invariants());
  a.trim();
  EXPECT_EQ(stats().reserved_bytes, 0u);
}

TEST_F(SharedSpans, BadFreesOfASharedSlotAreRefusedAndChangeNothing) {
  Allocator& a = make();
  void* host_slot_user = a.allocate(256 * kKiB, 0, nullptr);
  void* x = a.allocate(1000, 0, nullptr);  // class 1024, a shared span
  void* y = a.allocate(1000, 0, nullptr);
  const DeviceStats before = stats();
  // An interior pointer, a size of another class, and after a free, a second free.
  EXPECT_THROW(a.deallocate(static_cast<char*>(x) + 512, 1000, 0, nullptr), usage_error);
  EXPECT_THROW(a.deallocate(x, 4096, 0, nullptr), usage_error);
  EXPECT_EQ(stats().live_bytes, before.live_bytes);
  EXPECT_EQ(stats().frees, before.frees);
  a.deallocate(x, 1000, 0, nullptr);
  try {
    a.deallocate(x, 1000, 0, nullptr);
    ADD_FAILURE() << "a double free of a shared slot was taken";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a live block"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(invariants());
  a.deallocate(y, 1000, 0, nullptr);
  a.deallocate(host_slot_user, 256 * kKiB, 0, nullptr);
  EXPECT_EQ(stats().live_bytes, 0u);
  EXPECT_TRUE(invariants());
}

TEST_F(SharedSpans, ASlotFreedOnAnotherStreamWaitsForItBeforeReuse) {
  Allocator& a = make();
  StreamHandle side = new_stream();
  void* x = a.allocate(2048, 0, nullptr);
  void* keep = a.allocate(2048, 0, nullptr);  // the span stays in use
  a.deallocate(x, 2048, 0, side);  // freed on another stream
  void* z = a.allocate(2048, 0, nullptr);
  EXPECT_EQ(z, x) << "the slot is reused, ordered after the side stream's work";
  EXPECT_GE(stats().cross_stream_waits, 1u);
  // record_stream on a shared slot: its reuse waits for the recorded stream.
  const std::uint64_t waits = stats().cross_stream_waits;
  a.record_stream(z, side);
  a.deallocate(z, 2048, 0, nullptr);
  EXPECT_GT(stats().cross_stream_waits, waits);
  a.deallocate(keep, 2048, 0, nullptr);
  EXPECT_TRUE(invariants());
}

TEST_F(SharedSpans, MemoryMapShowsTheSharedSlotsInTheirHostsGranule) {
  Allocator& a = make();
  void* x = a.allocate(512, 0, nullptr);
  void* y = a.allocate(8 * kKiB, 0, nullptr);
  void* own = a.allocate(250 * kKiB, 0, nullptr);  // a slot of the host class itself
  const auto map = a.memory_map(0);
  std::size_t tiles = 0;
  bool saw_x = false, saw_y = false, saw_own = false;
  for (const SegmentInfo& s : map) {
    std::uintptr_t at = s.addr;
    for (const BlockInfo& b : s.blocks) {
      EXPECT_EQ(b.addr, at) << "blocks tile their segment in address order";
      at += b.size;
      ++tiles;
      if (b.addr == addr(x)) saw_x = b.allocated && b.small && b.size == 512;
      if (b.addr == addr(y)) saw_y = b.allocated && b.small && b.size == 8 * kKiB;
      if (b.addr == addr(own)) saw_own = b.allocated && b.small && b.size == 256 * kKiB;
    }
    EXPECT_EQ(at, s.addr + s.size);
  }
  EXPECT_TRUE(saw_x);
  EXPECT_TRUE(saw_y);
  EXPECT_TRUE(saw_own);
  EXPECT_GE(tiles, 5u);
  a.deallocate(x, 512, 0, nullptr);
  a.deallocate(y, 8 * kKiB, 0, nullptr);
  a.deallocate(own, 250 * kKiB, 0, nullptr);
}

TEST_F(SharedSpans, ChurnOverManyClassesKeepsTheInvariantsAndGivesEverythingBack) {
  Allocator& a = make();
  std::vector<std::pair<void*, std::size_t>> live;
  std::uint64_t x = 12345;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int step = 0; step < 20000; ++step) {
    if (live.size() < 300 && (next() % 3 != 0 || live.empty())) {
      const std::size_t n = 1 + next() % (300 * kKiB);
      live.emplace_back(a.allocate(n, 0, nullptr), n);
    } else {
      const std::size_t i = next() % live.size();
      a.deallocate(live[i].first, live[i].second, 0, nullptr);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 2000 == 0) {
      ASSERT_TRUE(invariants()) << "step " << step;
    }
  }
  for (auto& [p, n] : live) a.deallocate(p, n, 0, nullptr);
  EXPECT_TRUE(invariants());
  a.trim();
  EXPECT_EQ(stats().reserved_bytes, 0u);
  EXPECT_EQ(sim_->physical_used(0), 0u);
}

}  // namespace
}  // namespace gvm::test
