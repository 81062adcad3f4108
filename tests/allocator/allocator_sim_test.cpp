// gvm::Allocator on SimDriver: what only the simulator can show.
//
//   StreamOrder   a block handed from one stream to another never races
//                 (SimDriver's vector clocks), and a hand-built sequence
//                 without the event wait does race (so the test can fail)
//   Fence         trim, release-before-growth, the OOM release and the
//                 release threshold unmap chunks with work still pending on
//                 them: no sticky error with the fence, a sticky
//                 illegal_address with Config::fence_enabled = false
//   Faults        one failed cuMemAddressReserve / cuMemCreate / cuMemMap /
//                 cuMemSetAccess / cuMemAlloc / event call during an
//                 allocation: the right error, nothing leaked, nothing
//                 counted, and the next allocation works
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "sim_allocator_fixture.hpp"

namespace gvm::test {
namespace {

using vmm::AccessKind;
using vmm::Call;
using vmm::Result;
using vmm::SimDriver;
using vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGranule = 2 * kMiB;
constexpr std::size_t kTinyBudget = 64 * kMiB;

vmm::DevicePtr dptr(const void* p) {
  return reinterpret_cast<vmm::DevicePtr>(p);
}

// The first race the simulator saw, for failure messages.
std::string first_race(const SimDriver& sim) {
  const auto r = sim.races();
  return r.empty() ? std::string("no race") : r.front();
}

::testing::AssertionResult ok(Result r) {
  if (r == Result::success) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << vmm::result_name(r);
}

// Two simulated H200s with a 64 MiB budget each (tiny: OOM in milliseconds).
class SimAllocatorTest : public SimAllocatorFixture {
 protected:
  SimAllocatorTest() : SimAllocatorFixture(2) {
    for (int d = 0; d < 2; ++d) sim_->set_physical_budget(d, kTinyBudget);
  }

  static Config tiny(Config c = {}) {
    c.max_chunk_bytes = kGranule;
    return c;
  }
  // Small blocks from spans from the first allocation on, in every class
  // (tests of spans; by default a class is served best fit until it is warm,
  // and a class of slots above span_max always).
  static Config spans_now(Config c) {
    c.span_warmup_allocations = 0;
    c.span_max_bytes = c.small_block_max_bytes;
    return c;
  }
  // The driver objects that must not leak.
  struct Counts {
    std::size_t reservations, handles, mappings, classic, events, used;
    friend bool operator==(const Counts&, const Counts&) = default;
  };
  Counts counts() const {
    return {sim_->live_reservations(),        sim_->live_handles(), sim_->live_mappings(),
            sim_->live_classic_allocations(), sim_->live_events(),  sim_->physical_used(0)};
  }

  SimDriver& sim() { return *sim_; }
};

// ============================================================ stream order ==

enum class Legacy { none, first, second };  // which stream is the legacy one
struct OrderCase {
  bool no_vmm;
  bool small;
  Legacy legacy;
};

std::string order_name(const OrderCase& c) {
  std::string n = c.no_vmm ? "no_vmm" : "vmm";
  n += c.small ? "_small" : "_large";
  if (c.legacy == Legacy::first) n += "_from_legacy";
  if (c.legacy == Legacy::second) n += "_to_legacy";
  return n;
}
void PrintTo(const OrderCase& c, std::ostream* os) {
  *os << order_name(c);
}

class StreamOrder : public SimAllocatorTest, public ::testing::WithParamInterface<OrderCase> {
 protected:
  void SetUp() override {
    Config c = spans_now(tiny());
    c.force_no_vmm = GetParam().no_vmm;
    make(c);
    s_ = GetParam().legacy == Legacy::first ? nullptr : new_stream();
    t_ = GetParam().legacy == Legacy::second ? nullptr : new_stream();
  }
  // 256 KiB slots: 8 per span. Large blocks straddle granules.
  std::size_t size() const { return GetParam().small ? 256 * 1024 : 3 * kMiB + 7; }
  Allocator& a() { return *alloc_; }
  ::testing::AssertionResult write(StreamHandle s, void* p, std::size_t n) {
    return ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write));
  }
  ::testing::AssertionResult read(StreamHandle s, void* p, std::size_t n) {
    return ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::read));
  }
  // Orders `later` after everything queued on `earlier` so far, as a user of
  // two streams does (an event, no host sync).
  void user_orders(StreamHandle earlier, StreamHandle later) {
    vmm::EventHandle e = nullptr;
    ASSERT_TRUE(ok(sim().event_create(0, &e)));
    ASSERT_TRUE(ok(sim().event_record(0, e, earlier)));
    ASSERT_TRUE(ok(sim().stream_wait_event(0, later, e)));
    ASSERT_TRUE(ok(sim().event_destroy(e)));
  }

  // Blocks written on s_ and freed on s_, of which the one at `handed` is
  // what the next allocation on t_ gets (same address). Small blocks: three
  // spans of one class, all freed; the middle one goes back to the large
  // pool (the cache keeps its current span and one spare), a hole exactly
  // one granule wide, which is where t_'s first span goes.
  void* written_then_freed_on_s() {
    const std::size_t n = size();
    if (!GetParam().small) {
      void* p = a().allocate(n, 0, s_);
      EXPECT_TRUE(write(s_, p, n));
      a().deallocate(p, n, 0, s_);
      return p;
    }
    std::vector<void*> blocks;
    for (int i = 0; i < 24; ++i) {
      blocks.push_back(a().allocate(n, 0, s_));
      EXPECT_TRUE(write(s_, blocks.back(), n));
    }
    for (void* p : blocks) a().deallocate(p, n, 0, s_);
    return blocks[8];  // slot 0 of the second span
  }

  StreamHandle s_ = nullptr, t_ = nullptr;
};

TEST_P(StreamOrder, BlockFreedOnOneStreamIsTakenByAnotherWithoutARace) {
  void* p = written_then_freed_on_s();
  const std::uint64_t waits = a().device_stats(0).cross_stream_waits;
  void* q = a().allocate(size(), 0, t_);
  ASSERT_EQ(q, p) << "the test expects the freed block to be handed to the other stream";
  EXPECT_TRUE(write(t_, q, size()));
  EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
  EXPECT_GT(a().device_stats(0).cross_stream_waits, waits);
  // Ordered by a stream wait, not a host sync: the first stream's work is
  // still pending.
  EXPECT_GT(sim().pending_accesses(), 0u);
  a().deallocate(q, size(), 0, t_);
  EXPECT_TRUE(invariants());
}

TEST_P(StreamOrder, WithoutTheEventTheSimulatorReportsTheRace) {
  // The same two writes, built by hand with no wait between the streams:
  // this is what the test above would see if gvmalloc did not order them.
  void* p = a().allocate(size(), 0, s_);
  ASSERT_TRUE(write(s_, p, size()));
  ASSERT_TRUE(write(t_, p, size()));
  EXPECT_EQ(sim().race_count(), 1u);
  sim().clear_races();
  // And with the event, none.
  user_orders(t_, s_);
  ASSERT_TRUE(write(s_, p, size()));
  EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
  a().deallocate(p, size(), 0, s_);
}

TEST_P(StreamOrder, RecordStreamOrdersTheNextUserAfterTheRecordedStream) {
  for (bool record : {true, false}) {
    SCOPED_TRACE(record ? "with record_stream" : "without record_stream (must race)");
    // A fresh allocator each time: free blocks keep the streams that used
    // them, which would order the control case by accident.
    Config c = tiny();
    c.force_no_vmm = GetParam().no_vmm;
    make(c);
    sim().clear_races();
    sim().complete_all();
    void* p = a().allocate(size(), 0, s_);
    ASSERT_TRUE(write(s_, p, size()));
    user_orders(s_, t_);
    ASSERT_TRUE(read(t_, p, size()));
    if (record) a().record_stream(p, t_);
    a().deallocate(p, size(), 0, s_);
    void* q = a().allocate(size(), 0, s_);  // the same stream takes it back at once
    ASSERT_EQ(q, p);
    ASSERT_TRUE(write(s_, q, size()));
    if (record) {
      EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    } else {
      // The control: nothing told gvmalloc about t_, so s_'s write races
      // t_'s read. This is why record_stream exists.
      EXPECT_EQ(sim().race_count(), 1u);
    }
    a().deallocate(q, size(), 0, s_);
    EXPECT_TRUE(invariants());
  }
}

TEST_P(StreamOrder, FreeOnAnotherStreamOrdersTheReuse) {
  void* p = a().allocate(size(), 0, s_);
  ASSERT_TRUE(write(s_, p, size()));
  user_orders(s_, t_);
  ASSERT_TRUE(write(t_, p, size()));
  a().deallocate(p, size(), 0, t_);  // last used on t_: freed there
  void* q = a().allocate(size(), 0, s_);
  ASSERT_EQ(q, p);
  ASSERT_TRUE(write(s_, q, size()));
  EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
  a().deallocate(q, size(), 0, s_);
  // A third stream that takes it after both (large blocks: the same block).
  if (!GetParam().small) {
    StreamHandle u = new_stream();
    void* r = a().allocate(size(), 0, u);
    ASSERT_EQ(r, p);
    ASSERT_TRUE(write(u, r, size()));
    EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    a().deallocate(r, size(), 0, u);
  }
  EXPECT_TRUE(invariants());
}

std::vector<OrderCase> order_cases() {
  std::vector<OrderCase> v;
  for (bool no_vmm : {false, true})
    for (bool small : {false, true})
      for (Legacy l : {Legacy::none, Legacy::first, Legacy::second})
        v.push_back({no_vmm, small, l});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sim, StreamOrder, ::testing::ValuesIn(order_cases()),
                         [](const ::testing::TestParamInfo<OrderCase>& i) {
                           return order_name(i.param);
                         });

// Blocks one stream freed together carry one token. The stream that then
// takes them one by one (here: stolen from the first stream's heap) waits for
// it once: the first cuStreamWaitEvent orders it after all of them. No race
// on the simulator, and one wait, not one per block.
TEST_F(SimAllocatorTest, BlocksFreedTogetherCostTheirTakerOneStreamWait) {
  Allocator& a = make(tiny());
  const StreamHandle s = new_stream(), t = new_stream();
  constexpr std::size_t n = 3 * kMiB;
  std::set<void*> freed;
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(a.allocate(n, 0, s));
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(blocks.back()), n, AccessKind::write)));
  }
  for (void* p : blocks) {
    a.deallocate(p, n, 0, s);
    freed.insert(p);
  }
  const std::size_t wait = static_cast<std::size_t>(Call::stream_wait_event);
  const std::uint64_t waits_before = a.stats().driver.calls[wait];
  std::vector<void*> taken;
  for (int i = 0; i < 4; ++i) {
    taken.push_back(a.allocate(n, 0, t));
    ASSERT_EQ(freed.count(taken.back()), 1u)
        << "the test expects the other stream's freed blocks to be handed to t";
    ASSERT_TRUE(ok(sim().enqueue_access(0, t, dptr(taken.back()), n, AccessKind::write)));
  }
  EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
  EXPECT_EQ(a.stats().driver.calls[wait] - waits_before, 1u);
  for (void* p : taken) a.deallocate(p, n, 0, t);
  EXPECT_TRUE(invariants());
}

// =================================================================== fence ==

// Each scenario leaves a write pending on a cached chunk and then makes the
// allocator unmap it. With the fence: no sticky error, the work was waited
// for. Without (fence_enabled = false): the simulator's context dies, which
// shows the fence is what prevents it.
class Fence : public SimAllocatorTest, public ::testing::WithParamInterface<bool> {
 protected:
  bool fenced() const { return GetParam(); }
  Config config(Config c = tiny()) const {
    c.fence_enabled = fenced();
    return c;
  }
  // What the scenario must end in.
  void expect_outcome() {
    if (fenced()) {
      EXPECT_EQ(sim().sticky_error(), Result::success);
      EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    } else {
      EXPECT_EQ(sim().sticky_error(), Result::illegal_address)
          << "an unfenced unmap under pending work must kill the context";
      sim().clear_sticky();  // so that the allocator can be torn down
    }
  }
  // Runs `unmapping` (which must unmap a chunk): with the fence it must not
  // throw; without, the driver's error may surface as driver_error.
  template <class Fn>
  void run(Fn unmapping) {
    if (fenced()) {
      EXPECT_NO_THROW(unmapping());
    } else {
      try {
        unmapping();
      } catch (const driver_error&) {
        // the unmap itself reported the dead context
      }
    }
  }
};

TEST_P(Fence, TrimUnderPendingWork) {
  for (std::size_t n : {3 * kMiB + 7, std::size_t{4096}}) {
    SCOPED_TRACE(n);
    Allocator& a = make(config());
    StreamHandle s = new_stream();
    void* p = a.allocate(n, 0, s);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
    a.deallocate(p, n, 0, s);
    const std::uint64_t unmapped = a.device_stats(0).chunks_unmapped;
    run([&] { a.trim(); });
    if (fenced()) {
      EXPECT_GT(a.device_stats(0).chunks_unmapped, unmapped);
      EXPECT_EQ(sim().pending_accesses(), 0u);
      EXPECT_TRUE(invariants());
    }
    expect_outcome();
    alloc_.reset();
    sim().complete_all();
  }
}

TEST_P(Fence, ReleaseBeforeGrowthUnderPendingWork) {
  Allocator& a = make(config());
  StreamHandle s = new_stream();
  // A freed block with a pending write, a pin after it, then a request too
  // big for the hole: release-before-growth unmaps the hole's chunks.
  const std::size_t n1 = 8 * kMiB, pin = 10 * kMiB, n2 = 12 * kMiB;
  void* p = a.allocate(n1, 0, s);
  void* q = a.allocate(pin, 0, s);
  ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n1, AccessKind::write)));
  a.deallocate(p, n1, 0, s);
  const std::uint64_t unmapped = a.device_stats(0).chunks_unmapped;
  void* r = nullptr;
  run([&] { r = a.allocate(n2, 0, s); });
  if (fenced()) {
    EXPECT_GT(a.device_stats(0).chunks_unmapped, unmapped)
        << "the scenario did not release before growing";
    a.deallocate(r, n2, 0, s);
  }
  expect_outcome();
  a.deallocate(q, pin, 0, s);
}

TEST_P(Fence, OutOfMemoryReleaseUnderPendingWork) {
  Config c = config();
  c.reserve_slack = -1;  // only the OOM path releases
  Allocator& a = make(c);
  StreamHandle s = new_stream();
  std::vector<void*> held;
  const std::size_t n = 8 * kMiB;
  for (std::size_t i = 0; i < kTinyBudget / n; ++i) held.push_back(a.allocate(n, 0, s));
  // Free all but every fourth (holes of 24 MiB); a write is pending on the first.
  ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(held[0]), n, AccessKind::write)));
  for (std::size_t i = 0; i < held.size(); ++i)
    if (i % 4 != 3) a.deallocate(held[i], n, 0, s);
  const std::uint64_t retries = a.device_stats(0).oom_retries;
  void* r = nullptr;
  // Wider than any hole: fits only once the driver has the cached chunks back.
  run([&] { r = a.allocate(4 * n, 0, s); });
  if (fenced()) {
    EXPECT_EQ(a.device_stats(0).oom_retries, retries + 1);
    a.deallocate(r, 4 * n, 0, s);
  }
  expect_outcome();
  for (std::size_t i = 3; i < held.size(); i += 4) a.deallocate(held[i], n, 0, s);
}

TEST_P(Fence, ReleaseThresholdUnderPendingWork) {
  Config c = config();
  c.release_threshold_bytes = 0;  // every free gives its chunks back
  Allocator& a = make(c);
  StreamHandle s = new_stream();
  const std::size_t n = 6 * kMiB;
  void* p = a.allocate(n, 0, s);
  ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
  run([&] { a.deallocate(p, n, 0, s); });
  if (fenced()) {
    EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
  }
  expect_outcome();
}

TEST_P(Fence, DestructionUnderPendingWork) {
  Allocator& a = make(config());
  StreamHandle s = new_stream();
  void* p = a.allocate(5 * kMiB, 0, s);
  ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), 5 * kMiB, AccessKind::read)));
  alloc_.reset();  // still live: its memory dies with the allocator
  if (fenced()) {
    EXPECT_EQ(sim().live_handles(), 0u);
  }
  expect_outcome();
}

INSTANTIATE_TEST_SUITE_P(Sim, Fence, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "fenced" : "unfenced");
                         });

// ================================================================== faults ==

struct FaultCase {
  const char* name;
  bool no_vmm;
  Call call;
  int nth;        // which call of the allocation fails
  Result result;  // what it returns
  bool small;     // through a new span
  int times = 1;  // that call and the ones after it fail
};

std::string fault_name(const ::testing::TestParamInfo<FaultCase>& info) {
  return info.param.name;
}
void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << c.name;
}

class Faults : public SimAllocatorTest, public ::testing::WithParamInterface<FaultCase> {
 protected:
  void* warm_small_ = nullptr;
};

TEST_P(Faults, FailedGrowthLeaksNothingAndTheNextAllocationWorks) {
  const FaultCase& f = GetParam();
  Config c = f.small ? spans_now(tiny()) : tiny();
  c.force_no_vmm = f.no_vmm;
  Allocator& a = make(c);
  const bool first_use = f.call == Call::address_reserve;
  if (!first_use) {
    // The arena exists and has cached memory; the request below needs growth
    // all the same (large: beyond the cached 4 MiB; small: a span of a new
    // class - a shared one, in a new host span - the mapped granule being
    // taken by the warm class's span, whose slots are too large to share).
    void* warm = a.allocate(f.small ? 100 * 1024 : 3 * kMiB, 0, nullptr);
    if (f.small) {
      warm_small_ = warm;
    } else {
      a.deallocate(warm, 3 * kMiB, 0, nullptr);
    }
  }
  // Large: 3 chunks of 2 MiB beyond what is mapped; small: a new span.
  const std::size_t n = f.small ? 3000 : 11 * kMiB + 1;
  const Counts before = counts();
  const DeviceStats stats_before = a.device_stats(0);
  for (int i = 0; i < f.times; ++i) sim().fail_call(f.call, f.nth + i, f.result);
  bool threw = false;
  try {
    void* p = a.allocate(n, 0, nullptr);
    // The fault did not fire (the allocation made fewer such calls), or a
    // retry absorbed it: a working block either way.
    a.deallocate(p, n, 0, nullptr);
  } catch (const out_of_memory& e) {
    threw = true;
    EXPECT_EQ(f.result, Result::out_of_memory) << e.what();
  } catch (const driver_error& e) {
    threw = true;
    EXPECT_NE(f.result, Result::out_of_memory) << e.what();
    EXPECT_EQ(e.result(), f.result) << e.what();
  }
  EXPECT_TRUE(threw) << "the injected failure was absorbed";
  sim().clear_faults();
  EXPECT_TRUE(invariants());
  if (threw) {
    // Nothing leaked: the driver holds no more than before (cached memory may
    // have been released on the way), and all it holds is accounted for.
    const Counts after = counts();
    EXPECT_LE(after.handles, before.handles);
    EXPECT_LE(after.mappings, before.mappings);
    EXPECT_LE(after.classic, before.classic);
    EXPECT_LE(after.used, before.used);
    EXPECT_LE(after.reservations, before.reservations);
    const DeviceStats s = a.device_stats(0);
    EXPECT_EQ(s.reserved_bytes, sim().physical_used(0));
    EXPECT_EQ(s.live_bytes, stats_before.live_bytes);
    EXPECT_EQ(s.allocations, stats_before.allocations);
  }
  // The next allocation works, and everything goes back.
  void* p = nullptr;
  ASSERT_NO_THROW(p = a.allocate(n, 0, nullptr));
  a.deallocate(p, n, 0, nullptr);
  if (!first_use && f.small) a.deallocate(warm_small_, 100 * 1024, 0, nullptr);
  a.trim();
  EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
  EXPECT_EQ(sim().physical_used(0), 0u);
  EXPECT_TRUE(invariants());
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

std::vector<FaultCase> fault_cases() {
  const Result err = Result::unknown;
  const Result oom = Result::out_of_memory;
  return {
      {"reserve", false, Call::address_reserve, 1, err, false},
      {"reserve_small", false, Call::address_reserve, 1, err, true},
      {"create_1st", false, Call::mem_create, 1, err, false},
      {"create_2nd", false, Call::mem_create, 2, err, false},
      {"create_3rd", false, Call::mem_create, 3, err, false},
      {"create_small", false, Call::mem_create, 1, err, true},
      {"create_oom_twice", false, Call::mem_create, 1, oom, false, 2},
      {"map_1st", false, Call::mem_map, 1, err, false},
      {"map_3rd", false, Call::mem_map, 3, err, false},
      {"map_small", false, Call::mem_map, 1, err, true},
      {"set_access_1st", false, Call::mem_set_access, 1, err, false},
      {"set_access_2nd", false, Call::mem_set_access, 2, err, false},
      {"set_access_small", false, Call::mem_set_access, 1, err, true},
      {"no_vmm_alloc", true, Call::mem_alloc, 1, err, false},
      {"no_vmm_alloc_small", true, Call::mem_alloc, 1, err, true},
  };
}

INSTANTIATE_TEST_SUITE_P(Sim, Faults, ::testing::ValuesIn(fault_cases()), fault_name);

// An injected OOM once is absorbed by the retry; twice is out_of_memory.
TEST_F(SimAllocatorTest, OneInjectedOutOfMemoryIsAbsorbedByTheRetry) {
  for (bool no_vmm : {false, true}) {
    SCOPED_TRACE(no_vmm ? "no VMM" : "VMM");
    Config c = tiny();
    c.force_no_vmm = no_vmm;
    Allocator& a = make(c);
    const Call create = no_vmm ? Call::mem_alloc : Call::mem_create;
    sim().fail_call(create, 1, Result::out_of_memory);
    void* p = nullptr;
    ASSERT_NO_THROW(p = a.allocate(5 * kMiB, 0, nullptr));
    EXPECT_EQ(a.device_stats(0).oom_retries, 1u);
    a.deallocate(p, 5 * kMiB, 0, nullptr);
    sim().fail_call(create, 1, Result::out_of_memory);
    sim().fail_call(create, 2, Result::out_of_memory);
    EXPECT_THROW(a.allocate(40 * kMiB, 0, nullptr), out_of_memory);
    EXPECT_EQ(a.device_stats(0).reserved_bytes, sim().physical_used(0));
    EXPECT_TRUE(invariants());
    sim().clear_faults();
    ASSERT_NO_THROW(p = a.allocate(40 * kMiB, 0, nullptr));
    a.deallocate(p, 40 * kMiB, 0, nullptr);
  }
}

// A failed event call while handing a block to another stream: the wait
// falls back to a device sync (slow, but ordered); only when that fails too
// is it a driver_error, with the block still free and nothing counted.
TEST_F(SimAllocatorTest, FailedStreamOrderWaitFallsBackToADeviceSync) {
  const std::size_t n = 3 * kMiB;
  for (Call call : {Call::event_create, Call::event_record, Call::stream_wait_event}) {
    for (bool sync_fails : {false, true}) {
      SCOPED_TRACE(std::string(vmm::call_name(call)) + (sync_fails ? ", and the sync" : ""));
      Allocator& a = make(tiny());
      StreamHandle s = new_stream(), t = new_stream();
      void* p = a.allocate(n, 0, s);
      ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
      a.deallocate(p, n, 0, s);
      const DeviceStats before = a.device_stats(0);
      sim().fail_call(call, 1, Result::unknown);
      if (sync_fails) sim().fail_call(Call::ctx_synchronize, 1, Result::unknown);
      void* q = nullptr;
      if (sync_fails) {
        EXPECT_THROW(q = a.allocate(n, 0, t), driver_error);
        sim().clear_faults();
        EXPECT_TRUE(invariants());
        EXPECT_EQ(a.device_stats(0).live_bytes, before.live_bytes);
        EXPECT_EQ(a.device_stats(0).allocations, before.allocations);
        q = a.allocate(n, 0, t);  // now with a working driver
      } else {
        EXPECT_NO_THROW(q = a.allocate(n, 0, t));
        EXPECT_EQ(sim().pending_accesses(), 0u) << "the fallback synchronized the device";
      }
      sim().clear_faults();
      EXPECT_EQ(q, p);
      ASSERT_TRUE(ok(sim().enqueue_access(0, t, dptr(q), n, AccessKind::write)));
      EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
      a.deallocate(q, n, 0, t);
      alloc_.reset();
      sim().complete_all();
    }
  }
}

// reserved_bytes (one atomic load, for the PyTorch backend's profiler
// reports) says what device_stats says, before the device is used, after it
// grows and after a trim; an unknown device is refused as by device_stats.
TEST_F(SimAllocatorTest, ReservedBytesIsWhatDeviceStatsSays) {
  Allocator& a = make();
  EXPECT_EQ(a.reserved_bytes(0), 0u);
  StreamHandle s = new_stream();
  void* p = a.allocate(9 * kMiB, 0, s);
  void* q = a.allocate(3000, 0, s);
  EXPECT_GT(a.reserved_bytes(0), 0u);
  EXPECT_EQ(a.reserved_bytes(0), a.device_stats(0).reserved_bytes);
  a.deallocate(p, 9 * kMiB, 0, s);
  a.trim();
  EXPECT_EQ(a.reserved_bytes(0), a.device_stats(0).reserved_bytes);
  EXPECT_EQ(a.reserved_bytes(0), sim().physical_used(0));
  a.deallocate(q, 3000, 0, s);
  EXPECT_THROW((void)a.reserved_bytes(a.device_count()), usage_error);
  EXPECT_THROW((void)a.reserved_bytes(-1), usage_error);
}

// A failed unmap during trim: driver_error, the chunk stays mapped and
// accounted for, and the next trim returns it.
TEST_F(SimAllocatorTest, FailedUnmapDuringTrimKeepsTheChunk) {
  for (Call call : {Call::mem_unmap, Call::mem_release, Call::event_record}) {
    SCOPED_TRACE(vmm::call_name(call));
    Allocator& a = make(tiny());
    StreamHandle s = new_stream();
    void* p = a.allocate(9 * kMiB, 0, s);
    a.deallocate(p, 9 * kMiB, 0, s);
    sim().fail_call(call, 1, Result::unknown);
    try {
      a.trim();
    } catch (const driver_error&) {
      // expected where the failing call is one trim cannot do without
    }
    sim().clear_faults();
    EXPECT_TRUE(invariants());
    EXPECT_EQ(a.device_stats(0).reserved_bytes, sim().physical_used(0));
    a.trim();
    EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
    EXPECT_EQ(sim().physical_used(0), 0u);
    EXPECT_EQ(sim().live_handles(), 0u);
    EXPECT_TRUE(invariants());
  }
}

// A trim of many chunks picks the wholly free ones in one walk and begins
// them in address order (LargeArena::releasable and its cursor): every chunk
// under a live block stays, every other one goes, and the blocks left are
// whole - with blocks across chunk edges, and freed in an order unlike
// their addresses.
TEST_F(SimAllocatorTest, TrimOfManyChunksReturnsExactlyTheWhollyFreeOnes) {
  Allocator& a = make(tiny());  // one 2 MiB granule per chunk
  StreamHandle s = new_stream();
  constexpr std::size_t kBlock = 3 * kMiB / 2;  // 1.5 MiB: blocks straddle chunk edges
  std::vector<void*> blocks;
  for (int i = 0; i < 36; ++i) blocks.push_back(a.allocate(kBlock, 0, s));
  std::vector<void*> live;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i % 5 == 0 || i % 7 == 3)
      live.push_back(blocks[i]);
    else
      a.deallocate(blocks[i], kBlock, 0, s);
  }
  sim().complete_all();
  a.trim();
  std::set<std::uintptr_t> granules;  // under a live block
  for (void* p : live)
    for (std::uintptr_t g = dptr(p) / kGranule; g <= (dptr(p) + kBlock - 1) / kGranule; ++g)
      granules.insert(g);
  EXPECT_EQ(a.device_stats(0).reserved_bytes, granules.size() * kGranule);
  EXPECT_EQ(sim().physical_used(0), granules.size() * kGranule);
  EXPECT_TRUE(invariants());
  // The blocks left are usable and whole: written across their length.
  for (void* p : live)
    EXPECT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), kBlock, AccessKind::write)));
  sim().complete_all();
  for (void* p : live) a.deallocate(p, kBlock, 0, s);
  sim().complete_all();
  a.trim();
  EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
  EXPECT_EQ(sim().physical_used(0), 0u);
  EXPECT_TRUE(invariants());
}

// ============================================ streams gone, driver trouble ==

// A stream destroyed by its owner after using a block must not make that
// block unusable: whoever takes it next cannot wait on the stream any more
// (its handle is invalid), so it must wait some other way, as the fence does.
TEST_F(SimAllocatorTest, DestroyedStreamDoesNotPoisonTheBlocksItUsed) {
  for (bool small : {false, true}) {
    SCOPED_TRACE(small ? "small" : "large");
    Allocator& a = make(tiny());
    StreamHandle s = new_stream(), t = nullptr;
    ASSERT_TRUE(ok(sim().stream_create(0, &t)));  // destroyed below, not by the fixture
    const std::size_t n = small ? 4096 : 3 * kMiB;
    void* p = a.allocate(n, 0, s);
    // t reads the block after s wrote it, and is recorded on it.
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
    vmm::EventHandle e = nullptr;
    ASSERT_TRUE(ok(sim().event_create(0, &e)));
    ASSERT_TRUE(ok(sim().event_record(0, e, s)));
    ASSERT_TRUE(ok(sim().stream_wait_event(0, t, e)));
    ASSERT_TRUE(ok(sim().event_destroy(e)));
    ASSERT_TRUE(ok(sim().enqueue_access(0, t, dptr(p), n, AccessKind::read)));
    a.record_stream(p, t);
    // As the CuPy and Numba integrations do when a stream object dies:
    // gvmalloc never touches the handle again (the driver may give it to a
    // new stream), and t's work is waited for through a device sync.
    a.forget_stream(t);
    ASSERT_TRUE(ok(sim().stream_destroy(0, t)));  // its read is still pending
    void* q = nullptr;
    EXPECT_NO_THROW({
      a.deallocate(p, n, 0, s);
      q = a.allocate(n, 0, s);
    });
    if (q != nullptr) {
      EXPECT_EQ(q, p);
      ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(q), n, AccessKind::write)));
      EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
      a.deallocate(q, n, 0, s);
    }
    EXPECT_TRUE(invariants());
    EXPECT_EQ(sim().sticky_error(), Result::success);
  }
}

// A stream destroyed with work queued, whose handle the driver then gives to
// a new stream (the simulated driver recycles handles as the real one does):
// once forgotten (as the CuPy and Numba integrations do), the old stream's
// blocks are waited for before the new stream reuses them, and a trim never
// touches the dead handle. Before forget_stream existed the trim recorded an
// event on the dead handle (one H200 with CuPy: CUresult 709) and the new
// stream reused the blocks at once.
TEST_F(SimAllocatorTest, RecycledHandleOfAForgottenStreamIsANewStream) {
  for (bool small : {false, true}) {
    SCOPED_TRACE(small ? "small" : "large");
    Allocator& a = make(tiny());
    StreamHandle s = nullptr;
    ASSERT_TRUE(ok(sim().stream_create(0, &s)));
    const std::size_t n = small ? 4096 : 3 * kMiB;
    void* p = a.allocate(n, 0, s);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
    a.deallocate(p, n, 0, s);  // s's write is still pending
    a.forget_stream(s);
    ASSERT_TRUE(ok(sim().stream_destroy(0, s)));
    StreamHandle again = nullptr;
    ASSERT_TRUE(ok(sim().stream_create(0, &again)));
    ASSERT_EQ(again, s) << "the simulated driver hands the handle out again";
    void* q = a.allocate(n, 0, again);
    ASSERT_TRUE(ok(sim().enqueue_access(0, again, dptr(q), n, AccessKind::write)));
    EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    a.deallocate(q, n, 0, again);
    EXPECT_NO_THROW(a.trim());
    EXPECT_EQ(sim().misuse_count(), 0u);
    EXPECT_EQ(sim().sticky_error(), Result::success);
    EXPECT_TRUE(invariants());
    alloc_.reset();
    (void)sim().stream_destroy(0, again);
    sim().complete_all();
    sim().clear_races();
  }
}

// More streams on one block than StreamTags keeps inline (it then means
// "every stream of the device"): streams that only read the block and were
// recorded on it, never allocating, must still be waited for.
TEST_F(SimAllocatorTest, ManyRecordedStreamsAreAllWaitedFor) {
  for (bool small : {false, true}) {
    SCOPED_TRACE(small ? "small" : "large");
    Allocator& a = make(spans_now(tiny()));
    StreamHandle s = new_stream();
    std::vector<StreamHandle> readers;
    for (int i = 0; i < 6; ++i) readers.push_back(new_stream());
    const std::size_t n = small ? 4096 : 3 * kMiB;
    void* p = a.allocate(n, 0, s);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
    vmm::EventHandle e = nullptr;
    ASSERT_TRUE(ok(sim().event_create(0, &e)));
    ASSERT_TRUE(ok(sim().event_record(0, e, s)));
    for (StreamHandle r : readers) {
      ASSERT_TRUE(ok(sim().stream_wait_event(0, r, e)));
      ASSERT_TRUE(ok(sim().enqueue_access(0, r, dptr(p), n, AccessKind::read)));
      a.record_stream(p, r);
    }
    ASSERT_TRUE(ok(sim().event_destroy(e)));
    a.deallocate(p, n, 0, s);
    void* q = a.allocate(n, 0, s);
    ASSERT_EQ(q, p);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(q), n, AccessKind::write)));
    EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    a.deallocate(q, n, 0, s);
    alloc_.reset();
    sim().complete_all();
    sim().clear_races();
  }
}

// A peer's stream recorded on a block (a kernel on device 1 reading device
// 0's memory through context peer access, as on the cuMemAlloc path with
// the global peer policy). gvmalloc's events belong to the block's device
// and cannot be recorded on the peer's stream, so whatever waits instead must
// cover the peer: the next user of the block, and the fence before the
// memory goes back to the driver.
TEST_F(SimAllocatorTest, RecordedStreamOfAPeerDeviceIsWaitedFor) {
  for (bool small : {false, true}) {
    SCOPED_TRACE(small ? "small" : "large");
    Config c = tiny();
    c.force_no_vmm = true;
    c.release_threshold_bytes = SIZE_MAX;
    Allocator& a = make(c);
    (void)sim().enable_peer_access(1, 0);  // already enabled after the first round
    StreamHandle s = new_stream(), t = nullptr;
    ASSERT_TRUE(ok(sim().stream_create(1, &t)));
    const std::size_t n = small ? 4096 : 3 * kMiB;
    void* p = a.allocate(n, 0, s);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(p), n, AccessKind::write)));
    vmm::EventHandle e = nullptr;
    ASSERT_TRUE(ok(sim().event_create(0, &e)));
    ASSERT_TRUE(ok(sim().event_record(0, e, s)));
    ASSERT_TRUE(ok(sim().stream_wait_event(1, t, e)));
    ASSERT_TRUE(ok(sim().event_destroy(e)));
    ASSERT_TRUE(ok(sim().enqueue_access(1, t, dptr(p), n, AccessKind::read)));
    ASSERT_EQ(sim().race_count(), 0u) << first_race(sim());
    a.record_stream(p, t);
    a.deallocate(p, n, 0, s);
    void* q = nullptr;
    ASSERT_NO_THROW(q = a.allocate(n, 0, s));
    ASSERT_EQ(q, p);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(q), n, AccessKind::write)));
    EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    // Again used by the peer, then freed and trimmed: the fence must wait for
    // the peer's stream before the segment goes.
    ASSERT_TRUE(ok(sim().enqueue_access(1, t, dptr(q), n, AccessKind::read)));
    sim().clear_races();  // that read was not ordered after s's write: the test's own doing
    a.record_stream(q, t);
    a.deallocate(q, n, 0, s);
    EXPECT_NO_THROW(a.trim());
    EXPECT_EQ(sim().sticky_error(), Result::success);
    EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
    alloc_.reset();
    sim().clear_sticky();
    sim().complete_all();
    (void)sim().stream_destroy(1, t);
  }
}

// deallocate's contract: usage errors only. Driver trouble while freeing
// (a release above the threshold, the wait of a free on another stream)
// must not surface as an exception after the block was already freed.
TEST_F(SimAllocatorTest, DeallocateDoesNotThrowForDriverTrouble) {
  {
    SCOPED_TRACE("release above the threshold, cuMemUnmap fails");
    Config c = tiny();
    c.release_threshold_bytes = 0;
    Allocator& a = make(c);
    void* p = a.allocate(6 * kMiB, 0, nullptr);
    sim().fail_call(Call::mem_unmap, 1, Result::unknown);
    EXPECT_NO_THROW(a.deallocate(p, 6 * kMiB, 0, nullptr));
    sim().clear_faults();
    EXPECT_EQ(a.device_stats(0).live_bytes, 0u);
    EXPECT_TRUE(invariants());
    EXPECT_THROW(a.deallocate(p, 6 * kMiB, 0, nullptr), usage_error) << "it was freed";
    a.trim();
    EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
    EXPECT_EQ(sim().physical_used(0), 0u);
  }
  for (Call call : {Call::event_record, Call::stream_wait_event}) {
    SCOPED_TRACE(std::string("small block freed on another stream, ") + vmm::call_name(call) +
                 " fails");
    Allocator& a = make(tiny());
    StreamHandle s = new_stream(), t = new_stream();
    void* p = a.allocate(4096, 0, s);
    ASSERT_TRUE(ok(sim().enqueue_access(0, t, dptr(p), 4096, AccessKind::write)));
    sim().fail_call(call, 1, Result::unknown);
    EXPECT_NO_THROW(a.deallocate(p, 4096, 0, t));
    sim().clear_faults();
    EXPECT_TRUE(invariants());
    EXPECT_EQ(a.device_stats(0).live_bytes, 0u);
    // Its owner stream takes it back at once: still ordered after t.
    void* q = a.allocate(4096, 0, s);
    EXPECT_EQ(q, p);
    ASSERT_TRUE(ok(sim().enqueue_access(0, s, dptr(q), 4096, AccessKind::write)));
    EXPECT_EQ(sim().race_count(), 0u) << first_race(sim());
    a.deallocate(q, 4096, 0, s);
  }
}


// A block taken over unmapped address space, then a steal of another
// stream's mapped free block whose wait cannot be had (no stream wait, no
// device sync): the allocation fails and every block is as it was (the
// taken one used to stay allocated, held by nobody, until the allocator
// went).
TEST_F(SimAllocatorTest, StealWhoseWaitFailsLosesNothing) {
  const Call call = Call::stream_wait_event;
  Allocator& a = make(tiny());
  StreamHandle s = new_stream(), t = new_stream();
  // s's heap: 8 MiB mapped and free, address space after it.
  void* first = a.allocate(8 * kMiB, 0, s);
  a.deallocate(first, 8 * kMiB, 0, s);
  // t's heap: a mapped free block, last used by t (a steal waits for t).
  void* q = a.allocate(16 * kMiB, 0, t);
  ASSERT_TRUE(ok(sim().enqueue_access(0, t, dptr(q), 16 * kMiB, AccessKind::write)));
  a.deallocate(q, 16 * kMiB, 0, t);
  const Counts before = counts();
  const std::uint64_t calls = sim().call_count(call);
  // 12 MiB on s: its free block is not mapped all through, t's is.
  sim().fail_every_call(call, Result::unknown);
  sim().fail_every_call(Call::ctx_synchronize, Result::unknown);  // the fallback
  EXPECT_THROW(a.allocate(12 * kMiB, 0, s), driver_error);
  sim().clear_faults();
  ASSERT_GT(sim().call_count(call), calls) << "no steal was tried: the test is off its path";
  EXPECT_TRUE(invariants());
  EXPECT_EQ(a.device_stats(0).live_bytes, 0u);
  Counts after = counts();
  after.events = before.events;  // s's own event, made for the wait: s keeps it
  EXPECT_EQ(after, before);
  // The range it had taken is free again: once nothing is left to steal, the
  // same allocation lands there.
  a.trim();
  void* again = a.allocate(12 * kMiB, 0, s);
  EXPECT_EQ(again, first) << "the failed allocation's range is still held";
  a.deallocate(again, 12 * kMiB, 0, s);
  a.trim();
  EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u);
  EXPECT_EQ(sim().physical_used(0), 0u);
}

// Devices of different sizes: a request is judged by its own device's memory,
// so one the larger device holds is no error there, and on the smaller one it
// is out of memory at once, naming that device (a check against any other
// device's figure - the smallest, say, to save a load - fails here).
TEST(SimAllocatorDevices, ARequestIsJudgedByItsOwnDevicesMemory) {
  const vmm::DeviceProfile small = vmm::profile(vmm::Profile::t4);
  const vmm::DeviceProfile large = vmm::profile(vmm::Profile::h200);
  SimDriver sim({small, large});
  Allocator a(sim, Config{});
  const std::size_t between = small.memory_bytes + kGranule;
  ASSERT_LT(between, large.memory_bytes);
  void* p = a.allocate(between, 1, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.device_stats(1).live_bytes, between);
  a.deallocate(p, between, 1, nullptr);
  try {
    (void)a.allocate(between, 0, nullptr);
    ADD_FAILURE() << "device 0 gave out more than it has";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("device 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(small.name), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.device_stats(0).reserved_bytes, 0u) << "the refusal mapped memory";
  EXPECT_EQ(a.device_stats(1).live_bytes, 0u);
}

}  // namespace
}  // namespace gvm::test
