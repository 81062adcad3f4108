// The hazard model: each rule that kills the context, next to its fenced
// counterpart that must not; completion; races between streams; and
// HazardModel, the two failures measured on real H200s (docs/measurements.md, "Hazards").
#include <string>
#include <vector>

#include "sim_fixture.hpp"

namespace gvm::test {
namespace {

class SimHazards : public SimTest {
 protected:
  // A chunk of device 0 at the start of a fresh reservation, owner-only.
  DevicePtr owned_by_0(std::size_t bytes) {
    DevicePtr r = reserve(bytes);
    map(r, 0, bytes, {{0, Access::read_write}});
    return r;
  }
  // Every entry point answers `r` (a sample from each family of calls).
  void expect_every_call_fails_with(Result r) {
    int n = 0;
    EXPECT_EQ(sim().device_count(&n), r);
    DevicePtr p = 0;
    EXPECT_EQ(sim().address_reserve(g_, 0, &p), r);
    EXPECT_EQ(sim().mem_alloc(0, 64, &p), r);
    vmm::StreamHandle s = nullptr;
    EXPECT_EQ(sim().stream_create(0, &s), r);
    EXPECT_EQ(sim().stream_synchronize(0, nullptr), r);
    EXPECT_EQ(sim().ctx_synchronize(1), r);
    vmm::EventHandle e = nullptr;
    EXPECT_EQ(sim().event_create(1, &e), r);
    EXPECT_EQ(sim().enable_peer_access(0, 1), r);
    EXPECT_EQ(sim().enqueue_access(0, nullptr, 0, 1, AccessKind::read), r);
  }
};

// --- rule 1: access without the right ----------------------------------------------

TEST_F(SimHazards, AccessToUnmappedMemoryIsIllegalAndSticky) {
  DevicePtr r = reserve(2 * g_);
  EXPECT_EQ(sim().enqueue_access(0, nullptr, r, 64, AccessKind::read), Result::illegal_address);
  EXPECT_EQ(sim().sticky_error(), Result::illegal_address);
  expect_every_call_fails_with(Result::illegal_address);
  // The simulator's own queries still answer.
  EXPECT_EQ(sim().live_reservations(), 1u);
  sim().clear_sticky();
  int n = 0;
  EXPECT_EQ(sim().device_count(&n), Result::success);
}

TEST_F(SimHazards, PeerNeedsAGrantAndWritesNeedReadWrite) {
  DevicePtr r = owned_by_0(g_);
  EXPECT_EQ(sim().enqueue_access(0, nullptr, r, g_, AccessKind::write), Result::success)
      << "the owner";
  EXPECT_EQ(sim().enqueue_access(1, nullptr, r, 64, AccessKind::read), Result::illegal_address)
      << "a peer without a grant";
  sim().clear_sticky();

  ASSERT_EQ(set_access(r, g_, {{1, Access::read}}), Result::success);
  EXPECT_EQ(sim().enqueue_access(1, nullptr, r, 64, AccessKind::read), Result::success);
  EXPECT_EQ(sim().enqueue_access(1, nullptr, r, 64, AccessKind::write), Result::illegal_address)
      << "a write through a read-only grant";
  sim().clear_sticky();
  EXPECT_EQ(sim().enqueue_access(0, nullptr, r + g_ - 8, 16, AccessKind::read),
            Result::illegal_address)
      << "running off the end of the mapping";
}

TEST_F(SimHazards, ClassicMemoryOfAPeerNeedsGlobalPeerAccess) {
  DevicePtr p = 0;
  ASSERT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  EXPECT_EQ(sim().enqueue_access(0, nullptr, p, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().enqueue_access(1, nullptr, p, 4096, AccessKind::read), Result::illegal_address);
  sim().clear_sticky();
  ASSERT_EQ(sim().enable_peer_access(1, 0), Result::success);
  EXPECT_EQ(sim().enqueue_access(1, nullptr, p, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(sim().enable_peer_access(1, 0), Result::peer_access_already_enabled);
}

TEST_F(SimHazards, GlobalPeerAccessDoesNotOpenVmmMemory) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(sim().enable_peer_access(1, 0), Result::success);
  EXPECT_EQ(sim().enqueue_access(1, nullptr, r, 64, AccessKind::read), Result::illegal_address)
      << "VMM memory is reached only through cuMemSetAccess";
}

// --- rule 2: the ground moves under pending work -------------------------------------

TEST_F(SimHazards, RevokeWhileThePeerReadsIsIllegalAddress) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  vmm::StreamHandle s1 = stream(1);
  ASSERT_EQ(sim().enqueue_access(1, s1, r, g_, AccessKind::read), Result::success);
  EXPECT_EQ(set_access(r, g_, {{1, Access::none}}), Result::illegal_address);
  EXPECT_EQ(sim().sticky_error(), Result::illegal_address);
  EXPECT_EQ(sim().pending_accesses(), 0u) << "a dead context drops its work";
}

TEST_F(SimHazards, RevokeAfterThePeerStreamIsSynchronizedIsFine) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  vmm::StreamHandle s1 = stream(1);
  ASSERT_EQ(sim().enqueue_access(1, s1, r, g_, AccessKind::read), Result::success);
  ASSERT_EQ(sim().stream_synchronize(1, s1), Result::success);
  EXPECT_EQ(set_access(r, g_, {{1, Access::none}}), Result::success);
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

TEST_F(SimHazards, SynchronizingTheWrongDeviceIsNoFence) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  ASSERT_EQ(sim().enqueue_access(1, nullptr, r, g_, AccessKind::read), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(0), Result::success);  // the owner, not the reader
  EXPECT_EQ(set_access(r, g_, {{1, Access::none}}), Result::illegal_address);
}

TEST_F(SimHazards, RevokingThePeerLeavesTheOwnersWorkAlone) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, nullptr, r, g_, AccessKind::write), Result::success);
  EXPECT_EQ(set_access(r, g_, {{1, Access::none}}), Result::success);
  // Lowering read_write to read under a pending write faults too.
  ASSERT_EQ(sim().enqueue_access(0, nullptr, r, 64, AccessKind::write), Result::success);
  EXPECT_EQ(set_access(r, g_, {{0, Access::read}}), Result::illegal_address);
}

TEST_F(SimHazards, UnmapUnderPendingWorkIsIllegalAndAfterSyncIsFine) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, s, r + 4096, 64, AccessKind::write), Result::success);
  EXPECT_EQ(sim().mem_unmap(r, g_), Result::illegal_address);
  EXPECT_EQ(sim().live_mappings(), 0u) << "the unmap itself happened";
  sim().clear_sticky();

  DevicePtr r2 = owned_by_0(g_);
  ASSERT_EQ(sim().enqueue_access(0, s, r2, 64, AccessKind::write), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(0), Result::success);
  EXPECT_EQ(sim().mem_unmap(r2, g_), Result::success);
}

TEST_F(SimHazards, DisablePeerAccessUnderAPeerCopyIsLaunchFailed) {
  DevicePtr src = 0, dst = 0;
  ASSERT_EQ(sim().mem_alloc(0, 1 << 20, &src), Result::success);
  ASSERT_EQ(sim().mem_alloc(1, 1 << 20, &dst), Result::success);
  ASSERT_EQ(sim().enable_peer_access(1, 0), Result::success);
  vmm::StreamHandle s1 = stream(1);
  ASSERT_EQ(sim().memcpy_peer_async(dst, 1, src, 0, 1 << 20, s1), Result::success);
  EXPECT_EQ(sim().disable_peer_access(1, 0), Result::launch_failed);
  EXPECT_EQ(sim().sticky_error(), Result::launch_failed);
  expect_every_call_fails_with(Result::launch_failed);
}

TEST_F(SimHazards, DisablePeerAccessAfterBothDevicesSynchronizeIsFine) {
  DevicePtr src = 0, dst = 0;
  ASSERT_EQ(sim().mem_alloc(0, 1 << 20, &src), Result::success);
  ASSERT_EQ(sim().mem_alloc(1, 1 << 20, &dst), Result::success);
  ASSERT_EQ(sim().enable_peer_access(1, 0), Result::success);
  vmm::StreamHandle s1 = stream(1);
  ASSERT_EQ(sim().memcpy_peer_async(dst, 1, src, 0, 1 << 20, s1), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(0), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(1), Result::success);
  EXPECT_EQ(sim().disable_peer_access(1, 0), Result::success);
  EXPECT_EQ(sim().disable_peer_access(1, 0), Result::peer_access_not_enabled);
}

TEST_F(SimHazards, DisablePeerAccessWithOnlyLocalWorkPendingIsFine) {
  DevicePtr mine = 0;
  ASSERT_EQ(sim().mem_alloc(1, 4096, &mine), Result::success);
  ASSERT_EQ(sim().enable_peer_access(1, 0), Result::success);
  ASSERT_EQ(sim().enqueue_access(1, nullptr, mine, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().disable_peer_access(1, 0), Result::success)
      << "device 1 touches only its own memory";
}

TEST_F(SimHazards, FreeingClassicMemoryWithQueuedWorkIsIllegalOnAnyDevice) {
  DevicePtr p = 0;
  ASSERT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  vmm::StreamHandle s0 = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, s0, p, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().stream_synchronize(0, s0), Result::success);
  EXPECT_EQ(sim().mem_free(0, p), Result::success) << "nothing queued on it any more";

  ASSERT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, s0, p, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().mem_free(0, p), Result::illegal_address)
      << "cuMemFree is no implicit synchronization of the owner";
  sim().clear_sticky();

  ASSERT_EQ(sim().mem_alloc(0, 4096, &p), Result::success);
  ASSERT_EQ(sim().enable_peer_access(1, 0), Result::success);
  ASSERT_EQ(sim().enqueue_access(1, nullptr, p, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(sim().mem_free(0, p), Result::illegal_address) << "the peer still reads it";
}

// --- rule 4: completion -------------------------------------------------------------

TEST_F(SimHazards, EventsCompleteOnlyWhatCameBeforeThem) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle s = stream(0);
  vmm::EventHandle e = event(0);
  ASSERT_EQ(sim().enqueue_access(0, s, r, 64, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_record(0, e, s), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, s, r + 64, 64, AccessKind::write), Result::success);
  EXPECT_EQ(sim().event_query(e), Result::not_ready) << "nothing runs by itself";
  ASSERT_EQ(sim().event_synchronize(e), Result::success);
  EXPECT_EQ(sim().event_query(e), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 1u) << "the access after the event is still pending";
  ASSERT_EQ(sim().stream_synchronize(0, s), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 0u);
}

TEST_F(SimHazards, AutoCompleteMakesQueriesFinishTheWork) {
  DevicePtr r = owned_by_0(g_);
  vmm::EventHandle e = event(0);
  ASSERT_EQ(sim().enqueue_access(0, nullptr, r, 64, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_record(0, e, nullptr), Result::success);
  sim().set_auto_complete(true);
  EXPECT_EQ(sim().event_query(e), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 0u);
}

TEST_F(SimHazards, WaitsMakeCompletionTransitive) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  vmm::StreamHandle a = stream(0), b = stream(1);
  vmm::EventHandle ea = event(0), eb = event(1);
  ASSERT_EQ(sim().enqueue_access(0, a, r, 64, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_record(0, ea, a), Result::success);
  ASSERT_EQ(sim().stream_wait_event(1, b, ea), Result::success);
  ASSERT_EQ(sim().enqueue_access(1, b, r, 64, AccessKind::read), Result::success);
  ASSERT_EQ(sim().event_record(1, eb, b), Result::success);
  ASSERT_EQ(sim().event_synchronize(eb), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 0u) << "b's work waited for a's";
  EXPECT_EQ(sim().race_count(), 0u);
}

TEST_F(SimHazards, ContextSynchronizeCompletesOnlyThatDevice) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, stream(0), r, 64, AccessKind::read), Result::success);
  ASSERT_EQ(sim().enqueue_access(1, stream(1), r, 64, AccessKind::read), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(1), Result::success);
  EXPECT_EQ(sim().pending_accesses(), 1u);
  sim().complete_all();
  EXPECT_EQ(sim().pending_accesses(), 0u);
}

TEST_F(SimHazards, WorkOfADestroyedStreamStaysPendingUntilSynchronized) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle s = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, s, r, 64, AccessKind::write), Result::success);
  ASSERT_EQ(sim().stream_destroy(0, s), Result::success);
  EXPECT_EQ(sim().live_streams(), 0u);
  EXPECT_EQ(sim().pending_accesses(), 1u);
  EXPECT_EQ(sim().mem_unmap(r, g_), Result::illegal_address) << "destroying a stream is no fence";
  sim().clear_sticky();
  DevicePtr r2 = owned_by_0(g_);
  s = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, s, r2, 64, AccessKind::write), Result::success);
  ASSERT_EQ(sim().stream_destroy(0, s), Result::success);
  ASSERT_EQ(sim().ctx_synchronize(0), Result::success);
  EXPECT_EQ(sim().mem_unmap(r2, g_), Result::success);
}

// --- rule 5: races between streams ----------------------------------------------------

TEST_F(SimHazards, UnorderedWriteThenReadOnAnotherStreamRaces) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle a = stream(0), b = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, a, r, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, b, r + 1024, 64, AccessKind::read), Result::success);
  ASSERT_EQ(sim().race_count(), 1u);
  const std::string why = sim().races().at(0);
  EXPECT_NE(why.find("read"), std::string::npos) << why;
  EXPECT_NE(why.find("write"), std::string::npos) << why;
  EXPECT_EQ(sim().sticky_error(), Result::success) << "a race is recorded, not fatal";
  sim().clear_races();
  EXPECT_EQ(sim().race_count(), 0u);
  EXPECT_TRUE(sim().races().empty());
}

TEST_F(SimHazards, AnEventWaitOrdersTheStreams) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle a = stream(0), b = stream(0);
  vmm::EventHandle e = event(0);
  ASSERT_EQ(sim().enqueue_access(0, a, r, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_record(0, e, a), Result::success);
  ASSERT_EQ(sim().stream_wait_event(0, b, e), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, b, r, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().race_count(), 0u);
}

TEST_F(SimHazards, AnEventRecordedBeforeTheWriteDoesNotOrderIt) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle a = stream(0), b = stream(0);
  vmm::EventHandle e = event(0);
  ASSERT_EQ(sim().event_record(0, e, a), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, a, r, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().stream_wait_event(0, b, e), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, b, r, 4096, AccessKind::read), Result::success);
  EXPECT_EQ(sim().race_count(), 1u);
}

TEST_F(SimHazards, OrderIsTransitiveAcrossThreeStreamsAndTwoDevices) {
  DevicePtr r = owned_by_0(g_);
  ASSERT_EQ(set_access(r, g_, {{1, Access::read_write}}), Result::success);
  vmm::StreamHandle a = stream(0), b = stream(1), c = stream(0);
  vmm::EventHandle ea = event(0), eb = event(1);
  ASSERT_EQ(sim().enqueue_access(0, a, r, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().event_record(0, ea, a), Result::success);
  ASSERT_EQ(sim().stream_wait_event(1, b, ea), Result::success);
  ASSERT_EQ(sim().event_record(1, eb, b), Result::success);
  ASSERT_EQ(sim().stream_wait_event(0, c, eb), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, c, r, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().race_count(), 0u) << "c waited for b, which waited for a";
}

TEST_F(SimHazards, ReadsSameStreamsDisjointRangesAndSyncedWorkNeverRace) {
  DevicePtr r = owned_by_0(g_);
  vmm::StreamHandle a = stream(0), b = stream(0);
  ASSERT_EQ(sim().enqueue_access(0, a, r, 4096, AccessKind::read), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, b, r, 4096, AccessKind::read), Result::success) << "two reads";
  ASSERT_EQ(sim().enqueue_access(0, a, r + 8192, 4096, AccessKind::write), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, a, r + 8192, 4096, AccessKind::read), Result::success)
      << "same stream";
  ASSERT_EQ(sim().enqueue_access(0, b, r + 16384, 4096, AccessKind::write), Result::success)
      << "disjoint";
  EXPECT_EQ(sim().race_count(), 0u);
  ASSERT_EQ(sim().stream_synchronize(0, a), Result::success);
  ASSERT_EQ(sim().enqueue_access(0, b, r + 8192, 4096, AccessKind::write), Result::success)
      << "the host waited for a";
  EXPECT_EQ(sim().race_count(), 0u);
  // The counterpart: a write on a against b's pending read does race.
  ASSERT_EQ(sim().enqueue_access(0, a, r, 4096, AccessKind::write), Result::success);
  EXPECT_EQ(sim().race_count(), 1u);
}

TEST_F(SimHazards, CopiesTakePartInRaces) {
  sim().enable_backing(true);
  DevicePtr r = owned_by_0(2 * g_);
  vmm::StreamHandle a = stream(0), b = stream(0);
  ASSERT_EQ(sim().memset_d8_async(0, r, 1, 4096, a), Result::success);
  ASSERT_EQ(sim().memcpy_async(0, r + g_, r, 4096, b), Result::success);  // reads what a writes
  EXPECT_EQ(sim().race_count(), 1u);
  ASSERT_EQ(sim().ctx_synchronize(0), Result::success);
  std::vector<unsigned char> host(4096);
  ASSERT_EQ(sim().memcpy_dtoh(0, host.data(), r + g_, host.size()), Result::success);
  EXPECT_EQ(sim().race_count(), 1u) << "a synchronous copy after a sync is ordered";
}

// --- HazardModel: docs/measurements.md "Hazards", both failures and both fences ---------

// Global peer access toggled between phases while a peer copy is queued:
// 20/20 runs failed with "unspecified launch failure" on two H200s; with both
// devices synchronized before each change, 0/20.
TEST(HazardModel, ToggleDuringTransferFailsAndFencedTogglesDoNot) {
  constexpr int kRuns = 20;  // as measured
  const std::size_t bytes = std::size_t{64} << 20;
  int unfenced_failures = 0;
  for (int run = 0; run < kRuns; ++run) {
    auto sim = SimDriver::uniform(Profile::h200, 2);
    DevicePtr src = 0, dst = 0;
    ASSERT_EQ(sim->mem_alloc(0, bytes, &src), Result::success);
    ASSERT_EQ(sim->mem_alloc(1, bytes, &dst), Result::success);
    ASSERT_EQ(sim->enable_peer_access(1, 0), Result::success);
    ASSERT_EQ(sim->memcpy_peer_async(dst, 1, src, 0, bytes, nullptr), Result::success);
    if (sim->disable_peer_access(1, 0) == Result::launch_failed &&
        sim->ctx_synchronize(1) == Result::launch_failed) {
      ++unfenced_failures;
    }
  }
  EXPECT_EQ(unfenced_failures, kRuns);

  int fenced_failures = 0;
  auto sim = SimDriver::uniform(Profile::h200, 2);
  DevicePtr src = 0, dst = 0;
  ASSERT_EQ(sim->mem_alloc(0, bytes, &src), Result::success);
  ASSERT_EQ(sim->mem_alloc(1, bytes, &dst), Result::success);
  for (int run = 0; run < kRuns; ++run) {
    bool ok = sim->enable_peer_access(1, 0) == Result::success &&
              sim->memcpy_peer_async(dst, 1, src, 0, bytes, nullptr) == Result::success &&
              sim->ctx_synchronize(0) == Result::success &&
              sim->ctx_synchronize(1) == Result::success &&
              sim->disable_peer_access(1, 0) == Result::success;
    if (!ok) ++fenced_failures;
  }
  EXPECT_EQ(fenced_failures, 0);
  EXPECT_EQ(sim->sticky_error(), Result::success);
}

// A peer's access revoked with cuMemSetAccess(PROT_NONE) while a kernel on
// that peer reads the range: "an illegal memory access was encountered".
TEST(HazardModel, RevokeDuringReadFailsAndFencedRevokeDoesNot) {
  for (bool fenced : {false, true}) {
    SCOPED_TRACE(fenced ? "fenced" : "unfenced");
    auto sim = SimDriver::uniform(Profile::h200, 2);
    const std::size_t bytes = std::size_t{64} << 20;
    DevicePtr r = 0;
    PhysHandle h = 0;
    ASSERT_EQ(sim->address_reserve(bytes, 0, &r), Result::success);
    ASSERT_EQ(sim->mem_create(0, bytes, vmm::ShareableHandleType::none, &h), Result::success);
    ASSERT_EQ(sim->mem_map(r, bytes, h), Result::success);
    const vmm::AccessDesc grant[] = {{0, Access::read_write}, {1, Access::read_write}};
    ASSERT_EQ(sim->mem_set_access(r, bytes, grant, 2), Result::success);
    vmm::StreamHandle peer = nullptr;
    ASSERT_EQ(sim->stream_create(1, &peer), Result::success);
    ASSERT_EQ(sim->enqueue_access(1, peer, r, bytes, AccessKind::read), Result::success);
    if (fenced) {
      // Every device that may touch the range is drained, not just the owner.
      ASSERT_EQ(sim->ctx_synchronize(0), Result::success);
      ASSERT_EQ(sim->ctx_synchronize(1), Result::success);
    }
    const vmm::AccessDesc revoke[] = {{1, Access::none}};
    Result got = sim->mem_set_access(r, bytes, revoke, 1);
    if (fenced) {
      EXPECT_EQ(got, Result::success);
      EXPECT_EQ(sim->sticky_error(), Result::success);
      EXPECT_EQ(sim->mem_unmap(r, bytes), Result::success);
    } else {
      EXPECT_EQ(got, Result::illegal_address);
      EXPECT_EQ(sim->sticky_error(), Result::illegal_address);
      EXPECT_EQ(sim->stream_synchronize(1, peer), Result::illegal_address) << "sticky";
    }
  }
}

}  // namespace
}  // namespace gvm::test
