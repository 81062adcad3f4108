// A release before a growth whose every chunk goes to that growth, and whose
// chunks only the growth's own stream may still be reading, hands the handles
// over with no host wait (Heap::hand_over_unfenced): the growth maps them at
// their new addresses while the old mappings stand, and the old mappings are
// unmapped once their work is known finished - at a later release, before
// anything maps their range again (after a wait if the work is still
// queued), at a trim, or at teardown. On a simulated H200, whose pending
// accesses stand for queued kernels: an unmap under one kills the context,
// so each case shows both that no wait was made and that nothing was
// unmapped under queued work.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "sim_allocator_fixture.hpp"

namespace gvm::test {
namespace {

using vmm::AccessKind;
using vmm::Call;
using vmm::Result;

constexpr std::size_t kMiB = std::size_t{1} << 20;

class UnfencedHandover : public SimAllocatorFixture {
 protected:
  // 8 MiB chunks: a 40 MiB hole is five chunks, a 60 MiB growth seven of
  // 8 MiB and one of 4 MiB, so the growth takes every handle of the hole.
  Allocator& make_small_chunks(std::size_t cap = 0) {
    Config c;
    c.max_chunk_bytes = 8 * kMiB;
    c.max_reserved_bytes = cap;
    return make(c);
  }
  ::testing::AssertionResult context_alive() const {
    if (sim_->sticky_error() == Result::success) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the context died: " << vmm::result_name(sim_->sticky_error());
  }
  // 4 MiB kept live behind a 40 MiB hole that a kernel on `reader` still
  // reads (queued, not done) when the hole is freed on the legacy stream.
  // Returns the 4 MiB block; *hole_at the hole's address.
  void* keep_behind_a_read_hole(Allocator& a, vmm::StreamHandle reader, void** hole_at) {
    void* hole = a.allocate(40 * kMiB, 0, nullptr);
    void* keep = a.allocate(4 * kMiB, 0, nullptr);
    if (reader != nullptr) a.record_stream(hole, reader);
    EXPECT_EQ(sim_->enqueue_access(0, reader, reinterpret_cast<vmm::DevicePtr>(hole), 40 * kMiB,
                                   AccessKind::read),
              Result::success);
    a.deallocate(hole, 40 * kMiB, 0, nullptr);
    *hole_at = hole;
    return keep;
  }
};

// The growth takes the hole's five handles with no host wait while the kernel
// still reads the hole; the old mappings stand until a query sees the work
// done, and a trim after it leaves none.
TEST_F(UnfencedHandover, TheGrowthsOwnStreamsQueuedReadNeedsNoWait) {
  Allocator& a = make_small_chunks();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  const std::size_t mappings = sim_->live_mappings();
  const std::uint64_t syncs = calls(Call::event_synchronize) + calls(Call::stream_synchronize) +
                              calls(Call::ctx_synchronize);
  const DeviceStats before = stats();
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  const DeviceStats s = stats();
  EXPECT_TRUE(context_alive());
  EXPECT_EQ(s.fences, before.fences) << "no host wait";
  EXPECT_EQ(calls(Call::event_synchronize) + calls(Call::stream_synchronize) +
                calls(Call::ctx_synchronize),
            syncs);
  EXPECT_EQ(s.chunks_reused, before.chunks_reused + 5);
  EXPECT_EQ(calls(Call::mem_release), 0u);
  // Eight chunks mapped under the new block, the hole's five still mapped at
  // their old addresses too: one handle, one charge.
  EXPECT_EQ(sim_->live_mappings(), mappings + 8);
  EXPECT_EQ(s.reserved_bytes, 64 * kMiB);
  EXPECT_EQ(s.peak_reserved_bytes, 64 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  // The new block is written on the same stream, after the read: stream order.
  EXPECT_EQ(sim_->enqueue_access(0, nullptr, reinterpret_cast<vmm::DevicePtr>(big), 60 * kMiB,
                                 AccessKind::write),
            Result::success);
  EXPECT_TRUE(sim_->races().empty());
  sim_->complete_all();
  a.trim(0);  // the old mappings go (their work is done), then the idle chunks
  EXPECT_TRUE(context_alive());
  EXPECT_EQ(sim_->live_mappings(), mappings + 8 - 5);
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  a.trim(0);
  EXPECT_EQ(sim_->live_mappings(), 0u);
  EXPECT_EQ(sim_->live_handles(), 0u);
  EXPECT_TRUE(invariants());
}

// Another stream may still read the hole (record_stream): the new block's
// stream is not behind that work, so the release waits as before.
TEST_F(UnfencedHandover, AnotherStreamsQueuedReadIsWaitedFor) {
  Allocator& a = make_small_chunks();
  const vmm::StreamHandle side = new_stream();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, side, &hole);
  const DeviceStats before = stats();
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  EXPECT_TRUE(context_alive());
  EXPECT_EQ(stats().fences, before.fences + 1);
  EXPECT_EQ(stats().chunks_reused, before.chunks_reused + 5);
  EXPECT_EQ(sim_->pending_accesses(), 0u) << "the wait completed the side stream's read";
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// A block placed over an old mapping's range, while its read is still
// queued: the growth waits for the read, unmaps the old mapping, then maps.
TEST_F(UnfencedHandover, AGrowthOverAnOldMappingWaitsForItsWorkFirst) {
  Allocator& a = make_small_chunks();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  ASSERT_EQ(stats().fences, 0u);
  const std::uint64_t syncs = calls(Call::event_synchronize);
  // The hole's range is free and unmapped in the arena's books: the exact fit.
  void* again = a.allocate(40 * kMiB, 0, nullptr);
  EXPECT_EQ(again, hole);
  EXPECT_TRUE(context_alive());
  EXPECT_GT(calls(Call::event_synchronize), syncs) << "a wait before the unmap";
  EXPECT_EQ(sim_->pending_accesses(), 0u);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  for (void* p : {again, big}) a.deallocate(p, p == big ? 60 * kMiB : 40 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// Teardown with an old mapping standing: the allocator's end fences the
// device and every mapping goes, the old ones included.
TEST_F(UnfencedHandover, TeardownUnmapsTheOldMappings) {
  Allocator& a = make_small_chunks();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  ASSERT_EQ(stats().fences, 0u);
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  alloc_.reset();
  EXPECT_TRUE(context_alive());
  EXPECT_EQ(sim_->live_mappings(), 0u);
  EXPECT_EQ(sim_->live_handles(), 0u);
}

// The growth fails after the handover (its first cuMemMap): the handles it
// took are released, and their memory leaves the device with the old
// mappings, unmapped after a wait for the read - nothing held, nothing
// counted that the device does not hold.
TEST_F(UnfencedHandover, AGrowthThatFailsAfterTheHandoverGivesTheMemoryBack) {
  Allocator& a = make_small_chunks();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  sim_->fail_call(Call::mem_map, 1, Result::unknown);
  EXPECT_THROW((void)a.allocate(60 * kMiB, 0, nullptr), vmm::DriverError);
  sim_->clear_faults();
  EXPECT_TRUE(context_alive());
  EXPECT_EQ(stats().reserved_bytes, 4 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_EQ(sim_->live_handles(), 1u);
  EXPECT_TRUE(invariants());
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// A release for another heap's growth (here the peer scratch's) waits as
// before: the handles would be mapped in that heap, whose later release of
// them could not see the old mappings standing in this one (found by the
// fuzzer: the device held 2 MiB the allocator did not count).
TEST_F(UnfencedHandover, AReleaseForAnotherHeapsGrowthWaits) {
  Config c;
  c.max_chunk_bytes = 8 * kMiB;
  c.scratch_chunk_bytes = 8 * kMiB;  // the scratch's chunks take the hole's handles
  c.max_reserved_bytes = 48 * kMiB;  // the cap makes the hole go for the scratch
  Allocator& a = make(c);
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  const DeviceStats before = stats();
  void* scratch = a.scratch_allocate(40 * kMiB, 0, nullptr);
  EXPECT_TRUE(context_alive());
  EXPECT_EQ(stats().fences, before.fences + 1);
  EXPECT_EQ(stats().chunks_reused, before.chunks_reused + 5);
  EXPECT_EQ(sim_->pending_accesses(), 0u);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  a.deallocate(scratch, 40 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  a.trim(0);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_EQ(sim_->live_mappings(), 0u);
  EXPECT_TRUE(invariants());
}

// An old mapping whose unmap the driver refuses stays, and the handle it
// maps is not released under it: a trim then keeps that chunk mapped and
// counted (found by the fuzzer: the device held 2 MiB the allocator no
// longer counted). The next trim, with the driver working, returns both.
TEST_F(UnfencedHandover, AHandleIsNotReleasedWhileAnOldMappingOfItStands) {
  Allocator& a = make_small_chunks();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  ASSERT_EQ(stats().fences, 0u);
  sim_->complete_all();
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  // The trim unmaps the five old mappings first (the first refused), after
  // its fence tries the refused one again (the sixth unmap, refused too),
  // then releases the idle chunks (the handle of that mapping is one of
  // them) and, before giving address space back, tries that mapping once
  // more: refused every time from the 14th unmap on, so that it stands when
  // the trim ends.
  sim_->fail_call(Call::mem_unmap, 1, Result::unknown);
  sim_->fail_call(Call::mem_unmap, 6, Result::unknown);
  for (int n = 14; n <= 16; ++n) sim_->fail_call(Call::mem_unmap, n, Result::unknown);
  try {
    a.trim(0);
  } catch (const vmm::DriverError&) {
  }
  sim_->clear_faults();
  EXPECT_TRUE(context_alive());
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  EXPECT_GE(stats().reserved_bytes, 4 * kMiB + 8 * kMiB) << "the chunk of the standing mapping";
  a.trim(0);
  EXPECT_EQ(stats().reserved_bytes, 4 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  a.trim(0);
  EXPECT_EQ(sim_->live_mappings(), 0u);
  EXPECT_EQ(sim_->live_handles(), 0u);
  EXPECT_TRUE(invariants());
}

// A handle handed over twice before its first old mapping went (the read
// under it still queued) has two old mappings. When the growth that took it
// fails and the unmaps fail too, its memory is owed: the device holds it
// until its last mapping goes, so the credit waits for that one, not the
// first of the two.
TEST_F(UnfencedHandover, AHandleHandedOverTwiceIsCreditedWhenItsLastOldMappingGoes) {
  Allocator& a = make_small_chunks();
  void* hole = nullptr;
  void* keep = keep_behind_a_read_hole(a, nullptr, &hole);
  // The first handover: five handles of the hole, their old mappings stand.
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  ASSERT_EQ(stats().fences, 0u);
  // Too large for the hole: after `big`, so that `big` is a hole of its own.
  void* after = a.allocate(48 * kMiB, 0, nullptr);
  ASSERT_EQ(sim_->enqueue_access(0, nullptr, reinterpret_cast<vmm::DevicePtr>(big), 60 * kMiB,
                                 AccessKind::read),
            Result::success);
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  // The second handover takes big's eight handles, five of them with an old
  // mapping standing in the first hole; its growth fails at its first map and
  // every unmap fails, so all thirteen old mappings stand, owed.
  const std::uint64_t releases = calls(Call::mem_release);
  sim_->fail_call(Call::mem_map, 1, Result::unknown);
  sim_->fail_every_call(Call::mem_unmap, Result::unknown);
  EXPECT_THROW((void)a.allocate(100 * kMiB, 0, nullptr), vmm::DriverError);
  sim_->clear_faults();
  ASSERT_GT(calls(Call::mem_release), releases) << "the growth released the handles it took";
  ASSERT_EQ(sim_->live_mappings(), 1u + 6u + 5u + 8u) << "keep's, after's, and 13 old mappings";
  EXPECT_TRUE(device_holds_reserved());
  // A trim unmaps the first hole's five (the first five unmaps), not big's:
  // the five handles are still mapped at big's old address.
  for (int n = 6; n <= 60; ++n) sim_->fail_call(Call::mem_unmap, n, Result::unknown);
  try {
    a.trim(0);
  } catch (const vmm::DriverError&) {
  }
  sim_->clear_faults();
  EXPECT_TRUE(context_alive());
  ASSERT_EQ(sim_->live_mappings(), 1u + 6u + 8u) << "keep's, after's, and big's old mappings";
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  a.trim(0);
  EXPECT_EQ(stats().reserved_bytes, 4 * kMiB + 48 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(after, 48 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  a.trim(0);
  EXPECT_EQ(sim_->live_mappings(), 0u);
  EXPECT_EQ(sim_->live_handles(), 0u);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
}

}  // namespace
}  // namespace gvm::test
