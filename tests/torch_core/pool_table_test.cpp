#include "pool_table.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace gvm::torch_backend {
namespace {

struct Pools : ::testing::Test {
  PoolTable table;
  PoolId next = 100;
  int made = 0;
  PoolTable::MakePool make = [this] {
    ++made;
    return next++;
  };
};

TEST_F(Pools, MemPoolReferencesCountAndTheLastReleaseFreesThePool) {
  const MempoolKey k{0, 7};
  table.create_or_incref(k, nullptr, make);
  EXPECT_EQ(table.use_count(k), 1);
  EXPECT_EQ(made, 1);
  table.create_or_incref(k, nullptr, make);
  EXPECT_EQ(table.use_count(k), 2);
  EXPECT_EQ(made, 1);
  EXPECT_FALSE(table.release(k).has_value());
  const auto released = table.release(k);
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(*released, 100u);
  EXPECT_EQ(table.use_count(k), 0);
  EXPECT_FALSE(table.release(k).has_value());  // unknown now: nothing to do
}

TEST_F(Pools, RoutesSendOnlyAcceptedStreamsIntoThePool) {
  int capture_stream = 0;
  int other_stream = 0;
  const MempoolKey k{5, 0};
  EXPECT_FALSE(table.any_routes());
  const Target t = table.begin(
      k, [&](void* s) { return s == &capture_stream; }, true, make);
  EXPECT_TRUE(t.capture);
  EXPECT_TRUE(table.any_routes());
  EXPECT_TRUE(table.capturing());
  EXPECT_EQ(table.route(&capture_stream).pool, t.pool);
  EXPECT_EQ(table.route(&capture_stream).key, k);
  EXPECT_EQ(table.route(&other_stream).pool, 0u);
  EXPECT_TRUE(table.route(&other_stream).key.is_default());
  const auto ended = table.end(k);
  ASSERT_TRUE(ended.has_value());
  EXPECT_TRUE(ended->capture);
  EXPECT_FALSE(table.any_routes());
  EXPECT_FALSE(table.capturing());
  EXPECT_EQ(table.route(&capture_stream).pool, 0u);
  EXPECT_EQ(table.use_count(k), 1);  // the graph keeps the pool until it is reset
  EXPECT_TRUE(table.release(k).has_value());
}

TEST_F(Pools, TwoGraphsShareOnePool) {
  const MempoolKey k{0, 3};  // torch.cuda.graph_pool_handle()
  int s1 = 0;
  const Target a = table.begin(
      k, [&](void* s) { return s == &s1; }, true, make);
  ASSERT_TRUE(table.end(k).has_value());
  const Target b = table.begin(
      k, [&](void* s) { return s == &s1; }, true, make);
  ASSERT_TRUE(table.end(k).has_value());
  EXPECT_EQ(a.pool, b.pool);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(table.use_count(k), 2);
  EXPECT_FALSE(table.release(k).has_value());  // the first graph dies
  EXPECT_TRUE(table.release(k).has_value());   // the second
}

TEST_F(Pools, TheFirstOpenRouteThatAcceptsAStreamWins) {
  int s = 0;
  const Target a = table.begin(
      MempoolKey{0, 1}, [](void*) { return true; }, false, make);
  const Target b = table.begin(
      MempoolKey{0, 2}, [](void*) { return true; }, false, make);
  EXPECT_FALSE(table.capturing());
  EXPECT_EQ(table.route(&s).pool, a.pool);
  ASSERT_TRUE(table.end(MempoolKey{0, 1}).has_value());
  EXPECT_EQ(table.route(&s).pool, b.pool);
}

TEST_F(Pools, EndWithoutBeginSaysSo) {
  EXPECT_FALSE(table.end(MempoolKey{0, 9}).has_value());
}

TEST_F(Pools, TheDefaultPoolIsNotAPrivatePool) {
  EXPECT_THROW(table.create_or_incref(MempoolKey{}, nullptr, make), std::invalid_argument);
  EXPECT_EQ(made, 0);
}

TEST_F(Pools, APoolWithItsOwnAllocatorHasNoGvmallocPool) {
  auto custom = std::make_shared<int>(1);
  const MempoolKey k{0, 4};
  table.create_or_incref(k, custom, make);
  EXPECT_EQ(made, 0);
  const Target t = table.begin(
      k, [](void*) { return true; }, false, make);
  EXPECT_EQ(t.custom, custom);
  EXPECT_THROW(table.create_or_incref(k, std::make_shared<int>(2), make), std::invalid_argument);
  ASSERT_TRUE(table.end(k).has_value());
  EXPECT_FALSE(table.release(k).has_value());  // begin's reference
  EXPECT_FALSE(table.release(k).has_value());  // the last: no gvmalloc pool to release
  EXPECT_EQ(table.use_count(k), 0);
}

TEST_F(Pools, AFailedPoolCreationAddsNothing) {
  PoolTable::MakePool failing = []() -> PoolId {
    throw std::runtime_error("no pools in this gvmalloc");
  };
  EXPECT_THROW(table.begin(
                   MempoolKey{1, 0}, [](void*) { return true; }, true, failing),
               std::runtime_error);
  EXPECT_FALSE(table.any_routes());
  EXPECT_EQ(table.use_count(MempoolKey{1, 0}), 0);
}

TEST_F(Pools, UseOnOomPoolsAreListed) {
  table.create_or_incref(MempoolKey{0, 1}, nullptr, make);
  table.create_or_incref(MempoolKey{0, 2}, nullptr, make);
  table.set_use_on_oom(MempoolKey{0, 2}, true);
  const auto targets = table.use_on_oom_targets();
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].key, (MempoolKey{0, 2}));
  table.set_use_on_oom(MempoolKey{0, 99}, false);  // MemPool's destructor on a gone pool: fine
  EXPECT_THROW(table.set_use_on_oom(MempoolKey{0, 99}, true), std::invalid_argument);
}

TEST_F(Pools, KeyOfFindsThePyTorchPoolOfAGvmallocPool) {
  table.create_or_incref(MempoolKey{0, 1}, nullptr, make);
  EXPECT_EQ(table.key_of(100), (MempoolKey{0, 1}));
  EXPECT_EQ(table.key_of(0), MempoolKey{});
  EXPECT_FALSE(table.key_of(12345).has_value());
}

}  // namespace
}  // namespace gvm::torch_backend
