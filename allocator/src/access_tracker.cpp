#include "access_tracker.hpp"

#include <cstdint>
#include <mutex>
#include <string>

namespace gvm::detail {

AccessTracker::AccessTracker(vmm::Driver& driver, std::vector<StreamRegistry*> registries,
                             bool fence_enabled)
    : driver_(driver), registries_(std::move(registries)), fence_enabled_(fence_enabled) {}

AccessTracker::Via AccessTracker::cover(const Token& t, StreamState::Record** out) {
  StreamState& s = *t.stream;
  if (s.finished(t)) return Via::nothing;  // complete, or a later record was seen done
  if (StreamState::Record* r = s.covering(t.epoch); r != nullptr) {
    *out = r;
    return Via::event;
  }
  if (s.retired()) return Via::device_sync;
  StreamState::Record* r = record(s);
  if (r == nullptr) return Via::device_sync;
  *out = r;
  return Via::event;
}

StreamState::Record* AccessTracker::record(StreamState& s) {
  StreamState::Record& r = s.next_record();
  if (r.event.empty()) {
    try {
      r.event = vmm::Event(driver_, s.device());
    } catch (const vmm::DriverError&) {
      return nullptr;
    }
  }
  const std::uint64_t n = s.begin_record();
  r.number = 0;  // what it held is overwritten, whether or not this record succeeds
  if (r.event.record(s.handle()) != vmm::Result::success) return nullptr;
  r.number = n;
  return &r;
}

void AccessTracker::mark(StreamState& s) {
  if (capturing()) return;
  std::lock_guard<std::mutex> guard(s.lock());
  if (s.retired()) return;  // its handle is never used again (stream_state.hpp)
  (void)record(s);  // a failure leaves one record fewer: a later wait records anew
}

void AccessTracker::sync_device(int device) {
  StreamRegistry& reg = registry(device);
  const std::uint64_t retired_before = reg.retire_count();
  const vmm::Result r = driver_.ctx_synchronize(device);
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, "cuCtxSynchronize(device " + std::to_string(device) +
                                  ") waiting for a stream's work");
  reg.device_synced(retired_before);
}

void AccessTracker::sync_devices(std::uint64_t mask) {
  for (int d = 0; d < device_count(); ++d)
    if ((mask >> d) & 1) sync_device(d);
}

void AccessTracker::fence_devices(std::uint64_t mask) {
  if (!fence_enabled_ || mask == 0) return;
  fences_.fetch_add(1, std::memory_order_relaxed);
  sync_devices(mask);
}

std::uint64_t AccessTracker::order(const WaitSet& waits, StreamState& consumer) {
  std::uint64_t waited = 0;
  std::uint64_t sync_mask = waits.overflow_devices();
  for (int i = 0; i < waits.size(); ++i) {
    const Token& t = waits[i];
    if (t.stream == &consumer || consumer.waited_past(t)) continue;
    Via via;
    {
      std::lock_guard<std::mutex> guard(t.stream->lock());
      StreamState::Record* r = nullptr;
      via = cover(t, &r);
      if (via == Via::event) {
        if (driver_.stream_wait_event(consumer.device(), consumer.handle(), r->event.get()) ==
            vmm::Result::success)
          consumer.note_waited(t.stream, r->number);
        else
          via = Via::device_sync;
      }
    }
    // Which device a failing or retired stream's work runs on is not sure (a
    // stream named without its device, a handle the driver refused): every
    // device is synchronised, which covers whatever it queued.
    if (via == Via::device_sync) sync_mask = ~std::uint64_t{0};
    if (via != Via::nothing) ++waited;
  }
  // A device sync (host) also orders the consumer: the work is done.
  sync_devices(sync_mask);
  return waited;
}

void AccessTracker::cover_now(const WaitSet& waits) {
  for (int i = 0; i < waits.size(); ++i) {
    std::lock_guard<std::mutex> guard(waits[i].stream->lock());
    StreamState::Record* r = nullptr;
    (void)cover(waits[i], &r);
  }
}

std::size_t AccessTracker::poll(int device) {
  if (capturing()) return 0;
  std::size_t moved = 0;
  for (StreamState* s : registry(device).live()) {
    std::lock_guard<std::mutex> guard(s->lock());
    // Newest first: the first one seen complete says the most; older ones
    // are asked only while the newer are still running.
    std::uint64_t below = UINT64_MAX;
    for (;;) {
      StreamState::Record* newest = nullptr;
      for (StreamState::Record& r : s->records())
        if (!r.event.empty() && r.number > s->done() && r.number < below &&
            (newest == nullptr || r.number > newest->number))
          newest = &r;
      if (newest == nullptr) break;
      if (driver_.event_query(newest->event.get()) == vmm::Result::success) {
        s->note_done(newest->number);
        ++moved;
        break;
      }
      below = newest->number;  // not_ready: an older one may be done
    }
  }
  return moved;
}

void AccessTracker::fence(const WaitSet& waits) {
  if (!fence_enabled_ || waits.empty()) return;
  fences_.fetch_add(1, std::memory_order_relaxed);
  std::uint64_t sync_mask = waits.overflow_devices();
  for (int i = 0; i < waits.size(); ++i) {
    const Token& t = waits[i];
    Via via;
    {
      std::lock_guard<std::mutex> guard(t.stream->lock());
      StreamState::Record* r = nullptr;
      via = cover(t, &r);
      if (via == Via::event) {
        if (r->event.synchronize() == vmm::Result::success)
          t.stream->note_done(r->number);
        else
          via = Via::device_sync;
      }
    }
    if (via == Via::device_sync) sync_mask = ~std::uint64_t{0};
  }
  sync_devices(sync_mask);
}

}  // namespace gvm::detail
