// The PyTorch backend over the simulated driver: what it reports to PyTorch
// for the blocks gvmalloc serves, without torch's Python side or a GPU.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "gvm/gvm.h"
#include "pool_checkpoint.hpp"

namespace gvm::torch_backend {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

struct FakeContext : c10::GatheredContext {
  int id = 7;
};
std::shared_ptr<c10::GatheredContext> fake_recorder() {
  return std::make_shared<FakeContext>();
}

class BackendSim : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(gvm_init_simulated("h200", 1, nullptr), GVM_OK) << gvm_last_error();
    Backend::instance().init(1);
  }
  Backend& b = Backend::instance();

  std::int64_t allocated(int pool = kStatAll) {
    return b.getDeviceStats(0).allocated_bytes[pool].current;
  }
  std::size_t gvm_reserved() {
    gvm_device_stats_t s{};
    EXPECT_EQ(gvm_device_stats(0, &s), GVM_OK);
    return s.reserved_bytes;
  }
};

TEST_F(BackendSim, StatisticsFollowEachBlockWithPyTorchsMeaning) {
  const std::int64_t a0 = allocated();
  const std::int64_t small0 = allocated(kStatSmall);
  void* p = b.malloc(10 * MiB, 0, nullptr);
  void* q = b.malloc(1000, 0, nullptr);
  EXPECT_EQ(allocated(), a0 + static_cast<std::int64_t>(10 * MiB) + 1024);
  EXPECT_EQ(allocated(kStatSmall), small0 + 1024);  // 1000 bytes, rounded to 512s
  auto s = b.getDeviceStats(0);
  EXPECT_GE(s.requested_bytes[kStatAll].current, static_cast<std::int64_t>(10 * MiB + 1000));
  EXPECT_EQ(s.active_bytes[kStatAll].current, s.allocated_bytes[kStatAll].current);
  EXPECT_EQ(static_cast<std::size_t>(s.reserved_bytes[kStatAll].current), gvm_reserved());
  EXPECT_GE(s.reserved_bytes[kStatAll].current, s.allocated_bytes[kStatAll].current);
  EXPECT_EQ(s.max_split_size, -1);
  b.raw_delete(p);
  b.raw_delete(q);
  EXPECT_EQ(allocated(), a0);
  s = b.getDeviceStats(0);
  EXPECT_GE(s.allocated_bytes[kStatAll].peak, a0 + static_cast<std::int64_t>(10 * MiB));
  b.resetPeakStats(0);
  s = b.getDeviceStats(0);
  EXPECT_EQ(s.allocated_bytes[kStatAll].peak, s.allocated_bytes[kStatAll].current);
  EXPECT_EQ(s.reserved_bytes[kStatAll].peak, s.reserved_bytes[kStatAll].current);
  b.resetAccumulatedStats(0);
  EXPECT_EQ(b.getDeviceStats(0).allocation[kStatAll].allocated, 0);
  b.raw_delete(b.malloc(4096, 0, nullptr));
  s = b.getDeviceStats(0);
  EXPECT_EQ(s.allocation[kStatAll].allocated, 1);
  EXPECT_EQ(s.allocation[kStatAll].freed, 1);
}

TEST_F(BackendSim, ZeroBytesIsNoBlock) {
  EXPECT_EQ(b.malloc(0, 0, nullptr), nullptr);
  EXPECT_NO_THROW(b.raw_delete(nullptr));
}

TEST_F(BackendSim, AnAddressNotHandedOutIsAnErrorThatChangesNothing) {
  const std::int64_t a0 = allocated();
  int not_ours = 0;
  try {
    b.raw_delete(&not_ours);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid device pointer"), std::string::npos) << e.what();
  }
  Backend::delete_block(&not_ours);  // the deleter reports on stderr, never throws
  EXPECT_EQ(allocated(), a0);
}

TEST_F(BackendSim, OutOfMemoryIsPyTorchsErrorAndTheObserversSeeItFirst) {
  static std::atomic<int> seen{0};
  static std::atomic<std::int64_t> seen_device{-1};
  b.attachOutOfMemoryObserver([](int64_t device, size_t, size_t, size_t) {
    ++seen;
    seen_device = device;
  });
  const int before = seen.load();
  const std::int64_t ooms = b.getDeviceStats(0).num_ooms;
  try {
    b.malloc(200ull << 30, 0, nullptr);
    FAIL() << "200 GiB on a simulated H200";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string m = e.what_without_backtrace();
    EXPECT_EQ(m.rfind("CUDA out of memory. Tried to allocate 200.00 GiB.", 0), 0u) << m;
    EXPECT_NE(m.find("gvmalloc: "), std::string::npos) << m;
  }
  EXPECT_EQ(seen.load(), before + 1);
  EXPECT_EQ(seen_device.load(), 0);
  EXPECT_EQ(b.getDeviceStats(0).num_ooms, ooms + 1);
  // Larger than any device: PyTorch's answer is the same error (its test looks for this text).
  try {
    b.malloc(std::size_t{1024} * 1024 * 1024 * 8000000000ull, 0, nullptr);
    FAIL() << "no error for 8e9 GiB";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("Tried to allocate 8000000000.00 GiB"), std::string::npos)
        << e.what();
  }
}

TEST_F(BackendSim, ASnapshotShowsEachSegmentAndBlock) {
  void* p = b.malloc(5 * MiB, 0, nullptr);
  const auto info = b.snapshot({0, 0}, false);
  std::size_t total = 0;
  bool found = false;
  for (const auto& s : info.segments) {
    total += s.total_size;
    std::size_t addr = s.address;
    std::size_t allocated_size = 0;
    for (const auto& blk : s.blocks) {
      if (addr == reinterpret_cast<std::size_t>(p)) {
        found = true;
        EXPECT_TRUE(blk.allocated);
        EXPECT_EQ(blk.requested_size, 5 * MiB);
        EXPECT_GE(blk.size, 5 * MiB);
      }
      if (blk.allocated) allocated_size += blk.size;
      addr += blk.size;
    }
    EXPECT_EQ(addr, s.address + s.total_size) << "blocks do not tile their segment";
    EXPECT_EQ(allocated_size, s.allocated_size);
    EXPECT_EQ(s.owner_private_pool_id, (c10::MempoolId_t{0, 0}));
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(total, gvm_reserved());
  EXPECT_NE(info.config_metadata.last_allocator_settings.find("gvmalloc"), std::string::npos);
  size_t size = 0;
  void* base = b.getBaseAllocation(static_cast<char*>(p) + 4096, &size);
  EXPECT_LE(reinterpret_cast<std::uintptr_t>(base), reinterpret_cast<std::uintptr_t>(p));
  EXPECT_GT(reinterpret_cast<std::uintptr_t>(base) + size,
            reinterpret_cast<std::uintptr_t>(p) + 5 * MiB - 1);
  b.raw_delete(p);
}

TEST_F(BackendSim, HistoryRecordsAllocAndFreeWithTheirStacks) {
  static std::atomic<int> tracked{0};  // the tracker stays attached after the test
  const int tracked0 = tracked.load();
  b.attachAllocatorTraceTracker([](const cda::TraceEntry&) { ++tracked; });
  b.recordHistory(true, &fake_recorder, 1000, cda::RecordContext::ALL, true, {});
  EXPECT_TRUE(b.isHistoryEnabled());
  void* gone = b.malloc(3 * MiB, 0, nullptr);
  b.raw_delete(gone);
  void* kept = b.malloc(2 * MiB, 0, nullptr);
  const auto info = b.snapshot({0, 0}, true);
  ASSERT_EQ(info.device_traces.size(), 1u);
  std::vector<cda::TraceEntry::Action> actions;
  for (const auto& e : info.device_traces[0]) {
    if (e.addr_ != reinterpret_cast<std::size_t>(gone)) continue;
    actions.push_back(e.action_);
    EXPECT_NE(dynamic_cast<FakeContext*>(e.context_.get()), nullptr) << "entry without its stack";
    EXPECT_GT(e.time_.t_, 1600000000000000) << "not microseconds since the epoch";
    EXPECT_EQ(e.compile_context_, "N/A");
  }
  ASSERT_GE(actions.size(), 3u);
  EXPECT_EQ(actions[0], cda::TraceEntry::ALLOC);
  EXPECT_EQ(actions[1], cda::TraceEntry::FREE_REQUESTED);
  EXPECT_EQ(actions[2], cda::TraceEntry::FREE_COMPLETED);
  bool with_stack = false;
  for (const auto& s : info.segments) {
    std::size_t addr = s.address;
    for (const auto& blk : s.blocks) {
      if (addr == reinterpret_cast<std::size_t>(kept))
        with_stack = blk.context_when_allocated != nullptr;
      addr += blk.size;
    }
  }
  EXPECT_TRUE(with_stack) << "the live block has no stack";
  EXPECT_GE(tracked.load() - tracked0, 4);
  // skip_actions and disabling.
  b.recordHistory(true, &fake_recorder, 1000, cda::RecordContext::ALL, true, {"alloc"});
  b.raw_delete(b.malloc(MiB, 0, nullptr));
  const auto skipped = b.snapshot({0, 0}, true);
  ASSERT_EQ(skipped.device_traces.size(), 1u);
  EXPECT_FALSE(skipped.device_traces[0].empty());
  for (const auto& e : skipped.device_traces[0]) EXPECT_NE(e.action_, cda::TraceEntry::ALLOC);
  b.recordHistory(false, &fake_recorder, 1, cda::RecordContext::NEVER, false, {});
  EXPECT_FALSE(b.isHistoryEnabled());
  EXPECT_TRUE(b.snapshot({0, 0}, true).device_traces[0].empty());
  EXPECT_THROW(
      b.recordHistory(true, &fake_recorder, 10, cda::RecordContext::ALL, false, {"nonsense"}),
      c10::Error);
  b.raw_delete(kept);
}

TEST_F(BackendSim, EmptyCacheReturnsCachedMemory) {
  void* p = b.malloc(256 * MiB, 0, nullptr);
  b.raw_delete(p);
  const std::size_t before = gvm_reserved();
  b.emptyCache({0, 0});
  EXPECT_LE(gvm_reserved() + 256 * MiB, before);
}

TEST_F(BackendSim, WithCachingDisabledAFreeReturnsItsMemory) {
  b.emptyCache({0, 0});
  const std::size_t base = gvm_reserved();
  b.enable(false);
  EXPECT_FALSE(b.isEnabled());
  b.raw_delete(b.malloc(256 * MiB, 0, nullptr));
  EXPECT_EQ(gvm_reserved(), base);
  b.enable(true);
}

TEST_F(BackendSim, PoolsFractionsAndWhatIsRefused) {
  b.createOrIncrefPool(0, {0, 1});
  EXPECT_EQ(b.getPoolUseCount(0, {0, 1}), 1);
  b.releasePool(0, {0, 1});
  EXPECT_EQ(b.getPoolUseCount(0, {0, 1}), 0);
  b.setMemoryFraction(0.5, 0);
  EXPECT_DOUBLE_EQ(b.getMemoryFraction(0), 0.5);
  b.setMemoryFraction(1.0, 0);
  EXPECT_THROW(b.setMemoryFraction(0.0, 0), c10::Error);
  EXPECT_THROW(b.getCheckpointState(0, {0, 99}), c10::Error);
  EXPECT_THROW(b.shareIpcHandle(nullptr), c10::Error);
  EXPECT_EQ(b.name(), "gvmalloc");
}

// The sizes of the semantics table's memory_stats_sequence case (float32
// tensors of i*i*4+1 elements, then of i x 7i x 9i x 11i), freed in another
// order: memory_allocated() must come back to where it started. It did not
// while a free counted the block's size class instead of its request.
TEST_F(BackendSim, MemoryAllocatedReturnsToItsStartAfterSmallAndLargeFrees) {
  const auto s0 = b.getDeviceStats(0);
  const std::size_t live0 = b.allocator().live_blocks();
  std::vector<void*> held;
  std::vector<std::size_t> sizes;
  for (std::size_t i = 1; i < 18; ++i) sizes.push_back(4 * (i * i * 4 + 1));
  for (std::size_t i = 5; i < 22; ++i) sizes.push_back(4 * i * (i * 7) * (i * 9) * (i * 11));
  std::int64_t expect = 0;
  for (std::size_t n : sizes) {
    held.push_back(b.malloc(n, 0, nullptr));
    expect += static_cast<std::int64_t>(torch_rounded(n));
    EXPECT_EQ(allocated() - s0.allocated_bytes[kStatAll].current, expect);
  }
  for (std::size_t k = 0; k < held.size(); ++k) {
    const std::size_t i = (k * 7) % held.size();  // 7 and 34 are coprime: each once
    b.raw_delete(held[i]);
    expect -= static_cast<std::int64_t>(torch_rounded(sizes[i]));
    EXPECT_EQ(allocated() - s0.allocated_bytes[kStatAll].current, expect) << "after freeing "
                                                                         << sizes[i] << " bytes";
  }
  const auto s = b.getDeviceStats(0);
  for (int t = 0; t < kStatTypes; ++t) {
    const auto i = static_cast<std::size_t>(t);
    EXPECT_EQ(s.allocated_bytes[i].current, s0.allocated_bytes[i].current) << "stat type " << t;
    EXPECT_EQ(s.requested_bytes[i].current, s0.requested_bytes[i].current) << "stat type " << t;
    EXPECT_EQ(s.allocation[i].current, s0.allocation[i].current) << "stat type " << t;
  }
  EXPECT_EQ(b.allocator().live_blocks(), live0);
}

TEST_F(BackendSim, ThreadsAllocatingAndFreeingLeaveExactCounts) {
  const auto s0 = b.getDeviceStats(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        held.push_back(
            b.malloc(static_cast<std::size_t>(512 + (i * 7919 + t) % (3 * MiB)), 0, nullptr));
        if (held.size() > 8) {
          b.raw_delete(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) b.raw_delete(p);
    });
  }
  for (auto& th : threads) th.join();
  const auto s = b.getDeviceStats(0);
  EXPECT_EQ(s.allocation[kStatAll].current, s0.allocation[kStatAll].current);
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, s0.allocated_bytes[kStatAll].current);
  EXPECT_EQ(s.requested_bytes[kStatAll].current, s0.requested_bytes[kStatAll].current);
  EXPECT_EQ(s.allocation[kStatAll].allocated - s0.allocation[kStatAll].allocated, 8000);
}

TEST(PoolCheckpointPlan, FreesWhatIsNewAndRestoresWhatWasFreed) {
  PoolCheckpoint then;
  then.live = {BlockView{0x1000, 512, 500, true, true, nullptr},
               BlockView{0x2000, 1024, 1000, true, true, nullptr}};
  const std::vector<BlockView> now = {
      BlockView{0x2000, 1024, 1000, true, true, nullptr},   // unchanged
      BlockView{0x3000, 512, 512, true, true, nullptr},     // new since
      BlockView{0x1000, 1024, 1024, true, true, nullptr}};  // reused, other size
  const CheckpointPlan plan = plan_restore(then, now);
  EXPECT_EQ(plan.to_free,
            (std::vector<void*>{reinterpret_cast<void*>(0x3000), reinterpret_cast<void*>(0x1000)}));
  ASSERT_EQ(plan.to_restore.size(), 1u);
  EXPECT_EQ(plan.to_restore[0].addr, 0x1000u);
  EXPECT_EQ(plan.to_restore[0].requested, 500u);
  const CheckpointPlan same = plan_restore(then, then.live);
  EXPECT_TRUE(same.to_free.empty());
  EXPECT_TRUE(same.to_restore.empty());
}

}  // namespace
}  // namespace gvm::torch_backend
