// DriverSuite: what every Driver (real or simulated) and the vmm owners must
// do, as one value-parameterized GoogleTest suite.
//
// Include this header in exactly ONE source file of a test binary (it defines
// the tests), then instantiate it with the drivers to test:
//
//   INSTANTIATE_TEST_SUITE_P(Cuda, DriverSuite,
//       ::testing::Values(gvm::test::DriverFactory{"cuda", [](std::string* why) {
//         return gvm::vmm::try_load_cuda_test_driver(why);
//       }}),
//       gvm::test::factory_name);
//
// A factory that returns nullptr makes every test skip with the reason it
// gave. Tests that need VMM, or two devices with peer access, skip with a
// reason where the driver has neither. Only behaviour the real driver is known
// to share is asserted here; what only the simulator can show (fault
// injection, leak counters, hazards) lives in the sim-only tests.
//
// Data checks copy through memory, so a SimDriver under this suite must have
// backing enabled.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <ostream>
#include <utility>
#include <vector>

#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "gvm/vmm/owners.hpp"

namespace gvm::test {

struct DriverFactory {
  std::string name;  // the test-name suffix: letters, digits and '_' only
  // A driver, or nullptr with *why saying why there is none.
  std::function<std::unique_ptr<vmm::TestDriver>(std::string* why)> make;
};

// GoogleTest prints a parameter in the test list ("# GetParam() = ..."):
// without this it prints the struct's raw bytes, which CMake 4's test
// discovery cannot parse.
inline void PrintTo(const DriverFactory& f, std::ostream* os) { *os << f.name; }

inline std::string factory_name(const ::testing::TestParamInfo<DriverFactory>& info) {
  return info.param.name;
}

class DriverSuite : public ::testing::TestWithParam<DriverFactory> {
 protected:
  void SetUp() override {
    std::string why;
    driver_ = GetParam().make(&why);
    if (!driver_) GTEST_SKIP() << "no driver (" << GetParam().name << "): " << why;
    ASSERT_EQ(driver_->device_count(&devices_), vmm::Result::success);
    if (devices_ == 0) GTEST_SKIP() << "the driver shows no device";
    caps_ = vmm::read_device_caps(*driver_, 0);
    gran_ = caps_.granularity;
  }

  vmm::TestDriver& driver() { return *driver_; }
  bool has_vmm() const { return caps_.vmm; }
  // Devices 0 and 1 can access each other (a peer pair for access tests).
  bool peer_pair() {
    if (devices_ < 2) return false;
    bool a = false, b = false;
    return driver_->can_access_peer(0, 1, &a) == vmm::Result::success && a &&
           driver_->can_access_peer(1, 0, &b) == vmm::Result::success && b;
  }
  std::vector<vmm::AccessDesc> owner_rw(int device) const {
    return {{device, vmm::Access::read_write}};
  }
  // Fills a host buffer with a pattern that differs per `seed`.
  static std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
    std::vector<unsigned char> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + 1) & 0xff);
    return v;
  }

  std::unique_ptr<vmm::TestDriver> driver_;
  int devices_ = 0;
  vmm::DeviceCaps caps_;
  std::size_t gran_ = 0;
};

#define GVM_NEED_VMM()                                                            \
  do {                                                                            \
    if (!has_vmm()) GTEST_SKIP() << "device 0 (" << caps_.name << ") has no VMM"; \
  } while (0)

#define GVM_NEED_PEERS()                                                              \
  do {                                                                                \
    if (!peer_pair()) GTEST_SKIP() << "needs two devices that can access each other"; \
  } while (0)

using vmm::Access;
using vmm::Result;

TEST_P(DriverSuite, DeviceCapsAreConsistent) {
  std::vector<vmm::DeviceCaps> all = vmm::read_all_device_caps(driver());
  ASSERT_EQ(static_cast<int>(all.size()), devices_);
  for (const vmm::DeviceCaps& c : all) {
    SCOPED_TRACE("device " + std::to_string(c.device) + " " + c.name);
    EXPECT_FALSE(c.name.empty());
    EXPECT_GT(c.cc_major, 0);
    EXPECT_EQ(c.compute_capability(), c.cc_major * 10 + c.cc_minor);
    EXPECT_GT(c.total_memory, 0u);
    if (c.vmm) {
      EXPECT_GT(c.granularity, 0u);
      EXPECT_EQ(c.granularity & (c.granularity - 1), 0u) << "granularity is a power of two";
      EXPECT_GE(c.recommended_granularity, c.granularity);
      EXPECT_EQ(c.recommended_granularity % c.granularity, 0u);
    }
    ASSERT_EQ(static_cast<int>(c.can_access_peer.size()), devices_);
    EXPECT_FALSE(c.can_access_peer[static_cast<std::size_t>(c.device)])
        << "a device is not its own peer";
    std::size_t free_bytes = 0, total_bytes = 0;
    ASSERT_EQ(driver().mem_get_info(c.device, &free_bytes, &total_bytes), Result::success);
    EXPECT_EQ(total_bytes, c.total_memory);
    EXPECT_LE(free_bytes, total_bytes);
  }
  EXPECT_THROW(vmm::read_device_caps(driver(), devices_), vmm::DriverError);
}

TEST_P(DriverSuite, BadDeviceIsInvalidDevice) {
  int v = 0;
  EXPECT_EQ(driver().device_attribute(devices_, vmm::DeviceAttribute::compute_capability_major, &v),
            Result::invalid_device);
  std::size_t bytes = 0;
  EXPECT_EQ(driver().device_total_memory(-1, &bytes), Result::invalid_device);
}

TEST_P(DriverSuite, ReserveAndFree) {
  GVM_NEED_VMM();
  vmm::ReservedRange a(driver(), 8 * gran_, 0);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.size(), 8 * gran_);
  EXPECT_EQ(a.base() % gran_, 0u);
  EXPECT_TRUE(a.contains(a.base()));
  EXPECT_TRUE(a.contains(a.base() + a.size() - 1));
  EXPECT_FALSE(a.contains(a.base() + a.size()));

  const std::size_t align = 16 * gran_;
  vmm::ReservedRange b(driver(), 4 * gran_, align);
  EXPECT_EQ(b.base() % align, 0u);
  EXPECT_TRUE(b.base() + b.size() <= a.base() || a.base() + a.size() <= b.base())
      << "ranges overlap";

  EXPECT_EQ(a.reset(), Result::success);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.reset(), Result::success) << "reset of an empty range is a no-op";
}

TEST_P(DriverSuite, CreateMapAccessRoundTrip) {
  GVM_NEED_VMM();
  vmm::ReservedRange range(driver(), 4 * gran_, 0);
  vmm::PhysicalChunk chunk(driver(), 0, 2 * gran_);
  ASSERT_FALSE(chunk.empty());
  EXPECT_EQ(chunk.size(), 2 * gran_);
  EXPECT_EQ(chunk.device(), 0);

  const vmm::DevicePtr at = range.base() + gran_;
  vmm::Mapping map(driver(), at, chunk);
  EXPECT_EQ(map.addr(), at);
  EXPECT_EQ(map.size(), chunk.size());
  auto access = owner_rw(0);
  ASSERT_EQ(driver().mem_set_access(at, map.size(), access.data(), access.size()), Result::success);
  Access got = Access::none;
  ASSERT_EQ(driver().mem_get_access(at + 100, 0, &got), Result::success);
  EXPECT_EQ(got, Access::read_write);

  // Data written at both ends of the chunk reads back.
  auto data = pattern(4096, 1);
  ASSERT_EQ(driver().memcpy_htod(0, at, data.data(), data.size()), Result::success);
  ASSERT_EQ(driver().memcpy_htod(0, at + map.size() - data.size(), data.data(), data.size()),
            Result::success);
  std::vector<unsigned char> back(data.size());
  ASSERT_EQ(driver().memcpy_dtoh(0, back.data(), at + map.size() - data.size(), back.size()),
            Result::success);
  EXPECT_EQ(back, data);

  EXPECT_EQ(map.reset(), Result::success);
  EXPECT_EQ(chunk.reset(), Result::success);
  EXPECT_EQ(range.reset(), Result::success);
}

TEST_P(DriverSuite, MappingIsExclusiveAndUnmapFreesTheAddress) {
  GVM_NEED_VMM();
  vmm::ReservedRange range(driver(), 2 * gran_, 0);
  vmm::PhysicalChunk first(driver(), 0, gran_);
  vmm::PhysicalChunk second(driver(), 0, gran_);
  {
    vmm::Mapping m(driver(), range.base(), first);
    EXPECT_NE(driver().mem_map(range.base(), gran_, second.get()), Result::success)
        << "an address is mapped once";
  }  // ~Mapping unmaps
  vmm::Mapping again(driver(), range.base(), second);
  EXPECT_EQ(again.addr(), range.base());
}

TEST_P(DriverSuite, MappedChunkRoundTrip) {
  GVM_NEED_VMM();
  vmm::ReservedRange range(driver(), 2 * gran_, 0);
  vmm::MappedChunk mc(driver(), 0, range.base(), gran_, owner_rw(0));
  ASSERT_FALSE(mc.empty());
  EXPECT_EQ(mc.addr(), range.base());
  EXPECT_EQ(mc.size(), gran_);
  EXPECT_EQ(mc.device(), 0);
  EXPECT_NE(mc.handle(), 0u);

  vmm::StreamHandle s = nullptr;
  ASSERT_EQ(driver().stream_create(0, &s), Result::success);
  ASSERT_EQ(driver().memset_d8_async(0, mc.addr(), 0x5a, mc.size(), s), Result::success);
  ASSERT_EQ(driver().stream_synchronize(0, s), Result::success);
  std::vector<unsigned char> back(4096);
  ASSERT_EQ(driver().memcpy_dtoh(0, back.data(), mc.addr() + mc.size() - back.size(), back.size()),
            Result::success);
  EXPECT_EQ(back, std::vector<unsigned char>(back.size(), 0x5a));
  EXPECT_EQ(driver().stream_destroy(0, s), Result::success);

  EXPECT_EQ(mc.reset(), Result::success);
  EXPECT_TRUE(mc.empty());
  // The address is free again.
  vmm::MappedChunk next(driver(), 0, range.base(), gran_, owner_rw(0));
  EXPECT_FALSE(next.empty());
}

TEST_P(DriverSuite, OwnersMoveAndMovedFromIsEmpty) {
  GVM_NEED_VMM();
  vmm::ReservedRange r1(driver(), 4 * gran_, 0);
  const vmm::DevicePtr base = r1.base();
  vmm::ReservedRange r2(std::move(r1));
  EXPECT_TRUE(r1.empty());  // NOLINT(bugprone-use-after-move): moved-from is specified empty
  EXPECT_EQ(r2.base(), base);
  vmm::ReservedRange r3(driver(), 2 * gran_, 0);
  r3 = std::move(r2);       // frees r3's own range
  EXPECT_TRUE(r2.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(r3.base(), base);

  vmm::PhysicalChunk c1(driver(), 0, gran_);
  const vmm::PhysHandle h = c1.get();
  vmm::PhysicalChunk c2 = std::move(c1);
  EXPECT_TRUE(c1.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(c2.get(), h);

  vmm::Mapping m1(driver(), base, c2);
  vmm::Mapping m2 = std::move(m1);
  EXPECT_TRUE(m1.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(m2.addr(), base);
  EXPECT_EQ(m1.reset(), Result::success) << "resetting an empty owner does nothing";

  vmm::Event e1(driver(), 0);
  vmm::Event e2 = std::move(e1);
  EXPECT_TRUE(e1.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(e2.empty());

  vmm::MappedChunk mc1(driver(), 0, base + 2 * gran_, gran_, owner_rw(0));
  vmm::MappedChunk mc2 = std::move(mc1);
  EXPECT_TRUE(mc1.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(mc2.addr(), base + 2 * gran_);

  // release() hands the handle over: the owner forgets it.
  vmm::PhysicalChunk c3(driver(), 0, gran_);
  const vmm::PhysHandle raw = c3.release();
  EXPECT_TRUE(c3.empty());
  EXPECT_EQ(driver().mem_release(raw), Result::success);
}

TEST_P(DriverSuite, EventsAndStreams) {
  vmm::StreamHandle a = nullptr, b = nullptr;
  ASSERT_EQ(driver().stream_create(0, &a), Result::success);
  ASSERT_EQ(driver().stream_create(0, &b), Result::success);
  EXPECT_NE(a, b);
  vmm::Event never(driver(), 0);
  EXPECT_EQ(never.query(), Result::success) << "an event never recorded is complete";

  vmm::Event e(driver(), 0);
  ASSERT_EQ(e.record(a), Result::success);
  ASSERT_EQ(e.wait_on(b), Result::success);
  ASSERT_EQ(driver().stream_synchronize(0, b), Result::success);
  EXPECT_EQ(e.synchronize(), Result::success);
  EXPECT_EQ(e.query(), Result::success);
  // The legacy default stream.
  ASSERT_EQ(e.record(nullptr), Result::success);
  EXPECT_EQ(driver().stream_synchronize(0, nullptr), Result::success);
  EXPECT_EQ(driver().ctx_synchronize(0), Result::success);
  EXPECT_EQ(e.reset(), Result::success);
  EXPECT_EQ(driver().stream_destroy(0, a), Result::success);
  EXPECT_EQ(driver().stream_destroy(0, b), Result::success);
}

// cuda.h: a stream's id "is unique for the life of the program"; the legacy
// stream has one too.
TEST_P(DriverSuite, StreamIdsAreUniqueAndNeverReused) {
  vmm::StreamHandle a = nullptr, b = nullptr, c = nullptr;
  ASSERT_EQ(driver().stream_create(0, &a), Result::success);
  ASSERT_EQ(driver().stream_create(0, &b), Result::success);
  std::uint64_t ia = 0, ib = 0, il = 0, again = 0, ic = 0;
  ASSERT_EQ(driver().stream_get_id(0, a, &ia), Result::success);
  ASSERT_EQ(driver().stream_get_id(0, b, &ib), Result::success);
  ASSERT_EQ(driver().stream_get_id(0, nullptr, &il), Result::success);
  EXPECT_NE(ia, ib);
  EXPECT_NE(ia, il);
  EXPECT_NE(ib, il);
  ASSERT_EQ(driver().stream_get_id(0, a, &again), Result::success);
  EXPECT_EQ(again, ia) << "the same stream, the same id";
  ASSERT_EQ(driver().stream_destroy(0, a), Result::success);
  ASSERT_EQ(driver().stream_create(0, &c), Result::success);
  ASSERT_EQ(driver().stream_get_id(0, c, &ic), Result::success);
  EXPECT_NE(ic, ia) << "a new stream never gets an old id, whatever its handle";
  EXPECT_NE(ic, ib);
  EXPECT_EQ(driver().stream_get_id(0, c, nullptr), Result::invalid_value);
  EXPECT_EQ(driver().stream_destroy(0, b), Result::success);
  EXPECT_EQ(driver().stream_destroy(0, c), Result::success);
}

TEST_P(DriverSuite, CaptureStatusFollowsBeginAndEnd) {
  vmm::DevicePtr p = 0;
  ASSERT_EQ(driver().mem_alloc(0, 4096, &p), Result::success);
  vmm::StreamHandle s = nullptr;
  ASSERT_EQ(driver().stream_create(0, &s), Result::success);
  vmm::CaptureStatus st = vmm::CaptureStatus::invalidated;
  ASSERT_EQ(driver().stream_capture_status(0, s, &st, nullptr), Result::success);
  EXPECT_EQ(st, vmm::CaptureStatus::none);
  std::uint64_t ids[2] = {0, 0};
  for (std::uint64_t& id : ids) {
    ASSERT_EQ(driver().stream_begin_capture(0, s, vmm::CaptureMode::relaxed), Result::success);
    ASSERT_EQ(driver().stream_capture_status(0, s, &st, &id), Result::success);
    EXPECT_EQ(st, vmm::CaptureStatus::active);
    EXPECT_EQ(driver().memset_d8_async(0, p, 1, 4096, s), Result::success) << "captured";
    EXPECT_EQ(driver().stream_end_capture(0, s), Result::success);
    ASSERT_EQ(driver().stream_capture_status(0, s, &st, nullptr), Result::success);
    EXPECT_EQ(st, vmm::CaptureStatus::none);
  }
  EXPECT_NE(ids[0], ids[1]) << "each capture sequence has its own id";
  EXPECT_NE(driver().stream_begin_capture(0, nullptr, vmm::CaptureMode::relaxed), Result::success)
      << "the legacy stream cannot be captured";
  EXPECT_EQ(driver().stream_destroy(0, s), Result::success);
  EXPECT_EQ(driver().ctx_synchronize(0), Result::success);
  EXPECT_EQ(driver().mem_free(0, p), Result::success);
}

TEST_P(DriverSuite, ClassicAllocationRoundTrip) {
  vmm::DevicePtr p = 0;
  const std::size_t n = std::size_t{1} << 20;
  ASSERT_EQ(driver().mem_alloc(0, n, &p), Result::success);
  EXPECT_NE(p, 0u);
  auto data = pattern(n, 2);
  ASSERT_EQ(driver().memcpy_htod(0, p, data.data(), n), Result::success);
  std::vector<unsigned char> back(n);
  ASSERT_EQ(driver().memcpy_dtoh(0, back.data(), p, n), Result::success);
  EXPECT_EQ(back, data);
  EXPECT_EQ(driver().mem_free(0, p), Result::success);
}

TEST_P(DriverSuite, BadSizesAreRejected) {
  GVM_NEED_VMM();
  vmm::PhysHandle h = 0;
  EXPECT_NE(driver().mem_create(0, 0, vmm::ShareableHandleType::none, &h), Result::success);
  EXPECT_NE(driver().mem_create(0, gran_ + 1, vmm::ShareableHandleType::none, &h), Result::success);
  vmm::ReservedRange range(driver(), 4 * gran_, 0);
  vmm::PhysicalChunk chunk(driver(), 0, 2 * gran_);
  EXPECT_NE(driver().mem_map(range.base(), gran_, chunk.get()), Result::success)
      << "a mapping covers the whole handle";
  EXPECT_THROW(vmm::ReservedRange(driver(), 0, 0), vmm::DriverError);
}

TEST_P(DriverSuite, PeerHasNoAccessUntilGrantedAndRevokeNamesThePeer) {
  GVM_NEED_VMM();
  GVM_NEED_PEERS();
  vmm::ReservedRange range(driver(), 2 * gran_, 0);
  vmm::MappedChunk mc(driver(), 0, range.base(), gran_, owner_rw(0));
  Access a = Access::read_write;
  ASSERT_EQ(driver().mem_get_access(mc.addr(), 1, &a), Result::success);
  EXPECT_EQ(a, Access::none) << "a private mapping is private";

  const vmm::AccessDesc grant[] = {{0, Access::read_write}, {1, Access::read_write}};
  ASSERT_EQ(driver().mem_set_access(mc.addr(), mc.size(), grant, 2), Result::success);
  ASSERT_EQ(driver().mem_get_access(mc.addr(), 1, &a), Result::success);
  EXPECT_EQ(a, Access::read_write);

  // Setting the owner's access alone leaves the peer's grant in place.
  auto owner = owner_rw(0);
  ASSERT_EQ(driver().mem_set_access(mc.addr(), mc.size(), owner.data(), owner.size()),
            Result::success);
  ASSERT_EQ(driver().mem_get_access(mc.addr(), 1, &a), Result::success);
  EXPECT_EQ(a, Access::read_write) << "an owner-only set does not revoke a peer";

  const vmm::AccessDesc revoke[] = {{1, Access::none}};
  ASSERT_EQ(driver().mem_set_access(mc.addr(), mc.size(), revoke, 1), Result::success);
  ASSERT_EQ(driver().mem_get_access(mc.addr(), 1, &a), Result::success);
  EXPECT_EQ(a, Access::none);
  ASSERT_EQ(driver().mem_get_access(mc.addr(), 0, &a), Result::success);
  EXPECT_EQ(a, Access::read_write) << "revoking the peer leaves the owner";
}

TEST_P(DriverSuite, PeerCopiesThroughAGrant) {
  GVM_NEED_VMM();
  GVM_NEED_PEERS();
  vmm::ReservedRange range(driver(), 4 * gran_, 0);
  const vmm::AccessDesc both[] = {{0, Access::read_write}, {1, Access::read_write}};
  vmm::MappedChunk src(driver(), 0, range.base(), gran_, {both[0], both[1]});
  vmm::MappedChunk dst(driver(), 1, range.base() + 2 * gran_, gran_, owner_rw(1));
  auto data = pattern(8192, 3);
  ASSERT_EQ(driver().memcpy_htod(0, src.addr(), data.data(), data.size()), Result::success);
  vmm::StreamHandle s = nullptr;
  ASSERT_EQ(driver().stream_create(1, &s), Result::success);
  ASSERT_EQ(driver().memcpy_async(1, dst.addr(), src.addr(), data.size(), s), Result::success);
  ASSERT_EQ(driver().stream_synchronize(1, s), Result::success);
  std::vector<unsigned char> back(data.size());
  ASSERT_EQ(driver().memcpy_dtoh(1, back.data(), dst.addr(), back.size()), Result::success);
  EXPECT_EQ(back, data);
  EXPECT_EQ(driver().stream_destroy(1, s), Result::success);
}

TEST_P(DriverSuite, GlobalPeerAccessToggles) {
  GVM_NEED_PEERS();
  ASSERT_EQ(driver().enable_peer_access(1, 0), Result::success);
  EXPECT_EQ(driver().enable_peer_access(1, 0), Result::peer_access_already_enabled);
  ASSERT_EQ(driver().ctx_synchronize(0), Result::success);
  ASSERT_EQ(driver().ctx_synchronize(1), Result::success);
  EXPECT_EQ(driver().disable_peer_access(1, 0), Result::success);
  EXPECT_EQ(driver().disable_peer_access(1, 0), Result::peer_access_not_enabled);
}

}  // namespace gvm::test
