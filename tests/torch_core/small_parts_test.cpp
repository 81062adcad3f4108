// The history ring, the block table, and the messages the backend gives.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "block_table.hpp"
#include "oom_message.hpp"
#include "size_format.hpp"
#include "trace_ring.hpp"
#include "version_check.hpp"

namespace gvm::torch_backend {
namespace {

TEST(TraceRing, KeepsTheNewestEntriesOldestFirst) {
  TraceRing<int> r(3);
  for (int i = 1; i <= 5; ++i) r.push(i);
  EXPECT_EQ(r.ordered(), (std::vector<int>{3, 4, 5}));
  r.set_capacity(2);
  EXPECT_EQ(r.ordered(), (std::vector<int>{4, 5}));
  r.push(6);
  EXPECT_EQ(r.ordered(), (std::vector<int>{5, 6}));
  r.set_capacity(4);
  r.push(7);
  EXPECT_EQ(r.ordered(), (std::vector<int>{5, 6, 7}));
  r.clear();
  EXPECT_TRUE(r.ordered().empty());
  TraceRing<int> zero(0);  // at least one entry, as PyTorch's max_entries
  zero.push(1);
  zero.push(2);
  EXPECT_EQ(zero.ordered(), std::vector<int>{2});
}

TEST(BlockTable, TakeReturnsARecordOnce) {
  BlockTable t;
  int a = 0;
  t.insert(&a, BlockRecord{100, 0, nullptr, nullptr, {}});
  EXPECT_TRUE(t.add_use(&a, &a, 1));
  const auto r = t.take(&a);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->requested, 100u);
  ASSERT_EQ(r->uses.size(), 1u);
  EXPECT_EQ(r->uses[0].second, 1);
  EXPECT_FALSE(t.take(&a).has_value());
  EXPECT_FALSE(t.add_use(&a, &a, 0));
}

TEST(BlockTable, ThreadsOnDifferentBlocks) {
  BlockTable t;
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&t, k] {
      for (std::uintptr_t i = 1; i <= 5000; ++i) {
        auto* p = reinterpret_cast<void*>((i + static_cast<std::uintptr_t>(k) * 100000) << 9);
        t.insert(p, BlockRecord{i, k, nullptr, nullptr, {}});
        if (i % 2 == 0) {
          auto r = t.take(p);
          ASSERT_TRUE(r.has_value());
          ASSERT_EQ(r->requested, i);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.size(), 4u * 2500u);
}

TEST(VersionCheck, TheSameVersionPasses) {
  EXPECT_EQ(version_mismatch("2.11.0+cu130", "2.11.0+cu130"), "");
}

TEST(VersionCheck, AnotherVersionNamesBothAndTheWayOut) {
  const std::string m = version_mismatch("2.11.0+cu130", "2.11.0+cu128");
  EXPECT_NE(m.find("built for torch 2.11.0+cu130"), std::string::npos) << m;
  EXPECT_NE(m.find("runs torch 2.11.0+cu128"), std::string::npos) << m;
  EXPECT_NE(m.find("backend=\"pluggable\""), std::string::npos) << m;
}

TEST(Messages, SizesAreWrittenAsPyTorchWritesThem) {
  EXPECT_EQ(format_size(1000), "1000 bytes");
  EXPECT_EQ(format_size(2048), "2.00 KiB");
  EXPECT_EQ(format_size(20u << 20), "20.00 MiB");
  EXPECT_EQ(format_size(1u << 30), "1024.00 MiB");  // PyTorch switches to GiB above 1 GiB
  // PyTorch's test_out_of_memory looks for this text.
  EXPECT_EQ(format_size(1024ull * 1024 * 1024 * 8000000000ull), "8000000000.00 GiB");
}

TEST(Messages, OutOfMemorySaysWhatWasAskedAndWhy) {
  OomFacts f;
  f.device = 0;
  f.requested = 3ull << 30;
  f.device_total = 140ull << 30;
  f.device_free = 1ull << 30;
  f.allocated = 100ull << 30;
  f.reserved = 102ull << 30;
  f.reason = "device 0 cannot map 3 GiB more (memory_fraction 0.5 reached)";
  const std::string m = oom_message(f);
  EXPECT_EQ(m.rfind("CUDA out of memory. Tried to allocate 3.00 GiB.", 0), 0u) << m;
  EXPECT_NE(m.find("GPU 0 has a total capacity of 140.00 GiB of which 1024.00 MiB is free"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("2.00 GiB is reserved by gvmalloc but unallocated"), std::string::npos) << m;
  EXPECT_NE(m.find("gvmalloc: device 0 cannot map"), std::string::npos) << m;
}

}  // namespace
}  // namespace gvm::torch_backend
