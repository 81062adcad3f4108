// A release before a growth hands the handles it unmaps to that growth
// (allocator/src/handle_stash.hpp): a chunk of the growth whose size a
// released chunk had is mapped with that chunk's handle - a cuMemCreate and a
// cuMemRelease fewer - and what no chunk takes is released before any new
// chunk is made. On a simulated H200: what the driver is asked, what the
// device holds, and that nothing is lost when a step fails.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

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

class HandleReuse : public SimAllocatorFixture {
 protected:
  // 8 MiB chunks: a 40 MiB hole is five chunks, a 60 MiB growth seven of
  // 8 MiB and one of 4 MiB.
  Allocator& make_small_chunks(std::size_t cap = 0) {
    Config c;
    c.max_chunk_bytes = 8 * kMiB;
    c.max_reserved_bytes = cap;
    return make(c);
  }
  std::uint64_t calls(Call c) const { return sim_->call_count(c); }
  // What the allocator counts as reserved is what the device holds.
  ::testing::AssertionResult device_holds_reserved() const {
    const std::size_t held = sim_->physical_used(0), reserved = stats().reserved_bytes;
    if (held == reserved) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the device holds " << held << " bytes, the allocator reserves " << reserved;
  }
  // The setting of every case: 4 MiB kept live behind a freed 40 MiB hole
  // (with make_small_chunks, five wholly free 8 MiB chunks); returns the
  // 4 MiB block.
  static void* keep_behind_a_hole(Allocator& a) {
    void* hole = a.allocate(40 * kMiB, 0, nullptr);
    void* keep = a.allocate(4 * kMiB, 0, nullptr);
    a.deallocate(hole, 40 * kMiB, 0, nullptr);
    return keep;
  }
};

// A 60 MiB request behind the hole sets a new peak of reserved bytes, so the
// free chunks go first (design-notes, rule 2).
TEST_F(HandleReuse, AGrowthMapsTheHandlesItsReleaseUnmappedWhereTheSizesMatch) {
  Allocator& a = make_small_chunks();
  void* keep = keep_behind_a_hole(a);
  ASSERT_EQ(stats().reserved_bytes, 44 * kMiB);
  const std::uint64_t creates = calls(Call::mem_create), releases = calls(Call::mem_release);
  const std::uint64_t maps = calls(Call::mem_map), grants = calls(Call::mem_set_access);
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  const DeviceStats s = stats();
  EXPECT_EQ(s.fences, 1u);
  EXPECT_EQ(s.chunks_unmapped, 5u);  // the hole's chunks, unmapped
  EXPECT_EQ(s.chunks_reused, 5u);    // and mapped again under the new block
  // Eight chunks mapped and granted, three of them new; nothing released.
  EXPECT_EQ(calls(Call::mem_map) - maps, 8u);
  EXPECT_EQ(calls(Call::mem_set_access) - grants, 8u);
  EXPECT_EQ(calls(Call::mem_create) - creates, 3u);
  EXPECT_EQ(calls(Call::mem_release) - releases, 0u);
  // The same memory as releasing and creating: 4 + 60 MiB, and no more at
  // any moment.
  EXPECT_EQ(s.reserved_bytes, 64 * kMiB);
  EXPECT_EQ(s.peak_reserved_bytes, 64 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// A handle mapped again is granted again: its new address is the owner's to
// use (a kernel there would kill the context if it were not), and the data
// written through it is where it was written.
TEST_F(HandleReuse, AReusedHandleIsGrantedAtItsNewAddressAndHoldsWhatIsWrittenThere) {
  sim_->enable_backing(true);
  Allocator& a = make_small_chunks();
  void* keep = keep_behind_a_hole(a);
  auto* big = static_cast<unsigned char*>(a.allocate(60 * kMiB, 0, nullptr));
  ASSERT_EQ(stats().chunks_reused, 5u);
  const auto addr = reinterpret_cast<vmm::DevicePtr>(big);
  EXPECT_EQ(sim_->enqueue_access(0, nullptr, addr, 60 * kMiB, AccessKind::write), Result::success);
  sim_->complete_all();
  EXPECT_EQ(sim_->sticky_error(), Result::success);
  std::vector<unsigned char> in(60 * kMiB), out(60 * kMiB);
  for (std::size_t i = 0; i < in.size(); i += 4096)
    in[i] = static_cast<unsigned char>(i / 4096 * 7 + 1);
  ASSERT_EQ(sim_->memcpy_htod(0, addr, in.data(), in.size()), Result::success);
  ASSERT_EQ(sim_->memcpy_dtoh(0, out.data(), addr, out.size()), Result::success);
  EXPECT_EQ(in, out);
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// Kept handles that fit no chunk of the growth are released before any new
// chunk is made: on a device that holds exactly what is needed after the
// release, creating first would run out of memory and retry.
TEST_F(HandleReuse, HandlesNoChunkTakesAreReleasedBeforeANewChunkIsMade) {
  Allocator& a = make();  // 128 MiB chunks: the 40 MiB chunk fits no piece of 60 MiB
  void* keep = keep_behind_a_hole(a);
  sim_->set_physical_budget(0, 64 * kMiB);
  const std::uint64_t releases = calls(Call::mem_release);
  void* big = a.allocate(60 * kMiB, 0, nullptr);
  EXPECT_EQ(stats().oom_retries, 0u);
  EXPECT_EQ(stats().chunks_reused, 0u);
  EXPECT_EQ(calls(Call::mem_release) - releases, 1u);
  EXPECT_EQ(stats().reserved_bytes, 64 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  a.deallocate(big, 60 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
}

// The reserved-bytes cap refuses the growth after its release kept handles
// for it: they are released, the device holds what the allocator reserves,
// and the next allocation that fits works.
TEST_F(HandleReuse, KeptHandlesAreReleasedWhenTheCapRefusesTheGrowth) {
  Allocator& a = make_small_chunks(/*cap=*/64 * kMiB);
  void* keep = keep_behind_a_hole(a);
  EXPECT_THROW((void)a.allocate(72 * kMiB, 0, nullptr), out_of_memory);
  EXPECT_EQ(stats().reserved_bytes, 4 * kMiB);
  EXPECT_EQ(stats().chunks_reused, 0u);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_TRUE(invariants());
  void* fits = a.allocate(56 * kMiB, 0, nullptr);
  EXPECT_EQ(stats().reserved_bytes, 60 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(fits, 56 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// A driver call that fails part-way through mapping the kept handles (the
// map of the second, the grant of the third) fails the allocation with the
// driver's error and loses nothing: every handle made or kept for it is
// released, and the same request works once the driver does.
TEST_F(HandleReuse, AFailureWhileMappingKeptHandlesReleasesThemAll) {
  for (const Call failing : {Call::mem_map, Call::mem_set_access}) {
    SCOPED_TRACE(failing == Call::mem_map ? "cuMemMap" : "cuMemSetAccess");
    Allocator& a = make_small_chunks();
    void* keep = keep_behind_a_hole(a);
    sim_->fail_call(failing, failing == Call::mem_map ? 2 : 3, Result::unknown);
    EXPECT_THROW((void)a.allocate(60 * kMiB, 0, nullptr), vmm::DriverError);
    sim_->clear_faults();
    EXPECT_EQ(stats().live_bytes, 4 * kMiB);
    EXPECT_EQ(stats().reserved_bytes, 4 * kMiB);
    EXPECT_TRUE(device_holds_reserved());
    EXPECT_EQ(sim_->live_handles(), 1u);  // the kept block's chunk
    EXPECT_TRUE(invariants());
    void* big = a.allocate(60 * kMiB, 0, nullptr);
    EXPECT_EQ(stats().reserved_bytes, 64 * kMiB);
    EXPECT_TRUE(device_holds_reserved());
    a.deallocate(big, 60 * kMiB, 0, nullptr);
    a.deallocate(keep, 4 * kMiB, 0, nullptr);
    EXPECT_TRUE(invariants());
  }
}

// A release the cap asks for fails part-way (the third chunk's cuMemUnmap):
// the allocation fails with the driver's error, and the handles the release
// had already unmapped and kept for the growth are released and credited,
// not lost: the device holds what the allocator reserves, the chunk whose
// unmap failed stays mapped and counted, and the request works once the
// driver does.
TEST_F(HandleReuse, AReleaseThatFailsPartWayReleasesWhatItKept) {
  Config c;
  c.max_chunk_bytes = 8 * kMiB;
  c.max_reserved_bytes = 64 * kMiB;
  c.reserve_slack = -1;  // only the cap releases: its failure is the allocation's
  Allocator& a = make(c);
  void* keep = keep_behind_a_hole(a);
  sim_->fail_call(Call::mem_unmap, 3, Result::unknown);
  EXPECT_THROW((void)a.allocate(56 * kMiB, 0, nullptr), vmm::DriverError);
  sim_->clear_faults();
  EXPECT_EQ(stats().live_bytes, 4 * kMiB);
  EXPECT_EQ(stats().reserved_bytes, 12 * kMiB);  // the kept block's chunk and the one not unmapped
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_EQ(sim_->live_handles(), 2u);
  EXPECT_TRUE(invariants());
  void* big = a.allocate(56 * kMiB, 0, nullptr);
  EXPECT_EQ(stats().reserved_bytes, 60 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  a.deallocate(big, 56 * kMiB, 0, nullptr);
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
  EXPECT_TRUE(invariants());
}

// The cap refuses the growth after its release kept handles for it, and the
// cuMemRelease of one of them fails once: it is tried again, so the device
// holds what the allocator counts (found by the fuzzer's driver faults: the
// handle was released once, in its owner's destructor, and lost).
TEST_F(HandleReuse, AKeptHandleWhoseReleaseFailsOnceIsReleasedAllTheSame) {
  Allocator& a = make_small_chunks(/*cap=*/64 * kMiB);
  void* keep = keep_behind_a_hole(a);
  sim_->fail_call(Call::mem_release, 2, Result::unknown);
  EXPECT_THROW((void)a.allocate(72 * kMiB, 0, nullptr), out_of_memory);
  sim_->clear_faults();
  EXPECT_EQ(stats().reserved_bytes, 4 * kMiB);
  EXPECT_TRUE(device_holds_reserved());
  EXPECT_EQ(sim_->live_handles(), 1u);
  EXPECT_TRUE(invariants());
  a.deallocate(keep, 4 * kMiB, 0, nullptr);
}

}  // namespace
}  // namespace gvm::test
