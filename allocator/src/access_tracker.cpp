#include "access_tracker.hpp"

#include <mutex>
#include <string>

namespace gvm::detail {

AccessTracker::AccessTracker(vmm::Driver& driver, std::vector<StreamRegistry*> registries,
                             bool fence_enabled)
    : driver_(driver), registries_(std::move(registries)), fence_enabled_(fence_enabled) {}

AccessTracker::Via AccessTracker::cover(const Token& t) {
  StreamState& s = *t.stream;
  if (s.finished(t)) return Via::nothing;  // complete, or a later record was seen done
  if (!s.event().empty() && s.recorded() > t.epoch) return Via::event;
  if (s.retired()) return Via::device_sync;
  if (s.event().empty()) {
    try {
      s.event() = vmm::Event(driver_, s.device());
    } catch (const vmm::DriverError&) {
      return Via::device_sync;
    }
  }
  const std::uint64_t n = s.begin_record();
  if (s.event().record(s.handle()) != vmm::Result::success) return Via::device_sync;
  s.end_record(n);
  return Via::event;
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
      via = cover(t);
      if (via == Via::event) {
        if (driver_.stream_wait_event(consumer.device(), consumer.handle(),
                                      t.stream->event().get()) == vmm::Result::success)
          consumer.note_waited(t.stream, t.stream->recorded());
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
    (void)cover(waits[i]);
  }
}

std::size_t AccessTracker::poll(int device) {
  if (capturing()) return 0;
  std::size_t moved = 0;
  for (StreamState* s : registry(device).live()) {
    std::lock_guard<std::mutex> guard(s->lock());
    const std::uint64_t n = s->recorded();
    if (s->event().empty() || n <= s->done()) continue;
    if (driver_.event_query(s->event().get()) != vmm::Result::success) continue;  // not_ready
    s->note_done(n);
    ++moved;
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
      via = cover(t);
      if (via == Via::event) {
        if (t.stream->event().synchronize() == vmm::Result::success)
          t.stream->note_done(t.stream->recorded());
        else
          via = Via::device_sync;
      }
    }
    if (via == Via::device_sync) sync_mask = ~std::uint64_t{0};
  }
  sync_devices(sync_mask);
}

}  // namespace gvm::detail
