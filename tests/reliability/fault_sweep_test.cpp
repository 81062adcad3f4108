// The fault-injection sweep: every driver call every public operation makes,
// failed in turn, with every result that matters.
//
// For each operation (a setup, then one public call):
//   1. a clean run records which driver calls the operation makes
//      (SimDriver::call_count before and after, per vmm::Call);
//   2. for each call site (the k-th call of one entry point within the
//      operation) and each result - out_of_memory, invalid_value (one failed
//      call, SimDriver::fail_call) and launch_failed made sticky (that call
//      and every later one fail, StickyDriver) - a fresh world runs the setup,
//      injects the fault, runs the operation and checks:
//        - it succeeded (the fault was absorbed: a retry, a fallback, a
//          noexcept free), or it threw a typed error: gvm::out_of_memory for
//          an injected out-of-memory, else gvm::driver_error carrying the
//          injected result, its message naming the failed call; never
//          usage_error, never anything else;
//        - "nothing leaked", at three moments (docs/reliability.md):
//            a. right after a throw: no driver object count (reservations,
//               handles, mappings, classic allocations) above what it was
//               before the operation, live bytes unchanged, reserved bytes
//               equal to the simulator's physical bytes in use (for a
//               sticky fault: after the context is revived);
//            b. after the faults are cleared, the test's blocks are freed
//               and the allocator trimmed: no handle, mapping, classic
//               allocation or physical byte left on any device;
//            c. after the allocator is destroyed: no reservation, no event;
//        - check_invariants() after the operation and at b;
//        - the allocator keeps serving: an allocation on another stream,
//          written there, then freed, with no race and no sticky error in the
//          simulator.
// The binary prints the number of (operation, call site, result) cases.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/sim_driver.hpp"
#include "sticky_driver.hpp"

namespace gvm::test {
namespace {

int g_sticky_residue = 0;

using vmm::AccessKind;
using vmm::Call;
using vmm::Result;
using vmm::SimDriver;
using vmm::StreamHandle;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kBudget = 64 * kMiB;  // tiny device: OOM paths in milliseconds
constexpr int kStreamsPerDevice = 3;

vmm::DevicePtr dptr(const void* p) {
  return reinterpret_cast<vmm::DevicePtr>(p);
}

// A block the test owns and frees at the end.
struct Held {
  void* ptr;
  std::size_t bytes;
  int device;
  StreamHandle stream;
};

// One simulator, the sticky view of it, an allocator over that view, and
// streams on every device.
struct World {
  std::unique_ptr<SimDriver> sim;
  std::unique_ptr<StickyDriver> drv;
  std::unique_ptr<Allocator> alloc;
  std::vector<std::array<StreamHandle, kStreamsPerDevice>> streams;
  std::vector<Held> held;

  World(vmm::Profile profile, int devices, const Config& config) {
    sim = SimDriver::uniform(profile, devices);
    for (int d = 0; d < devices; ++d) sim->set_physical_budget(d, kBudget);
    drv = std::make_unique<StickyDriver>(*sim);
    streams.resize(static_cast<std::size_t>(devices));
    for (int d = 0; d < devices; ++d)
      for (auto& s : streams[static_cast<std::size_t>(d)])
        EXPECT_EQ(sim->stream_create(d, &s), Result::success);
    alloc = std::make_unique<Allocator>(*drv, config);
  }
  ~World() {
    alloc.reset();
    for (std::size_t d = 0; d < streams.size(); ++d)
      for (StreamHandle s : streams[d]) (void)sim->stream_destroy(static_cast<int>(d), s);
  }
  StreamHandle s(int device, int i) const {
    return streams[static_cast<std::size_t>(device)][static_cast<std::size_t>(i)];
  }
  int devices() const { return static_cast<int>(streams.size()); }
  Allocator& a() { return *alloc; }
  void* keep(std::size_t bytes, int device, int stream, bool scratch = false) {
    StreamHandle st = s(device, stream);
    void* p = scratch ? a().scratch_allocate(bytes, device, st) : a().allocate(bytes, device, st);
    held.push_back({p, bytes, device, st});
    return p;
  }
  void write(int device, int stream, const void* p, std::size_t bytes) {
    EXPECT_EQ(sim->enqueue_access(device, s(device, stream), dptr(p), bytes, AccessKind::write),
              Result::success);
  }
  void free_held() {
    for (const Held& h : held) a().deallocate(h.ptr, h.bytes, h.device, h.stream);
    held.clear();
  }
};

struct Operation {
  const char* name;
  vmm::Profile profile = vmm::Profile::h200;
  int devices = 2;
  std::function<void(Config&)> configure;
  std::function<void(World&)> setup;
  std::function<void(World&)> run;  // the one public call under test
};

Config tiny() {
  Config c;
  c.max_chunk_bytes = 2 * kMiB;
  c.scratch_chunk_bytes = 4 * kMiB;
  return c;
}

std::vector<Operation> operations() {
  auto none = [](World&) {};
  std::vector<Operation> ops;
  // --- allocation -------------------------------------------------------
  ops.push_back({"allocate_first_use", vmm::Profile::h200, 2, nullptr, none,
                 [](World& w) { w.keep(3 * kMiB + 1, 0, 0); }});
  ops.push_back({"allocate_growth_large", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   void* p = w.a().allocate(3 * kMiB, 0, w.s(0, 0));
                   w.a().deallocate(p, 3 * kMiB, 0, w.s(0, 0));
                 },
                 [](World& w) { w.keep(11 * kMiB + 1, 0, 0); }});
  ops.push_back({"allocate_growth_small", vmm::Profile::h200, 2, nullptr,
                 [](World& w) { w.keep(100, 0, 0); }, [](World& w) { w.keep(3000, 0, 0); }});
  ops.push_back({"allocate_no_vmm_first_use", vmm::Profile::h200, 2,
                 [](Config& c) { c.force_no_vmm = true; }, none,
                 [](World& w) { w.keep(5 * kMiB, 0, 0); }});
  ops.push_back({"allocate_no_vmm_growth", vmm::Profile::h200, 2,
                 [](Config& c) { c.force_no_vmm = true; },
                 [](World& w) {
                   w.keep(2 * kMiB, 0, 0);
                   w.keep(100, 0, 0);
                 },
                 [](World& w) { w.keep(9 * kMiB, 0, 1); }});
  ops.push_back({"allocate_no_vmm_device", vmm::Profile::p40, 2, nullptr,
                 [](World& w) { w.keep(100, 0, 0); }, [](World& w) { w.keep(9 * kMiB, 0, 0); }});
  // The OOM retry: 20 MiB cached below 30 MiB live, 30 MiB asked of a
  // 64 MiB device: only fits once the cache is given back.
  ops.push_back({"allocate_oom_retry", vmm::Profile::h200, 2,
                 [](Config& c) { c.reserve_slack = -1; },
                 [](World& w) {
                   void* p = w.a().allocate(20 * kMiB, 0, w.s(0, 0));
                   w.keep(30 * kMiB, 0, 0);
                   w.a().deallocate(p, 20 * kMiB, 0, w.s(0, 0));
                 },
                 [](World& w) { w.keep(30 * kMiB, 0, 0); }});
  // A growth past the reserved-bytes cap releases cached chunks first, behind
  // the fence (the freed block was written), and maps the handles it unmapped
  // again where the sizes match (allocator/src/handle_stash.hpp): 20 MiB
  // cached, 4 live, 24 asked under a 32 MiB cap.
  auto cached_beside_live = [](World& w) {
    void* p = w.a().allocate(20 * kMiB, 0, w.s(0, 0));
    w.write(0, 0, p, 20 * kMiB);
    w.keep(4 * kMiB, 0, 0);
    w.a().deallocate(p, 20 * kMiB, 0, w.s(0, 0));
  };
  auto grow_by_24 = [](World& w) { w.keep(24 * kMiB, 0, 0); };
  ops.push_back({"allocate_release_for_the_cap", vmm::Profile::h200, 2,
                 [](Config& c) {
                   c.reserve_slack = -1;
                   c.max_reserved_bytes = 32 * kMiB;
                 },
                 cached_beside_live, grow_by_24});
  // The same release asked for by the slack bound at a new peak (design-notes,
  // rule 2): its failures leave the growth to go on without it.
  ops.push_back({"allocate_release_before_growth", vmm::Profile::h200, 2, nullptr,
                 cached_beside_live, grow_by_24});
  // Handing a block freed (and written) on one stream to another.
  ops.push_back({"allocate_reuse_across_streams", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   void* p = w.a().allocate(5 * kMiB, 0, w.s(0, 0));
                   w.write(0, 0, p, 5 * kMiB);
                   w.a().deallocate(p, 5 * kMiB, 0, w.s(0, 0));
                 },
                 [](World& w) { w.keep(5 * kMiB, 0, 1); }});
  // --- free ---------------------------------------------------------------
  ops.push_back({"free_large", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   void* p = w.keep(5 * kMiB, 0, 0);
                   w.write(0, 0, p, 5 * kMiB);
                 },
                 [](World& w) { w.free_held(); }});
  ops.push_back({"free_small_on_other_stream", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   void* p = w.a().allocate(4096, 0, w.s(0, 0));
                   w.write(0, 1, p, 4096);
                   w.held.push_back({p, 4096, 0, w.s(0, 1)});
                 },
                 [](World& w) { w.free_held(); }});
  ops.push_back({"free_release_threshold", vmm::Profile::h200, 2,
                 [](Config& c) { c.release_threshold_bytes = 0; },
                 [](World& w) {
                   void* p = w.keep(7 * kMiB, 0, 0);
                   w.write(0, 0, p, 7 * kMiB);
                 },
                 [](World& w) { w.free_held(); }});
  ops.push_back({"free_after_record_stream", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   void* p = w.keep(5 * kMiB, 0, 0);
                   w.write(0, 1, p, 5 * kMiB);
                   w.a().record_stream(p, w.s(0, 1));
                 },
                 [](World& w) { w.free_held(); }});
  ops.push_back({"free_no_vmm_release_threshold", vmm::Profile::h200, 2,
                 [](Config& c) {
                   c.force_no_vmm = true;
                   c.release_threshold_bytes = 0;
                 },
                 [](World& w) { w.keep(7 * kMiB, 0, 0); }, [](World& w) { w.free_held(); }});
  // --- record_stream ----------------------------------------------------
  ops.push_back({"record_stream", vmm::Profile::h200, 2, nullptr,
                 [](World& w) { w.keep(5 * kMiB, 0, 0); },
                 [](World& w) { w.a().record_stream(w.held[0].ptr, w.s(0, 2)); }});
  ops.push_back({"record_stream_peer", vmm::Profile::h200, 2,
                 [](Config& c) { c.scratch_fence_tracked = true; },
                 [](World& w) { w.keep(1 * kMiB, 0, 0, true); },
                 [](World& w) { w.a().record_stream(w.held[0].ptr, w.s(1, 0), 1); }});
  // --- trim -----------------------------------------------------------------
  ops.push_back({"trim", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   w.keep(100, 0, 0);
                   void* p = w.a().allocate(11 * kMiB, 0, w.s(0, 0));
                   w.a().deallocate(p, 11 * kMiB, 0, w.s(0, 0));
                   void* q = w.a().allocate(5 * kMiB, 1, w.s(1, 0));
                   w.a().deallocate(q, 5 * kMiB, 1, w.s(1, 0));
                 },
                 [](World& w) { w.a().trim(); }});
  // The fence: the freed blocks still have work pending on two streams.
  ops.push_back({"trim_fenced_pending_work", vmm::Profile::h200, 2, nullptr,
                 [](World& w) {
                   void* p = w.a().allocate(11 * kMiB, 0, w.s(0, 0));
                   w.write(0, 0, p, 11 * kMiB);
                   (void)w.sim->enqueue_access(0, w.s(0, 1), dptr(p) + 6 * kMiB, 512,
                                               AccessKind::read);
                   w.a().record_stream(p, w.s(0, 1));  // the user's side of the contract
                   w.a().deallocate(p, 11 * kMiB, 0, w.s(0, 0));
                 },
                 [](World& w) { w.a().trim(0); }});
  ops.push_back({"trim_no_vmm", vmm::Profile::h200, 2, [](Config& c) { c.force_no_vmm = true; },
                 [](World& w) {
                   void* p = w.a().allocate(11 * kMiB, 0, w.s(0, 0));
                   w.a().deallocate(p, 11 * kMiB, 0, w.s(0, 0));
                 },
                 [](World& w) { w.a().trim(); }});
  // --- peer scratch and policy --------------------------------------------
  ops.push_back({"scratch_allocate_grant", vmm::Profile::h200, 3, nullptr, none,
                 [](World& w) { w.keep(6 * kMiB, 0, 0, true); }});
  ops.push_back({"scratch_allocate_growth", vmm::Profile::h200, 3, nullptr,
                 [](World& w) { w.keep(3 * kMiB, 0, 0, true); },
                 [](World& w) { w.keep(3 * kMiB, 0, 0, true); }});
  ops.push_back({"scratch_allocate_global", vmm::Profile::p40, 2, nullptr, none,
                 [](World& w) { w.keep(1 * kMiB, 0, 0, true); }});
  auto with_scratch = [](World& w) {
    void* p = w.keep(5 * kMiB, 0, 0, true);
    w.write(0, 0, p, 5 * kMiB);
    (void)w.sim->enqueue_access(1, w.s(1, 0), dptr(p), 4096, AccessKind::read);
  };
  ops.push_back({"set_peer_policy_per_allocation_to_none", vmm::Profile::h200, 2, nullptr,
                 with_scratch, [](World& w) { w.a().set_peer_policy(PeerPolicy::none); }});
  ops.push_back({"set_peer_policy_per_allocation_to_global", vmm::Profile::h200, 2, nullptr,
                 with_scratch, [](World& w) { w.a().set_peer_policy(PeerPolicy::global); }});
  ops.push_back({"set_peer_policy_global_back_to_per_allocation", vmm::Profile::h200, 2, nullptr,
                 [with_scratch](World& w) {
                   with_scratch(w);
                   w.a().set_peer_policy(PeerPolicy::global);
                 },
                 [](World& w) { w.a().set_peer_policy(PeerPolicy::per_allocation); }});
  ops.push_back({"set_peer_policy_none_back_to_automatic", vmm::Profile::h200, 2, nullptr,
                 [with_scratch](World& w) {
                   with_scratch(w);
                   w.a().set_peer_policy(PeerPolicy::none);
                 },
                 [](World& w) { w.a().set_peer_policy(PeerPolicy::automatic); }});
  auto copy_pair = [](World& w) {
    w.keep(2 * kMiB, 1, 0, true);  // src: device 1's scratch
    w.keep(2 * kMiB, 0, 0);        // dst: an ordinary block of device 0
  };
  auto copy = [](World& w) {
    w.a().peer_copy(w.held[1].ptr, 0, w.held[0].ptr, 1, 2 * kMiB, w.s(0, 0));
  };
  ops.push_back({"peer_copy_direct", vmm::Profile::h200, 2, nullptr, copy_pair, copy});
  ops.push_back({"peer_copy_staged", vmm::Profile::h200, 2,
                 [](Config& c) { c.peer_policy = PeerPolicy::none; }, copy_pair, copy});
  ops.push_back({"peer_copy_global", vmm::Profile::p40, 2, nullptr, copy_pair, copy});
  return ops;
}

// What the simulator holds, for the leak checks.
struct Counts {
  std::size_t reservations, handles, mappings, classic;
  std::vector<std::size_t> used;
};
Counts counts(const SimDriver& sim, int devices) {
  Counts c{sim.live_reservations(),
           sim.live_handles(),
           sim.live_mappings(),
           sim.live_classic_allocations(),
           {}};
  for (int d = 0; d < devices; ++d) c.used.push_back(sim.physical_used(d));
  return c;
}

std::size_t live_bytes(const Allocator& a) {
  std::size_t n = 0;
  for (int d = 0; d < a.device_count(); ++d) n += a.device_stats(d).live_bytes;
  return n;
}

::testing::AssertionResult accounted(const World& w) {
  for (int d = 0; d < w.devices(); ++d) {
    const DeviceStats s = w.alloc->device_stats(d);
    if (s.reserved_bytes != w.sim->physical_used(d))
      return ::testing::AssertionFailure()
             << "device " << d << ": reserved_bytes " << s.reserved_bytes
             << " but the driver holds " << w.sim->physical_used(d);
  }
  std::string why;
  if (!w.alloc->check_invariants(&why)) return ::testing::AssertionFailure() << why;
  return ::testing::AssertionSuccess();
}

Config config_of(const Operation& op) {
  Config c = tiny();
  if (op.configure) op.configure(c);
  return c;
}

// Calls the operation makes, per entry point, on a clean run.
std::array<std::uint64_t, vmm::kCallCount> record_calls(const Operation& op) {
  World w(op.profile, op.devices, config_of(op));
  op.setup(w);
  std::array<std::uint64_t, vmm::kCallCount> before{}, made{};
  for (int c = 0; c < vmm::kCallCount; ++c) before[c] = w.sim->call_count(static_cast<Call>(c));
  op.run(w);
  for (int c = 0; c < vmm::kCallCount; ++c)
    made[c] = w.sim->call_count(static_cast<Call>(c)) - before[c];
  EXPECT_TRUE(accounted(w));
  w.free_held();
  return made;
}

enum class Mode { out_of_memory, invalid_value, sticky };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::out_of_memory: return "out_of_memory";
    case Mode::invalid_value: return "invalid_value";
    case Mode::sticky: return "sticky launch_failed";
  }
  return "?";
}

int g_cases = 0;

// After a sticky error the context is dead: a real process must restart,
// and the driver objects go with the context. Undo work the dead context
// refused (a cuMemUnmap or cuMemRelease after the fault) leaves objects the
// allocator no longer tracks; they are counted as residue, not failed. What
// is checked: the allocator's books are still consistent (invariants, and it
// never counts more than the driver holds), and, the context revived, its
// destructor runs without crashing and gives back everything it tracks.
void check_after_sticky(World& w) {
  std::string why;
  EXPECT_TRUE(w.alloc->check_invariants(&why)) << why;
  for (int d = 0; d < w.devices(); ++d)
    EXPECT_LE(w.alloc->device_stats(d).reserved_bytes, w.sim->physical_used(d)) << "device " << d;
  w.held.clear();  // their memory dies with the allocator
  w.sim->complete_all();
  w.alloc.reset();
  std::size_t used = 0;
  for (int d = 0; d < w.devices(); ++d) used += w.sim->physical_used(d);
  if (used != 0 || w.sim->live_mappings() != 0 || w.sim->live_reservations() != 0)
    ++g_sticky_residue;
}

int g_threw = 0;
int g_operations = 0;

// One (operation, call site, result) case.
void run_case(const Operation& op, Call call, int k, Mode mode) {
  SCOPED_TRACE(std::string(op.name) + ": call " + std::to_string(k) + " of " +
               vmm::call_name(call) + " fails with " + mode_name(mode));
  ++g_cases;
  World w(op.profile, op.devices, config_of(op));
  op.setup(w);
  // The setups' own unordered accesses are not the allocator's races.
  w.sim->clear_races();
  const Counts before = counts(*w.sim, w.devices());
  const std::size_t live_before = live_bytes(w.a());
  const std::size_t held_before = w.held.size();
  switch (mode) {
    case Mode::out_of_memory: w.sim->fail_call(call, k, Result::out_of_memory); break;
    case Mode::invalid_value: w.sim->fail_call(call, k, Result::invalid_value); break;
    case Mode::sticky: w.drv->arm(call, k, Result::launch_failed); break;
  }
  bool threw = false;
  try {
    op.run(w);
  } catch (const out_of_memory& e) {
    threw = true;
    EXPECT_EQ(mode, Mode::out_of_memory) << "out_of_memory for another fault: " << e.what();
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  } catch (const driver_error& e) {
    threw = true;
    const std::string what = e.what();
    if (mode == Mode::sticky) {
      EXPECT_EQ(e.result(), Result::launch_failed) << what;
      EXPECT_NE(what.find("cu"), std::string::npos) << "names no driver call: " << what;
    } else {
      EXPECT_EQ(e.result(),
                mode == Mode::out_of_memory ? Result::out_of_memory : Result::invalid_value)
          << what;
      EXPECT_NE(what.find(vmm::call_name(call)), std::string::npos)
          << "does not name " << vmm::call_name(call) << ": " << what;
    }
  } catch (const usage_error& e) {
    threw = true;
    ADD_FAILURE() << "a driver fault reported as usage_error: " << e.what();
  } catch (const std::exception& e) {
    threw = true;
    ADD_FAILURE() << "untyped error: " << e.what();
  }
  if (threw) ++g_threw;
  const bool was_dead = w.drv->dead();
  w.sim->clear_faults();
  w.drv->revive();
  if (was_dead) return check_after_sticky(w);
  EXPECT_TRUE(accounted(w));
  if (threw) {
    // a. A failed operation left nothing new behind (the arena's
    // reservation, made on first use, is kept until the allocator goes: c).
    const Counts after = counts(*w.sim, w.devices());
    EXPECT_LE(after.handles, before.handles);
    EXPECT_LE(after.mappings, before.mappings);
    EXPECT_LE(after.classic, before.classic);
    for (int d = 0; d < w.devices(); ++d)
      EXPECT_LE(after.used[static_cast<std::size_t>(d)], before.used[static_cast<std::size_t>(d)])
          << "device " << d;
    EXPECT_EQ(live_bytes(w.a()), live_before);
    // A free that threw still owns its block; an allocation that threw
    // registered nothing.
    EXPECT_LE(w.held.size(), held_before);
  }
  // The allocator keeps serving: a block on another stream, written there.
  try {
    void* p = w.a().allocate(3 * kMiB + 5, 0, w.s(0, 2));
    w.write(0, 2, p, 3 * kMiB + 5);
    w.a().deallocate(p, 3 * kMiB + 5, 0, w.s(0, 2));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the allocator stopped serving: " << e.what();
  }
  // b. Everything given back.
  w.free_held();
  w.sim->complete_all();
  w.a().trim();
  EXPECT_TRUE(accounted(w));
  EXPECT_EQ(w.sim->live_handles(), 0u);
  EXPECT_EQ(w.sim->live_mappings(), 0u);
  EXPECT_EQ(w.sim->live_classic_allocations(), 0u);
  for (int d = 0; d < w.devices(); ++d) EXPECT_EQ(w.sim->physical_used(d), 0u) << "device " << d;
  // c. Nothing outlives the allocator.
  w.alloc.reset();
  EXPECT_EQ(w.sim->live_reservations(), 0u);
  EXPECT_EQ(w.sim->live_events(), 0u);
  EXPECT_EQ(w.sim->sticky_error(), Result::success);
  EXPECT_EQ(w.sim->race_count(), 0u) << w.sim->races().front();
}

class FaultSweep : public ::testing::TestWithParam<Operation> {};

TEST_P(FaultSweep, EveryCallSiteFailedWithEveryResult) {
  const Operation& op = GetParam();
  const auto made = record_calls(op);
  int cases = 0;
  std::string calls;
  for (int c = 0; c < vmm::kCallCount; ++c) {
    if (made[c] == 0) continue;
    calls += std::string(calls.empty() ? "" : ", ") + vmm::call_name(static_cast<Call>(c)) + " x" +
             std::to_string(made[c]);
    for (int k = 1; k <= static_cast<int>(made[c]); ++k)
      for (Mode m : {Mode::out_of_memory, Mode::invalid_value, Mode::sticky}) {
        run_case(op, static_cast<Call>(c), k, m);
        ++cases;
        if (HasFatalFailure()) return;
      }
  }
  ++g_operations;
  std::printf("[ sweep    ] %s: %d cases; calls: %s\n", op.name, cases,
              calls.empty() ? "none" : calls.c_str());
}

INSTANTIATE_TEST_SUITE_P(Sim, FaultSweep, ::testing::ValuesIn(operations()),
                         [](const ::testing::TestParamInfo<Operation>& i) {
                           return std::string(i.param.name);
                         });

// The total, when the whole binary runs (docs/reliability.md quotes it).
class SweepTotal : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_operations > 0)
      std::printf(
          "[ sweep    ] total: %d (operation, call site, result) cases over %d "
          "operations; %d threw a typed error, the rest were absorbed; %d sticky "
          "cases left driver objects the dead context refused to release\n",
          g_cases, g_operations, g_threw, g_sticky_residue);
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new SweepTotal);

}  // namespace
}  // namespace gvm::test
