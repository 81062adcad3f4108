// The peer entry points of the C ABI over the simulated driver.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gvm/gvm.h"

namespace {

struct PeerCApi : ::testing::Test {
  void SetUp() override {
    if (gvm_is_initialized()) gvm_shutdown();
    ASSERT_EQ(gvm_init_simulated("h200", 2, "scratch_chunk_size:2MiB"), GVM_OK) << gvm_last_error();
  }
  void TearDown() override { gvm_shutdown(); }
};

TEST_F(PeerCApi, ScratchRoundTripAndPolicy) {
  void* p = gvm_scratch_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr) << gvm_last_error();
  EXPECT_STREQ(gvm_peer_policy(0, 1), "per_allocation");
  ASSERT_EQ(gvm_record_stream_on(p, nullptr, 1), GVM_OK) << gvm_last_error();
  void* dst = gvm_malloc(4096, 1, nullptr);
  ASSERT_NE(dst, nullptr);
  EXPECT_EQ(gvm_peer_copy(dst, 1, p, 0, 4096, nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(gvm_set_peer_policy("none"), GVM_OK) << gvm_last_error();
  EXPECT_STREQ(gvm_peer_policy(0, 1), "none");
  EXPECT_EQ(gvm_set_peer_policy("auto"), GVM_OK);
  EXPECT_EQ(gvm_free(p, 4096, 0, nullptr), GVM_OK) << gvm_last_error();
  EXPECT_EQ(gvm_free(dst, 4096, 1, nullptr), GVM_OK) << gvm_last_error();
}

TEST_F(PeerCApi, BadInputIsRefusedWithAMessage) {
  EXPECT_EQ(gvm_scratch_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(gvm_last_status(), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_scratch_malloc(64, 7, nullptr), nullptr);
  EXPECT_EQ(gvm_last_status(), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_set_peer_policy("sometimes"), GVM_ERROR_CONFIG);
  EXPECT_NE(std::string(gvm_last_error()).find("sometimes"), std::string::npos) << gvm_last_error();
  EXPECT_EQ(gvm_peer_policy(0, 5), nullptr);
  EXPECT_EQ(gvm_record_stream_on(nullptr, nullptr, 0), GVM_ERROR_INVALID_ARGUMENT);
  int x = 0;
  EXPECT_EQ(gvm_record_stream_on(&x, nullptr, 0), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_peer_copy(nullptr, 1, &x, 0, 4, nullptr), GVM_ERROR_INVALID_ARGUMENT);
}

}  // namespace
