// The rows of docs/reliability.md's bad-input table that the allocator and
// C ABI suites do not already cover: use after trim, free after
// gvm_shutdown, a stream of another device, sizes near SIZE_MAX through
// every entry point, negative ssize_t through the framework entry points,
// device ids out of range everywhere, malformed config strings through the
// C ABI, bad arguments to the peer calls. Every row checks the error, its
// message, and that nothing changed.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/gvm.h"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm::test {
namespace {

using vmm::Result;
using vmm::SimDriver;
using vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Everything a bad call must leave as it was.
struct State {
  std::vector<DeviceStats> devices;
  std::size_t handles, mappings, classic, events;
  bool operator==(const State& o) const {
    if (devices.size() != o.devices.size()) return false;
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const DeviceStats &a = devices[d], &b = o.devices[d];
      if (a.live_bytes != b.live_bytes || a.reserved_bytes != b.reserved_bytes ||
          a.allocations != b.allocations || a.frees != b.frees ||
          a.chunks_mapped != b.chunks_mapped || a.chunks_unmapped != b.chunks_unmapped)
        return false;
    }
    return handles == o.handles && mappings == o.mappings && classic == o.classic &&
           events == o.events;
  }
};

class BadInput : public ::testing::Test {
 protected:
  BadInput() : sim_(SimDriver::uniform(vmm::Profile::h200, 2)) {
    for (int d = 0; d < 2; ++d) {
      sim_->set_physical_budget(d, 256 * kMiB);
      EXPECT_EQ(sim_->stream_create(d, &stream_[d]), Result::success);
    }
    Config c;
    c.max_chunk_bytes = 2 * kMiB;
    c.scratch_chunk_bytes = 4 * kMiB;
    alloc_ = std::make_unique<Allocator>(*sim_, c);
  }
  ~BadInput() override {
    alloc_.reset();
    for (int d = 0; d < 2; ++d) (void)sim_->stream_destroy(d, stream_[d]);
  }
  State state() const {
    State s{{},
            sim_->live_handles(),
            sim_->live_mappings(),
            sim_->live_classic_allocations(),
            sim_->live_events()};
    for (int d = 0; d < alloc_->device_count(); ++d) s.devices.push_back(alloc_->device_stats(d));
    return s;
  }
  ::testing::AssertionResult invariants() const {
    std::string why;
    if (alloc_->check_invariants(&why)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << why;
  }
  Allocator& a() { return *alloc_; }

  std::unique_ptr<SimDriver> sim_;
  std::unique_ptr<Allocator> alloc_;
  StreamHandle stream_[2] = {nullptr, nullptr};
};

// `stmt` throws usage_error whose message holds `fragment`, and changes nothing.
#define EXPECT_REFUSED(stmt, fragment)                                                  \
  do {                                                                                  \
    const State before_ = state();                                                      \
    try {                                                                               \
      stmt;                                                                             \
      ADD_FAILURE() << #stmt " was accepted";                                           \
    } catch (const ::gvm::usage_error& e_) {                                            \
      EXPECT_NE(std::string(e_.what()).find(fragment), std::string::npos) << e_.what(); \
    }                                                                                   \
    EXPECT_TRUE(before_ == state()) << #stmt " changed the allocator";                  \
    EXPECT_TRUE(invariants());                                                          \
  } while (0)

// Trim keeps live blocks: a pointer allocated before a trim is still valid
// after it, can be used and freed; freeing it twice afterwards is refused.
TEST_F(BadInput, FreeAfterTrimIsValidBecauseTrimKeepsLiveBlocks) {
  void* small = a().allocate(3000, 0, stream_[0]);
  void* large = a().allocate(9 * kMiB, 0, stream_[0]);
  void* gone = a().allocate(20 * kMiB, 0, stream_[0]);
  a().deallocate(gone, 20 * kMiB, 0, stream_[0]);
  const std::size_t reserved = a().device_stats(0).reserved_bytes;
  a().trim();
  EXPECT_LT(a().device_stats(0).reserved_bytes, reserved) << "trim gave nothing back";
  // The live blocks are still mapped and writable.
  EXPECT_EQ(sim_->enqueue_access(0, stream_[0], reinterpret_cast<vmm::DevicePtr>(small), 3000,
                                 vmm::AccessKind::write),
            Result::success);
  EXPECT_EQ(sim_->enqueue_access(0, stream_[0], reinterpret_cast<vmm::DevicePtr>(large), 9 * kMiB,
                                 vmm::AccessKind::write),
            Result::success);
  EXPECT_NO_THROW(a().deallocate(small, 3000, 0, stream_[0]));
  EXPECT_NO_THROW(a().deallocate(large, 9 * kMiB, 0, stream_[0]));
  EXPECT_TRUE(invariants());
  // The block freed before the trim is gone: refused, nothing changes.
  EXPECT_REFUSED(a().deallocate(gone, 20 * kMiB, 0, stream_[0]), "gvmalloc: deallocate(");
  EXPECT_REFUSED(a().deallocate(large, 9 * kMiB, 0, stream_[0]), "not a live block");
  a().trim();
  EXPECT_EQ(sim_->physical_used(0), 0u);
  EXPECT_EQ(sim_->sticky_error(), Result::success);
}

// A stream of device 1 named in an allocation on device 0: stream handles
// are opaque to the allocator, so it cannot refuse them up front. What it
// must do is stay correct: the block is served, its free and its reuse by
// another stream leave no race, no sticky error and nothing leaked.
TEST_F(BadInput, StreamOfAnotherDeviceStaysCorrect) {
  for (std::size_t n : {std::size_t{4096}, 5 * kMiB}) {
    SCOPED_TRACE(n);
    void* p = nullptr;
    try {
      p = a().allocate(n, 0, stream_[1]);
    } catch (const driver_error& e) {
      // Refusing it with the driver's reason is acceptable too.
      EXPECT_NE(std::string(e.what()).find("cu"), std::string::npos) << e.what();
      continue;
    }
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(sim_->enqueue_access(0, stream_[0], reinterpret_cast<vmm::DevicePtr>(p), n,
                                   vmm::AccessKind::write),
              Result::success);
    EXPECT_NO_THROW(a().deallocate(p, n, 0, stream_[1]));
    void* q = a().allocate(n, 0, stream_[0]);
    EXPECT_EQ(sim_->enqueue_access(0, stream_[0], reinterpret_cast<vmm::DevicePtr>(q), n,
                                   vmm::AccessKind::write),
              Result::success);
    a().deallocate(q, n, 0, stream_[0]);
    EXPECT_TRUE(invariants());
  }
  sim_->complete_all();
  a().trim();
  EXPECT_EQ(sim_->physical_used(0), 0u);
  EXPECT_EQ(sim_->physical_used(1), 0u);
  EXPECT_EQ(sim_->sticky_error(), Result::success);
  EXPECT_EQ(sim_->race_count(), 0u) << sim_->races().front();
}

TEST_F(BadInput, SizesNearSizeMaxAreRefusedEverywhere) {
  void* keep = a().allocate(4096, 0, stream_[0]);
  for (std::size_t n :
       {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 511, SIZE_MAX / 2 + 1, (std::size_t{1} << 47) + 1}) {
    SCOPED_TRACE(n);
    EXPECT_REFUSED((void)a().allocate(n, 0, stream_[0]), "not a size any GPU can hold");
    EXPECT_REFUSED((void)a().scratch_allocate(n, 0, stream_[0]), "gvmalloc: ");
    // SIZE_MAX is kUnknownSize (the size check is skipped, by contract).
    if (n != kUnknownSize)
      EXPECT_REFUSED(a().deallocate(keep, n, 0, stream_[0]), "gvmalloc: deallocate(");
  }
  // Between the device's memory and the absurd bound: out_of_memory, typed.
  const State before = state();
  EXPECT_THROW((void)a().allocate(std::size_t{1} << 46, 0, stream_[0]), out_of_memory);
  EXPECT_TRUE(before == state());
  a().deallocate(keep, 4096, 0, stream_[0]);
}

TEST_F(BadInput, DeviceIdsOutOfRangeAreRefusedEverywhere) {
  void* p = a().allocate(4096, 0, stream_[0]);
  void* s = a().scratch_allocate(4096, 0, stream_[0]);
  for (int d : {-2, -1, 2, 99, INT32_MIN, INT32_MAX}) {
    SCOPED_TRACE(d);
    if (d != -1) EXPECT_REFUSED(a().trim(d), "does not exist");  // -1 means every device
    EXPECT_REFUSED((void)a().allocate(4096, d, stream_[0]), "does not exist");
    EXPECT_REFUSED((void)a().scratch_allocate(4096, d, stream_[0]), "does not exist");
    EXPECT_REFUSED(a().deallocate(p, 4096, d, stream_[0]), "does not exist");
    EXPECT_REFUSED(a().record_stream(s, stream_[0], d), "gvmalloc: ");
    EXPECT_REFUSED((void)a().device_stats(d), "does not exist");
    EXPECT_REFUSED((void)a().caps(d), "does not exist");
    EXPECT_REFUSED((void)a().peer_policy(d, 0), "gvmalloc: ");
    EXPECT_REFUSED((void)a().peer_policy(0, d), "gvmalloc: ");
    EXPECT_REFUSED(a().peer_copy(p, 0, s, d, 4096, stream_[0]), "gvmalloc: ");
    EXPECT_REFUSED(a().peer_copy(p, d, s, 0, 4096, stream_[0]), "gvmalloc: ");
  }
  a().deallocate(p, 4096, 0, stream_[0]);
  a().deallocate(s, 4096, 0, stream_[0]);
}

TEST_F(BadInput, BadPeerCopiesAreRefused) {
  void* dst = a().allocate(4 * kMiB, 1, stream_[1]);
  void* src = a().scratch_allocate(4 * kMiB, 0, stream_[0]);
  void* freed = a().allocate(4 * kMiB, 1, stream_[1]);
  a().deallocate(freed, 4 * kMiB, 1, stream_[1]);
  // A range that runs past the end of its block (it would reach unmapped
  // memory: an illegal address that kills the context).
  EXPECT_REFUSED(a().peer_copy(dst, 1, src, 0, 4 * kMiB + 512, stream_[1]), "whole range");
  EXPECT_REFUSED(a().peer_copy(static_cast<char*>(dst) + 512, 1, src, 0, 4 * kMiB, stream_[1]),
                 "destination");
  // Counts that would wrap the address space.
  EXPECT_REFUSED(a().peer_copy(dst, 1, src, 0, SIZE_MAX, stream_[1]), "whole range");
  EXPECT_REFUSED(a().peer_copy(dst, 1, src, 0, SIZE_MAX - 4095, stream_[1]), "whole range");
  // Pointers named with the wrong device.
  EXPECT_REFUSED(a().peer_copy(dst, 0, src, 1, 4096, stream_[0]), "belongs to device");
  // A block already freed.
  EXPECT_REFUSED(a().peer_copy(freed, 1, src, 0, 4096, stream_[1]), "live block");
  // Pointers gvmalloc never gave out are the caller's memory, passed through.
  EXPECT_EQ(sim_->sticky_error(), Result::success);
  a().deallocate(dst, 4 * kMiB, 1, stream_[1]);
  a().deallocate(src, 4 * kMiB, 0, stream_[0]);
}

// ---- C ABI ---------------------------------------------------------------

class BadInputC : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gvm_is_initialized()) (void)gvm_shutdown();
    ASSERT_EQ(gvm_init_simulated("h200", 2, "max_chunk_size:2MiB"), GVM_OK) << gvm_last_error();
    gvm_clear_last_error();
  }
  void TearDown() override {
    if (gvm_is_initialized()) (void)gvm_shutdown();
    gvm_clear_last_error();
  }
};

#define EXPECT_LAST(status, fragment)                                           \
  do {                                                                          \
    EXPECT_EQ(gvm_last_status(), status) << gvm_status_name(gvm_last_status()); \
    EXPECT_NE(std::string(gvm_last_error()).find(fragment), std::string::npos)  \
        << gvm_last_error();                                                    \
    gvm_clear_last_error();                                                     \
  } while (0)

TEST_F(BadInputC, FreeAfterShutdownIsNotInitializedAndStartsNothing) {
  void* p = gvm_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr) << gvm_last_error();
  ASSERT_EQ(gvm_shutdown(), GVM_OK);
  EXPECT_EQ(gvm_free(p, 4096, 0, nullptr), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_LAST(GVM_ERROR_NOT_INITIALIZED, "gvm_free: ");
  EXPECT_EQ(gvm_record_stream(p, nullptr), GVM_ERROR_NOT_INITIALIZED);
  EXPECT_LAST(GVM_ERROR_NOT_INITIALIZED, "gvm_record_stream");
  testing::internal::CaptureStderr();
  gvm_torch_free(p, 4096, 0, nullptr);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_LAST(GVM_ERROR_NOT_INITIALIZED, "gvm_torch_free");
  EXPECT_NE(err.find("gvmalloc: gvm_torch_free: "), std::string::npos) << err;
  EXPECT_EQ(gvm_is_initialized(), 0) << "a free after shutdown started the allocator";
  // A new allocator does not know the old pointer.
  ASSERT_EQ(gvm_init_simulated("h200", 2, nullptr), GVM_OK);
  EXPECT_EQ(gvm_free(p, 4096, 0, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_free: ");
}

TEST_F(BadInputC, NegativeAndHugeSizesThroughTheFrameworkEntryPoints) {
  for (ssize_t n : {ssize_t{-1}, ssize_t{-4096}, static_cast<ssize_t>(INT64_MIN)}) {
    SCOPED_TRACE(n);
    testing::internal::CaptureStderr();
    EXPECT_EQ(gvm_torch_malloc(n, 0, nullptr), nullptr);
    EXPECT_FALSE(testing::internal::GetCapturedStderr().empty());
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "is negative");
  }
  testing::internal::CaptureStderr();
  EXPECT_EQ(gvm_torch_malloc(static_cast<ssize_t>(INT64_MAX), 0, nullptr), nullptr);
  (void)testing::internal::GetCapturedStderr();
  EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_torch_malloc: ");
  for (std::size_t n : {SIZE_MAX, SIZE_MAX - 511}) {
    testing::internal::CaptureStderr();
    EXPECT_EQ(gvm_cupy_malloc(0, n, 0), 0);
    (void)testing::internal::GetCapturedStderr();
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_cupy_malloc: ");
    EXPECT_EQ(gvm_scratch_malloc(n, 0, nullptr), nullptr);
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_scratch_malloc: ");
  }
  gvm_device_stats_t s{};
  ASSERT_EQ(gvm_device_stats(0, &s), GVM_OK);
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);
}

TEST_F(BadInputC, DeviceIdsOutOfRangeThroughEveryEntryPoint) {
  void* p = gvm_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr);
  for (int d : {-2, 2, 99, INT32_MIN}) {
    SCOPED_TRACE(d);
    EXPECT_EQ(gvm_trim(d), GVM_ERROR_INVALID_ARGUMENT);
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_trim");
    EXPECT_EQ(gvm_scratch_malloc(4096, d, nullptr), nullptr);
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_scratch_malloc");
    EXPECT_EQ(gvm_record_stream_on(p, nullptr, d), GVM_ERROR_INVALID_ARGUMENT);
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_record_stream_on");
    EXPECT_EQ(gvm_peer_policy(d, 0), nullptr);
    EXPECT_LAST(GVM_ERROR_INVALID_ARGUMENT, "gvm_peer_policy");
    testing::internal::CaptureStderr();
    EXPECT_EQ(gvm_cupy_malloc(0, 4096, d), 0);
    gvm_cupy_free(0, reinterpret_cast<intptr_t>(p), d);
    gvm_torch_free(p, 4096, d, nullptr);
    (void)testing::internal::GetCapturedStderr();
    EXPECT_EQ(gvm_last_status(), GVM_ERROR_INVALID_ARGUMENT);
    gvm_clear_last_error();
  }
  // p survived every bad call.
  EXPECT_EQ(gvm_free(p, 4096, 0, nullptr), GVM_OK) << gvm_last_error();
}

TEST_F(BadInputC, MalformedConfigStringsAreRefusedAndStartNothing) {
  ASSERT_EQ(gvm_shutdown(), GVM_OK);
  const char* bad[] = {
      "max_chunk_size",                          // no value
      ":4MiB",                                   // no key
      "max_chunk_size:",                         // empty value
      "max_chunk_size:4XiB",                     // unknown unit
      "max_chunk_size:-4MiB",                    // negative size
      "max_chunk_size:99999999999999999999999",  // overflows
      "max_chunk_size:16EiB",                    // beyond the units
      "memory_fraction:1.5",                     // out of range
      "memory_fraction:nan",
      "no_vmm:maybe",  // not a boolean
      "peer_policy:sometimes",
      "unknown_key:1",
      "max_chunk_size:4MiB;small_max:1MiB",  // wrong separator
      "max_chunk_size:4MiB,,bogus:1",
  };
  for (const char* conf : bad) {
    SCOPED_TRACE(conf);
    EXPECT_EQ(gvm_init_simulated("h200", 2, conf), GVM_ERROR_CONFIG);
    EXPECT_EQ(gvm_last_status(), GVM_ERROR_CONFIG);
    EXPECT_NE(std::string(gvm_last_error()).find("gvm_init_simulated: "), std::string::npos)
        << gvm_last_error();
    gvm_clear_last_error();
    EXPECT_EQ(gvm_is_initialized(), 0);
  }
  // Bad profiles and device counts.
  EXPECT_EQ(gvm_init_simulated("h300", 2, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_init_simulated(nullptr, 2, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_init_simulated("h200", 0, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_init_simulated("h200", -1, nullptr), GVM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(gvm_is_initialized(), 0);
  gvm_clear_last_error();
  // Bad policy names at run time.
  ASSERT_EQ(gvm_init_simulated("h200", 2, nullptr), GVM_OK);
  for (const char* p : {"", "globall", "per-allocation", "NONE;"}) {
    SCOPED_TRACE(p);
    // A policy name is a config value: GVM_ERROR_CONFIG, naming it.
    EXPECT_EQ(gvm_set_peer_policy(p), GVM_ERROR_CONFIG);
    EXPECT_LAST(GVM_ERROR_CONFIG, "gvm_set_peer_policy");
  }
  EXPECT_EQ(gvm_set_peer_policy(nullptr), GVM_ERROR_INVALID_ARGUMENT);
  gvm_clear_last_error();
}

}  // namespace
}  // namespace gvm::test
