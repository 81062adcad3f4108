// AccessTracker: the one place that turns "who may still touch this memory"
// into waits. Blocks carry WaitSets (wait_set.hpp) of Tokens; everything that
// hands memory to another stream, changes who may access it, or unmaps it
// asks the tracker:
//
//   order(waits, consumer)  a stream wait: the consumer stream's next work
//                           runs after what `waits` names (no host sync);
//   fence(waits)            a host wait: returns when it is complete (before
//                           an access change, an unmap, a peer-access toggle).
//
// For a token of stream S: nothing if S is the consumer, if the token's work
// is known finished (S complete, or a later record of S seen done) or, for
// order(), if the consumer already waited on a record that covers it
// (stream_state.hpp); else the oldest of S's kept records that began after
// the token (it covers the token, and waits for the least work queued after
// it: stream_state.hpp, "Records kept"); else a new record on S, if S is live
// (its handle may be used, see stream_state.hpp); else - S retired with work of unknown extent - a
// synchronisation of S's device, after which every state retired before it
// is complete. An event call that fails falls back to that sync too; only a
// failing sync is an error (DriverError: the caller leaves memory as it is).
//
// Why events and not "synchronise the device": a device sync waits for
// unrelated work of every stream; MEASUREMENTS in docs/measurements.md (the
// hazards) show why the wait itself cannot be skipped - a revoke or unmap
// under queued work kills the context.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "gvm/vmm/driver.hpp"
#include "stream_registry.hpp"
#include "wait_set.hpp"

namespace gvm::detail {

class AccessTracker {
 public:
  // `registries[d]`: device d's streams. `fence_enabled` false is the test
  // hook that turns fences (not stream order) off.
  AccessTracker(vmm::Driver& driver, std::vector<StreamRegistry*> registries, bool fence_enabled);

  // Returns the number of streams the consumer was made to wait for.
  std::uint64_t order(const WaitSet& waits, StreamState& consumer);
  void fence(const WaitSet& waits);
  // Records now, on every live stream in `waits`, an event that covers its
  // token (record_stream's event at free time). Never waits.
  void cover_now(const WaitSet& waits);
  // A record on s now, without a wait (at a growth: see stream_state.hpp,
  // "Records kept"). Not during a capture, nor on a retired stream.
  void mark(StreamState& s);
  // Asks the driver which of `device`'s live streams have finished the work
  // their event covers (cuEventQuery, never a wait), so that free memory
  // their tokens kept apart can merge (stream_state.hpp, "Work known
  // finished"). Returns how many streams' finished work moved on. Not
  // during a capture (a query is one of the calls it forbids).
  std::size_t poll(int device);
  // Synchronises each device in the mask (bit d), fence or not: the
  // fallback, teardown, and what a fence without tracking must do.
  void sync_devices(std::uint64_t mask);
  void fence_devices(std::uint64_t mask);

  bool fence_enabled() const noexcept { return fence_enabled_; }
  // CUDA graph captures under way on any device (Allocator::begin_capture).
  // A capture in the global mode forbids every thread, whatever its device,
  // the calls it calls unsafe (event queries and syncs, context syncs): while
  // one is under way nothing fences, releases or synchronises anywhere.
  bool capturing() const noexcept { return captures_.load(std::memory_order_acquire) > 0; }
  void capture(int delta) noexcept { captures_.fetch_add(delta, std::memory_order_acq_rel); }
  std::uint64_t fences() const noexcept { return fences_.load(std::memory_order_relaxed); }
  int device_count() const noexcept { return static_cast<int>(registries_.size()); }
  StreamRegistry& registry(int device) { return *registries_[static_cast<std::size_t>(device)]; }

 private:
  enum class Via { nothing, event, device_sync };
  // Finds (or makes) a record of S that covers `t`, into *out when the way
  // is Via::event; lock of S held by caller.
  Via cover(const Token& t, StreamState::Record** out);
  // A new record on s (lock held), or null if the driver refused it.
  StreamState::Record* record(StreamState& s);
  void sync_device(int device);

  vmm::Driver& driver_;
  std::vector<StreamRegistry*> registries_;
  const bool fence_enabled_;
  std::atomic<std::uint64_t> fences_{0};
  std::atomic<int> captures_{0};
};

}  // namespace gvm::detail
