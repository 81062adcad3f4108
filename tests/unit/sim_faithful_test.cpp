// The simulated driver refuses what the real one refuses and decides nothing
// the real one would decide otherwise (issue 14, "The simulated driver"):
//   (a) a direct copy of VMM memory the stream's device was not granted fails
//   (b) cuMemcpyPeerAsync runs on a stream of dst_device (nullptr: its legacy one)
//   (c) stream handles are recycled; a destroyed one used again is fatal and reported
//   (d) cuMemFree of memory with queued work is a hazard, not a synchronization
//   (e) pre-Ampere per-range peer access behaves like the global toggle
// Each failed on the simulator as it was before. Capture is in sim_capture_test.cpp.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "sim_fixture.hpp"

namespace gvm::test {
namespace {

class SimFaithful : public SimTest {
 protected:
  explicit SimFaithful(Profile p = Profile::h200) : SimTest(p, 2) {}
  std::string first_race() const { return sim_->races().empty() ? "" : sim_->races()[0]; }
  // A chunk of `owner` at the start of a fresh reservation, with `access`.
  DevicePtr chunk(int owner, std::vector<vmm::AccessDesc> access) {
    DevicePtr r = reserve(g_);
    map(r, owner, g_, std::move(access));
    return r;
  }
  std::uint64_t id_of(int device, vmm::StreamHandle s) {
    std::uint64_t id = 0;
    EXPECT_EQ(sim().stream_get_id(device, s, &id), Result::success);
    return id;
  }
};

// --- (a) direct copies need a grant ------------------------------------------------

TEST_F(SimFaithful, DirectCopyOfVmmMemoryNeverGrantedToTheStreamsDeviceFails) {
  const DevicePtr src = chunk(0, {{0, Access::read_write}});
  const DevicePtr dst = chunk(1, {{1, Access::read_write}});
  vmm::StreamHandle s1 = stream(1);
  EXPECT_EQ(sim().memcpy_async(1, dst, src, 4096, s1), Result::invalid_value)
      << "device 1 was never granted the source: the driver refuses, it does not stage";
  EXPECT_EQ(sim().sticky_error(), Result::success) << "a refused call, not a dead context";
  EXPECT_EQ(sim().pending_accesses(), 0u) << "nothing was enqueued";
  EXPECT_EQ(sim().memcpy_async(0, dst, src, 4096, stream(0)), Result::invalid_value)
      << "nor the destination to device 0";

  ASSERT_EQ(set_access(src, g_, {{1, Access::read}}), Result::success);
  EXPECT_EQ(sim().memcpy_async(1, dst, src, 4096, s1), Result::success) << "granted: direct";
}

TEST_F(SimFaithful, DirectCopyOfARevokedRangeFailsButAPeerCopyIsStaged) {
  sim().enable_backing(true);
  const DevicePtr src = chunk(0, {{0, Access::read_write}, {1, Access::read_write}});
  const DevicePtr dst = chunk(1, {{1, Access::read_write}});
  ASSERT_EQ(set_access(src, g_, {{1, Access::none}}), Result::success);
  vmm::StreamHandle s1 = stream(1);
  EXPECT_EQ(sim().memcpy_async(1, dst, src, 4096, s1), Result::invalid_value);
  EXPECT_EQ(sim().memcpy_peer_async(dst, 1, src, 0, 4096, s1), Result::success)
      << "cuMemcpyPeerAsync stages through the owner";
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

TEST_F(SimFaithful, DirectCopyOfMappedMemoryWithoutTheOwnersOwnAccessFails) {
  DevicePtr r = reserve(2 * g_);
  map(r, 0, g_, {});  // mapped, no access set for anyone
  map(r + g_, 0, g_, {{0, Access::read_write}});
  EXPECT_EQ(sim().memcpy_async(0, r + g_, r, 4096, stream(0)), Result::invalid_value);
}

TEST_F(SimFaithful, DirectCopyOfClassicPeerMemoryIsStillStaged) {
  DevicePtr a = 0, b = 0;
  ASSERT_EQ(sim().mem_alloc(0, 4096, &a), Result::success);
  ASSERT_EQ(sim().mem_alloc(1, 4096, &b), Result::success);
  EXPECT_EQ(sim().memcpy_async(1, b, a, 4096, stream(1)), Result::success)
      << "cudaMalloc memory of a peer is reached through the driver's staging";
}

// --- (b) the stream of cuMemcpyPeerAsync -------------------------------------------

TEST_F(SimFaithful, PeerCopyOnTheNullStreamRunsOnTheDestinationsLegacyStream) {
  const DevicePtr src = chunk(0, {{0, Access::read_write}});
  const DevicePtr dst = chunk(1, {{1, Access::read_write}});
  // A kernel on device 1's legacy stream writes dst; the copy into dst on
  // the null stream is ordered after it only on device 1's legacy stream.
  ASSERT_EQ(sim().enqueue_access(1, nullptr, dst, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().memcpy_peer_async(dst, 1, src, 0, 4096, nullptr), Result::success);
  EXPECT_EQ(sim().race_count(), 0u) << first_race();
  ASSERT_EQ(sim().ctx_synchronize(0), Result::success);
  EXPECT_GT(sim().pending_accesses(), 0u) << "the source device's sync does not cover it";
  ASSERT_EQ(sim().ctx_synchronize(1), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 0u);
}

TEST_F(SimFaithful, PeerCopyOnAStreamOfTheSourceDeviceIsRefused) {
  const DevicePtr src = chunk(0, {{0, Access::read_write}});
  const DevicePtr dst = chunk(1, {{1, Access::read_write}});
  EXPECT_EQ(sim().memcpy_peer_async(dst, 1, src, 0, 4096, stream(0)), Result::invalid_handle)
      << "the Driver contract: a stream of dst_device";
  EXPECT_EQ(sim().pending_accesses(), 0u);
  EXPECT_EQ(sim().memcpy_peer_async(dst, 1, src, 0, 4096, stream(1)), Result::success);
}

// --- (c) stream handles ---------------------------------------------------------------

TEST_F(SimFaithful, ADestroyedHandleComesBackFromTheNextCreateLastInFirstOut) {
  vmm::StreamHandle a = stream(0), b = stream(0);
  const std::uint64_t ida = id_of(0, a), idb = id_of(0, b);
  ASSERT_EQ(sim().stream_destroy(0, a), Result::success);
  ASSERT_EQ(sim().stream_destroy(0, b), Result::success);
  vmm::StreamHandle c = stream(0), d = stream(1);
  EXPECT_EQ(c, b) << "the last destroyed comes back first";
  EXPECT_EQ(d, a) << "on any device";
  const std::uint64_t idc = id_of(0, c), idd = id_of(1, d);
  std::vector<std::uint64_t> ids = {ida, idb, idc, idd, id_of(0, nullptr), id_of(1, nullptr)};
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end())
      << "ids are never reused, legacy streams have their own";
  EXPECT_EQ(sim().live_streams(), 2u);
  EXPECT_EQ(sim().misuse_count(), 0u);
}

TEST_F(SimFaithful, ARecycledHandleIsANewStreamNotOrderedAfterTheOldOne) {
  const DevicePtr r = chunk(0, {{0, Access::read_write}});
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, s, r, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().stream_destroy(0, s), Result::success);
  vmm::StreamHandle t = stream(0);
  ASSERT_EQ(t, s);
  EXPECT_EQ(sim().pending_accesses(), 1u) << "the old stream's write is still pending";
  ASSERT_EQ(sim().enqueue_access(0, t, r, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(sim().race_count(), 1u) << "same handle, other stream: no stream order";
  ASSERT_EQ(sim().stream_synchronize(0, t), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 1u) << "synchronizing the new stream leaves the old one's";
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

// Every call that takes a stream, on a destroyed handle not created again.
TEST(SimStreamHandles, UsingADestroyedHandleKillsTheContextAndIsReported) {
  struct Use {
    const char* call;
    std::function<Result(SimDriver&, vmm::StreamHandle)> run;
  };
  const std::vector<Use> uses = {
      {"cuEventRecord",
       [](SimDriver& d, vmm::StreamHandle s) {
         vmm::EventHandle e = nullptr;
         EXPECT_EQ(d.event_create(0, &e), Result::success);
         return d.event_record(0, e, s);
       }},
      {"cuStreamWaitEvent",
       [](SimDriver& d, vmm::StreamHandle s) {
         vmm::EventHandle e = nullptr;
         EXPECT_EQ(d.event_create(0, &e), Result::success);
         return d.stream_wait_event(0, s, e);
       }},
      {"cuStreamSynchronize",
       [](SimDriver& d, vmm::StreamHandle s) { return d.stream_synchronize(0, s); }},
      {"cuStreamDestroy", [](SimDriver& d, vmm::StreamHandle s) { return d.stream_destroy(0, s); }},
      {"cuStreamGetId",
       [](SimDriver& d, vmm::StreamHandle s) {
         std::uint64_t id = 0;
         return d.stream_get_id(0, s, &id);
       }},
      {"cuStreamGetCaptureInfo",
       [](SimDriver& d, vmm::StreamHandle s) {
         vmm::CaptureStatus st{};
         return d.stream_capture_status(0, s, &st, nullptr);
       }},
      {"cuMemsetD8Async",
       [](SimDriver& d, vmm::StreamHandle s) { return d.memset_d8_async(0, 0, 0, 16, s); }},
      {"cuMemcpyAsync",
       [](SimDriver& d, vmm::StreamHandle s) { return d.memcpy_async(0, 0, 0, 16, s); }},
      {"cuLaunchKernel",
       [](SimDriver& d, vmm::StreamHandle s) {
         return d.enqueue_access(0, s, 0, 16, AccessKind::read);
       }},
  };
  for (const Use& u : uses) {
    SCOPED_TRACE(u.call);
    auto sim = SimDriver::uniform(Profile::h200, 1);
    vmm::StreamHandle s = nullptr;
    ASSERT_EQ(sim->stream_create(0, &s), Result::success);
    ASSERT_EQ(sim->stream_destroy(0, s), Result::success);
    EXPECT_EQ(u.run(*sim, s), Result::context_is_destroyed);
    EXPECT_EQ(sim->sticky_error(), Result::context_is_destroyed) << "never a quiet fallback";
    ASSERT_EQ(sim->misuse_count(), 1u);
    const std::string report = sim->misuse().at(0);
    EXPECT_NE(report.find(u.call), std::string::npos) << report;
    EXPECT_NE(report.find("destroyed"), std::string::npos) << report;
    sim->clear_misuse();
    EXPECT_EQ(sim->misuse_count(), 0u);
  }
}

// --- (d) cuMemFree is no synchronization -------------------------------------------

TEST_F(SimFaithful, FreeOfMemoryWithQueuedWorkOfItsOwnDeviceIsIllegalAddress) {
  DevicePtr p = 0;
  ASSERT_EQ(sim().mem_alloc(0, 1 << 20, &p), Result::success);
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, s, p, 1 << 20, AccessKind::write), Result::success);
  EXPECT_EQ(sim().mem_free(0, p), Result::illegal_address);
  EXPECT_EQ(sim().sticky_error(), Result::illegal_address);
}

TEST_F(SimFaithful, FreeAfterTheQueuedWorkIsWaitedForIsFine) {
  DevicePtr p = 0, other = 0;
  ASSERT_EQ(sim().mem_alloc(0, 1 << 20, &p), Result::success);
  ASSERT_EQ(sim().mem_alloc(0, 1 << 20, &other), Result::success);
  vmm::StreamHandle s = stream(0), t = stream(0);
  vmm::EventHandle e = event(0);
  ASSERT_EQ(sim().enqueue_access(0, s, p, 1 << 20, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_record(0, e, s), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, t, other, 1 << 20, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_synchronize(e), Result::success);
  EXPECT_EQ(sim().mem_free(0, p), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 1u)
      << "cuMemFree completed nothing else: t's work on other memory is still queued";
}

// --- (e) pre-Ampere per-range access is the global toggle --------------------------

struct P40Pair : SimFaithful {
  P40Pair() : SimFaithful(Profile::p40) {}
};

TEST_F(P40Pair, GrantingAnotherRangeWhileAPeerReadsTheOwnerKillsTheContext) {
  const DevicePtr a = chunk(0, {{0, Access::read_write}, {1, Access::read_write}});
  const DevicePtr b = chunk(0, {{0, Access::read_write}});
  ASSERT_EQ(sim().enqueue_access(1, stream(1), a, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(set_access(b, g_, {{1, Access::read_write}}), Result::launch_failed)
      << "on a P40 a grant of b toggles the pair's peer mapping under the read of a";
  EXPECT_EQ(sim().sticky_error(), Result::launch_failed);
}

TEST_F(P40Pair, RevokingAnotherRangeWhileAPeerCopyRunsKillsTheContext) {
  const DevicePtr a = chunk(0, {{0, Access::read_write}, {1, Access::read_write}});
  const DevicePtr b = chunk(0, {{0, Access::read_write}, {1, Access::read_write}});
  const DevicePtr dst = chunk(1, {{1, Access::read_write}});
  ASSERT_EQ(sim().memcpy_async(1, dst, a, 4096, stream(1)), Result::success);
  EXPECT_EQ(set_access(b, g_, {{1, Access::none}}), Result::launch_failed);
}

TEST_F(P40Pair, ChangesAfterTheFenceAndOwnerOnlyChangesAreFine) {
  const DevicePtr a = chunk(0, {{0, Access::read_write}, {1, Access::read_write}});
  const DevicePtr b = chunk(0, {{0, Access::read_write}});
  vmm::StreamHandle s1 = stream(1);
  ASSERT_EQ(sim().enqueue_access(1, s1, a, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(set_access(b, g_, {{0, Access::read_write}}), Result::success)
      << "the owner's own access is no peer toggle";
  EXPECT_EQ(set_access(b, g_, {{1, Access::none}}), Result::success)
      << "setting what is already set changes nothing";
  ASSERT_EQ(sim().stream_synchronize(1, s1), Result::success);
  EXPECT_EQ(set_access(b, g_, {{1, Access::read_write}}), Result::success);
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

TEST_F(SimFaithful, OnAnAmperePairAGrantOfAnotherRangeUnderPeerWorkIsFine) {
  const DevicePtr a = chunk(0, {{0, Access::read_write}, {1, Access::read_write}});
  const DevicePtr b = chunk(0, {{0, Access::read_write}});
  ASSERT_EQ(sim().enqueue_access(1, stream(1), a, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(set_access(b, g_, {{1, Access::read_write}}), Result::success);
  EXPECT_EQ(sim().emulated_peer_toggles(), 0u);
}

TEST(SimPreAmpereCost, APeerAccessChangeCostsAGlobalToggleBeforeAmpere) {
  auto grant_cost = [](Profile p, std::uint64_t* toggles) {
    auto sim = SimDriver::uniform(p, 2);
    const std::size_t g = vmm::profile(p).granularity;
    DevicePtr r = 0;
    PhysHandle h = 0;
    EXPECT_EQ(sim->address_reserve(g, 0, &r), Result::success);
    EXPECT_EQ(sim->mem_create(0, g, vmm::ShareableHandleType::none, &h), Result::success);
    EXPECT_EQ(sim->mem_map(r, g, h), Result::success);
    const vmm::AccessDesc grant[] = {{0, Access::read_write}, {1, Access::read_write}};
    const std::uint64_t before = sim->simulated_ns(Call::mem_set_access);
    EXPECT_EQ(sim->mem_set_access(r, g, grant, 2), Result::success);
    *toggles = sim->emulated_peer_toggles();
    return sim->simulated_ns(Call::mem_set_access) - before;
  };
  std::uint64_t toggles_p40 = 0, toggles_h200 = 0;
  const std::uint64_t p40 = grant_cost(Profile::p40, &toggles_p40);
  const std::uint64_t h200 = grant_cost(Profile::h200, &toggles_h200);
  EXPECT_EQ(toggles_p40, 1u);
  EXPECT_EQ(toggles_h200, 0u);
  EXPECT_GT(h200, 0u);
  // As slow as cuCtxEnablePeerAccess: ~10 ms against ~1 ms for a grant on Ampere and later.
  EXPECT_GE(p40, 5 * h200);
  auto sim = SimDriver::uniform(Profile::p40, 2);
  ASSERT_EQ(sim->enable_peer_access(1, 0), Result::success);
  EXPECT_EQ(sim->simulated_ns(Call::enable_peer_access), p40);
  EXPECT_EQ(sim->simulated_ns_total(), p40);
}

}  // namespace
}  // namespace gvm::test
