// The races and holes an outside review found in the peer paths, each shown on
// the simulated H200 pair (docs/reliability.md lists them with these tests):
//   1. peer_copy racing set_peer_policy: the copy must be queued and noted
//      under the policy it was decided by, or the switch revokes under it;
//   2. teardown: every device is fenced before any memory is unmapped;
//   3. no_vmm on an Ampere+ pair: the policy follows the memory gvmalloc
//      really hands out (cuMemAlloc segments need context peer access);
//   6. a policy switch that fails part-way leaves policy and grants agreeing,
//      and a retry applies it;
//   7. the reserve cap holds per device, arena and scratch together.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/hook_driver.hpp"
#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace {

using gvm::Allocator;
using gvm::Config;
using gvm::PeerPolicy;
using gvm::vmm::Access;
using gvm::vmm::AccessKind;
using gvm::vmm::Call;
using gvm::vmm::DevicePtr;
using gvm::vmm::Profile;
using gvm::vmm::Result;
using gvm::vmm::SimDriver;
using gvm::vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;

Config tiny() {
  Config c;
  c.scratch_chunk_bytes = 4 * kMiB;
  c.max_chunk_bytes = 4 * kMiB;
  return c;
}

DevicePtr at(const void* p) { return reinterpret_cast<DevicePtr>(p); }

// One-shot flag a thread can wait on with a timeout.
class Flag {
 public:
  void set() {
    std::lock_guard<std::mutex> g(m_);
    set_ = true;
    cv_.notify_all();
  }
  // True if set within `ms`.
  bool wait(int ms) {
    std::unique_lock<std::mutex> g(m_);
    return cv_.wait_for(g, std::chrono::milliseconds(ms), [&] { return set_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool set_ = false;
};

struct SimPair {
  std::unique_ptr<SimDriver> sim = SimDriver::uniform(Profile::h200, 2);
  StreamHandle s0 = nullptr, s1 = nullptr;
  SimPair() {
    EXPECT_EQ(sim->stream_create(0, &s0), Result::success);
    EXPECT_EQ(sim->stream_create(1, &s1), Result::success);
  }
  ~SimPair() {
    sim->clear_sticky();
    sim->complete_all();
    (void)sim->stream_destroy(0, s0);
    (void)sim->stream_destroy(1, s1);
  }
};

// --- 1. peer_copy racing set_peer_policy ------------------------------------

// Thread A copies from device 0's scratch on device 1's stream (direct);
// thread B switches the policy to none. The hooks hold A just before it
// queues the copy until B reaches the revoke (or 300 ms pass), and hold B's
// revoke until A's copy is queued (or 300 ms pass): the interleaving the
// review found. Correct code cannot reach it (A holds the policy while it
// decides, notes and queues), so both waits time out and the revoke fences
// the queued copy.
void copy_races_switch(bool tracked) {
  SimPair t;
  gvm::test::HookDriver hook(*t.sim);
  Config c = tiny();
  c.scratch_fence_tracked = tracked;
  Allocator a(hook, c);
  void* src = a.scratch_allocate(4 * kMiB, 0, t.s0);
  void* dst = a.allocate(4 * kMiB, 1, t.s1);
  ASSERT_TRUE(a.is_peer_copy_direct(src, 0, 1));

  Flag a_at_copy, b_at_revoke, a_done;
  std::atomic<std::thread::id> a_id{}, b_id{};
  std::atomic<bool> a_held{false}, b_held{false};
  hook.set_hook([&](Call call) {
    const auto me = std::this_thread::get_id();
    if (call == Call::memcpy_async && me == a_id.load() && !a_held.exchange(true)) {
      a_at_copy.set();
      (void)b_at_revoke.wait(300);
    } else if (call == Call::mem_set_access && me == b_id.load() && !b_held.exchange(true)) {
      b_at_revoke.set();
      (void)a_done.wait(300);
    }
  });
  std::string a_error, b_error;
  std::thread ta([&] {
    a_id = std::this_thread::get_id();
    try {
      a.peer_copy(dst, 1, src, 0, 4 * kMiB, t.s1);
    } catch (const std::exception& e) {
      a_error = e.what();
    }
    a_done.set();
  });
  // B starts once A has decided "direct" and is about to queue the copy.
  ASSERT_TRUE(a_at_copy.wait(5000));
  std::thread tb([&] {
    b_id = std::this_thread::get_id();
    try {
      a.set_peer_policy(PeerPolicy::none);
    } catch (const std::exception& e) {
      b_error = e.what();
    }
  });
  ta.join();
  tb.join();
  hook.set_hook(nullptr);
  EXPECT_EQ(a_error, "");
  EXPECT_EQ(b_error, "");
  EXPECT_EQ(t.sim->sticky_error(), Result::success)
      << "the switch revoked device 1's access under the queued copy";
  EXPECT_EQ(a.peer_policy(0, 1), PeerPolicy::none);
  Access acc = Access::read_write;
  ASSERT_EQ(t.sim->mem_get_access(at(src), 1, &acc), Result::success);
  EXPECT_EQ(acc, Access::none);
  a.deallocate(dst, 4 * kMiB, 1, t.s1);
  a.deallocate(src, 4 * kMiB, 0, t.s0);
}

TEST(PeerCorrectness, CopyRacingAPolicySwitchIsFencedWithDeviceFence) { copy_races_switch(false); }
TEST(PeerCorrectness, CopyRacingAPolicySwitchIsFencedWithTrackedFence) { copy_races_switch(true); }

// A direct copy queued on the peer's stream is waited for by a trim of the
// scratch it reads.
TEST(PeerCorrectness, TrimWaitsForAQueuedDirectCopy) {
  SimPair t;
  Config c = tiny();
  c.scratch_fence_tracked = true;
  Allocator a(*t.sim, c);
  void* src = a.scratch_allocate(4 * kMiB, 0, t.s0);
  void* dst = a.allocate(4 * kMiB, 1, t.s1);
  a.peer_copy(dst, 1, src, 0, 4 * kMiB, t.s1);  // queued, not complete
  a.deallocate(src, 4 * kMiB, 0, t.s0);
  a.trim(0);
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
  a.deallocate(dst, 4 * kMiB, 1, t.s1);
}

// A staged copy runs on the destination device's stream and reads the
// source device's ordinary memory: a trim of that memory must wait for it
// (the fence drained the owner device only).
TEST(PeerCorrectness, TrimWaitsForAStagedCopyOnThePeersStream) {
  for (bool tracked : {false, true}) {
    SimPair t;
    Config c = tiny();
    c.scratch_fence_tracked = tracked;
    Allocator a(*t.sim, c);
    void* src = a.allocate(8 * kMiB, 0, t.s0);
    void* dst = a.allocate(8 * kMiB, 1, t.s1);
    void* ssrc = a.scratch_allocate(4 * kMiB, 0, t.s0);
    a.set_peer_policy(PeerPolicy::none);  // the scratch copy is staged too
    a.peer_copy(dst, 1, src, 0, 8 * kMiB, t.s1);
    a.peer_copy(dst, 1, ssrc, 0, 4 * kMiB, t.s1);
    a.deallocate(src, 8 * kMiB, 0, t.s0);
    a.deallocate(ssrc, 4 * kMiB, 0, t.s0);
    a.trim(0);
    EXPECT_EQ(t.sim->sticky_error(), Result::success) << (tracked ? "tracked" : "devices");
    EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
    a.deallocate(dst, 8 * kMiB, 1, t.s1);
  }
}

// --- 2. teardown --------------------------------------------------------------

TEST(PeerCorrectness, TeardownFencesEveryDeviceBeforeUnmappingAny) {
  SimPair t;
  {
    Allocator a(*t.sim, tiny());
    void* src = a.allocate(8 * kMiB, 0, t.s0);  // ordinary: the copy is staged
    void* dst = a.allocate(8 * kMiB, 1, t.s1);
    ASSERT_FALSE(a.is_peer_copy_direct(src, 0, 1));
    a.peer_copy(dst, 1, src, 0, 8 * kMiB, t.s1);  // device 1's stream reads device 0
    ASSERT_GT(t.sim->pending_accesses(), 0u);
    // Destroyed with the copy queued and both blocks live.
  }
  EXPECT_EQ(t.sim->sticky_error(), Result::success)
      << "device 0's arena was unmapped while device 1's stream still read it";
  EXPECT_EQ(t.sim->live_mappings(), 0u);
  EXPECT_EQ(t.sim->live_handles(), 0u);
  EXPECT_EQ(t.sim->live_reservations(), 0u);
}

// --- 3. no_vmm on an Ampere+ pair ---------------------------------------------

TEST(PeerCorrectness, NoVmmOnAmperePairUsesContextPeerAccessForTheScratch) {
  SimPair t;
  Config c = tiny();
  c.force_no_vmm = true;
  Allocator a(*t.sim, c);
  // The scratch is cuMemAlloc memory: a grant with cuMemSetAccess cannot
  // reach it, context peer access can.
  EXPECT_EQ(a.peer_policy(0, 1), PeerPolicy::global);
  void* scratch = a.scratch_allocate(3 * kMiB, 0, t.s0);
  EXPECT_TRUE(a.is_peer_copy_direct(scratch, 0, 1));
  ASSERT_EQ(t.sim->enqueue_access(1, t.s1, at(scratch), 3 * kMiB, AccessKind::read),
            Result::success)
      << "a peer kernel faulted on a scratch nobody granted";
  t.sim->complete_all();
  a.deallocate(scratch, 3 * kMiB, 0, t.s0);
  // Leaving global on a classic scratch disables what was enabled, fenced.
  a.set_peer_policy(PeerPolicy::none);
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
}

// --- 6. a policy switch failing part-way ----------------------------------------

TEST(PeerCorrectness, SwitchFailingPartWayKeepsPolicyAndGrantsAgreeingAndRetryApplies) {
  SimPair t;
  Allocator a(*t.sim, tiny());
  // Two scratch chunks on device 0, both granted to device 1.
  void* p = a.scratch_allocate(4 * kMiB, 0, t.s0);
  void* q = a.scratch_allocate(4 * kMiB, 0, t.s0);
  auto granted = [&](void* x) {
    Access acc = Access::none;
    EXPECT_EQ(t.sim->mem_get_access(at(x), 1, &acc), Result::success);
    return acc == Access::read_write;
  };
  ASSERT_TRUE(granted(p) && granted(q));
  // The revoke of the second chunk fails.
  t.sim->fail_call(Call::mem_set_access, 2, Result::unknown);
  EXPECT_THROW(a.set_peer_policy(PeerPolicy::none), gvm::driver_error);
  // What the allocator says is what the driver holds.
  const PeerPolicy now = a.peer_policy(0, 1);
  if (now == PeerPolicy::per_allocation) {
    EXPECT_TRUE(granted(p) && granted(q)) << "policy says granted, a chunk was revoked";
  } else {
    EXPECT_EQ(now, PeerPolicy::none);
    EXPECT_FALSE(granted(p) || granted(q)) << "policy says none, a chunk is still granted";
  }
  EXPECT_EQ(a.is_peer_copy_direct(p, 0, 1), now != PeerPolicy::none);
  // The retry does the switch.
  a.set_peer_policy(PeerPolicy::none);
  EXPECT_EQ(a.peer_policy(0, 1), PeerPolicy::none);
  EXPECT_FALSE(granted(p));
  EXPECT_FALSE(granted(q));
  EXPECT_EQ(t.sim->sticky_error(), Result::success);
  a.deallocate(p, 4 * kMiB, 0, t.s0);
  a.deallocate(q, 4 * kMiB, 0, t.s0);
}

// --- 7. the reserve cap, per device ---------------------------------------------

TEST(PeerCorrectness, ReserveCapCountsArenaAndScratchTogether) {
  SimPair t;
  Config c = tiny();
  c.max_reserved_bytes = 32 * kMiB;
  Allocator a(*t.sim, c);
  void* s = a.scratch_allocate(20 * kMiB, 0, t.s0);
  EXPECT_THROW((void)a.allocate(20 * kMiB, 0, t.s0), gvm::out_of_memory);
  EXPECT_LE(a.device_stats(0).reserved_bytes, 32 * kMiB);
  void* small = a.allocate(8 * kMiB, 0, t.s0);  // what the cap leaves
  EXPECT_LE(a.device_stats(0).reserved_bytes, 32 * kMiB);
  a.deallocate(small, 8 * kMiB, 0, t.s0);
  a.deallocate(s, 20 * kMiB, 0, t.s0);
  // The same through memory_fraction: 32 MiB of the device's memory.
  Config f = tiny();
  f.memory_fraction = static_cast<double>(32 * kMiB) / static_cast<double>(a.caps(1).total_memory);
  Allocator b(*t.sim, f);
  void* s2 = b.scratch_allocate(20 * kMiB, 1, t.s1);
  EXPECT_THROW((void)b.allocate(20 * kMiB, 1, t.s1), gvm::out_of_memory);
  EXPECT_LE(b.device_stats(1).reserved_bytes, 32 * kMiB + 2 * kMiB);
  b.deallocate(s2, 20 * kMiB, 1, t.s1);
}

}  // namespace
