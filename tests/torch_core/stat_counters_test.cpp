#include "stat_counters.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace gvm::torch_backend {
namespace {

TEST(StatCounters, RoundsAndClassifiesRequestsAsPyTorchDoes) {
  EXPECT_EQ(torch_rounded(1), 512u);
  EXPECT_EQ(torch_rounded(512), 512u);
  EXPECT_EQ(torch_rounded(513), 1024u);
  EXPECT_EQ(stat_pool(1u << 20), kStatSmall);
  EXPECT_EQ(stat_pool((1u << 20) + 1), kStatLarge);
}

TEST(StatCounters, AllocationsAndFreesMoveCurrentAndPeak) {
  DeviceCounters c;
  c.on_alloc(100);       // small: 512 bytes
  c.on_alloc(3u << 20);  // large
  CountersSnapshot s = c.read();
  EXPECT_EQ(s.allocation[kStatAll].current, 2);
  EXPECT_EQ(s.allocation[kStatSmall].current, 1);
  EXPECT_EQ(s.allocation[kStatLarge].current, 1);
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, 512 + (3 << 20));
  EXPECT_EQ(s.requested_bytes[kStatAll].current, 100 + (3 << 20));
  c.on_free(3u << 20);
  s = c.read();
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, 512);
  EXPECT_EQ(s.allocated_bytes[kStatAll].peak, 512 + (3 << 20));
  EXPECT_EQ(s.allocated_bytes[kStatLarge].current, 0);
  EXPECT_EQ(s.allocated_bytes[kStatLarge].allocated, 3 << 20);
  EXPECT_EQ(s.allocated_bytes[kStatLarge].freed, 3 << 20);
}

TEST(StatCounters, ResetPeakBringsPeakToCurrent) {
  DeviceCounters c;
  c.on_alloc(1u << 22);
  c.on_alloc(1u << 22);
  c.on_free(1u << 22);
  c.reset_peak();
  CountersSnapshot s = c.read();
  EXPECT_EQ(s.allocated_bytes[kStatAll].peak, s.allocated_bytes[kStatAll].current);
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, 1 << 22);
}

TEST(StatCounters, ResetAccumulatedKeepsCurrent) {
  DeviceCounters c;
  c.on_alloc(4096);
  c.on_alloc(4096);
  c.on_free(4096);
  c.on_oom();
  c.reset_accumulated();
  CountersSnapshot s = c.read();
  EXPECT_EQ(s.allocation[kStatAll].current, 1);
  EXPECT_EQ(s.allocation[kStatAll].allocated, 0);
  EXPECT_EQ(s.allocation[kStatAll].freed, 0);
  EXPECT_EQ(s.num_ooms, 0);
  c.on_free(4096);
  s = c.read();
  EXPECT_EQ(s.allocation[kStatAll].current, 0);
  EXPECT_EQ(s.allocation[kStatAll].freed, 1);
}

TEST(StatCounters, ThreadsCountExactly) {
  DeviceCounters c;
  constexpr int kThreads = 8;
  constexpr int kOps = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&c, t] {
      for (int i = 0; i < kOps; ++i) {
        const std::size_t n = 512u * static_cast<std::size_t>(1 + (i + t) % 4096);
        c.on_alloc(n);
        c.on_free(n);
      }
      c.on_alloc(1000);
    });
  }
  for (auto& th : threads) th.join();
  const CountersSnapshot s = c.read();
  EXPECT_EQ(s.allocation[kStatAll].current, kThreads);
  EXPECT_EQ(s.allocated_bytes[kStatAll].current, kThreads * 1024);
  EXPECT_EQ(s.allocation[kStatAll].allocated, kThreads * (kOps + 1));
  EXPECT_GE(s.allocated_bytes[kStatAll].peak, s.allocated_bytes[kStatAll].current);
}

}  // namespace
}  // namespace gvm::torch_backend
