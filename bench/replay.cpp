#include "replay.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

namespace gvm::bench {

TraceStreams::TraceStreams(vmm::TestDriver& driver, int device, const Trace& trace)
    : driver_(driver), device_(device) {
  streams_.reserve(trace.stream_count());
  streams_.push_back(nullptr);  // trace stream 0: the legacy default stream
  for (std::size_t i = 1; i < trace.stream_count(); ++i) {
    vmm::StreamHandle s = nullptr;
    const vmm::Result r = driver_.stream_create(device_, &s);
    if (r != vmm::Result::success) {
      destroy_all();
      throw vmm::DriverError(r, "cuStreamCreate(device " + std::to_string(device) +
                                    ") for trace stream " + std::to_string(trace.stream_ids[i]));
    }
    streams_.push_back(s);
  }
}

TraceStreams::~TraceStreams() {
  destroy_all();
}

void TraceStreams::destroy_all() noexcept {
  for (std::size_t i = 1; i < streams_.size(); ++i) {
    // Errors ignored: a driver that is shutting down has nothing left to wait for.
    (void)driver_.stream_synchronize(device_, streams_[i]);
    (void)driver_.stream_destroy(device_, streams_[i]);
  }
  streams_.clear();
}

namespace {

std::string describe(const Trace& trace, std::size_t index) {
  const TraceEvent& e = trace.events[index];
  std::string s = "event " + std::to_string(index + 1) + " of " + trace.source + " (";
  s += e.op == TraceOp::allocate ? "allocate id " : "free id ";
  s += std::to_string(trace.block_ids[e.block]) + ", " + std::to_string(e.bytes) +
       " bytes, stream " + std::to_string(trace.stream_ids[e.stream]) + "): ";
  return s;
}

// Frees what the replay still holds, each block on the stream it was
// allocated on. Never throws: used on the way out of an error too.
void free_held(const Trace& trace, Allocator& allocator, int device, const TraceStreams* streams,
               std::vector<void*>& held) noexcept {
  for (const TraceEvent& e : trace.events) {
    if (e.op != TraceOp::allocate || held[e.block] == nullptr) continue;
    try {
      allocator.deallocate(held[e.block], e.bytes, device,
                           streams ? (*streams)[e.stream] : nullptr);
    } catch (...) {
      // The allocator keeps the block; it dies with the allocator.
    }
    held[e.block] = nullptr;
  }
}

}  // namespace

ReplayResult replay(const Trace& trace, Allocator& allocator, vmm::TestDriver& driver, int device,
                    const ReplayOptions& options) {
  const TraceStreams* streams = options.streams;
  if (streams == nullptr && trace.stream_count() > 1) {
    throw std::invalid_argument("replay: " + trace.source + " uses " +
                                std::to_string(trace.stream_count()) +
                                " streams; pass ReplayOptions::streams (a TraceStreams)");
  }
  if (streams != nullptr &&
      (streams->size() != trace.stream_count() || streams->device() != device)) {
    throw std::invalid_argument(
        "replay: ReplayOptions::streams was made for another trace or device");
  }
  if (options.timeline != nullptr && options.timeline_every > 0 && !options.sample_memory) {
    throw std::invalid_argument("replay: a timeline needs sample_memory");
  }

  ReplayResult result;
  std::vector<void*> held(trace.block_count(), nullptr);
  const std::size_t n = trace.events.size();
  const bool sample = options.sample_memory;
  const bool keep_timeline = sample && options.timeline != nullptr && options.timeline_every > 0;
  if (keep_timeline) options.timeline->reserve(n / options.timeline_every + 1);

  std::uint64_t live = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t peak_reserved = 0;
  const DriverCallStats before = allocator.stats().driver;
  std::size_t i = 0;
  const auto start = std::chrono::steady_clock::now();
  try {
    for (; i < n; ++i) {
      const TraceEvent& e = trace.events[i];
      const vmm::StreamHandle stream = streams ? (*streams)[e.stream] : nullptr;
      if (e.op == TraceOp::allocate) {
        held[e.block] = allocator.allocate(e.bytes, device, stream);
        live += e.bytes;
        if (live > peak_live) peak_live = live;
      } else {
        allocator.deallocate(held[e.block], e.bytes, device, stream);
        held[e.block] = nullptr;
        live -= e.bytes;
      }
      if (sample) {
        const std::uint64_t reserved = allocator.device_stats(device).reserved_bytes;
        if (reserved > peak_reserved) peak_reserved = reserved;
        if (keep_timeline && ((i + 1) % options.timeline_every == 0 || i + 1 == n)) {
          options.timeline->push_back(TimelinePoint{i + 1, live, reserved});
        }
      }
    }
  } catch (const out_of_memory& e) {
    free_held(trace, allocator, device, streams, held);
    throw out_of_memory(describe(trace, i) + e.what());
  } catch (const usage_error& e) {
    free_held(trace, allocator, device, streams, held);
    throw usage_error(describe(trace, i) + e.what());
  } catch (...) {
    free_held(trace, allocator, device, streams, held);
    throw;
  }
  const auto stop = std::chrono::steady_clock::now();

  result.wall_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start).count());
  const DriverCallStats after = allocator.stats().driver;
  result.driver_calls = after.total_calls() - before.total_calls();
  result.driver_call_ns = after.total_nanoseconds() - before.total_nanoseconds();
  for (std::size_t c = 0; c < result.calls_by.size(); ++c) {
    result.calls_by[c] = after.calls[c] - before.calls[c];
    result.ns_by[c] = after.nanoseconds[c] - before.nanoseconds[c];
  }
  result.allocator_peak_reserved_bytes = allocator.device_stats(device).peak_reserved_bytes;
  result.events = n;
  result.allocations = trace.allocations;
  result.frees = trace.frees;
  result.peak_live_bytes = peak_live;
  result.peak_reserved_bytes = peak_reserved;

  if (options.free_leftovers) {
    free_held(trace, allocator, device, streams, held);
    if (streams != nullptr) {
      for (std::size_t s = 0; s < streams->size(); ++s) {
        vmm::check(driver.stream_synchronize(device, (*streams)[s]), "cuStreamSynchronize");
      }
    }
  }
  return result;
}

}  // namespace gvm::bench
