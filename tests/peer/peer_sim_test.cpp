// Peer scratch, peer policy and the fence on the simulated driver.
//
// Every hazard test runs twice: with the fence (no sticky error) and with the
// fence disabled through the test hook (the simulator's sticky error, as the
// real driver gives) - proof that the tests can fail.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

#ifndef GVM_PEER_PROFILE
#define GVM_PEER_PROFILE h200
#endif
#define GVM_STR2(x) #x
#define GVM_STR(x) GVM_STR2(x)

namespace {

using gvm::Allocator;
using gvm::Config;
using gvm::PeerPolicy;
using gvm::vmm::Access;
using gvm::vmm::AccessKind;
using gvm::vmm::Call;
using gvm::vmm::Profile;
using gvm::vmm::Result;
using gvm::vmm::SimDriver;
using gvm::vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;

Profile this_profile() { return gvm::vmm::parse_profile(GVM_STR(GVM_PEER_PROFILE)); }

Config tiny(bool fence = true) {
  Config c;
  c.scratch_chunk_bytes = 4 * kMiB;
  c.max_chunk_bytes = 4 * kMiB;
  c.fence_enabled = fence;
  return c;
}

struct Pair {
  std::unique_ptr<SimDriver> sim;
  std::unique_ptr<Allocator> alloc;
  StreamHandle s0 = nullptr, s1 = nullptr;

  explicit Pair(Config c, Profile p = this_profile(), int devices = 2) {
    sim = SimDriver::uniform(p, devices);
    alloc = std::make_unique<Allocator>(*sim, c);
    EXPECT_EQ(sim->stream_create(0, &s0), Result::success);
    EXPECT_EQ(sim->stream_create(1, &s1), Result::success);
  }
  ~Pair() {
    sim->clear_sticky();
    sim->complete_all();
    alloc.reset();
    sim->stream_destroy(0, s0);
    sim->stream_destroy(1, s1);
  }
  gvm::vmm::DevicePtr addr(void* p) { return reinterpret_cast<gvm::vmm::DevicePtr>(p); }
};

PeerPolicy expected_policy(Profile p) {
  const auto prof = gvm::vmm::profile(p);
  return prof.cc_major >= 8 ? PeerPolicy::per_allocation : PeerPolicy::global;
}

// --- the policy chosen per pair -------------------------------------------

TEST(PeerPolicy, ChosenFromDeviceCaps) {
  Pair t(tiny());
  EXPECT_EQ(t.alloc->peer_policy(0, 1), expected_policy(this_profile()));
  EXPECT_EQ(t.alloc->peer_policy(1, 0), expected_policy(this_profile()));
}

TEST(PeerPolicy, NoP2PPathMeansNone) {
  auto sim = SimDriver::uniform(this_profile(), 2);
  sim->set_peer(0, 1, false);
  sim->set_peer(1, 0, false);
  Allocator a(*sim, tiny());
  EXPECT_EQ(a.peer_policy(0, 1), PeerPolicy::none);
  // Forcing a policy cannot create a P2P path.
  a.set_peer_policy(PeerPolicy::per_allocation);
  EXPECT_EQ(a.peer_policy(0, 1), PeerPolicy::none);
}

TEST(PeerPolicy, MixedPairWithPreAmpereIsGlobal) {
  std::vector<gvm::vmm::DeviceProfile> devs{gvm::vmm::profile(Profile::p40),
                                             gvm::vmm::profile(Profile::h200)};
  SimDriver sim(devs);
  Allocator a(sim, tiny());
  EXPECT_EQ(a.peer_policy(0, 1), PeerPolicy::global);
  EXPECT_EQ(a.peer_policy(1, 0), PeerPolicy::global);
}

TEST(PeerPolicy, ConfigOverride) {
  Config c = tiny();
  c.peer_policy = PeerPolicy::global;
  Pair t(c);
  EXPECT_EQ(t.alloc->peer_policy(0, 1), PeerPolicy::global);
  t.alloc->set_peer_policy(PeerPolicy::automatic);
  EXPECT_EQ(t.alloc->peer_policy(0, 1), expected_policy(this_profile()));
}

// --- what a peer may touch --------------------------------------------------

TEST(PeerScratch, PeerReachesScratchButNotOrdinaryBlocks) {
  Pair t(tiny());
  void* scratch = t.alloc->scratch_allocate(3 * kMiB, 0, t.s0);
  void* ordinary = t.alloc->allocate(3 * kMiB, 0, t.s0);
  Access acc = Access::read;
  ASSERT_EQ(t.sim->mem_get_access(t.addr(scratch), 1, &acc), Result::success);
  EXPECT_EQ(acc, Access::read_write);
  ASSERT_EQ(t.sim->mem_get_access(t.addr(ordinary), 1, &acc), Result::success);
  EXPECT_EQ(acc, Access::none) << "an ordinary block must stay private to its device";
  EXPECT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(scratch), 3 * kMiB, AccessKind::write),
            Result::success);
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
  // A peer touching an ordinary block is exactly what must never work.
  EXPECT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(ordinary), 4096, AccessKind::read),
            Result::illegal_address);
  t.sim->clear_sticky();
  t.sim->complete_all();
  t.alloc->deallocate(scratch, 3 * kMiB, 0, t.s0);
  t.alloc->deallocate(ordinary, 3 * kMiB, 0, t.s0);
  std::string why;
  EXPECT_TRUE(t.alloc->check_invariants(&why)) << why;
}

TEST(PeerScratch, GrowthGrantsOnlyTheNewChunkAndFreeNeverRevokes) {
  Pair t(tiny());
  const auto grants0 = t.sim->call_count(Call::mem_set_access);
  void* a = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  EXPECT_EQ(t.sim->call_count(Call::mem_set_access) - grants0, 1u);
  void* b = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  EXPECT_EQ(t.sim->call_count(Call::mem_set_access) - grants0, 2u);
  t.alloc->deallocate(a, 4 * kMiB, 0, t.s0);
  t.alloc->deallocate(b, 4 * kMiB, 0, t.s0);
  void* c = t.alloc->scratch_allocate(8 * kMiB, 0, t.s0);  // reuses both, merged
  EXPECT_EQ(t.sim->call_count(Call::mem_set_access) - grants0, 2u);
  EXPECT_EQ(t.sim->call_count(Call::mem_unmap), 0u);
  t.alloc->deallocate(c, 8 * kMiB, 0, t.s0);
  EXPECT_EQ(t.alloc->device_stats(0).scratch_reserved_bytes, 8 * kMiB);
}

// The scratch grows while a peer kernel reads it: a grant of the new chunk
// only. Before Ampere the driver emulates that grant with the global peer
// toggle, which races the peer's read as a cuCtxDisablePeerAccess would
// (docs/peer-access.md); the simulator kills the context there
// (tests/unit/sim_faithful_test.cpp, P40Pair).
TEST(PeerScratch, GrowthWhileAPeerReadsTheScratchIsClean) {
  Pair t(tiny());
  void* a = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  ASSERT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(a), 4 * kMiB, AccessKind::read),
            Result::success);
  void* b = nullptr;
  EXPECT_NO_THROW(b = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0));
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
  t.sim->clear_sticky();
  t.sim->complete_all();
  t.alloc->deallocate(a, 4 * kMiB, 0, t.s0);
  if (b != nullptr) t.alloc->deallocate(b, 4 * kMiB, 0, t.s0);
}

// --- the fence: trim, policy switch, global toggle --------------------------

void trim_with_pending_peer_read(bool fence) {
  Pair t(tiny(fence));
  void* p = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  ASSERT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(p), 4 * kMiB, AccessKind::read), Result::success);
  t.alloc->deallocate(p, 4 * kMiB, 0, t.s0);  // the peer kernel still runs
  if (fence) {
    t.alloc->trim(0);
    EXPECT_EQ(t.sim->sticky_error(), Result::success);
    EXPECT_EQ(t.alloc->device_stats(0).scratch_reserved_bytes, 0u);
  } else {
    EXPECT_THROW(t.alloc->trim(0), gvm::driver_error);
    EXPECT_TRUE(gvm::vmm::is_sticky(t.sim->sticky_error()));
  }
}
TEST(PeerFence, TrimWhilePeerReadsIsFenced) { trim_with_pending_peer_read(true); }
TEST(PeerFence, TrimWithoutFenceKillsTheContext) { trim_with_pending_peer_read(false); }

void switch_with_pending_peer_read(bool fence) {
  Pair t(tiny(fence));
  void* p = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  ASSERT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(p), 4 * kMiB, AccessKind::read), Result::success);
  // The "large batch" phase: peers lose their access while a read is queued.
  if (fence) {
    t.alloc->set_peer_policy(PeerPolicy::none);
    EXPECT_EQ(t.sim->sticky_error(), Result::success);
    EXPECT_EQ(t.alloc->peer_policy(0, 1), PeerPolicy::none);
    Access acc = Access::read_write;
    ASSERT_EQ(t.sim->mem_get_access(t.addr(p), 1, &acc), Result::success);
    EXPECT_EQ(acc, Access::none);
    // And back: the grant returns for the chunk that is still mapped.
    t.alloc->set_peer_policy(PeerPolicy::automatic);
    ASSERT_EQ(t.sim->mem_get_access(t.addr(p), 1, &acc), Result::success);
    EXPECT_EQ(acc, Access::read_write);
    EXPECT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(p), 4 * kMiB, AccessKind::read),
              Result::success);
  } else {
    EXPECT_THROW(t.alloc->set_peer_policy(PeerPolicy::none), gvm::driver_error);
    EXPECT_TRUE(gvm::vmm::is_sticky(t.sim->sticky_error()));
  }
}
TEST(PeerFence, PolicySwitchWhilePeerReadsIsFenced) { switch_with_pending_peer_read(true); }
TEST(PeerFence, PolicySwitchWithoutFenceKillsTheContext) { switch_with_pending_peer_read(false); }

// The pre-Ampere path on any profile: global access enabled once; leaving
// it while a peer copy is queued is the toggle-during-transfer failure.
void global_toggle_with_pending_copy(bool fence) {
  Config c = tiny(fence);
  c.peer_policy = PeerPolicy::global;
  Pair t(c);
  void* p = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  // Device 1's context may now reach device 0's memory: enabled once, when
  // device 0's scratch appeared.
  EXPECT_EQ(t.sim->call_count(Call::enable_peer_access), 1u);
  void* q = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  EXPECT_EQ(t.sim->call_count(Call::enable_peer_access), 1u) << "never toggled again";
  ASSERT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(p), 4 * kMiB, AccessKind::read), Result::success);
  t.alloc->deallocate(q, 4 * kMiB, 0, t.s0);
  if (fence) {
    t.alloc->set_peer_policy(PeerPolicy::none);
    EXPECT_EQ(t.sim->sticky_error(), Result::success);
    EXPECT_GE(t.sim->call_count(Call::disable_peer_access), 1u);
  } else {
    EXPECT_THROW(t.alloc->set_peer_policy(PeerPolicy::none), gvm::driver_error);
    EXPECT_TRUE(gvm::vmm::is_sticky(t.sim->sticky_error()));
  }
}
TEST(PeerFence, GlobalToggleWhileCopyQueuedIsFenced) { global_toggle_with_pending_copy(true); }
TEST(PeerFence, GlobalToggleWithoutFenceKillsTheContext) { global_toggle_with_pending_copy(false); }

TEST(PeerFence, GlobalAccessAlreadyEnabledByTheRuntimeIsTolerated) {
  auto sim = SimDriver::uniform(this_profile(), 2);
  ASSERT_EQ(sim->enable_peer_access(1, 0), Result::success);  // the runtime did it
  Config c = tiny();
  c.peer_policy = PeerPolicy::global;
  {
    Allocator a(*sim, c);
    void* p = a.scratch_allocate(kMiB, 0, nullptr);
    a.deallocate(p, kMiB, 0, nullptr);
    a.set_peer_policy(PeerPolicy::none);  // must not disable what it did not enable
  }
  EXPECT_EQ(sim->disable_peer_access(1, 0), Result::success) << "still enabled: not ours to undo";
}

// With scratch_fence:tracked the fence waits for the streams it was told of,
// not whole devices; a peer stream nobody named is not waited for.
void tracked_trim(bool name_the_stream) {
  Config c = tiny();
  c.scratch_fence_tracked = true;
  Pair t(c);
  void* p = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  ASSERT_EQ(t.sim->enqueue_access(1, t.s1, t.addr(p), 4 * kMiB, AccessKind::read), Result::success);
  if (name_the_stream) t.alloc->record_stream(p, t.s1, 1);
  t.alloc->deallocate(p, 4 * kMiB, 0, t.s0);
  if (name_the_stream) {
    const auto syncs = t.sim->call_count(Call::ctx_synchronize);
    t.alloc->trim(0);
    EXPECT_EQ(t.sim->sticky_error(), Result::success);
    EXPECT_EQ(t.sim->call_count(Call::ctx_synchronize), syncs) << "tracked: no device sync";
  } else {
    EXPECT_THROW(t.alloc->trim(0), gvm::driver_error);
    EXPECT_TRUE(gvm::vmm::is_sticky(t.sim->sticky_error()));
  }
}
TEST(PeerFence, TrackedFenceWaitsForNamedPeerStreams) { tracked_trim(true); }
TEST(PeerFence, TrackedFenceMissesUnnamedPeerStreams) { tracked_trim(false); }

// --- peer copies ------------------------------------------------------------

TEST(PeerCopy, DirectFromScratchStagedOtherwise) {
  Pair t(tiny());
  void* src_scratch = t.alloc->scratch_allocate(kMiB, 0, t.s0);
  void* src_private = t.alloc->allocate(kMiB, 0, t.s0);
  void* dst = t.alloc->allocate(kMiB, 1, t.s1);
  const auto staged0 = t.sim->call_count(Call::memcpy_peer_async);
  const auto direct0 = t.sim->call_count(Call::memcpy_async);
  EXPECT_TRUE(t.alloc->is_peer_copy_direct(src_scratch, 0, 1));
  EXPECT_FALSE(t.alloc->is_peer_copy_direct(src_private, 0, 1));
  t.alloc->peer_copy(dst, 1, src_scratch, 0, kMiB, t.s1);
  EXPECT_EQ(t.sim->call_count(Call::memcpy_async) - direct0, 1u);
  t.alloc->peer_copy(dst, 1, src_private, 0, kMiB, t.s1);
  EXPECT_EQ(t.sim->call_count(Call::memcpy_peer_async) - staged0, 1u);
  t.alloc->set_peer_policy(PeerPolicy::none);
  EXPECT_FALSE(t.alloc->is_peer_copy_direct(src_scratch, 0, 1));
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
  t.sim->complete_all();
  t.alloc->deallocate(src_scratch, kMiB, 0, t.s0);
  t.alloc->deallocate(src_private, kMiB, 0, t.s0);
  t.alloc->deallocate(dst, kMiB, 1, t.s1);
}

// --- the engine scenario, simulated ----------------------------------------
// Phases alternate: "small batch" (peer reads of every other device's scratch
// in flight) and "large batch" (policy switch, scratch trim and regrowth while
// the reads are still queued). Nothing may go sticky.
void engine_scenario(int devices, int phases, bool fence) {
  Config c = tiny(fence);
  auto sim = SimDriver::uniform(this_profile(), devices);
  Allocator a(*sim, c);
  std::vector<StreamHandle> streams(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d) ASSERT_EQ(sim->stream_create(d, &streams[static_cast<std::size_t>(d)]), Result::success);
  bool failed = false;
  auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  for (int phase = 0; phase < phases && !failed; ++phase) {
    try {
      // "Small batch": peers read every scratch buffer directly.
      a.set_peer_policy(PeerPolicy::automatic);
      std::vector<void*> scratch(static_cast<std::size_t>(devices));
      for (int d = 0; d < devices; ++d)
        at(scratch, d) = a.scratch_allocate((1 + static_cast<std::size_t>(phase % 3)) * kMiB, d,
                                            at(streams, d));
      for (int d = 0; d < devices; ++d)
        for (int p = 0; p < devices; ++p)
          if (p != d) {
            ASSERT_EQ(sim->enqueue_access(p, at(streams, p),
                                          reinterpret_cast<gvm::vmm::DevicePtr>(at(scratch, d)),
                                          kMiB, AccessKind::read),
                      Result::success);
          }
      for (int d = 0; d < devices; ++d)
        a.deallocate(at(scratch, d), gvm::kUnknownSize, d, at(streams, d));
      // "Large batch": the switch, a trim and regrowth, with the reads queued.
      a.set_peer_policy(PeerPolicy::none);
      if (phase % 4 == 1) a.trim();
    } catch (const gvm::driver_error&) {
      failed = true;
    }
  }
  if (fence) {
    EXPECT_FALSE(failed);
    EXPECT_EQ(sim->sticky_error(), Result::success);
    std::string why;
    EXPECT_TRUE(a.check_invariants(&why)) << why;
  } else {
    EXPECT_TRUE(failed);
    EXPECT_TRUE(gvm::vmm::is_sticky(sim->sticky_error()));
    sim->clear_sticky();
  }
  sim->complete_all();
}
TEST(PeerEngine, TwoDevices200PhasesNoHazard) { engine_scenario(2, 200, true); }
TEST(PeerEngine, TwoDevicesWithoutFenceFails) { engine_scenario(2, 10, false); }
TEST(PeerEngine, EightDevices40PhasesNoHazard) { engine_scenario(8, 40, true); }

TEST(PeerScratch, EightDevicesEveryPeerGrantedInOneCall) {
  auto sim = SimDriver::uniform(this_profile(), 8);
  Allocator a(*sim, tiny());
  const auto grants0 = sim->call_count(Call::mem_set_access);
  void* p = a.scratch_allocate(kMiB, 3, nullptr);
  EXPECT_EQ(sim->call_count(Call::mem_set_access) - grants0, 1u) << "one grant names all 7 peers";
  for (int peer = 0; peer < 8; ++peer) {
    Access acc = Access::none;
    ASSERT_EQ(sim->mem_get_access(reinterpret_cast<gvm::vmm::DevicePtr>(p), peer, &acc), Result::success);
    EXPECT_EQ(acc, Access::read_write) << "device " << peer;
  }
  a.deallocate(p, kMiB, 3, nullptr);
}

}  // namespace

namespace {

// A direct peer copy that starts inside a scratch block is remembered by the
// tracked fence too: the trim after it waits for the copying stream.
TEST(PeerFence, TrackedFenceSeesCopiesFromInsideABlock) {
  Config c = tiny();
  c.scratch_fence_tracked = true;
  Pair t(c);
  void* p = t.alloc->scratch_allocate(4 * kMiB, 0, t.s0);
  void* dst = t.alloc->allocate(kMiB, 1, t.s1);
  auto* inside = static_cast<char*>(p) + kMiB;
  ASSERT_TRUE(t.alloc->is_peer_copy_direct(inside, 0, 1));
  t.alloc->peer_copy(dst, 1, inside, 0, kMiB, t.s1);  // queued on device 1's stream
  ASSERT_GT(t.sim->pending_accesses(), 0u);
  t.alloc->deallocate(p, 4 * kMiB, 0, t.s0);
  t.alloc->trim(0);
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
  t.sim->complete_all();
  t.alloc->deallocate(dst, kMiB, 1, t.s1);
}

}  // namespace
