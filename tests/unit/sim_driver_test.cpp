// SimDriver bookkeeping: profiles, reservations, handles, mappings, access,
// budget, classic allocation, shareable handles, backing store, streams and
// events, counters, threads.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gvm/vmm/device_caps.hpp"
#include "sim_fixture.hpp"

namespace gvm::test {
namespace {

// --- profiles ------------------------------------------------------------------

TEST(SimProfiles, NamesRoundTripAndUnknownNamesAreNamed) {
  for (Profile p : vmm::kAllProfiles) {
    EXPECT_EQ(vmm::parse_profile(vmm::profile_name(p)), p) << vmm::profile_name(p);
  }
  try {
    vmm::parse_profile("h300");
    FAIL() << "parse_profile accepted h300";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'h300'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("h200"), std::string::npos)
        << "lists the known names: " << e.what();
  }
  EXPECT_THROW(vmm::parse_profile(""), std::invalid_argument);
  EXPECT_THROW(vmm::parse_profile("H200"), std::invalid_argument) << "names are exact";
}

TEST(SimProfiles, DriverReportsItsProfile) {
  for (Profile p : vmm::kAllProfiles) {
    SCOPED_TRACE(vmm::profile_name(p));
    const vmm::DeviceProfile want = vmm::profile(p);
    auto sim = SimDriver::uniform(p, 3);
    std::vector<vmm::DeviceCaps> caps = vmm::read_all_device_caps(*sim);
    ASSERT_EQ(caps.size(), 3u);
    for (const vmm::DeviceCaps& c : caps) {
      EXPECT_EQ(c.name, want.name);
      EXPECT_EQ(c.cc_major, want.cc_major);
      EXPECT_EQ(c.cc_minor, want.cc_minor);
      EXPECT_EQ(c.total_memory, want.memory_bytes);
      EXPECT_EQ(c.vmm, want.vmm);
      EXPECT_EQ(c.posix_fd_handles, want.posix_fd_handles);
      EXPECT_EQ(c.fabric_handles, want.fabric_handles);
      EXPECT_EQ(c.compression, want.compression);
      EXPECT_EQ(c.granularity, want.granularity);
      EXPECT_EQ(c.recommended_granularity, want.recommended_granularity);
      for (int q = 0; q < 3; ++q)
        EXPECT_EQ(c.can_access_peer[static_cast<std::size_t>(q)], q != c.device);
    }
    int sms = 0;
    ASSERT_EQ(sim->device_attribute(0, vmm::DeviceAttribute::multiprocessor_count, &sms),
              Result::success);
    EXPECT_EQ(sms, want.multiprocessor_count);
    // The profiles (vmm/src/sim_profiles.cpp): compression from Ampere on; fabric
    // handles from Hopper on.
    EXPECT_EQ(want.compression, want.cc_major >= 8);
    EXPECT_EQ(want.fabric_handles, want.cc_major >= 9);
  }
}

TEST(SimProfiles, BadProfilesAreRejected) {
  vmm::DeviceProfile d = vmm::profile(Profile::t4);
  d.memory_bytes = 0;
  EXPECT_THROW(SimDriver({d}), std::invalid_argument);
  d = vmm::profile(Profile::t4);
  d.granularity = 3 << 20;
  EXPECT_THROW(SimDriver({d}), std::invalid_argument);
  EXPECT_THROW(SimDriver::uniform(Profile::t4, -1), std::invalid_argument);
  auto none = SimDriver::uniform(Profile::t4, 0);
  int n = -1;
  EXPECT_EQ(none->device_count(&n), Result::success);
  EXPECT_EQ(n, 0);
  EXPECT_THROW(vmm::read_all_device_caps(*none), vmm::DriverError);
}

TEST(SimProfiles, PeerMatrixIsConfigurable) {
  auto sim = SimDriver::uniform(Profile::a100, 3);
  sim->set_peer(0, 2, false);
  bool can = true;
  ASSERT_EQ(sim->can_access_peer(0, 2, &can), Result::success);
  EXPECT_FALSE(can);
  ASSERT_EQ(sim->can_access_peer(2, 0, &can), Result::success);
  EXPECT_TRUE(can) << "the matrix is per ordered pair";
  EXPECT_EQ(sim->enable_peer_access(0, 2), Result::invalid_device);
  EXPECT_EQ(sim->enable_peer_access(0, 0), Result::invalid_device);
  EXPECT_THROW(sim->set_peer(0, 0, true), std::invalid_argument);
  EXPECT_THROW(sim->set_peer(0, 3, true), std::invalid_argument);
}

// --- reservations ----------------------------------------------------------------

using SimReserve = SimTest;

TEST_F(SimReserve, SizesAndAlignmentsMustBeGranules) {
  DevicePtr p = 0;
  EXPECT_EQ(sim().address_reserve(0, 0, &p), Result::invalid_value);
  EXPECT_EQ(sim().address_reserve(g_ + 4096, 0, &p), Result::invalid_value);
  EXPECT_EQ(sim().address_reserve(g_, g_ / 2, &p), Result::invalid_value);
  EXPECT_EQ(sim().address_reserve(g_, 0, nullptr), Result::invalid_value);
  EXPECT_EQ(sim().live_reservations(), 0u);
  ASSERT_EQ(sim().address_reserve(g_, 64 * g_, &p), Result::success);
  EXPECT_EQ(p % (64 * g_), 0u);
}

TEST_F(SimReserve, RangesNeverOverlapAndAreNotReusedAtOnce) {
  std::vector<std::pair<DevicePtr, std::size_t>> got;
  for (std::size_t i = 1; i <= 16; ++i) got.push_back({reserve(i * g_), i * g_});
  for (std::size_t i = 0; i < got.size(); ++i) {
    for (std::size_t j = i + 1; j < got.size(); ++j) {
      bool apart = got[i].first + got[i].second <= got[j].first ||
                   got[j].first + got[j].second <= got[i].first;
      EXPECT_TRUE(apart) << i << " and " << j << " overlap";
    }
  }
  ASSERT_EQ(sim().address_free(got[0].first, got[0].second), Result::success);
  DevicePtr next = reserve(got[0].second);
  EXPECT_NE(next, got[0].first) << "a freed range is not handed out again at once";
}

TEST_F(SimReserve, AddressSpaceRunsOutAndComesBack) {
  DevicePtr p = 0;
  EXPECT_EQ(sim().address_reserve(std::size_t{1} << 62, 0, &p), Result::out_of_memory);
  // Half the space twice, then a third time only after freeing.
  const std::size_t half = std::size_t{1} << 49;
  DevicePtr a = reserve(half);
  DevicePtr b = reserve(half);
  EXPECT_EQ(sim().address_reserve(half, 0, &p), Result::out_of_memory);
  ASSERT_EQ(sim().address_free(a, half), Result::success);
  EXPECT_EQ(sim().address_reserve(half, 0, &p), Result::success)
      << "the cursor wraps to freed space";
  EXPECT_EQ(p, a);
  (void)b;
}

TEST_F(SimReserve, FreeNeedsTheExactRangeAndNoMappings) {
  DevicePtr r = reserve(4 * g_);
  EXPECT_EQ(sim().address_free(r, 2 * g_), Result::invalid_value);
  EXPECT_EQ(sim().address_free(r + g_, 3 * g_), Result::invalid_value);
  PhysHandle h = map(r + g_, 0, g_, {});
  EXPECT_EQ(sim().address_free(r, 4 * g_), Result::invalid_value) << "unmap first";
  EXPECT_EQ(sim().live_reservations(), 1u);
  ASSERT_EQ(sim().mem_unmap(r + g_, g_), Result::success);
  ASSERT_EQ(sim().mem_release(h), Result::success);
  EXPECT_EQ(sim().address_free(r, 4 * g_), Result::success);
  EXPECT_EQ(sim().address_free(r, 4 * g_), Result::invalid_value) << "double free";
  EXPECT_EQ(sim().live_reservations(), 0u);
}

// --- handles and mappings ------------------------------------------------------------

using SimMemory = SimTest;

TEST_F(SimMemory, CreateChecksDeviceSizeAndHandleType) {
  PhysHandle h = 0;
  EXPECT_EQ(sim().mem_create(2, g_, vmm::ShareableHandleType::none, &h), Result::invalid_device);
  EXPECT_EQ(sim().mem_create(0, g_ + 1, vmm::ShareableHandleType::none, &h), Result::invalid_value);
  EXPECT_EQ(sim().mem_create(0, 0, vmm::ShareableHandleType::none, &h), Result::invalid_value);
  EXPECT_EQ(sim().mem_create(0, g_, static_cast<vmm::ShareableHandleType>(5), &h),
            Result::invalid_value);
  EXPECT_EQ(sim().live_handles(), 0u);
  EXPECT_EQ(sim().physical_used(0), 0u);
  auto p40 = SimDriver::uniform(Profile::p40, 1);
  EXPECT_EQ(p40->mem_create(0, g_, vmm::ShareableHandleType::fabric, &h), Result::not_supported);
}

TEST_F(SimMemory, MapStaysInsideOneReservationAndOffMappings) {
  DevicePtr r1 = reserve(4 * g_);
  DevicePtr r2 = reserve(4 * g_);
  PhysHandle h = create(0, 2 * g_);
  EXPECT_EQ(sim().mem_map(r1 + 3 * g_, 2 * g_, h), Result::invalid_value) << "runs off the end";
  EXPECT_EQ(sim().mem_map(r1 + 4096, 2 * g_, h), Result::invalid_value) << "unaligned";
  EXPECT_EQ(sim().mem_map(r1, g_, h), Result::invalid_value) << "part of a handle";
  EXPECT_EQ(sim().mem_map(r1 - 2 * g_, 2 * g_, h), Result::invalid_value) << "not reserved";
  EXPECT_EQ(sim().mem_map(r1, 2 * g_, h + 1000), Result::invalid_value) << "no such handle";
  ASSERT_EQ(sim().mem_map(r1, 2 * g_, h), Result::success);
  PhysHandle h2 = create(0, 2 * g_);
  EXPECT_EQ(sim().mem_map(r1 + g_, 2 * g_, h2), Result::invalid_value) << "overlaps";
  EXPECT_EQ(sim().mem_map(r2, 2 * g_, h2), Result::success);
  EXPECT_EQ(sim().mem_map(r1 + 2 * g_, 2 * g_, h), Result::success)
      << "a handle may be mapped twice";
  EXPECT_EQ(sim().live_mappings(), 3u);
}

TEST_F(SimMemory, UnmapCoversWholeMappings) {
  DevicePtr r = reserve(4 * g_);
  PhysHandle a = map(r, 0, g_, {});
  PhysHandle b = map(r + g_, 0, 2 * g_, {});
  EXPECT_EQ(sim().mem_unmap(r + g_, g_), Result::invalid_value) << "half a mapping";
  EXPECT_EQ(sim().mem_unmap(r, 4 * g_), Result::invalid_value) << "runs past the mappings";
  EXPECT_EQ(sim().mem_unmap(r + 3 * g_, g_), Result::invalid_value) << "nothing mapped there";
  EXPECT_EQ(sim().live_mappings(), 2u);
  ASSERT_EQ(sim().mem_unmap(r, 3 * g_), Result::success) << "two adjacent mappings at once";
  EXPECT_EQ(sim().live_mappings(), 0u);
  EXPECT_EQ(sim().mem_release(a), Result::success);
  EXPECT_EQ(sim().mem_release(b), Result::success);
  EXPECT_EQ(sim().mem_release(b), Result::invalid_value) << "double release";
  EXPECT_EQ(sim().live_handles(), 0u);
}

TEST_F(SimMemory, ReleaseOfAMappedHandleIsDeferredUntilUnmap) {
  DevicePtr r = reserve(2 * g_);
  PhysHandle h = map(r, 0, 2 * g_, {{0, Access::read_write}});
  ASSERT_EQ(sim().mem_release(h), Result::success);
  EXPECT_EQ(sim().live_handles(), 1u);
  EXPECT_EQ(sim().physical_used(0), 2 * g_);
  EXPECT_EQ(sim().mem_map(r, 2 * g_, h), Result::invalid_value)
      << "a released handle cannot be mapped again";
  ASSERT_EQ(sim().mem_unmap(r, 2 * g_), Result::success);
  EXPECT_EQ(sim().live_handles(), 0u);
  EXPECT_EQ(sim().physical_used(0), 0u);
}

TEST_F(SimMemory, SetAccessValidatesEverythingFirst) {
  DevicePtr r = reserve(4 * g_);
  map(r, 0, 2 * g_, {});
  Access a = Access::read_write;
  ASSERT_EQ(sim().mem_get_access(r, 0, &a), Result::success);
  EXPECT_EQ(a, Access::none) << "mapped is not accessible, even for the owner";
  EXPECT_EQ(set_access(r, g_, {{0, Access::read_write}}), Result::invalid_value)
      << "part of a mapping";
  EXPECT_EQ(set_access(r, 3 * g_, {{0, Access::read_write}}), Result::invalid_value)
      << "past the mapping";
  EXPECT_EQ(set_access(r, 2 * g_, {}), Result::invalid_value);
  EXPECT_EQ(set_access(r, 2 * g_, {{0, Access::read_write}, {2, Access::read_write}}),
            Result::invalid_device);
  EXPECT_EQ(set_access(r, 2 * g_, {{0, Access::read_write}, {1, static_cast<Access>(2)}}),
            Result::invalid_value);
  sim().set_peer(1, 0, false);
  EXPECT_EQ(set_access(r, 2 * g_, {{0, Access::read_write}, {1, Access::read}}),
            Result::invalid_device)
      << "device 1 cannot reach device 0";
  // None of the failed calls changed anything.
  ASSERT_EQ(sim().mem_get_access(r, 0, &a), Result::success);
  EXPECT_EQ(a, Access::none);
  EXPECT_EQ(sim().mem_get_access(r + 2 * g_, 0, &a), Result::invalid_value) << "not mapped";
  EXPECT_EQ(sim().mem_get_access(r, 2, &a), Result::invalid_device);
}

TEST_F(SimMemory, BudgetGivesOutOfMemoryAndMemGetInfoFollowsIt) {
  sim().set_physical_budget(0, 3 * g_);
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(sim().mem_get_info(0, &free_bytes, &total), Result::success);
  EXPECT_EQ(free_bytes, 3 * g_);
  EXPECT_EQ(total, sim().device_profile(0).memory_bytes);
  PhysHandle a = create(0, 2 * g_);
  PhysHandle h = 0;
  EXPECT_EQ(sim().mem_create(0, 2 * g_, vmm::ShareableHandleType::none, &h), Result::out_of_memory);
  EXPECT_EQ(sim().live_handles(), 1u);
  DevicePtr p = 0;
  EXPECT_EQ(sim().mem_alloc(0, 2 * g_, &p), Result::out_of_memory)
      << "classic memory shares the budget";
  ASSERT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  ASSERT_EQ(sim().mem_get_info(0, &free_bytes, &total), Result::success);
  EXPECT_EQ(free_bytes, 3 * g_ - sim().physical_used(0));
  EXPECT_EQ(sim().mem_create(1, 2 * g_, vmm::ShareableHandleType::none, &h), Result::success)
      << "budgets are per device";
  ASSERT_EQ(sim().mem_release(a), Result::success);
  EXPECT_EQ(sim().mem_create(0, 2 * g_, vmm::ShareableHandleType::none, &h), Result::success);
  // Lowering the budget below what is used evicts nothing and reports no free memory.
  sim().set_physical_budget(0, g_);
  ASSERT_EQ(sim().mem_get_info(0, &free_bytes, &total), Result::success);
  EXPECT_EQ(free_bytes, 0u);
  EXPECT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::none, &h), Result::out_of_memory);
}

TEST_F(SimMemory, ClassicAllocationsAreValidatedAndCounted) {
  DevicePtr a = 0, b = 0;
  EXPECT_EQ(sim().mem_alloc(0, 0, &a), Result::invalid_value);
  EXPECT_EQ(sim().mem_alloc(5, 4096, &a), Result::invalid_device);
  ASSERT_EQ(sim().mem_alloc(0, 1000, &a), Result::success);
  ASSERT_EQ(sim().mem_alloc(1, 3 * g_, &b), Result::success);
  EXPECT_EQ(sim().live_classic_allocations(), 2u);
  EXPECT_GE(sim().physical_used(0), 1000u);
  EXPECT_EQ(sim().mem_free(1, a), Result::invalid_value) << "wrong device";
  EXPECT_EQ(sim().mem_free(0, a + 8), Result::invalid_value) << "interior pointer";
  ASSERT_EQ(sim().mem_free(0, a), Result::success);
  EXPECT_EQ(sim().mem_free(0, a), Result::invalid_value) << "double free";
  ASSERT_EQ(sim().mem_free(1, b), Result::success);
  EXPECT_EQ(sim().live_classic_allocations(), 0u);
  EXPECT_EQ(sim().physical_used(0), 0u);
  EXPECT_EQ(sim().physical_used(1), 0u);
}

// --- shareable handles ---------------------------------------------------------------

TEST_F(SimMemory, PosixFdExportImportsTheSameHandle) {
  PhysHandle h = 0;
  ASSERT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::posix_fd, &h), Result::success);
  int fd = -1;
  ASSERT_EQ(sim().export_shareable_handle(h, vmm::ShareableHandleType::posix_fd, &fd),
            Result::success);
  PhysHandle back = 0;
  void* shareable = reinterpret_cast<void*>(static_cast<std::intptr_t>(fd));
  ASSERT_EQ(sim().import_shareable_handle(shareable, vmm::ShareableHandleType::posix_fd, &back),
            Result::success);
  EXPECT_EQ(back, h);
  // Two references now: both must be released.
  ASSERT_EQ(sim().mem_release(h), Result::success);
  EXPECT_EQ(sim().live_handles(), 1u);
  ASSERT_EQ(sim().mem_release(back), Result::success);
  EXPECT_EQ(sim().live_handles(), 0u);
  EXPECT_EQ(sim().import_shareable_handle(shareable, vmm::ShareableHandleType::posix_fd, &back),
            Result::invalid_value)
      << "the allocation is gone";
}

TEST_F(SimMemory, ExportNeedsAnExportableHandleOfThatType) {
  PhysHandle plain = create(0, g_);
  int fd = -1;
  EXPECT_EQ(sim().export_shareable_handle(plain, vmm::ShareableHandleType::posix_fd, &fd),
            Result::invalid_value);
  EXPECT_EQ(sim().export_shareable_handle(plain, vmm::ShareableHandleType::none, &fd),
            Result::invalid_value);
  EXPECT_EQ(sim().export_shareable_handle(plain + 99, vmm::ShareableHandleType::posix_fd, &fd),
            Result::invalid_value);
  PhysHandle back = 0;
  EXPECT_EQ(sim().import_shareable_handle(reinterpret_cast<void*>(std::intptr_t{12345}),
                                          vmm::ShareableHandleType::posix_fd, &back),
            Result::invalid_value);

  PhysHandle fab = 0;
  ASSERT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::fabric, &fab), Result::success);
  unsigned char fabric[64] = {};
  ASSERT_EQ(sim().export_shareable_handle(fab, vmm::ShareableHandleType::fabric, fabric),
            Result::success);
  ASSERT_EQ(sim().import_shareable_handle(fabric, vmm::ShareableHandleType::fabric, &back),
            Result::success);
  EXPECT_EQ(back, fab);
  unsigned char garbage[64] = {1, 2, 3};
  EXPECT_EQ(sim().import_shareable_handle(garbage, vmm::ShareableHandleType::fabric, &back),
            Result::invalid_value);

  auto l4 = SimDriver::uniform(Profile::l4, 1);
  EXPECT_EQ(l4->export_shareable_handle(1, vmm::ShareableHandleType::fabric, fabric),
            Result::invalid_value)
      << "no such handle";
  PhysHandle h = 0;
  EXPECT_EQ(l4->mem_create(0, g_, vmm::ShareableHandleType::fabric, &h), Result::not_supported);
}

// --- backing store ------------------------------------------------------------------

TEST_F(SimMemory, BackingHoldsDataAcrossMappingsAndReadsZerosWhereUnwritten) {
  sim().enable_backing(true);
  DevicePtr r = reserve(4 * g_);
  const std::vector<vmm::AccessDesc> rw0 = {{0, Access::read_write}};
  map(r, 0, g_, rw0);
  map(r + g_, 0, g_, rw0);
  // A write straddling the two mappings.
  std::vector<unsigned char> data(300000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7);
  const DevicePtr at = r + g_ - 100000;
  ASSERT_EQ(sim().memcpy_htod(0, at, data.data(), data.size()), Result::success);
  std::vector<unsigned char> back(data.size());
  ASSERT_EQ(sim().memcpy_dtoh(0, back.data(), at, back.size()), Result::success);
  EXPECT_EQ(back, data);
  std::vector<unsigned char> zeros(4096, 0xff);
  ASSERT_EQ(sim().memcpy_dtoh(0, zeros.data(), r + 1000, zeros.size()), Result::success);
  EXPECT_EQ(zeros, std::vector<unsigned char>(4096, 0));

  // Device-to-device copy and memset on a stream.
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().memcpy_async(0, r, at, 5000, s), Result::success);
  ASSERT_EQ(sim().memset_d8_async(0, r + 10, 0xab, 3, s), Result::success);
  ASSERT_EQ(sim().stream_synchronize(0, s), Result::success);
  std::vector<unsigned char> first(5000);
  ASSERT_EQ(sim().memcpy_dtoh(0, first.data(), r, first.size()), Result::success);
  std::vector<unsigned char> want(data.begin(), data.begin() + 5000);
  want[10] = want[11] = want[12] = 0xab;
  EXPECT_EQ(first, want);

  // Out of range: validated up front, no dead context.
  EXPECT_EQ(sim().memcpy_htod(0, r + 2 * g_, data.data(), 16), Result::invalid_value);
  EXPECT_EQ(sim().memcpy_dtoh(0, back.data(), r + 2 * g_ - 8, 16), Result::invalid_value);
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

TEST_F(SimMemory, WithoutBackingCopiesValidateOnlyAndReadZeros) {
  DevicePtr r = reserve(2 * g_);
  map(r, 0, g_, {{0, Access::read_write}});
  std::vector<unsigned char> data(64, 0x11);
  ASSERT_EQ(sim().memcpy_htod(0, r, data.data(), data.size()), Result::success);
  std::vector<unsigned char> back(64, 0x22);
  ASSERT_EQ(sim().memcpy_dtoh(0, back.data(), r, back.size()), Result::success);
  EXPECT_EQ(back, std::vector<unsigned char>(64, 0));
}

TEST_F(SimMemory, PeerCopyWithoutPeerAccessIsStagedAndCopies) {
  sim().enable_backing(true);
  DevicePtr a = 0, b = 0;
  ASSERT_EQ(sim().mem_alloc(0, 4096, &a), Result::success);
  ASSERT_EQ(sim().mem_alloc(1, 4096, &b), Result::success);
  std::vector<unsigned char> data(4096, 0x3c);
  ASSERT_EQ(sim().memcpy_htod(0, a, data.data(), data.size()), Result::success);
  ASSERT_EQ(sim().memcpy_peer_async(b, 1, a, 0, data.size(), nullptr), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(1), Result::success);
  std::vector<unsigned char> back(4096);
  ASSERT_EQ(sim().memcpy_dtoh(1, back.data(), b, back.size()), Result::success);
  EXPECT_EQ(back, data);
  EXPECT_EQ(sim().memcpy_peer_async(b, 1, a, 0, 16, nullptr), Result::success);
  EXPECT_EQ(sim().memcpy_peer_async(b, 2, a, 0, 16, nullptr), Result::invalid_device);
}

// --- streams, events, counters ----------------------------------------------------

using SimStreams = SimTest;

TEST_F(SimStreams, HandlesAreValidated) {
  vmm::StreamHandle s = stream(0);
  vmm::EventHandle e0 = event(0);
  vmm::EventHandle e1 = event(1);
  EXPECT_EQ(sim().live_streams(), 1u);
  EXPECT_EQ(sim().live_events(), 2u);
  EXPECT_EQ(sim().stream_destroy(0, nullptr), Result::invalid_handle)
      << "the legacy stream is not ours";
  EXPECT_EQ(sim().event_record(1, e1, s), Result::invalid_handle)
      << "stream of device 0, event of device 1";
  EXPECT_EQ(sim().event_record(0, e0, s), Result::success);
  EXPECT_EQ(sim().stream_wait_event(1, nullptr, e0), Result::success) << "a wait may cross devices";
  EXPECT_EQ(sim().enqueue_access(1, s, 0, 16, AccessKind::read), Result::invalid_handle)
      << "work goes on a stream of its own device";
  EXPECT_EQ(sim().stream_create(2, &s), Result::invalid_device);
  EXPECT_EQ(sim().stream_synchronize(0, reinterpret_cast<vmm::StreamHandle>(0x1234)),
            Result::invalid_handle)
      << "a handle never handed out";
  ASSERT_EQ(sim().stream_destroy(0, s), Result::success);
  // A destroyed handle used again is undefined in the real driver: the
  // simulator kills the context (SimStreamHandles in sim_faithful_test.cpp).
  ASSERT_EQ(sim().event_destroy(e0), Result::success);
  EXPECT_EQ(sim().event_destroy(e0), Result::invalid_handle);
  EXPECT_EQ(sim().event_query(e0), Result::invalid_handle);
  ASSERT_EQ(sim().event_destroy(e1), Result::success);
  EXPECT_EQ(sim().live_streams(), 0u);
  EXPECT_EQ(sim().live_events(), 0u);
}

TEST_F(SimStreams, CallCountsIncludeFailedCalls) {
  EXPECT_EQ(sim().call_count(Call::mem_create), 0u);
  PhysHandle h = 0;
  sim().mem_create(0, g_, vmm::ShareableHandleType::none, &h);
  sim().mem_create(0, 1, vmm::ShareableHandleType::none, &h);
  EXPECT_EQ(sim().call_count(Call::mem_create), 2u);
  EXPECT_EQ(sim().call_count(Call::mem_map), 0u);
  EXPECT_THROW(sim().call_count(Call::count_), std::invalid_argument);
}

TEST_F(SimStreams, ModulesAreNotSimulated) {
  vmm::ModuleHandle m = nullptr;
  EXPECT_EQ(sim().module_load_data(0, ".version 6.0", &m), Result::not_supported);
  EXPECT_EQ(sim().launch_kernel(0, nullptr, 1, 1, nullptr, nullptr), Result::not_supported);
}

TEST(SimNoVmm, VmmCallsAreNotSupportedAndCapsSayWhy) {
  vmm::DeviceProfile d = vmm::profile(Profile::p40);
  d.vmm = false;
  SimDriver sim({d});
  DevicePtr p = 0;
  EXPECT_EQ(sim.address_reserve(d.granularity, 0, &p), Result::not_supported);
  PhysHandle h = 0;
  EXPECT_EQ(sim.mem_create(0, d.granularity, vmm::ShareableHandleType::none, &h),
            Result::not_supported);
  std::size_t g = 0;
  EXPECT_EQ(sim.allocation_granularity(0, vmm::GranularityKind::minimum, &g),
            Result::not_supported);
  vmm::DeviceCaps caps = vmm::read_device_caps(sim, 0);
  EXPECT_FALSE(caps.vmm);
  EXPECT_EQ(caps.granularity, 0u);
  EXPECT_EQ(sim.mem_alloc(0, 4096, &p), Result::success) << "the classic path still works";
}

TEST(SimThreads, ConcurrentUseKeepsTheBooksStraight) {
  auto sim = SimDriver::uniform(Profile::h100, 2);
  const std::size_t g = vmm::profile(Profile::h100).granularity;
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int dev = t % 2;
      for (int i = 0; i < kRounds; ++i) {
        DevicePtr r = 0;
        PhysHandle h = 0;
        vmm::EventHandle e = nullptr;
        vmm::AccessDesc rw{dev, Access::read_write};
        bool ok = sim->address_reserve(2 * g, 0, &r) == Result::success &&
                  sim->mem_create(dev, g, vmm::ShareableHandleType::none, &h) == Result::success &&
                  sim->mem_map(r, g, h) == Result::success &&
                  sim->mem_set_access(r, g, &rw, 1) == Result::success &&
                  sim->enqueue_access(dev, nullptr, r, g, AccessKind::write) == Result::success &&
                  sim->event_create(dev, &e) == Result::success &&
                  sim->event_record(dev, e, nullptr) == Result::success &&
                  sim->event_synchronize(e) == Result::success &&
                  sim->event_destroy(e) == Result::success &&
                  sim->mem_unmap(r, g) == Result::success &&
                  sim->mem_release(h) == Result::success &&
                  sim->address_free(r, 2 * g) == Result::success;
        if (!ok) ++failures[static_cast<std::size_t>(t)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(failures[static_cast<std::size_t>(t)], 0) << "thread " << t;
  EXPECT_EQ(sim->live_reservations(), 0u);
  EXPECT_EQ(sim->live_handles(), 0u);
  EXPECT_EQ(sim->live_mappings(), 0u);
  EXPECT_EQ(sim->live_events(), 0u);
  EXPECT_EQ(sim->pending_accesses(), 0u);
  EXPECT_EQ(sim->race_count(), 0u) << "each thread touches its own range";
  EXPECT_EQ(sim->call_count(Call::mem_map), static_cast<std::uint64_t>(kThreads * kRounds));
}

}  // namespace
}  // namespace gvm::test
