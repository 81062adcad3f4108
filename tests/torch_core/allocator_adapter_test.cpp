// The adapter over the process's allocator, started on the simulated driver:
// every call the backend makes, and what a free gives back.
#include "allocator_adapter.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gvm/errors.hpp"
#include "gvm/gvm.h"
#include "stat_counters.hpp"

namespace gvm::torch_backend {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class Adapter : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(gvm_init_simulated("h200", 1, nullptr), GVM_OK) << gvm_last_error();
  }
  AllocatorAdapter& a = AllocatorAdapter::instance();
};

TEST_F(Adapter, AllocateThenDeallocateGivesBackSizeAndDevice) {
  const std::size_t live0 = a.device_stats(0).live_bytes;
  void* p = a.allocate(3u << 20, 0, nullptr, 0);
  ASSERT_NE(p, nullptr);
  EXPECT_GT(a.device_stats(0).live_bytes, live0);
  const FreedBlock f = a.deallocate(p);
  EXPECT_EQ(f.requested, 3u << 20);
  EXPECT_EQ(f.device, 0);
  EXPECT_EQ(a.device_stats(0).live_bytes, live0);
}

// gvmalloc's deallocate(ptr) answers with the bytes a block was allocated
// with: for a small block its size class (5121 bytes live in a 6144-byte
// slot). PyTorch's statistics count the request, so a free must give back the
// request, or memory_allocated() drifts away from its start after the frees
// (what the first H200 run of the semantics table showed).
TEST_F(Adapter, AFreeGivesBackTheRequestNotTheSizeClass) {
  const std::vector<std::size_t> sizes = {1,       511,     513,     1000,          4628,
                                          5121,    100001,  MiB,     MiB + 1,       3 * MiB + 7,
                                          2049,    6145,    777777,  64 * MiB + 3};
  DeviceCounters counters;
  std::vector<void*> held;
  for (std::size_t n : sizes) {
    held.push_back(a.allocate(n, 0, nullptr, 0));
    counters.on_alloc(n);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const FreedBlock f = a.deallocate(held[i]);
    EXPECT_EQ(f.requested, sizes[i]) << "a block of " << sizes[i] << " bytes";
    counters.on_free(f.requested);
  }
  const CountersSnapshot c = counters.read();
  for (int t = 0; t < kStatTypes; ++t) {
    const auto i = static_cast<std::size_t>(t);
    EXPECT_EQ(c.allocated_bytes[i].current, 0) << "stat type " << t;
    EXPECT_EQ(c.requested_bytes[i].current, 0) << "stat type " << t;
    EXPECT_EQ(c.allocation[i].current, 0) << "stat type " << t;
  }
  EXPECT_EQ(a.live_blocks(), 0u);
}

TEST_F(Adapter, AnAddressNeverHandedOutIsRefusedAndChangesNothing) {
  void* p = a.allocate(4096, 0, nullptr, 0);
  const std::size_t live = a.device_stats(0).live_bytes;
  int not_ours = 0;
  EXPECT_THROW(a.deallocate(&not_ours), usage_error);
  EXPECT_EQ(a.device_stats(0).live_bytes, live);
  EXPECT_EQ(a.live_blocks(), 1u);
  a.deallocate(p);
  EXPECT_THROW(a.deallocate(p), usage_error);  // a double free
  EXPECT_EQ(a.live_blocks(), 0u);
}

TEST_F(Adapter, ABlockOfTheAllocatorNotHandedOutHereIsRefusedAndStaysLive) {
  // A block from the C ABI (another user of the same allocator): not the
  // backend's to free.
  void* p = gvm_malloc(8192, 0, nullptr);
  ASSERT_NE(p, nullptr);
  const std::size_t live = a.device_stats(0).live_bytes;
  EXPECT_THROW(a.deallocate(p), usage_error);
  EXPECT_EQ(a.device_stats(0).live_bytes, live);
  EXPECT_EQ(gvm_free(p, 8192, 0, nullptr), GVM_OK);
}

TEST_F(Adapter, RecordStreamOnALiveBlock) {
  void* p = a.allocate(1u << 20, 0, nullptr, 0);
  EXPECT_NO_THROW(a.record_stream(p, nullptr, 0));
  a.deallocate(p);
}

TEST_F(Adapter, MoreThanTheDeviceHasIsOutOfMemory) {
  // 200 GiB on a simulated H200 (141 GB): the allocator's out_of_memory.
  EXPECT_THROW(a.allocate(200ull << 30, 0, nullptr, 0), out_of_memory);
  EXPECT_EQ(a.live_blocks(), 0u);
}

TEST_F(Adapter, TrimKeepsLiveBlocks) {
  void* p = a.allocate(64u << 20, 0, nullptr, 0);
  void* q = a.allocate(64u << 20, 0, nullptr, 0);
  a.deallocate(q);
  a.trim(0);
  const DeviceStats s = a.device_stats(0);
  EXPECT_GE(s.live_bytes, 64u << 20);
  EXPECT_GE(s.reserved_bytes, s.live_bytes);
  a.deallocate(p);
}

TEST_F(Adapter, PrivatePoolsCaptureAndTheirTrim) {
  const PoolId pool = a.create_pool(0);
  a.begin_capture(pool);
  void* p = a.allocate(1000, 0, nullptr, pool);  // a pool's block, however small
  a.end_capture(pool);
  const FreedBlock f = a.deallocate(p);
  EXPECT_EQ(f.requested, 1000u);
  const std::size_t reserved = a.device_stats(0).reserved_bytes;
  a.trim_pool(pool);
  EXPECT_LT(a.device_stats(0).reserved_bytes, reserved) << "the pool's cached memory went back";
  a.release_pool(pool);
  EXPECT_THROW(a.allocate(4096, 0, nullptr, pool), usage_error) << "a released pool";
  EXPECT_EQ(a.live_blocks(), 0u);
}

TEST_F(Adapter, ACheckpointBlockRestoredIsLiveAndFreedWithItsRequest) {
  const PoolId pool = a.create_pool(0);
  void* x = a.allocate(5 * MiB + 3, 0, nullptr, pool);
  void* y = a.allocate(MiB, 0, nullptr, pool);
  a.deallocate(x);
  void* back = a.allocate_at(x, 5 * MiB + 3, nullptr, pool);
  EXPECT_EQ(back, x);
  EXPECT_THROW(a.allocate_at(y, MiB, nullptr, pool), usage_error) << "a live block";
  const FreedBlock f = a.deallocate(back);
  EXPECT_EQ(f.requested, 5 * MiB + 3);
  EXPECT_EQ(f.device, 0);
  a.deallocate(y);
  a.release_pool(pool);
}

TEST_F(Adapter, MemoryFractionCapsTheDevice) {
  a.set_memory_fraction(0, 0.25);
  EXPECT_DOUBLE_EQ(a.memory_fraction(0), 0.25);
  EXPECT_THROW(a.allocate(60ull << 30, 0, nullptr, 0), out_of_memory);
  a.set_memory_fraction(0, 1.0);
}

TEST_F(Adapter, LargestCachedBlockAndPeakReset) {
  void* p = a.allocate(32 * MiB, 0, nullptr, 0);
  a.deallocate(p);
  EXPECT_GE(a.largest_cached_block(0), 32 * MiB);
  a.trim(0);
  a.reset_peak_stats(0);
  const DeviceStats s = a.device_stats(0);
  EXPECT_EQ(s.peak_reserved_bytes, s.reserved_bytes);
}

TEST_F(Adapter, MemoryMapShowsALiveBlockWithItsRequest) {
  void* p = a.allocate(5u << 20, 0, nullptr, 0);
  bool found = false;
  for (const SegmentView& s : a.memory_map(0)) {
    for (const BlockView& b : s.blocks) {
      if (b.addr == reinterpret_cast<std::uintptr_t>(p)) {
        found = true;
        EXPECT_TRUE(b.allocated);
        EXPECT_EQ(b.requested, 5u << 20);
      }
    }
  }
  EXPECT_TRUE(found);
  a.deallocate(p);
  EXPECT_NE(a.config_text().find("small_max"), std::string::npos) << a.config_text();
}

}  // namespace
}  // namespace gvm::torch_backend
