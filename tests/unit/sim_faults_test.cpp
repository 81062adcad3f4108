// Fault injection: a failed call changes nothing, and every owner undoes
// half-done work when a driver call fails part-way.
#include <stdexcept>
#include <string>

#include "gvm/vmm/owners.hpp"
#include "sim_fixture.hpp"

namespace gvm::test {
namespace {

using SimFaults = SimTest;

TEST_F(SimFaults, TheNthCallFailsAndOnlyThat) {
  sim().fail_call(Call::mem_create, 2, Result::out_of_memory);
  PhysHandle h = 0;
  EXPECT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::none, &h), Result::success);
  const std::size_t used = sim().physical_used(0);
  EXPECT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::none, &h), Result::out_of_memory);
  EXPECT_EQ(sim().live_handles(), 1u);
  EXPECT_EQ(sim().physical_used(0), used);
  EXPECT_EQ(sim().mem_create(0, g_, vmm::ShareableHandleType::none, &h), Result::success);
  EXPECT_EQ(sim().live_handles(), 2u);
}

TEST_F(SimFaults, EveryCallFailsUntilCleared) {
  sim().fail_every_call(Call::stream_create, Result::unknown);
  vmm::StreamHandle s = nullptr;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sim().stream_create(0, &s), Result::unknown);
  EXPECT_EQ(sim().live_streams(), 0u);
  sim().fail_call(Call::event_create, 1, Result::not_permitted);
  sim().clear_faults();
  EXPECT_EQ(sim().stream_create(0, &s), Result::success);
  vmm::EventHandle e = nullptr;
  EXPECT_EQ(sim().event_create(0, &e), Result::success) << "cleared faults do not fire";
}

TEST_F(SimFaults, FaultArgumentsAreChecked) {
  EXPECT_THROW(sim().fail_call(Call::mem_map, 0, Result::unknown), std::invalid_argument);
  EXPECT_THROW(sim().fail_call(Call::mem_map, 1, Result::success), std::invalid_argument);
  EXPECT_THROW(sim().fail_every_call(Call::mem_map, Result::success), std::invalid_argument);
  EXPECT_THROW(sim().fail_call(Call::count_, 1, Result::unknown), std::invalid_argument);
}

TEST_F(SimFaults, FailedCallsLeaveNoStateChange) {
  DevicePtr r = reserve(4 * g_);
  PhysHandle h = create(0, g_);

  sim().fail_call(Call::mem_map, 1, Result::out_of_memory);
  EXPECT_EQ(sim().mem_map(r, g_, h), Result::out_of_memory);
  EXPECT_EQ(sim().live_mappings(), 0u);
  ASSERT_EQ(sim().mem_map(r, g_, h), Result::success);

  sim().fail_call(Call::mem_set_access, 1, Result::unknown);
  EXPECT_EQ(set_access(r, g_, {{0, Access::read_write}}), Result::unknown);
  Access a = Access::read_write;
  ASSERT_EQ(sim().mem_get_access(r, 0, &a), Result::success);
  EXPECT_EQ(a, Access::none);

  sim().fail_call(Call::mem_unmap, 1, Result::unknown);
  EXPECT_EQ(sim().mem_unmap(r, g_), Result::unknown);
  EXPECT_EQ(sim().live_mappings(), 1u);

  sim().fail_call(Call::mem_release, 1, Result::unknown);
  ASSERT_EQ(sim().mem_unmap(r, g_), Result::success);
  EXPECT_EQ(sim().mem_release(h), Result::unknown);
  EXPECT_EQ(sim().live_handles(), 1u);
  ASSERT_EQ(sim().mem_release(h), Result::success);

  sim().fail_call(Call::address_free, 1, Result::unknown);
  EXPECT_EQ(sim().address_free(r, 4 * g_), Result::unknown);
  EXPECT_EQ(sim().live_reservations(), 1u);
  ASSERT_EQ(sim().address_free(r, 4 * g_), Result::success);

  // An injected sticky-looking code does not kill the context: nothing happened.
  sim().fail_call(Call::ctx_synchronize, 1, Result::launch_failed);
  EXPECT_EQ(sim().ctx_synchronize(0), Result::launch_failed);
  EXPECT_EQ(sim().sticky_error(), Result::success);
}

// --- owners ----------------------------------------------------------------------

// Expects `fn` to throw DriverError with `result` and a message naming `call`.
template <class Fn>
void expect_driver_error(Fn fn, Result result, const std::string& call) {
  try {
    fn();
    ADD_FAILURE() << "no DriverError for " << call;
  } catch (const vmm::DriverError& e) {
    EXPECT_EQ(e.result(), result) << e.what();
    EXPECT_NE(std::string(e.what()).find(call), std::string::npos) << e.what();
  }
}

TEST_F(SimFaults, OwnerConstructorsThatFailLeaveNothingBehind) {
  sim().fail_call(Call::address_reserve, 1, Result::out_of_memory);
  expect_driver_error([&] { vmm::ReservedRange r(sim(), g_, 0); }, Result::out_of_memory,
                      "cuMemAddressReserve");
  EXPECT_EQ(sim().live_reservations(), 0u);

  sim().fail_call(Call::mem_create, 1, Result::out_of_memory);
  expect_driver_error([&] { vmm::PhysicalChunk c(sim(), 1, g_); }, Result::out_of_memory,
                      "cuMemCreate");
  EXPECT_EQ(sim().live_handles(), 0u);
  EXPECT_EQ(sim().physical_used(1), 0u);

  vmm::ReservedRange range(sim(), 2 * g_, 0);
  vmm::PhysicalChunk chunk(sim(), 0, g_);
  sim().fail_call(Call::mem_map, 1, Result::invalid_value);
  expect_driver_error([&] { vmm::Mapping m(sim(), range.base(), chunk); }, Result::invalid_value,
                      "cuMemMap");
  EXPECT_EQ(sim().live_mappings(), 0u);

  sim().fail_call(Call::event_create, 1, Result::unknown);
  expect_driver_error([&] { vmm::Event e(sim(), 0); }, Result::unknown, "cuEventCreate");
  EXPECT_EQ(sim().live_events(), 0u);
}

TEST_F(SimFaults, MappedChunkUndoesEachStep) {
  vmm::ReservedRange range(sim(), 2 * g_, 0);
  const std::vector<vmm::AccessDesc> rw = {{0, Access::read_write}};

  sim().fail_call(Call::mem_create, 1, Result::out_of_memory);
  expect_driver_error([&] { vmm::MappedChunk mc(sim(), 0, range.base(), g_, rw); },
                      Result::out_of_memory, "cuMemCreate");
  EXPECT_EQ(sim().live_handles(), 0u);

  sim().fail_call(Call::mem_map, 1, Result::out_of_memory);
  expect_driver_error([&] { vmm::MappedChunk mc(sim(), 0, range.base(), g_, rw); },
                      Result::out_of_memory, "cuMemMap");
  EXPECT_EQ(sim().live_handles(), 0u) << "the handle was released";
  EXPECT_EQ(sim().physical_used(0), 0u);

  sim().fail_call(Call::mem_set_access, 1, Result::out_of_memory);
  expect_driver_error([&] { vmm::MappedChunk mc(sim(), 0, range.base(), g_, rw); },
                      Result::out_of_memory, "cuMemSetAccess");
  EXPECT_EQ(sim().live_mappings(), 0u) << "unmapped";
  EXPECT_EQ(sim().live_handles(), 0u) << "and released";

  // A real failure (a peer that cannot reach the owner) takes the same path.
  sim().set_peer(1, 0, false);
  expect_driver_error(
      [&] {
        vmm::MappedChunk mc(sim(), 0, range.base(), g_,
                            {{0, Access::read_write}, {1, Access::read_write}});
      },
      Result::invalid_device, "cuMemSetAccess");
  EXPECT_EQ(sim().live_mappings(), 0u);
  EXPECT_EQ(sim().live_handles(), 0u);
}

TEST_F(SimFaults, DestructorsFreeAndResetFailuresKeepTheHandle) {
  {
    vmm::ReservedRange range(sim(), 2 * g_, 0);
    vmm::MappedChunk mc(sim(), 0, range.base(), g_, {{0, Access::read_write}});
    vmm::Event e(sim(), 1);
    EXPECT_EQ(sim().live_reservations(), 1u);
    EXPECT_EQ(sim().live_mappings(), 1u);
    EXPECT_EQ(sim().live_events(), 1u);

    sim().fail_call(Call::mem_unmap, 1, Result::unknown);
    EXPECT_EQ(mc.reset(), Result::unknown);
    EXPECT_FALSE(mc.empty()) << "still owned, so the caller can retry";
    EXPECT_EQ(sim().live_handles(), 1u) << "nothing released under a live mapping";
  }
  EXPECT_EQ(sim().live_reservations(), 0u);
  EXPECT_EQ(sim().live_mappings(), 0u);
  EXPECT_EQ(sim().live_handles(), 0u);
  EXPECT_EQ(sim().live_events(), 0u);
}

TEST_F(SimFaults, DestructorsTolerateADriverShuttingDown) {
  sim().fail_every_call(Call::mem_release, Result::deinitialized);
  sim().fail_every_call(Call::address_free, Result::deinitialized);
  {
    vmm::ReservedRange range(sim(), 2 * g_, 0);
    vmm::PhysicalChunk chunk(sim(), 0, g_);
    EXPECT_EQ(chunk.reset(), Result::success) << "deinitialized counts as done";
    EXPECT_TRUE(chunk.empty());
  }
  EXPECT_EQ(sim().call_count(Call::address_free), 1u);
}

}  // namespace
}  // namespace gvm::test
