// Replaying an allocation trace through gvm::Allocator.
//
// One call replays every event of a Trace on one device, in order: trace
// stream 0 is the legacy default stream (nullptr), every other trace stream a
// stream made with TestDriver::stream_create (TraceStreams). The timed part is the
// replay loop alone.
//
// Two kinds of pass (docs/replay.md):
//   timed   (sample_memory = false) nothing is read from the allocator inside
//           the loop; wall time and driver calls are what the loop cost.
//   memory  (sample_memory = true) Allocator::device_stats is read after every
//           event for the peak of reserved bytes and the timeline; its wall
//           time includes that sampling and is not a performance figure.
// gvm-replay runs --repeat timed passes and one memory pass, each on a fresh
// Allocator.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/vmm/test_driver.hpp"
#include "trace.hpp"

namespace gvm::bench {

// The streams a trace names, created on one device. Index 0 (trace stream 0)
// is the legacy default stream, nullptr. Destroyed (after a synchronize) with
// this object, so declare it before the Allocator that uses the streams: the
// Allocator must die first.
class TraceStreams {
 public:
  // Throws DriverError when a stream cannot be created (those made are destroyed).
  TraceStreams(vmm::TestDriver& driver, int device, const Trace& trace);
  ~TraceStreams();
  TraceStreams(const TraceStreams&) = delete;
  TraceStreams& operator=(const TraceStreams&) = delete;

  int device() const noexcept { return device_; }
  std::size_t size() const noexcept { return streams_.size(); }
  vmm::StreamHandle operator[](std::size_t i) const noexcept { return streams_[i]; }

 private:
  void destroy_all() noexcept;

  vmm::TestDriver& driver_;
  int device_;
  std::vector<vmm::StreamHandle> streams_;
};

struct TimelinePoint {
  std::uint64_t event;  // 1-based: the state after this many events
  std::uint64_t live_bytes;
  std::uint64_t reserved_bytes;
};

struct ReplayOptions {
  // Streams for the trace (same device as the replay). May be null only when
  // the trace uses stream 0 alone; replay() refuses otherwise, because streams
  // it made itself would die while the allocator still knows them.
  const TraceStreams* streams = nullptr;
  // Read device_stats after every event (a memory pass, see above).
  bool sample_memory = false;
  // With sample_memory: keep every Nth sample (and always the last) in
  // *timeline. 0 keeps none.
  std::size_t timeline_every = 0;
  std::vector<TimelinePoint>* timeline = nullptr;
  // After the loop (untimed), free the blocks the trace leaves live, so the
  // allocator can be used again.
  bool free_leftovers = true;
};

struct ReplayResult {
  std::uint64_t events = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  // Sum of requested bytes of live blocks, at its highest.
  std::uint64_t peak_live_bytes = 0;
  // Max of device_stats(device).reserved_bytes after each event; only
  // measured by a memory pass (0 in a timed pass).
  std::uint64_t peak_reserved_bytes = 0;
  // device_stats(device).peak_reserved_bytes when the loop ended: the
  // allocator's own peak, read once (both kinds of pass). It also sees peaks
  // inside a single call, so it is >= peak_reserved_bytes.
  std::uint64_t allocator_peak_reserved_bytes = 0;
  // Driver calls the loop made (all entry points, all devices).
  std::uint64_t driver_calls = 0;
  std::uint64_t driver_call_ns = 0;  // time inside those calls (the allocator's stats)
  // The same by entry point (vmm::Call): where a replay's driver time goes.
  std::array<std::uint64_t, gvm::vmm::kCallCount> calls_by{};
  std::array<std::uint64_t, gvm::vmm::kCallCount> ns_by{};
  std::uint64_t wall_ns = 0;         // the replay loop, steady_clock
  double ns_per_op() const noexcept {
    return events == 0 ? 0.0 : static_cast<double>(wall_ns) / static_cast<double>(events);
  }
};

// Replays `trace` on `device`. Blocks are allocated and freed with the sizes
// and streams the trace gives. Throws gvm::out_of_memory / usage_error /
// driver_error with the event that failed named in front of the allocator's
// message; the blocks the replay holds are freed first. Throws
// std::invalid_argument when options are inconsistent (see ReplayOptions).
ReplayResult replay(const Trace& trace, Allocator& allocator, vmm::TestDriver& driver, int device,
                    const ReplayOptions& options = {});

}  // namespace gvm::bench
