// Private pools, CUDA graph capture, and the per-device calls PyTorch's
// allocator interface needs (deallocate by pointer, allocate_at, the memory
// fraction, peak resets, the largest cached block), on the simulated H200.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace {

using gvm::Allocator;
using gvm::Config;
using gvm::PoolId;
using gvm::usage_error;
using gvm::vmm::AccessKind;
using gvm::vmm::Call;
using gvm::vmm::DevicePtr;
using gvm::vmm::Profile;
using gvm::vmm::Result;
using gvm::vmm::SimDriver;
using gvm::vmm::StreamHandle;

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;

DevicePtr at(const void* p) { return reinterpret_cast<DevicePtr>(p); }

class PoolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = SimDriver::uniform(Profile::h200, 2);
    sim_->enable_backing(true);
    ASSERT_EQ(sim_->stream_create(0, &s_), Result::success);
    ASSERT_EQ(sim_->stream_create(0, &t_), Result::success);
    Config c;
    c.max_chunk_bytes = 4 * kMiB;
    a_ = std::make_unique<Allocator>(*sim_, c);
  }
  void TearDown() override {
    a_.reset();
    sim_->complete_all();
    (void)sim_->stream_destroy(0, s_);
    (void)sim_->stream_destroy(0, t_);
  }
  // Calls a capture forbids (or that fence) made since `base`.
  std::uint64_t forbidden_since(const std::vector<std::uint64_t>& base) const {
    std::uint64_t n = 0;
    const Call calls[] = {Call::ctx_synchronize, Call::event_query, Call::event_synchronize,
                          Call::stream_synchronize, Call::mem_unmap, Call::mem_free};
    for (std::size_t i = 0; i < std::size(calls); ++i) n += sim_->call_count(calls[i]) - base[i];
    return n;
  }
  std::vector<std::uint64_t> forbidden_base() const {
    return {sim_->call_count(Call::ctx_synchronize), sim_->call_count(Call::event_query),
            sim_->call_count(Call::event_synchronize), sim_->call_count(Call::stream_synchronize),
            sim_->call_count(Call::mem_unmap), sim_->call_count(Call::mem_free)};
  }
  bool invariants() {
    std::string why;
    const bool ok = a_->check_invariants(&why);
    if (!ok) ADD_FAILURE() << why;
    return ok;
  }

  std::unique_ptr<SimDriver> sim_;
  std::unique_ptr<Allocator> a_;
  StreamHandle s_ = nullptr, t_ = nullptr;
};

TEST_F(PoolsTest, PoolBlocksComeFromThePoolAndAreReusedOnlyThere) {
  const PoolId p = a_->create_pool(0);
  EXPECT_NE(p, 0u);
  void* x = a_->allocate(3 * kMiB, 0, s_, p);
  void* small = a_->allocate(4 * kKiB, 0, s_, p);  // pools serve every size
  void* y = a_->allocate(3 * kMiB, 0, s_);         // the default pool
  const auto map = a_->memory_map(0);
  int in_pool = 0;
  for (const auto& seg : map)
    for (const auto& b : seg.blocks)
      if (b.allocated && (b.addr == at(x) || b.addr == at(small))) {
        EXPECT_EQ(seg.pool, p);
        ++in_pool;
      }
  EXPECT_EQ(in_pool, 2);
  a_->deallocate(x, 3 * kMiB, 0, s_);
  // Freed in the pool: the default pool does not get it...
  void* z = a_->allocate(3 * kMiB, 0, s_);
  EXPECT_NE(z, x);
  // ...the pool does.
  void* w = a_->allocate(3 * kMiB, 0, s_, p);
  EXPECT_EQ(w, x);
  for (void* q : {w, y, z}) a_->deallocate(q, 3 * kMiB, 0, s_);
  a_->deallocate(small, 4 * kKiB, 0, s_);
  EXPECT_TRUE(invariants());
}

TEST_F(PoolsTest, BadPoolUseIsRefused) {
  EXPECT_THROW(a_->allocate(kMiB, 0, s_, 12345), usage_error);
  const PoolId p = a_->create_pool(0);
  EXPECT_THROW(a_->allocate(kMiB, 1, s_, p), usage_error);  // a pool of device 0
  EXPECT_THROW(a_->release_pool(999), usage_error);
  EXPECT_THROW(a_->end_capture(p), usage_error);  // no capture under way
  EXPECT_THROW((void)a_->create_pool(7), usage_error);
  a_->release_pool(p);
  EXPECT_THROW(a_->allocate(kMiB, 0, s_, p), usage_error);
}

TEST_F(PoolsTest, ReleasedPoolGivesItsMemoryBackAsItsBlocksAreFreed) {
  const PoolId p = a_->create_pool(0);
  void* x = a_->allocate(8 * kMiB, 0, s_, p);
  void* y = a_->allocate(8 * kMiB, 0, s_, p);
  a_->deallocate(x, 8 * kMiB, 0, s_);
  const std::size_t before = a_->device_stats(0).reserved_bytes;
  a_->release_pool(p);
  EXPECT_LT(a_->device_stats(0).reserved_bytes, before) << "its cached memory went back";
  EXPECT_GT(a_->device_stats(0).reserved_bytes, 0u) << "the live block stays";
  a_->deallocate(y, 8 * kMiB, 0, s_);
  EXPECT_EQ(a_->device_stats(0).reserved_bytes, 0u);
  EXPECT_TRUE(invariants());
}

// A graph captured into a pool writes, at every replay, where the capture
// freed: a live pool's free memory stays mapped through a trim, an
// out-of-memory retry, the release threshold and release before growth (it
// did not: torch.compile's reduce-overhead then failed with "invalid
// argument" on an H200, a copy into an unmapped static buffer). Only the
// pool's release or its own trim_pool gives it back.
TEST_F(PoolsTest, ALivePoolsFreeMemoryStaysMappedForItsGraphs) {
  a_.reset();
  Config c;
  c.max_chunk_bytes = 4 * kMiB;
  c.release_threshold_bytes = 0;
  sim_->set_physical_budget(0, 64 * kMiB);
  a_ = std::make_unique<Allocator>(*sim_, c);
  const PoolId p = a_->create_pool(0);
  void* x = a_->allocate(16 * kMiB, 0, s_, p);
  a_->deallocate(x, 16 * kMiB, 0, s_);  // the capture's free: the graph still writes there
  auto graph_writes = [&] {
    return sim_->enqueue_access(0, s_, at(x), 16 * kMiB, AccessKind::write);
  };
  a_->trim();
  EXPECT_EQ(graph_writes(), Result::success) << "trim unmapped the pool's memory";
  // Growth outside the pool up to the device's memory: out of memory rather
  // than the pool's memory.
  void* big = nullptr;
  EXPECT_THROW(big = a_->allocate(60 * kMiB, 0, t_), gvm::out_of_memory);
  EXPECT_EQ(graph_writes(), Result::success) << "an out-of-memory retry unmapped it";
  void* y = a_->allocate(32 * kMiB, 0, t_);
  a_->deallocate(y, 32 * kMiB, 0, t_);  // above the threshold (0)
  EXPECT_EQ(graph_writes(), Result::success) << "the release threshold unmapped it";
  EXPECT_EQ(sim_->sticky_error(), Result::success);
  sim_->complete_all();
  a_->trim_pool(p);  // the owner asks
  EXPECT_EQ(a_->device_stats(0).reserved_bytes, 0u);
  (void)big;
  EXPECT_TRUE(invariants());
}

TEST_F(PoolsTest, DeallocateByPointerUsesTheAllocationStreamAndReturnsTheSize) {
  void* big = a_->allocate(3 * kMiB + 5, 0, t_);
  void* small = a_->allocate(700, 0, t_);
  EXPECT_EQ(a_->device_of(big), 0);
  EXPECT_EQ(a_->device_of(&big), -1);
  // Work of t_ on both, still pending: a free on t_ needs no wait.
  ASSERT_EQ(sim_->enqueue_access(0, t_, at(big), 3 * kMiB, AccessKind::write), Result::success);
  ASSERT_EQ(sim_->enqueue_access(0, t_, at(small), 700, AccessKind::write), Result::success);
  EXPECT_EQ(a_->deallocate(big), 3 * kMiB + 5);
  EXPECT_GE(a_->deallocate(small), 700u);
  EXPECT_THROW(a_->deallocate(big), usage_error);
  EXPECT_EQ(a_->device_stats(0).live_bytes, 0u);
  // t_ takes them again at once; another stream would wait.
  void* again = a_->allocate(3 * kMiB + 5, 0, t_);
  EXPECT_EQ(again, big);
  ASSERT_EQ(sim_->enqueue_access(0, t_, at(again), 3 * kMiB, AccessKind::write), Result::success);
  EXPECT_EQ(sim_->race_count(), 0u);
  a_->deallocate(again);
  EXPECT_TRUE(invariants());
}

TEST_F(PoolsTest, AllocateAtRestoresExactlyThatRange) {
  const PoolId p = a_->create_pool(0);
  void* x = a_->allocate(5 * kMiB, 0, s_, p);
  void* y = a_->allocate(kMiB, 0, s_, p);
  a_->deallocate(x, 5 * kMiB, 0, s_);
  void* back = a_->allocate_at(x, 5 * kMiB, s_, p);
  EXPECT_EQ(back, x);
  EXPECT_THROW(a_->allocate_at(y, kMiB, s_, p), usage_error) << "a live block";
  EXPECT_THROW(a_->allocate_at(static_cast<char*>(x) + 1, 512, s_, p), usage_error);
  a_->deallocate(back, 5 * kMiB, 0, s_);
  a_->deallocate(y, kMiB, 0, s_);
  EXPECT_TRUE(invariants());
}

TEST_F(PoolsTest, CaptureDoesNothingACaptureForbidsAndKeepsOutsideFreesUntilItEnds) {
  const PoolId p = a_->create_pool(0);
  // Memory of the default pool, used before the capture, freed during it.
  void* before = a_->allocate(6 * kMiB, 0, s_);
  void* before_small = a_->allocate(2 * kKiB, 0, s_);
  // A cached chunk and a cap: growth past the cap would need a release.
  void* cached = a_->allocate(8 * kMiB, 0, s_);
  a_->deallocate(cached, 8 * kMiB, 0, s_);
  const auto base = forbidden_base();
  const std::size_t live_before = a_->device_stats(0).live_bytes;
  a_->begin_capture(p);
  void* g1 = a_->allocate(3 * kMiB, 0, s_, p);  // grows the pool: maps, no fence
  void* g2 = a_->allocate(64 * kKiB, 0, s_, p);
  a_->deallocate(g2, 64 * kKiB, 0, s_);
  void* g3 = a_->allocate(64 * kKiB, 0, s_, p);  // reused inside the capture
  EXPECT_EQ(g3, g2);
  // Another stream inside the same capture: not handed s_'s freed block
  // (no wait across the capture's boundary).
  a_->deallocate(g3, 64 * kKiB, 0, s_);
  void* g4 = a_->allocate(64 * kKiB, 0, t_, p);
  EXPECT_NE(g4, g3);
  // Frees outside the pool are kept: the graph may still use the memory.
  a_->deallocate(before, 6 * kMiB, 0, s_);
  a_->deallocate(before_small, 2 * kKiB, 0, s_);
  EXPECT_THROW(a_->deallocate(before, 6 * kMiB, 0, s_), usage_error) << "a double free, still";
  void* other = a_->allocate(6 * kMiB, 0, s_);
  EXPECT_NE(other, before) << "reused during the capture";
  EXPECT_THROW(a_->trim(), usage_error);
  EXPECT_EQ(forbidden_since(base), 0u) << "a capture forbids event queries, syncs and unmaps";
  a_->end_capture(p);
  // After it: the kept frees happened.
  EXPECT_EQ(a_->device_stats(0).live_bytes,
            live_before - 6 * kMiB - 2 * kKiB + 3 * kMiB + 64 * kKiB + 6 * kMiB);
  for (void* q : {g1, other}) a_->deallocate(q);
  a_->deallocate(g4);
  a_->trim();
  EXPECT_TRUE(invariants());
  EXPECT_EQ(sim_->sticky_error(), Result::success);
}

TEST_F(PoolsTest, GrowthPastTheCapDuringACaptureSaysWhatToRaise) {
  Config c;
  c.max_chunk_bytes = 4 * kMiB;
  c.max_reserved_bytes = 16 * kMiB;
  a_ = std::make_unique<Allocator>(*sim_, c);
  void* x = a_->allocate(12 * kMiB, 0, s_);
  a_->deallocate(x, 12 * kMiB, 0, s_);  // cached: out of a capture it would go back
  const PoolId p = a_->create_pool(0);
  a_->begin_capture(p);
  try {
    (void)a_->allocate(8 * kMiB, 0, s_, p);
    ADD_FAILURE() << "grew past the cap";
  } catch (const gvm::out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("capture"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_reserved"), std::string::npos) << e.what();
  }
  a_->end_capture(p);
  void* y = a_->allocate(8 * kMiB, 0, s_, p);  // outside the capture the cache goes back
  a_->deallocate(y);
  EXPECT_TRUE(invariants());
}

TEST_F(PoolsTest, MemoryFractionPerDeviceAndPeakResets) {
  EXPECT_EQ(a_->memory_fraction(0), 0.0);
  const std::size_t total = a_->caps(0).total_memory;
  a_->set_memory_fraction(0, static_cast<double>(16 * kMiB) / static_cast<double>(total));
  EXPECT_THROW((void)a_->allocate(32 * kMiB, 0, s_), gvm::out_of_memory);
  void* ok = a_->allocate(8 * kMiB, 1, nullptr);  // device 1: no cap
  a_->deallocate(ok, 8 * kMiB, 1, nullptr);
  EXPECT_THROW(a_->set_memory_fraction(0, 0.0), usage_error);
  EXPECT_THROW(a_->set_memory_fraction(0, 1.5), usage_error);
  a_->set_memory_fraction(0, 1.0);
  void* x = a_->allocate(32 * kMiB, 0, s_);
  a_->deallocate(x, 32 * kMiB, 0, s_);
  EXPECT_GE(a_->device_stats(0).peak_live_bytes, 32 * kMiB);
  a_->reset_peak_stats(0);
  EXPECT_EQ(a_->device_stats(0).peak_live_bytes, 0u);
  EXPECT_EQ(a_->device_stats(0).peak_reserved_bytes, a_->device_stats(0).reserved_bytes);
}

TEST_F(PoolsTest, LargestCachedBlockIsWhatAHitCouldGet) {
  EXPECT_EQ(a_->largest_cached_block(0), 0u);
  void* x = a_->allocate(12 * kMiB, 0, s_);
  void* y = a_->allocate(4 * kMiB, 0, s_);
  a_->deallocate(x, 12 * kMiB, 0, s_);
  EXPECT_GE(a_->largest_cached_block(0), 12 * kMiB);
  const std::size_t maps = sim_->call_count(Call::mem_map);
  void* z = a_->allocate(a_->largest_cached_block(0), 0, s_);
  EXPECT_EQ(sim_->call_count(Call::mem_map), maps) << "served from cached memory";
  a_->deallocate(z);
  a_->deallocate(y);
}

}  // namespace
