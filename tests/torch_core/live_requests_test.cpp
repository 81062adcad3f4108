// The backend's record of what each live block was asked for.
#include "live_requests.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace gvm::torch_backend {
namespace {

void* at(std::uintptr_t i) {
  return reinterpret_cast<void*>(i << 9);  // blocks are 512-byte aligned
}

TEST(LiveRequests, TakeReturnsARecordOnce) {
  LiveRequests t;
  t.insert(at(1), LiveRequest{5121, 0});
  t.insert(at(2), LiveRequest{7, 3});
  EXPECT_EQ(t.size(), 2u);
  const auto r = t.take(at(1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->requested, 5121u);
  EXPECT_EQ(r->device, 0);
  EXPECT_FALSE(t.take(at(1)).has_value()) << "a second free";
  EXPECT_EQ(t.take(at(2))->device, 3);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_FALSE(t.take(nullptr).has_value());
  t.insert(nullptr, LiveRequest{1, 0});
  EXPECT_EQ(t.size(), 0u) << "nothing lives at address 0";
}

TEST(LiveRequests, ARecordForALiveAddressIsReplaced) {
  LiveRequests t;
  t.insert(at(9), LiveRequest{100, 0});
  t.insert(at(9), LiveRequest{200, 1});
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.take(at(9))->requested, 200u);
}

// Random inserts and takes against std::unordered_map: runs of colliding
// slots, growth, and the backward shift of every deletion must keep every
// record findable.
TEST(LiveRequests, AgreesWithAMapOverRandomInsertsAndTakes) {
  LiveRequests t;
  std::unordered_map<std::uintptr_t, std::size_t> ref;
  std::mt19937_64 rng(11);
  for (int op = 0; op < 200000; ++op) {
    // Few distinct addresses, so that takes hit and the runs are long.
    const std::uintptr_t k = 1 + rng() % 20000;
    if (rng() % 3 != 0) {
      const std::size_t n = 1 + rng() % (1u << 24);
      t.insert(at(k), LiveRequest{n, static_cast<int>(k % 4)});
      ref[k] = n;
    } else {
      const auto got = t.take(at(k));
      const auto it = ref.find(k);
      ASSERT_EQ(got.has_value(), it != ref.end()) << "address " << k << " at op " << op;
      if (got) {
        EXPECT_EQ(got->requested, it->second);
        EXPECT_EQ(got->device, static_cast<int>(k % 4));
        ref.erase(it);
      }
    }
  }
  EXPECT_EQ(t.size(), ref.size());
  for (const auto& [k, n] : ref) {
    const auto got = t.take(at(k));
    ASSERT_TRUE(got.has_value()) << k;
    EXPECT_EQ(got->requested, n);
  }
  EXPECT_EQ(t.size(), 0u);
}

TEST(LiveRequests, ThreadsOnDifferentBlocks) {
  LiveRequests t;
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&t, k] {
      const auto base = static_cast<std::uintptr_t>(k) * 1000000;
      for (std::uintptr_t i = 1; i <= 20000; ++i) {
        t.insert(at(base + i), LiveRequest{i, k});
        if (i % 2 == 0) {
          const auto r = t.take(at(base + i - 1));
          ASSERT_TRUE(r.has_value());
          EXPECT_EQ(r->requested, i - 1);
          EXPECT_EQ(r->device, k);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.size(), 4u * 10000u);
}

}  // namespace
}  // namespace gvm::torch_backend
