// AllocatorSuite: what gvm::Allocator must do over any driver, as one
// value-parameterized GoogleTest suite (the shape of RMM's mr_ref tests).
//
// Include this header in exactly ONE source file of a test binary (it defines
// the tests), then instantiate it with the targets to test:
//
//   INSTANTIATE_TEST_SUITE_P(Cuda, AllocatorSuite,
//       ::testing::Values(gvm::test::AllocatorTarget{"cuda",
//           [](std::string* why) { return gvm::vmm::try_load_cuda_test_driver(why); },
//           gvm::Config{}, std::size_t{2} << 30}),
//       gvm::test::target_name);
//
// A target whose factory returns nullptr makes every test skip with the reason
// it gave. Everything here goes through the Driver interface only (copies for
// data checks, streams from stream_create), so the same tests run on the real
// driver; what only the simulator can show (races, sticky errors, fault
// injection, leak counters) is in allocator_sim_test.cpp, with a few extra
// checks here where the driver happens to be a SimDriver.
//
// A SimDriver target must have backing enabled: the data checks read back
// what they wrote.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/json_check.hpp"
#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;

struct AllocatorTarget {
  std::string name;  // the test-name suffix: letters, digits and '_' only
  // A driver, or nullptr with *why saying why there is none.
  std::function<std::unique_ptr<vmm::TestDriver>(std::string* why)> make;
  Config config;
  // The most bytes the suite maps per device. Where the device has more free
  // memory than this, the tests that run out of memory cap the allocator
  // here (max_reserved_bytes); a simulated device with this physical budget
  // runs out in the driver instead.
  std::size_t budget = 0;
  // How long the multi-threaded tests run.
  std::chrono::milliseconds threaded_time{1000};
};

// GoogleTest prints the parameter of a failed test: its name, not its bytes.
inline void PrintTo(const AllocatorTarget& t, std::ostream* os) {
  *os << t.name;
}

inline std::string target_name(const ::testing::TestParamInfo<AllocatorTarget>& info) {
  return info.param.name;
}

inline std::size_t round_up(std::size_t x, std::size_t a) {
  return (x + a - 1) / a * a;
}

inline std::uintptr_t addr_of(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// "%.2f MiB" the way gvmalloc writes sizes in its messages ("1.50 GiB",
// "100.00 MiB", "4096 bytes").
inline std::string human_bytes(std::size_t n) {
  char buf[64];
  const double gib = static_cast<double>(n) / double(std::size_t{1} << 30);
  const double mib = static_cast<double>(n) / double(kMiB);
  if (gib >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", gib);
  } else if (mib >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", mib);
  } else {
    std::snprintf(buf, sizeof buf, "%zu bytes", n);
  }
  return buf;
}

// A seed for randomized tests: GVM_TEST_SEED if set, else a fixed one derived
// from `salt`, so a failure reproduces by rerunning with the seed it printed.
inline std::uint64_t test_seed(const std::string& salt) {
  if (const char* s = std::getenv("GVM_TEST_SEED"); s != nullptr && *s != '\0')
    return std::strtoull(s, nullptr, 0);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : salt) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// A block the test holds.
struct Held {
  void* p = nullptr;
  std::size_t bytes = 0;
  int device = 0;
  vmm::StreamHandle stream = nullptr;
  std::size_t charged = 0;  // what live_bytes grew by when it was allocated
  unsigned char tag = 0;
};

class AllocatorSuite : public ::testing::TestWithParam<AllocatorTarget> {
 protected:
  void SetUp() override {
    std::string why;
    driver_ = GetParam().make(&why);
    if (!driver_) GTEST_SKIP() << "no driver (" << GetParam().name << "): " << why;
    ASSERT_EQ(driver_->device_count(&devices_), vmm::Result::success);
    if (devices_ == 0) GTEST_SKIP() << "the driver shows no device";
    sim_ = dynamic_cast<vmm::SimDriver*>(driver_.get());
    std::size_t free_bytes = 0, total = 0;
    ASSERT_EQ(driver_->mem_get_info(0, &free_bytes, &total), vmm::Result::success);
    device_free_ = free_bytes;
  }

  void TearDown() override {
    alloc_.reset();  // fences and unmaps before the streams go
    if (driver_) {
      for (auto& [device, s] : streams_) (void)driver_->stream_destroy(device, s);
    }
    streams_.clear();
    driver_.reset();
  }

  const AllocatorTarget& target() const { return GetParam(); }
  vmm::TestDriver& driver() { return *driver_; }
  vmm::SimDriver* sim() { return sim_; }
  int devices() const { return devices_; }
  std::size_t budget() const { return target().budget; }
  // A block size that scales with the budget: 4 MiB on a 64 MiB device, at
  // most 64 MiB (so that a simulated 192 GiB device needs no more blocks
  // than a small one to show the same thing). Always a whole granule and
  // above the small-block maximum.
  std::size_t unit() const {
    const std::size_t g = std::size_t{2} << 20;
    return std::max<std::size_t>(std::min<std::size_t>(budget() / 16, 64 * kMiB) / g * g, 2 * g);
  }

  // The allocator under test, made on first use with the target's config.
  Allocator& alloc() {
    if (!alloc_) alloc_ = std::make_unique<Allocator>(*driver_, target().config);
    return *alloc_;
  }
  // Replaces the allocator (the old one is destroyed first).
  Allocator& remake(const Config& c) {
    alloc_.reset();
    alloc_ = std::make_unique<Allocator>(*driver_, c);
    return *alloc_;
  }
  // The target's config with spans from a class's first allocation, for
  // every class (tests of spans; by default a class is served best fit until
  // it is warm, and a class of slots above span_max always).
  Config spans_now(Config c) const {
    c.span_warmup_allocations = 0;
    c.span_max_bytes = c.small_block_max_bytes;
    return c;
  }
  // The target's config, capped at the budget where the device has more.
  Config oom_config() const {
    Config c = target().config;
    if (device_free_ > budget()) {
      if (c.max_reserved_bytes == 0 || c.max_reserved_bytes > budget())
        c.max_reserved_bytes = budget();
    }
    return c;
  }
  // What the allocator will really use: VMM or the cuMemAlloc fallback.
  bool uses_vmm() { return alloc().caps(0).vmm && !alloc().config().force_no_vmm; }

  // The i-th stream made by the test on `device` (created on first use).
  vmm::StreamHandle stream(int i, int device = 0) {
    std::size_t seen = 0;
    for (auto& [d, s] : streams_) {
      if (d != device) continue;
      if (seen++ == static_cast<std::size_t>(i)) return s;
    }
    vmm::StreamHandle s = nullptr;
    for (; seen <= static_cast<std::size_t>(i); ++seen) {
      EXPECT_EQ(driver_->stream_create(device, &s), vmm::Result::success);
      streams_.emplace_back(device, s);
    }
    return s;
  }

  DeviceStats dstats(int device = 0) { return alloc().device_stats(device); }

  // Every call the simulated driver has seen, from anyone.
  std::uint64_t sim_call_total() const {
    std::uint64_t n = 0;
    for (int c = 0; c < vmm::kCallCount; ++c) n += sim_->call_count(static_cast<vmm::Call>(c));
    return n;
  }

  ::testing::AssertionResult invariants() {
    std::string why;
    if (alloc().check_invariants(&why)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "invariant broken: " << why;
  }

  // Writes `value` to the first and last byte of a block (synchronous copies).
  void put_tag(const Held& h, unsigned char value) {
    const auto at = static_cast<vmm::DevicePtr>(addr_of(h.p));
    ASSERT_EQ(driver_->memcpy_htod(h.device, at, &value, 1), vmm::Result::success);
    ASSERT_EQ(driver_->memcpy_htod(h.device, at + h.bytes - 1, &value, 1), vmm::Result::success);
  }
  // Both bytes still hold what put_tag wrote (no other block overlapped).
  ::testing::AssertionResult tag_intact(const Held& h) {
    const auto at = static_cast<vmm::DevicePtr>(addr_of(h.p));
    unsigned char first = 0, last = 0;
    if (driver_->memcpy_dtoh(h.device, &first, at, 1) != vmm::Result::success ||
        driver_->memcpy_dtoh(h.device, &last, at + h.bytes - 1, 1) != vmm::Result::success)
      return ::testing::AssertionFailure() << "cannot read block " << h.p << " back";
    if (first != h.tag || last != h.tag)
      return ::testing::AssertionFailure()
             << "block " << h.p << " (" << h.bytes << " bytes) holds " << int(first) << "/"
             << int(last) << ", wrote " << int(h.tag);
    return ::testing::AssertionSuccess();
  }

  // Allocates and records what live_bytes grew by.
  Held take(std::size_t bytes, int device = 0, vmm::StreamHandle s = nullptr) {
    Held h;
    h.bytes = bytes;
    h.device = device;
    h.stream = s;
    const std::size_t before = dstats(device).live_bytes;
    h.p = alloc().allocate(bytes, device, s);
    h.charged = dstats(device).live_bytes - before;
    return h;
  }
  void give(const Held& h) { alloc().deallocate(h.p, h.bytes, h.device, h.stream); }

  std::unique_ptr<vmm::TestDriver> driver_;
  vmm::SimDriver* sim_ = nullptr;
  int devices_ = 0;
  std::size_t device_free_ = 0;
  std::unique_ptr<Allocator> alloc_;
  std::vector<std::pair<int, vmm::StreamHandle>> streams_;
};

// Everything a refused call must leave as it was: the device counters and the
// driver calls made (a refused call makes none).
struct Frozen {
  std::vector<DeviceStats> devices;
  std::array<std::uint64_t, vmm::kCallCount> calls{};

  explicit Frozen(const Allocator& a) {
    const Stats s = a.stats();
    devices = s.devices;
    calls = s.driver.calls;
  }
  static bool same(const DeviceStats& a, const DeviceStats& b) {
#define GVM_STATS_SAME(type, name, doc) a.name == b.name&&
    return GVM_DEVICE_STATS_FIELDS(GVM_STATS_SAME) true;
#undef GVM_STATS_SAME
  }
  friend bool operator==(const Frozen& a, const Frozen& b) {
    if (a.devices.size() != b.devices.size() || a.calls != b.calls) return false;
    for (std::size_t i = 0; i < a.devices.size(); ++i)
      if (!same(a.devices[i], b.devices[i])) return false;
    return true;
  }
};

// ============================================================ sizes, layout ==

TEST_P(AllocatorSuite, EverySizeAloneIsServedOrIsOutOfMemory) {
  const std::vector<std::size_t> sizes = {
      1,     511,      512,  513,      3,        1000,         4 * kKiB,        4 * kKiB + 1,
      65537, kMiB - 1, kMiB, kMiB + 1, 2 * kMiB, 3 * kMiB + 7, 33 * kMiB + 513, 100 * kMiB};
  for (std::size_t n : sizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    if (n > budget()) {
      EXPECT_THROW(alloc().allocate(n, 0, nullptr), out_of_memory);
      EXPECT_TRUE(invariants());
      continue;
    }
    Held h = take(n);
    ASSERT_NE(h.p, nullptr);
    EXPECT_EQ(addr_of(h.p) % kBlockAlignment, 0u);
    EXPECT_GE(h.charged, n);
    EXPECT_EQ(h.charged % kBlockAlignment, 0u);
    h.tag = 0x5a;
    put_tag(h, h.tag);
    EXPECT_TRUE(tag_intact(h));
    EXPECT_TRUE(invariants());
    give(h);
    EXPECT_EQ(dstats().live_bytes, 0u);
    EXPECT_TRUE(invariants());
  }
}

TEST_P(AllocatorSuite, LiveBlocksAreAlignedAndDoNotOverlap) {
  // Three blocks of every small size class neighbourhood and some large ones,
  // all live at once.
  std::vector<std::size_t> sizes = {
      1,    200,  511,   512,   513,      600,        640,  700,      768,          800,
      896,  1000, 1024,  1025,  1300,     1536,       1800, 2047,     2049,         3000,
      5000, 7777, 12345, 40000, kMiB / 3, kMiB - 512, kMiB, kMiB + 1, 2 * kMiB + 3, unit() + 511};
  std::vector<Held> held;
  unsigned char tag = 1;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t n : sizes) {
      // The third round on another stream, large sizes only: a stream's
      // small blocks take a span (one granule) per size class, more than a
      // 64 MiB device has for thirty classes on two streams.
      if (round == 2 && n <= alloc().config().small_block_max_bytes) continue;
      Held h = take(n, 0, round == 2 ? stream(0) : nullptr);
      h.tag = tag++;
      if (tag == 0) tag = 1;
      EXPECT_EQ(addr_of(h.p) % kBlockAlignment, 0u) << n << " bytes at " << h.p;
      put_tag(h, h.tag);
      held.push_back(h);
    }
  }
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> spans;
  for (const Held& h : held) spans.emplace_back(addr_of(h.p), addr_of(h.p) + h.bytes);
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].second, spans[i].first) << "blocks overlap";
  for (const Held& h : held) EXPECT_TRUE(tag_intact(h));
  EXPECT_TRUE(invariants());
  for (const Held& h : held) give(h);
  EXPECT_EQ(dstats().live_bytes, 0u);
  EXPECT_TRUE(invariants());
}

// ================================================================== reuse ==

TEST_P(AllocatorSuite, FreedBlockIsReusedOnItsStreamWithoutDriverCalls) {
  // One allocator per stream: free blocks merge, and a merged block carries
  // the streams of all its parts (reuse by another stream must wait for them).
  for (int which = 0; which < 2; ++which) {
    Allocator& a = remake(target().config);
    vmm::StreamHandle s = which == 0 ? nullptr : stream(0);
    for (std::size_t n :
         {std::size_t{1}, std::size_t{512}, 4 * kKiB, kMiB, kMiB + 1, 2 * kMiB, unit() + 3}) {
      SCOPED_TRACE("size " + std::to_string(n) + (s == nullptr ? " legacy stream" : " stream"));
      void* p = a.allocate(n, 0, s);
      a.deallocate(p, n, 0, s);
      const Stats before = a.stats();
      const std::uint64_t sim_before = sim() != nullptr ? sim_call_total() : 0;
      void* q = a.allocate(n, 0, s);
      const Stats after = a.stats();
      EXPECT_EQ(q, p);
      EXPECT_EQ(after.driver.total_calls(), before.driver.total_calls());
      EXPECT_EQ(after.devices[0].cache_hits, before.devices[0].cache_hits + 1);
      EXPECT_EQ(after.devices[0].reserved_bytes, before.devices[0].reserved_bytes);
      if (sim() != nullptr) {
        EXPECT_EQ(sim_call_total(), sim_before);
      }
      a.deallocate(q, n, 0, s);
      EXPECT_TRUE(invariants());
    }
  }
}

TEST_P(AllocatorSuite, LargeBlockTakenByAnotherStreamWaitsForTheFirst) {
  vmm::StreamHandle s = stream(0), t = stream(1);
  const std::size_t n = unit() + 1;
  void* p = alloc().allocate(n, 0, s);
  alloc().deallocate(p, n, 0, s);
  const std::uint64_t waits = dstats().cross_stream_waits;
  void* q = alloc().allocate(n, 0, t);
  EXPECT_EQ(q, p) << "best fit should hand the same block out again";
  EXPECT_GT(dstats().cross_stream_waits, waits);
  alloc().deallocate(q, n, 0, t);
  EXPECT_TRUE(invariants());
}

// ============================================================= coalescing ==

TEST_P(AllocatorSuite, FreeNeighboursMergeAcrossChunks) {
  // Odd sizes, so the blocks straddle granule and chunk boundaries.
  const std::size_t n = 2 * unit() + 512 + 1;
  const std::size_t r = round_up(n, kBlockAlignment);
  if (!uses_vmm()) {
    // Without VMM each growth is a separate cuMemAlloc segment, and blocks
    // merge only inside one: make one segment big enough for all three.
    Held room = take(3 * r + 512);
    give(room);
  }
  Held a = take(n), b = take(n), c = take(n);
  ASSERT_EQ(addr_of(b.p), addr_of(a.p) + r) << "a fresh arena hands out contiguous blocks";
  ASSERT_EQ(addr_of(c.p), addr_of(b.p) + r);
  c.tag = 0x77;
  put_tag(c, c.tag);
  give(a);
  give(b);
  EXPECT_TRUE(invariants());
  const DeviceStats before = dstats();
  Held d = take(2 * r);
  EXPECT_EQ(d.p, a.p) << "A and B merged into one free block";
  const DeviceStats after = dstats();
  EXPECT_EQ(after.chunks_mapped, before.chunks_mapped) << "the merged block needed no growth";
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_TRUE(tag_intact(c));
  give(d);
  give(c);
  EXPECT_TRUE(invariants());
}

// =================================================================== trim ==

TEST_P(AllocatorSuite, TrimReturnsWhatLiveBlocksDoNotNeed) {
  Held a = take(3 * unit() + 1000);
  const std::size_t reserved_a = dstats().reserved_bytes;
  const std::size_t used_a = sim() != nullptr ? sim()->physical_used(0) : 0;
  Held b = take(5 * unit() + 7);
  Held small1 = take(4 * kKiB), small2 = take(100);
  a.tag = 0xa1;
  put_tag(a, a.tag);
  EXPECT_GT(dstats().reserved_bytes, reserved_a);
  give(b);
  give(small1);
  give(small2);
  const std::size_t handles = sim() != nullptr ? sim()->live_handles() : 0;
  const std::size_t unmapped = dstats().chunks_unmapped;
  alloc().trim();
  DeviceStats s = dstats();
  EXPECT_EQ(s.reserved_bytes, reserved_a);
  EXPECT_EQ(s.live_bytes, a.charged);
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.live_bytes);
  EXPECT_GT(s.chunks_unmapped, unmapped);
  if (sim() != nullptr) {
    EXPECT_EQ(sim()->physical_used(0), used_a);
    if (uses_vmm()) {
      EXPECT_LT(sim()->live_handles(), handles);
    }
  }
  EXPECT_TRUE(tag_intact(a));
  EXPECT_TRUE(invariants());
  give(a);
  alloc().trim();
  s = dstats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  if (sim() != nullptr) {
    EXPECT_EQ(sim()->physical_used(0), 0u);
    EXPECT_EQ(sim()->live_handles(), 0u);
    EXPECT_EQ(sim()->live_classic_allocations(), 0u);
  }
  EXPECT_TRUE(invariants());
  // And the allocator still works after giving everything back.
  Held c = take(unit() + 5);
  give(c);
  EXPECT_TRUE(invariants());
}

TEST_P(AllocatorSuite, TrimKeepsExactlyTheGranulesOfLiveSmallBlocks) {
  remake(spans_now(target().config));
  std::vector<Held> held;
  std::mt19937_64 rng(test_seed(target().name + "trim-small"));
  // A few size classes on two streams: spans of about a dozen classes, which
  // fit a 64 MiB device.
  const std::vector<std::size_t> sizes = {100, 700, 3000, 20000, 100000, 300000};
  for (int i = 0; i < 300; ++i) {
    const std::size_t n =
        sizes[std::uniform_int_distribution<std::size_t>(0, sizes.size() - 1)(rng)];
    held.push_back(take(n, 0, i % 3 == 0 ? stream(0) : nullptr));
  }
  std::vector<Held> kept;
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (i % 37 == 0) {
      kept.push_back(held[i]);
    } else {
      give(held[i]);
    }
  }
  alloc().trim();
  std::vector<std::uintptr_t> granules;
  for (const Held& h : kept) granules.push_back(addr_of(h.p) & ~((std::size_t{2} << 20) - 1));
  std::sort(granules.begin(), granules.end());
  granules.erase(std::unique(granules.begin(), granules.end()), granules.end());
  // In an arena that only ever held small blocks every span mapped its own
  // granule, so what trim keeps is exactly the granules with a live slot.
  EXPECT_EQ(dstats().reserved_bytes, granules.size() * (std::size_t{2} << 20));
  EXPECT_TRUE(invariants());
  for (const Held& h : kept) give(h);
  alloc().trim();
  EXPECT_EQ(dstats().reserved_bytes, 0u);
  EXPECT_TRUE(invariants());
}

// ================================================================== stats ==

TEST_P(AllocatorSuite, StatsEqualWhatTheTestDid) {
  const DeviceStats zero = dstats();
  EXPECT_EQ(zero.live_bytes, 0u);
  EXPECT_EQ(zero.reserved_bytes, 0u);
  EXPECT_EQ(zero.allocations, 0u);
  std::vector<Held> held;
  std::size_t live = 0, peak = 0;
  const std::vector<std::size_t> sizes = {1, 700, 4 * kKiB, kMiB, kMiB + 1, unit() + 3, 3 * kMiB};
  for (std::size_t n : sizes) {
    held.push_back(take(n));
    const Held& h = held.back();
    // Small blocks round to their class (at most 25% over), large ones to 512 B.
    if (n > alloc().config().small_block_max_bytes) {
      EXPECT_EQ(h.charged, round_up(n, kBlockAlignment)) << n;
    } else {
      EXPECT_LE(h.charged, std::max<std::size_t>(512, n + n / 4 + 511)) << n;
    }
    live += h.charged;
    peak = std::max(peak, live);
  }
  DeviceStats s = dstats();
  EXPECT_EQ(s.live_bytes, live);
  EXPECT_EQ(s.peak_live_bytes, peak);
  EXPECT_EQ(s.allocations, sizes.size());
  EXPECT_EQ(s.frees, 0u);
  EXPECT_GE(s.reserved_bytes, s.live_bytes);
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.live_bytes);
  EXPECT_EQ(s.reserved_bytes % (std::size_t{2} << 20), 0u);
  EXPECT_EQ(s.peak_reserved_bytes, s.reserved_bytes);
  EXPECT_LE(s.cache_hits, s.allocations);
  const Stats all = alloc().stats();
  const auto& calls = all.driver.calls;
  if (uses_vmm()) {
    EXPECT_EQ(s.chunks_mapped, calls[static_cast<int>(vmm::Call::mem_create)]);
    EXPECT_EQ(s.chunks_mapped, calls[static_cast<int>(vmm::Call::mem_map)]);
  } else {
    EXPECT_GE(calls[static_cast<int>(vmm::Call::mem_alloc)], s.chunks_mapped);
  }
  if (sim() != nullptr) {
    // Every driver call the allocator made went through its counter.
    for (int c = 0; c < vmm::kCallCount; ++c) {
      const auto call = static_cast<vmm::Call>(c);
      if (call == vmm::Call::memcpy_htod || call == vmm::Call::memcpy_dtoh ||
          call == vmm::Call::stream_create || call == vmm::Call::stream_destroy ||
          call == vmm::Call::mem_get_info || call == vmm::Call::device_count)
        continue;  // the test's own calls
      EXPECT_EQ(calls[static_cast<std::size_t>(c)], sim()->call_count(call))
          << vmm::call_name(call);
    }
  }
  // Free half: live drops by exactly what each block added; peaks stay.
  std::size_t freed = 0;
  for (std::size_t i = 0; i < held.size(); i += 2) {
    give(held[i]);
    live -= held[i].charged;
    ++freed;
  }
  s = dstats();
  EXPECT_EQ(s.live_bytes, live);
  EXPECT_EQ(s.peak_live_bytes, peak);
  EXPECT_EQ(s.frees, freed);
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.live_bytes);
  // Reuse of a freed block counts as a cache hit.
  const std::uint64_t hits = s.cache_hits;
  Held again = take(held[0].bytes);
  EXPECT_EQ(dstats().cache_hits, hits + 1);
  give(again);
  for (std::size_t i = 1; i < held.size(); i += 2) give(held[i]);
  s = dstats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.allocations, s.frees);
  EXPECT_EQ(s.allocations, sizes.size() + 1);
  EXPECT_TRUE(invariants());
  // The other device was never touched.
  if (devices() > 1) {
    const DeviceStats other = dstats(1);
    EXPECT_EQ(other.device, 1);
    EXPECT_EQ(other.allocations, 0u);
    EXPECT_EQ(other.reserved_bytes, 0u);
  }
}

TEST_P(AllocatorSuite, MemoryMapTilesTheReservedBytesAndNamesEveryLiveBlock) {
  remake(spans_now(target().config));
  EXPECT_TRUE(alloc().memory_map(0).empty());
  std::vector<Held> held = {take(100), take(3000), take(unit() + 9), take(kMiB + 1),
                            take(2 * unit(), 0, stream(0))};
  give(held[1]);
  const DeviceStats s = dstats();
  const std::vector<SegmentInfo> map = alloc().memory_map(0);
  std::size_t reserved = 0, live = 0;
  for (const SegmentInfo& seg : map) {
    EXPECT_EQ(seg.device, 0);
    EXPECT_FALSE(seg.scratch);
    reserved += seg.size;
    std::uintptr_t at = seg.addr;
    for (const BlockInfo& b : seg.blocks) {
      EXPECT_EQ(b.addr, at) << "blocks must tile the segment in address order";
      at += b.size;
      if (b.allocated) {
        live += b.size;
        EXPECT_GE(b.size, b.requested);
      } else {
        EXPECT_EQ(b.requested, 0u);
      }
    }
    EXPECT_EQ(at, seg.addr + seg.size);
  }
  EXPECT_EQ(reserved, s.reserved_bytes);
  EXPECT_EQ(live, s.live_bytes);
  // Each live block appears once, with what was asked for (large) or its
  // slot (small), and on its stream.
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (i == 1) continue;
    int found = 0;
    for (const SegmentInfo& seg : map)
      for (const BlockInfo& b : seg.blocks)
        if (b.allocated && b.addr == addr_of(held[i].p)) {
          ++found;
          EXPECT_EQ(b.stream, held[i].stream);
          if (held[i].bytes > alloc().config().small_block_max_bytes) {
            EXPECT_FALSE(b.small);
            EXPECT_EQ(b.requested, held[i].bytes);
          } else {
            EXPECT_TRUE(b.small);
            EXPECT_EQ(b.size, held[i].charged);
          }
        }
    EXPECT_EQ(found, 1) << held[i].bytes;
  }
  for (std::size_t i = 0; i < held.size(); ++i)
    if (i != 1) give(held[i]);
  EXPECT_THROW(alloc().memory_map(devices()), usage_error);
}

TEST_P(AllocatorSuite, SnapshotJsonParsesAndMatchesTheStats) {
  std::vector<Held> held = {take(100), take(unit() + 9)};
  if (devices() > 1) held.push_back(take(5000, 1));
  give(held[0]);
  const std::string text = alloc().snapshot_json();
  const Stats s = alloc().stats();
  Json j;
  std::string why;
  ASSERT_TRUE(JsonReader::parse(text, &j, &why)) << why << "\n" << text;
  ASSERT_EQ(j.kind, Json::Kind::object);
  const Json* devs = j.find("devices");
  ASSERT_NE(devs, nullptr);
  ASSERT_EQ(devs->kind, Json::Kind::array);
  ASSERT_EQ(devs->items.size(), static_cast<std::size_t>(devices()));
  for (int d = 0; d < devices(); ++d) {
    const Json& o = devs->items[static_cast<std::size_t>(d)];
    const DeviceStats& ds = s.devices[static_cast<std::size_t>(d)];
    const std::vector<std::pair<const char*, std::uint64_t>> want = {
        {"device", static_cast<std::uint64_t>(ds.device)},
        {"live_bytes", ds.live_bytes},
        {"reserved_bytes", ds.reserved_bytes},
        {"cached_bytes", ds.cached_bytes},
        {"peak_live_bytes", ds.peak_live_bytes},
        {"peak_reserved_bytes", ds.peak_reserved_bytes},
        {"scratch_reserved_bytes", ds.scratch_reserved_bytes},
        {"allocations", ds.allocations},
        {"frees", ds.frees},
        {"cache_hits", ds.cache_hits},
        {"chunks_mapped", ds.chunks_mapped},
        {"chunks_unmapped", ds.chunks_unmapped},
        {"oom_retries", ds.oom_retries},
        {"fences", ds.fences},
        {"cross_stream_waits", ds.cross_stream_waits}};
    for (const auto& [key, value] : want) {
      const Json* v = o.find(key);
      ASSERT_NE(v, nullptr) << "device " << d << " has no \"" << key << "\"";
      ASSERT_EQ(v->kind, Json::Kind::number) << key;
      EXPECT_EQ(v->as_u64(), value) << key;
    }
  }
  const Json* calls = j.find("driver_calls");
  ASSERT_NE(calls, nullptr);
  ASSERT_EQ(calls->kind, Json::Kind::object);
  const char* create = vmm::call_name(uses_vmm() ? vmm::Call::mem_create : vmm::Call::mem_alloc);
  const Json* c = calls->find(create);
  ASSERT_NE(c, nullptr) << "no \"" << create << "\" in driver_calls";
  ASSERT_NE(c->find("calls"), nullptr);
  ASSERT_NE(c->find("ns"), nullptr);
  EXPECT_GE(c->find("calls")->as_u64(), 1u);
  const Json* config = j.find("config");
  ASSERT_NE(config, nullptr);
  ASSERT_EQ(config->kind, Json::Kind::string);
  EXPECT_EQ(to_string(parse_config(config->text)), to_string(alloc().config()));
  for (std::size_t i = 1; i < held.size(); ++i) give(held[i]);
}

// ==================================================================== OOM ==

// The parts of an OOM message the user needs to act on.
inline ::testing::AssertionResult names_oom_facts(const std::string& msg, const Allocator& a,
                                                  int device, std::size_t request) {
  const std::vector<std::string> want = {"device " + std::to_string(device),
                                         a.caps(device).name,
                                         human_bytes(request),
                                         "live",
                                         "cached",
                                         "reserved"};
  for (const std::string& w : want)
    if (msg.find(w) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks \"" << w << "\": " << msg;
  return ::testing::AssertionSuccess();
}

TEST_P(AllocatorSuite, OutOfMemoryIsTypedAndSaysWhy) {
  Allocator& a = remake(oom_config());
  vmm::StreamHandle s = stream(0);
  Held small = take(4 * kKiB, 0, s);  // a span with free slots, kept
  std::vector<Held> held;
  const std::size_t n = 2 * unit() + 512;
  const std::size_t limit = budget() / n + 2;
  std::string message;
  bool threw = false;
  for (std::size_t i = 0; i < limit && !threw; ++i) {
    const Frozen before(a);
    try {
      held.push_back(take(n, 0, s));
    } catch (const out_of_memory& e) {
      threw = true;
      message = e.what();
      // The failed call counted nothing, held nothing.
      const DeviceStats now = dstats();
      EXPECT_EQ(now.live_bytes, before.devices[0].live_bytes);
      EXPECT_EQ(now.allocations, before.devices[0].allocations);
    }
  }
  ASSERT_TRUE(threw) << "no out_of_memory within " << limit << " blocks of " << n << " bytes";
  EXPECT_TRUE(names_oom_facts(message, a, 0, n));
  std::size_t free_bytes = 0, total = 0;
  if (driver().mem_get_info(0, &free_bytes, &total) == vmm::Result::success) {
    EXPECT_NE(message.find("free of " + human_bytes(total)), std::string::npos) << message;
  }
  // Also a std::bad_alloc, for code that only knows the standard.
  EXPECT_THROW(a.allocate(n, 0, s), std::bad_alloc);
  EXPECT_TRUE(invariants());
  // Still serves what fits: a slot of the kept span, and a smaller block in a
  // freed hole, with no growth.
  Held small2 = take(4 * kKiB, 0, s);
  EXPECT_NE(small2.p, nullptr);
  give(held.front());
  held.erase(held.begin());
  const std::size_t mapped = dstats().chunks_mapped;
  Held smaller = take(unit(), 0, s);
  EXPECT_EQ(dstats().chunks_mapped, mapped);
  EXPECT_TRUE(invariants());
  give(smaller);
  give(small2);
  give(small);
  for (const Held& h : held) give(h);
  EXPECT_EQ(dstats().live_bytes, 0u);
  EXPECT_TRUE(invariants());
}

TEST_P(AllocatorSuite, MoreThanTheDeviceHasIsOutOfMemoryAtOnce) {
  const std::size_t total = alloc().caps(0).total_memory;
  const Frozen before(alloc());
  try {
    alloc().allocate(total + 1, 0, nullptr);
    ADD_FAILURE() << "allocated more than the device has";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find(alloc().caps(0).name), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device 0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before == Frozen(alloc()));
}

TEST_P(AllocatorSuite, SmallRequestOutOfMemoryNamesTheRequest) {
  Allocator& a = remake(oom_config());
  std::vector<Held> held;
  const std::size_t n = unit();  // whole granules: nothing left over for a span
  bool full = false;
  for (std::size_t i = 0; i < budget() / n + 2 && !full; ++i) {
    try {
      held.push_back(take(n));
    } catch (const out_of_memory&) {
      full = true;
    }
  }
  ASSERT_TRUE(full);
  // Fill what is left granule by granule (spans of a size class nobody else uses).
  for (int i = 0; i < 64; ++i) {
    try {
      held.push_back(take(kMiB + 1));
    } catch (const out_of_memory&) {
      break;
    }
  }
  try {
    a.allocate(3000, 0, stream(0));  // a new stream: needs a new span
    ADD_FAILURE() << "a new span fit in a full device";
  } catch (const out_of_memory& e) {
    EXPECT_TRUE(names_oom_facts(e.what(), a, 0, 3000));
  }
  EXPECT_TRUE(invariants());
  for (const Held& h : held) give(h);
}

TEST_P(AllocatorSuite, OutOfMemoryGivesBackEmptySpans) {
  Allocator& a = remake(spans_now(oom_config()));
  vmm::StreamHandle s = stream(0);
  // One block in each of a dozen size classes, all freed: the stream's cache
  // keeps every span (each is its class's current one), 24 MiB in all.
  std::vector<Held> small;
  for (std::size_t n = 1000; n <= 600 * kKiB; n = n * 7 / 4) small.push_back(take(n, 0, s));
  for (const Held& h : small) give(h);
  const DeviceStats before = dstats();
  ASSERT_GE(before.cached_bytes, small.size() * (std::size_t{2} << 20) / 2);
  // A large block that fits only in memory those spans hold.
  const std::size_t g = std::size_t{2} << 20;
  const std::size_t n = round_up(budget() - before.reserved_bytes / 2, g);
  void* p = nullptr;
  try {
    p = a.allocate(n, 0, s);
  } catch (const out_of_memory& e) {
    FAIL() << "empty spans were not given back: " << e.what();
  }
  EXPECT_TRUE(invariants());
  a.deallocate(p, n, 0, s);
  EXPECT_TRUE(invariants());
}

// Fill, then free everything but a pin every fourth block: the freed holes are
// each too small for a request that is still well inside the budget, so it
// only fits in new memory, which only exists once cached chunks are released.
struct BeforeAfter {
  DeviceStats before, after;
};

inline BeforeAfter run_release_then_retry(Allocator& a, std::size_t n, std::size_t budget) {
  std::vector<Held> held;
  for (std::size_t i = 0; i < budget / n + 2; ++i) {
    try {
      Held h;
      h.bytes = n;
      h.p = a.allocate(n, 0, nullptr);
      held.push_back(h);
    } catch (const out_of_memory&) {
      break;
    }
  }
  if (held.size() < 8) {
    ADD_FAILURE() << "only " << held.size() << " blocks of " << n << " bytes fit";
    return {};
  }
  std::vector<Held> pins;
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (i % 4 == 3) {
      pins.push_back(held[i]);
    } else {
      a.deallocate(held[i].p, n, 0, nullptr);
    }
  }
  const DeviceStats before = a.device_stats(0);
  const std::size_t want = 4 * n;  // wider than any hole (3 blocks)
  EXPECT_LE(want + pins.size() * n, budget);
  void* p = nullptr;
  try {
    p = a.allocate(want, 0, nullptr);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the request did not fit after releasing cached chunks: " << e.what();
    for (const Held& h : pins) a.deallocate(h.p, n, 0, nullptr);
    return {};
  }
  const DeviceStats after = a.device_stats(0);
  EXPECT_TRUE(after.oom_retries > before.oom_retries ||
              after.chunks_unmapped > before.chunks_unmapped);
  std::string why;
  EXPECT_TRUE(a.check_invariants(&why)) << why;
  a.deallocate(p, want, 0, nullptr);
  for (const Held& h : pins) a.deallocate(h.p, n, 0, nullptr);
  EXPECT_EQ(a.device_stats(0).live_bytes, 0u);
  return {before, after};
}

TEST_P(AllocatorSuite, RequestThatOnlyFitsOnceCacheIsReleasedSucceeds) {
  // With the default reserve_slack the room comes from release-before-growth
  // or from the OOM retry, depending on how far below its peak live memory is.
  Allocator& a = remake(oom_config());
  (void)run_release_then_retry(a, 2 * unit(), budget());
}

TEST_P(AllocatorSuite, OutOfMemoryRetryReleasesCachedChunks) {
  Config c = oom_config();
  c.reserve_slack = -1;  // no release before growth: only the OOM path frees
  Allocator& a = remake(c);
  const BeforeAfter r = run_release_then_retry(a, 2 * unit(), budget());
  if (c.max_reserved_bytes == 0) {
    EXPECT_EQ(r.after.oom_retries, r.before.oom_retries + 1)
        << "the driver ran out, then the retry worked";
  }
}

// ======================================================== caps on reserve ==

inline void fill_to_cap(Allocator& a, std::size_t n, std::size_t cap) {
  std::vector<void*> held;
  std::string message;
  for (std::size_t i = 0; i < cap / n + 2; ++i) {
    try {
      held.push_back(a.allocate(n, 0, nullptr));
    } catch (const out_of_memory& e) {
      message = e.what();
      break;
    }
  }
  EXPECT_FALSE(message.empty()) << "filled past the cap of " << cap << " bytes";
  EXPECT_NE(message.find("cap"), std::string::npos) << message;
  const DeviceStats s = a.device_stats(0);
  EXPECT_LE(s.peak_reserved_bytes, cap);
  // At least what fits when every block takes whole granules of its own (a
  // segment each, without VMM), less one for rounding.
  EXPECT_GE(held.size(), cap / round_up(n + (std::size_t{2} << 20), std::size_t{2} << 20) - 1);
  std::string why;
  EXPECT_TRUE(a.check_invariants(&why)) << why;
  for (void* p : held) a.deallocate(p, n, 0, nullptr);
}

TEST_P(AllocatorSuite, ReservedBytesCapHolds) {
  Config c = target().config;
  const std::size_t cap = std::min(budget() / 2, 16 * unit());
  c.max_reserved_bytes = cap;
  Allocator& a = remake(c);
  fill_to_cap(a, unit() + 512, cap);
}

TEST_P(AllocatorSuite, MemoryFractionCapsReserve) {
  Config c = target().config;
  const std::size_t total = alloc().caps(0).total_memory;
  const std::size_t want = std::min(budget() / 2, 16 * unit());
  c.memory_fraction = static_cast<double>(want) / static_cast<double>(total);
  const auto cap = static_cast<std::size_t>(c.memory_fraction * static_cast<double>(total));
  Allocator& a = remake(c);
  fill_to_cap(a, unit() + 512, cap);
}

TEST_P(AllocatorSuite, SmallerOfTheTwoCapsWins) {
  Config c = target().config;
  const std::size_t total = alloc().caps(0).total_memory;
  const std::size_t cap = std::min(budget() / 4, 8 * unit());
  c.max_reserved_bytes = cap;
  c.memory_fraction = static_cast<double>(2 * cap) / static_cast<double>(total);
  Allocator& a = remake(c);
  fill_to_cap(a, unit() + 512, cap);
}

// ====================================================== release threshold ==

TEST_P(AllocatorSuite, ReleaseThresholdBoundsCachedBytes) {
  for (std::size_t threshold : {std::size_t{0}, 2 * unit()}) {
    SCOPED_TRACE("threshold " + std::to_string(threshold));
    Config c = target().config;
    c.release_threshold_bytes = threshold;
    Allocator& a = remake(c);
    std::vector<void*> held;
    for (int i = 0; i < 8; ++i) held.push_back(a.allocate(unit(), 0, nullptr));
    const std::size_t reserved = a.device_stats(0).reserved_bytes;
    EXPECT_GE(reserved, 8 * unit());
    for (void* p : held) a.deallocate(p, unit(), 0, nullptr);
    const DeviceStats s = a.device_stats(0);
    EXPECT_LE(s.cached_bytes, threshold);
    EXPECT_GT(s.chunks_unmapped, 0u);
    std::string why;
    EXPECT_TRUE(a.check_invariants(&why)) << why;
  }
}

// ========================================================== reserve slack ==

// Requests that grow step by step, each freed once a longer-lived block (a
// "pin", larger than any hole so far) sits after it: every step leaves a hole
// too small for the next request. Whole granules, so that each hole is whole
// chunks that can go back. Returns the stats at the end.
inline DeviceStats run_growing_steps(Allocator& a, std::size_t unit) {
  const std::size_t g = std::size_t{2} << 20;
  std::vector<std::pair<void*, std::size_t>> pins;
  for (std::size_t i = 1; i <= 4; ++i) {
    const std::size_t n = round_up(i * unit / 2, g);
    void* p = a.allocate(n, 0, nullptr);
    pins.emplace_back(a.allocate(n + g, 0, nullptr), n + g);
    a.deallocate(p, n, 0, nullptr);
  }
  const DeviceStats s = a.device_stats(0);
  for (auto [p, n] : pins) a.deallocate(p, n, 0, nullptr);
  return s;
}

TEST_P(AllocatorSuite, ReserveSlackKeepsReservedNearLive) {
  Config c = target().config;
  c.reserve_slack = -1;
  const DeviceStats loose = run_growing_steps(remake(c), unit());
  c.reserve_slack = target().config.reserve_slack >= 0 ? target().config.reserve_slack : 0.02;
  const DeviceStats tight = run_growing_steps(remake(c), unit());
  EXPECT_EQ(loose.peak_live_bytes, tight.peak_live_bytes);
  EXPECT_LT(tight.peak_reserved_bytes, loose.peak_reserved_bytes);
  EXPECT_EQ(loose.chunks_unmapped, 0u) << "reserve_slack -1 never releases before growth";
  EXPECT_GT(tight.chunks_unmapped, 0u);
  // Within the slack (a granule for rounding).
  const std::size_t g = std::size_t{2} << 20;
  EXPECT_LE(
      tight.peak_reserved_bytes,
      static_cast<std::size_t>(static_cast<double>(tight.peak_live_bytes) * (1 + c.reserve_slack)) +
          g);
}

// A release before a growth hands the handles it unmaps to the growth
// (allocator/src/handle_stash.hpp): chunks of the growth of a released
// chunk's size are mapped with that chunk's handle at their new address,
// granted again, and hold what is written there. With 4 MiB chunks: a 20 MiB
// hole (five chunks) freed behind a live 4 MiB block, then a 28 MiB request
// at a new peak - its seven 4 MiB chunks take the five kept handles.
TEST_P(AllocatorSuite, AGrowthMapsTheHandlesItsReleaseKept) {
  if (!uses_vmm()) GTEST_SKIP() << "no VMM: segments are not chunks";
  Config c = target().config;
  c.max_chunk_bytes = 4 * kMiB;
  Allocator& a = remake(c);
  void* hole = a.allocate(20 * kMiB, 0, nullptr);
  void* keep = a.allocate(4 * kMiB, 0, nullptr);
  a.deallocate(hole, 20 * kMiB, 0, nullptr);
  ASSERT_EQ(dstats().reserved_bytes, 24 * kMiB);
  const DeviceStats before = dstats();
  void* big = a.allocate(28 * kMiB, 0, nullptr);
  const DeviceStats after = dstats();
  EXPECT_EQ(after.chunks_unmapped - before.chunks_unmapped, 5u);
  EXPECT_EQ(after.chunks_reused - before.chunks_reused, 5u);
  EXPECT_EQ(after.chunks_mapped - before.chunks_mapped, 7u);
  EXPECT_EQ(after.reserved_bytes, 32 * kMiB);
  EXPECT_EQ(after.peak_reserved_bytes, 32 * kMiB);
  EXPECT_TRUE(invariants());
  // Every chunk of the block is the owner's to read and write.
  const auto at = reinterpret_cast<vmm::DevicePtr>(big);
  std::vector<unsigned char> in(28 * kMiB), out(28 * kMiB, 0);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>((i >> 12) * 13 + i);
  ASSERT_EQ(driver().memcpy_htod(0, at, in.data(), in.size()), vmm::Result::success);
  ASSERT_EQ(driver().memcpy_dtoh(0, out.data(), at, out.size()), vmm::Result::success);
  EXPECT_TRUE(in == out);
  a.deallocate(big, 28 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// ============================================================== bad input ==

#define GVM_EXPECT_REFUSED(stmt)                                    \
  do {                                                              \
    const ::gvm::test::Frozen gvm_before_(alloc());                 \
    EXPECT_THROW(stmt, ::gvm::usage_error);                         \
    EXPECT_TRUE(gvm_before_ == ::gvm::test::Frozen(alloc()))        \
        << "a refused call changed the stats or called the driver"; \
    EXPECT_TRUE(invariants());                                      \
  } while (0)

TEST_P(AllocatorSuite, DoubleFreeIsRefused) {
  for (std::size_t n : {std::size_t{100}, 4 * kKiB, kMiB + 1, unit() + 7}) {
    SCOPED_TRACE(n);
    Held keep = take(n);  // so the freed slot's span stays
    Held h = take(n);
    give(h);
    GVM_EXPECT_REFUSED(give(h));
    GVM_EXPECT_REFUSED(alloc().deallocate(h.p, kUnknownSize, 0, nullptr));
    give(keep);
  }
}

TEST_P(AllocatorSuite, ForeignAndInteriorPointersAreRefused) {
  Held small = take(4 * kKiB), large = take(unit() + 1);
  int on_host = 0;
  GVM_EXPECT_REFUSED(alloc().deallocate(&on_host, sizeof on_host, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(reinterpret_cast<void*>(0x1000), 16, 0, nullptr));
  // Inside the arena, never handed out: just past both blocks' slots.
  GVM_EXPECT_REFUSED(alloc().deallocate(
      static_cast<char*>(large.p) + round_up(large.bytes, 512) + 4096, 512, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(static_cast<char*>(small.p) + 512, 512, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(static_cast<char*>(small.p) + 1, kUnknownSize, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(static_cast<char*>(large.p) + 512, 512, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(static_cast<char*>(large.p) + 1, kUnknownSize, 0, nullptr));
  give(small);
  give(large);
}

TEST_P(AllocatorSuite, SizeMismatchIsRefused) {
  Held small = take(4 * kKiB), large = take(unit() + 1);
  GVM_EXPECT_REFUSED(alloc().deallocate(small.p, 64 * kKiB, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(small.p, 100, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(small.p, 0, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(large.p, large.bytes + 1, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(large.p, large.bytes - 1, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().deallocate(large.p, 4 * kKiB, 0, nullptr));
  // The right size (or "unknown") still works after the refusals.
  alloc().deallocate(small.p, kUnknownSize, 0, nullptr);
  give(large);
  EXPECT_EQ(dstats().live_bytes, 0u);
}

TEST_P(AllocatorSuite, AbsurdSizesAreRefused) {
  (void)alloc();
  GVM_EXPECT_REFUSED(alloc().allocate(0, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().allocate(SIZE_MAX, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().allocate(std::size_t{1} << 50, 0, nullptr));
  GVM_EXPECT_REFUSED(alloc().allocate(static_cast<std::size_t>(-4096), 0, nullptr));
}

TEST_P(AllocatorSuite, NoSuchDeviceIsRefused) {
  Held h = take(100);
  for (int d : {-1, 99, devices()}) {
    SCOPED_TRACE(d);
    GVM_EXPECT_REFUSED(alloc().allocate(100, d, nullptr));
    GVM_EXPECT_REFUSED(alloc().deallocate(h.p, 100, d, nullptr));
    if (d != -1) {  // -1 means every device
      GVM_EXPECT_REFUSED(alloc().trim(d));
    }
    GVM_EXPECT_REFUSED((void)alloc().device_stats(d));
    GVM_EXPECT_REFUSED((void)alloc().caps(d));
  }
  give(h);
}

TEST_P(AllocatorSuite, FreeOnTheWrongDeviceIsRefused) {
  if (devices() < 2) GTEST_SKIP() << "needs 2 devices, the driver shows " << devices();
  for (std::size_t n : {std::size_t{100}, unit() + 1}) {
    Held h = take(n, 0);
    try {
      alloc().deallocate(h.p, n, 1, nullptr);
      ADD_FAILURE() << "freed device 0's block on device 1";
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("device 0"), std::string::npos) << e.what();
    }
    // Once device 1 has a heap of its own, too.
    Held other = take(n, 1);
    GVM_EXPECT_REFUSED(alloc().deallocate(h.p, n, 1, nullptr));
    GVM_EXPECT_REFUSED(alloc().deallocate(other.p, n, 0, nullptr));
    give(other);
    give(h);
  }
}

TEST_P(AllocatorSuite, RecordStreamOnAFreedPointerIsRefused) {
  for (std::size_t n : {std::size_t{100}, unit() + 1}) {
    Held keep = take(n);
    Held h = take(n);
    give(h);
    GVM_EXPECT_REFUSED(alloc().record_stream(h.p, stream(0)));
    GVM_EXPECT_REFUSED(alloc().record_stream(static_cast<char*>(keep.p) + 512, stream(0)));
    int on_host = 0;
    GVM_EXPECT_REFUSED(alloc().record_stream(&on_host, stream(0)));
    GVM_EXPECT_REFUSED(alloc().record_stream(nullptr, stream(0)));
    give(keep);
  }
}

TEST_P(AllocatorSuite, NullptrFreeIsANoOp) {
  Held h = take(100);
  const Frozen before(alloc());
  EXPECT_NO_THROW(alloc().deallocate(nullptr, 0, 0, nullptr));
  EXPECT_NO_THROW(alloc().deallocate(nullptr, 100, 0, stream(0)));
  EXPECT_TRUE(before == Frozen(alloc()));
  give(h);
}

// ============================================================= randomized ==

// Random allocate / free / record_stream / trim on up to 3 streams and 2
// devices, the invariant checker after every step, and each block's tag read
// back when it is freed (no block ever overlapped it).
TEST_P(AllocatorSuite, RandomSequencesKeepTheInvariants) {
  const std::uint64_t seed = test_seed(target().name + "random");
  SCOPED_TRACE("seed " + std::to_string(seed) +
               " (rerun with GVM_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  const int ndev = std::min(devices(), 2);
  const std::size_t max_size = std::min<std::size_t>(64 * kMiB, budget() / 8);
  const std::size_t max_live = budget() / 2;
  std::vector<vmm::StreamHandle> streams[2];
  for (int d = 0; d < ndev; ++d) streams[d] = {nullptr, stream(0, d), stream(1, d)};
  std::vector<Held> held;
  std::size_t live_requested[2] = {0, 0};
  std::size_t charged[2] = {0, 0};
  unsigned char next_tag = 1;
  int attempts = 0, refused = 0;
  const double log_max = std::log2(static_cast<double>(max_size));
  constexpr int kSteps = 2500;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int op = std::uniform_int_distribution<>(0, 99)(rng);
    if (op < 50 || held.empty()) {
      const int d = std::uniform_int_distribution<>(0, ndev - 1)(rng);
      const auto n = std::max<std::size_t>(
          1,
          static_cast<std::size_t>(std::exp2(std::uniform_real_distribution<>(0, log_max)(rng))));
      if (live_requested[d] + n > max_live) continue;
      vmm::StreamHandle s = streams[d][std::uniform_int_distribution<std::size_t>(0, 2)(rng)];
      ++attempts;
      Held h;
      try {
        h = take(n, d, s);
      } catch (const out_of_memory& e) {
        // A small device fills up with partly used spans (one per size class
        // and stream), so a request may be refused well below the budget. But
        // the refusal must be final: the allocator already gave back all it
        // could, so a trim cannot make the same request fit.
        ++refused;
        alloc().trim(d);
        EXPECT_THROW(alloc().allocate(n, d, s), out_of_memory)
            << "fits after a trim, yet was refused: " << e.what();
        continue;
      }
      ASSERT_EQ(addr_of(h.p) % kBlockAlignment, 0u);
      h.tag = next_tag++;
      if (next_tag == 0) next_tag = 1;
      put_tag(h, h.tag);
      live_requested[d] += n;
      charged[d] += h.charged;
      held.push_back(h);
    } else if (op < 88) {
      const auto i = std::uniform_int_distribution<std::size_t>(0, held.size() - 1)(rng);
      Held h = held[i];
      held[i] = held.back();
      held.pop_back();
      ASSERT_TRUE(tag_intact(h));
      // Mostly on its own stream; sometimes on another (the last user's).
      vmm::StreamHandle s = h.stream;
      if (std::uniform_int_distribution<>(0, 4)(rng) == 0)
        s = streams[h.device][std::uniform_int_distribution<std::size_t>(0, 2)(rng)];
      const std::size_t bytes =
          std::uniform_int_distribution<>(0, 9)(rng) == 0 ? kUnknownSize : h.bytes;
      alloc().deallocate(h.p, bytes, h.device, s);
      live_requested[h.device] -= h.bytes;
      charged[h.device] -= h.charged;
    } else if (op < 97) {
      const auto i = std::uniform_int_distribution<std::size_t>(0, held.size() - 1)(rng);
      const Held& h = held[i];
      alloc().record_stream(
          h.p, streams[h.device][std::uniform_int_distribution<std::size_t>(0, 2)(rng)]);
    } else {
      alloc().trim(std::uniform_int_distribution<>(-1, ndev - 1)(rng));
    }
    ASSERT_TRUE(invariants());
    for (int d = 0; d < ndev; ++d) {
      const DeviceStats s = dstats(d);
      ASSERT_EQ(s.live_bytes, charged[d]) << "device " << d;
      ASSERT_EQ(s.cached_bytes, s.reserved_bytes - s.live_bytes);
    }
  }
  RecordProperty("allocations_refused", refused);
  EXPECT_LT(refused, attempts / 4) << "most requests should fit in half the budget";
  for (const Held& h : held) {
    EXPECT_TRUE(tag_intact(h));
    give(h);
  }
  alloc().trim();
  for (int d = 0; d < ndev; ++d) {
    const DeviceStats s = dstats(d);
    EXPECT_EQ(s.live_bytes, 0u);
    EXPECT_EQ(s.reserved_bytes, 0u);
    EXPECT_EQ(s.allocations, s.frees);
  }
  EXPECT_TRUE(invariants());
  if (sim() != nullptr) {
    EXPECT_EQ(sim()->physical_used(0), 0u);
    EXPECT_EQ(sim()->race_count(), 0u) << (sim()->races().empty() ? "" : sim()->races()[0]);
    EXPECT_EQ(sim()->sticky_error(), vmm::Result::success);
  }
}

// ========================================================== multi-threaded ==

TEST_P(AllocatorSuite, ThreadsAllocateAndFreeConcurrently) {
  constexpr int kThreads = 8;
  // Threads 0-5 have a stream each; 6 and 7 share thread 5's; thread 4 uses
  // the legacy stream of device 0.
  std::vector<vmm::StreamHandle> streams;
  for (int i = 0; i < 5; ++i) streams.push_back(stream(i));
  streams[4] = nullptr;
  streams.push_back(stream(5));
  streams.push_back(streams[5]);
  streams.push_back(streams[5]);
  Allocator& a = alloc();
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0}, ooms{0}, failures{0};
  const std::size_t per_thread_live = budget() / (4 * kThreads);
  auto worker = [&](int id) {
    std::mt19937_64 rng(test_seed(target().name + "thread") + static_cast<std::uint64_t>(id));
    std::vector<std::pair<void*, std::size_t>> mine;
    std::size_t live = 0;
    const int device = (devices() > 1 && id % 3 == 2) ? 1 : 0;
    vmm::StreamHandle s = device == 0 ? streams[static_cast<std::size_t>(id)] : nullptr;
    const double log_max =
        std::log2(static_cast<double>(std::min<std::size_t>(4 * kMiB, per_thread_live)));
    while (!stop.load(std::memory_order_relaxed)) {
      const bool alloc_now = mine.empty() || (mine.size() < 64 && rng() % 2 == 0);
      if (alloc_now) {
        const auto n = std::max<std::size_t>(
            1,
            static_cast<std::size_t>(std::exp2(std::uniform_real_distribution<>(0, log_max)(rng))));
        if (live + n > per_thread_live && !mine.empty()) continue;
        try {
          mine.emplace_back(a.allocate(n, device, s), n);
          live += n;
        } catch (const out_of_memory&) {
          ++ooms;
        } catch (...) {
          ++failures;
        }
      } else {
        const std::size_t i = rng() % mine.size();
        try {
          a.deallocate(mine[i].first, mine[i].second, device, s);
        } catch (...) {
          ++failures;
        }
        live -= mine[i].second;
        mine[i] = mine.back();
        mine.pop_back();
      }
      ops.fetch_add(1, std::memory_order_relaxed);
    }
    for (auto [p, n] : mine) {
      try {
        a.deallocate(p, n, device, s);
      } catch (...) {
        ++failures;
      }
    }
  };
  std::atomic<std::uint64_t> checks{0}, broken{0};
  auto observer = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      try {
        a.trim();
        const Stats s = a.stats();
        if (s.devices.empty()) ++broken;
        if (a.snapshot_json().empty()) ++broken;
        if (!a.check_invariants(nullptr)) ++broken;
        ++checks;
      } catch (...) {
        ++failures;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  threads.emplace_back(observer);
  std::this_thread::sleep_for(target().threaded_time);
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(broken.load(), 0u) << "invariants broke while threads ran";
  EXPECT_GT(ops.load(), 1000u);
  EXPECT_GT(checks.load(), 0u);
  EXPECT_TRUE(invariants());
  for (int d = 0; d < std::min(devices(), 2); ++d) {
    const DeviceStats s = dstats(d);
    EXPECT_EQ(s.live_bytes, 0u) << "device " << d;
    EXPECT_EQ(s.allocations, s.frees) << "device " << d;
  }
  if (sim() != nullptr) {
    EXPECT_EQ(sim()->sticky_error(), vmm::Result::success);
  }
}

}  // namespace gvm::test
