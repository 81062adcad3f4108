// The adapter over the process's allocator, started on the simulated driver.
// What it cannot do yet (capabilities) must fail with api_unavailable, never
// pretend.
#include "allocator_adapter.hpp"

#include <gtest/gtest.h>

#include <string>

#include "gvm/errors.hpp"
#include "gvm/gvm.h"

namespace gvm::torch_backend {
namespace {

class Adapter : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(gvm_init_simulated("h200", 1, nullptr), GVM_OK) << gvm_last_error();
  }
  AllocatorAdapter& a = AllocatorAdapter::instance();
  Capabilities caps = AllocatorAdapter::capabilities();
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

TEST_F(Adapter, AnAddressNeverHandedOutIsRefusedAndChangesNothing) {
  void* p = a.allocate(4096, 0, nullptr, 0);
  const std::size_t live = a.device_stats(0).live_bytes;
  int not_ours = 0;
  EXPECT_THROW(a.deallocate(&not_ours), usage_error);
  EXPECT_EQ(a.device_stats(0).live_bytes, live);
  a.deallocate(p);
  EXPECT_THROW(a.deallocate(p), usage_error);  // a double free
}

TEST_F(Adapter, RecordStreamOnALiveBlock) {
  void* p = a.allocate(1u << 20, 0, nullptr, 0);
  EXPECT_NO_THROW(a.record_stream(p, nullptr, 0));
  a.deallocate(p);
}

TEST_F(Adapter, MoreThanTheDeviceHasIsOutOfMemory) {
  // 200 GiB on a simulated H200 (141 GB): the allocator's out_of_memory.
  EXPECT_THROW(a.allocate(200ull << 30, 0, nullptr, 0), out_of_memory);
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

TEST_F(Adapter, PrivatePoolsWorkOrSayWhatIsMissing) {
  if (!caps.pool_allocate) {
    try {
      a.create_pool(0);
      FAIL() << "create_pool did not throw without the API";
    } catch (const api_unavailable& e) {
      EXPECT_NE(std::string(e.what()).find("create_pool"), std::string::npos) << e.what();
    }
    EXPECT_THROW(a.allocate(4096, 0, nullptr, 7), api_unavailable);
    return;
  }
  const PoolId pool = a.create_pool(0);
  void* p = a.allocate(1u << 20, 0, nullptr, pool);
  a.deallocate(p);
  a.release_pool(pool);
}

TEST_F(Adapter, MemoryFractionWorksOrSaysWhatIsMissing) {
  if (!caps.memory_fraction) {
    EXPECT_THROW(a.set_memory_fraction(0, 0.5), api_unavailable);
    EXPECT_EQ(a.memory_fraction(0), 0.0);
    return;
  }
  a.set_memory_fraction(0, 0.25);
  EXPECT_DOUBLE_EQ(a.memory_fraction(0), 0.25);
  EXPECT_THROW(a.allocate(60ull << 30, 0, nullptr, 0), out_of_memory);
  a.set_memory_fraction(0, 1.0);
}

TEST_F(Adapter, MemoryMapWorksOrSaysWhatIsMissing) {
  void* p = a.allocate(5u << 20, 0, nullptr, 0);
  if (!caps.memory_map) {
    EXPECT_THROW(a.memory_map(0), api_unavailable);
    a.deallocate(p);
    return;
  }
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
}

TEST_F(Adapter, RestoringACheckpointBlockWorksOrSaysWhatIsMissing) {
  if (!caps.allocate_at) {
    EXPECT_THROW(a.allocate_at(reinterpret_cast<void*>(0x10000), 4096, nullptr, 1),
                 api_unavailable);
  }
}

}  // namespace
}  // namespace gvm::torch_backend
