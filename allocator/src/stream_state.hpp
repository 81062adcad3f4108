// StreamState: what gvmalloc knows about one stream of one device, and the
// event through which other streams and fences wait for its work.
//
// Rule (docs/design-notes.md, "Streams"): gvmalloc calls the driver with a
// stream's handle only while that stream is alive, and a stream is alive from
// the first call that names it until Allocator::forget_stream(handle). After
// that the state is retired: its handle is never touched again (the driver
// may hand the same value to a new stream, which then gets a new state), and
// work it left is waited for through its last event or a device sync.
//
// Epochs. `started_` counts event records begun on the stream; a free
// remembers the count it saw (a Token). A record that begins after that is
// issued after every use the freeing thread enqueued before the free, so the
// event, once recorded with a later number, covers the token. Waiting on the
// latest event may wait a little longer than needed (work queued after the
// free), never less.
//
// Records kept. A stream keeps its last kRecords records, each in an event of
// its own, not only the latest: a wait for a token uses the oldest record that
// covers it (covering), so a fence before an unmap waits for the work queued
// up to that record and not for everything the stream queued since. Besides
// the records fences and stream waits make, one is made at each growth
// (AccessTracker::mark): memory freed before a growth and released at a later
// one is covered by the first growth's record, which the GPU may have passed
// already. Memory freed after the last record still needs a new one, which
// waits for everything queued: GPT-2's releases take memory freed after the
// last growth, so none of its fences is served (docs/design-notes.md,
// "Records kept", counts which traces' waits are).
//
// Waits already made. A stream that waited on another's event is ordered
// after that stream's work up to the event's record, for all it runs later;
// a token that record covers needs no second cuStreamWaitEvent. Blocks that
// one stream freed together carry the same token, and a heap that takes
// them one by one from another stream's memory would otherwise wait once
// per block (half of all waits with 16 threads stealing from each other,
// on the simulated H200). Each stream keeps, for a few producers, the
// number of the record it last waited on (waited_past, note_waited).
//
// Work known finished. `done_` is the highest record number whose event was
// seen complete (a fence's event sync, or a query before a growth:
// AccessTracker::poll); a token it covers names finished work and needs no
// wait at all, so free memory that carried it merges with any neighbour
// (large_arena.cpp, merge_split_pairs).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "gvm/vmm/owners.hpp"
#include "gvm/vmm/types.hpp"
#include "spin_lock.hpp"

namespace gvm::detail {

class StreamState;

// "The work `stream` had queued when its epoch was `epoch`."
struct Token {
  StreamState* stream = nullptr;
  std::uint64_t epoch = 0;
  friend bool operator==(const Token&, const Token&) = default;
};

class StreamState {
 public:
  StreamState(std::uint64_t id, int device, vmm::StreamHandle handle) noexcept
      : id_(id), device_(device), handle_(handle) {}
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  std::uint64_t id() const noexcept { return id_; }
  int device() const noexcept { return device_; }
  vmm::StreamHandle handle() const noexcept { return handle_; }

  // The epoch a free made now would remember (see above). Lock-free.
  std::uint64_t epoch() const noexcept { return started_.load(std::memory_order_acquire); }

  bool retired() const noexcept { return retired_.load(std::memory_order_acquire); }
  void retire() noexcept { retired_.store(true, std::memory_order_release); }
  // Retired and every piece of its work known complete (a device sync ran
  // after it was retired): its tokens need no wait at all.
  bool complete() const noexcept { return complete_.load(std::memory_order_acquire); }
  void mark_complete() noexcept { complete_.store(true, std::memory_order_release); }

  // One record: an event of this stream and the number of the record it
  // holds (0: none that may be waited on).
  struct Record {
    vmm::Event event;
    std::uint64_t number = 0;
  };
  static constexpr std::size_t kRecords = 4;

  // Under lock(): the records, in no order.
  std::mutex& lock() const noexcept { return mu_; }
  // The record with the smallest number above `epoch`: it covers a token of
  // that epoch and waits for the least work after it. Null if none does.
  Record* covering(std::uint64_t epoch) noexcept {
    Record* best = nullptr;
    for (Record& r : records_)
      if (!r.event.empty() && r.number > epoch && (best == nullptr || r.number < best->number))
        best = &r;
    return best;
  }
  // Where the next record goes: an unused slot, else the oldest record.
  Record& next_record() noexcept {
    Record* oldest = &records_[0];
    for (Record& r : records_) {
      if (r.number == 0) return r;
      if (r.number < oldest->number) oldest = &r;
    }
    return *oldest;
  }
  std::array<Record, kRecords>& records() noexcept { return records_; }
  // Destroys the events (nobody waits on a complete stream).
  void reset_records() noexcept {
    for (Record& r : records_) {
      (void)r.event.reset();
      r.number = 0;
    }
  }
  // Begins a record: the number it will carry (lock() held).
  std::uint64_t begin_record() noexcept { return started_.fetch_add(1, std::memory_order_acq_rel) + 1; }

  // t's work is finished: the stream is complete, or a record after t was
  // seen complete. Lock-free.
  bool finished(const Token& t) const noexcept {
    return complete() || done_.load(std::memory_order_acquire) > t.epoch;
  }
  // The event holding record `number` was seen complete.
  void note_done(std::uint64_t number) noexcept {
    std::uint64_t d = done_.load(std::memory_order_relaxed);
    while (number > d && !done_.compare_exchange_weak(d, number, std::memory_order_acq_rel)) {
    }
  }
  std::uint64_t done() const noexcept { return done_.load(std::memory_order_acquire); }

  // This stream is ordered after t's work already: it waited on an event of
  // t.stream whose record covers t (see "Waits already made" above).
  bool waited_past(const Token& t) const noexcept {
    std::lock_guard<SpinLock> guard(waited_lock_);
    for (const Waited& w : waited_)
      if (w.producer == t.stream) return w.record > t.epoch;
    return false;
  }
  // This stream now waits on `producer`'s event holding record `record`
  // (the wait is queued: later work on this stream runs after it).
  void note_waited(const StreamState* producer, std::uint64_t record) noexcept {
    std::lock_guard<SpinLock> guard(waited_lock_);
    for (Waited& w : waited_)
      if (w.producer == producer) {
        if (record > w.record) w.record = record;
        return;
      }
    waited_[next_waited_] = Waited{producer, record};
    next_waited_ = (next_waited_ + 1) % waited_.size();
  }

 private:
  // States are never destroyed before their registry (stream_registry.hpp),
  // so a producer's address names one stream for the table's lifetime.
  struct Waited {
    const StreamState* producer = nullptr;
    std::uint64_t record = 0;
  };

  const std::uint64_t id_;
  const int device_;
  const vmm::StreamHandle handle_;
  std::atomic<std::uint64_t> started_{0};
  std::atomic<bool> retired_{false};
  std::atomic<bool> complete_{false};
  std::atomic<std::uint64_t> done_{0};  // records up to this one are finished
  mutable std::mutex mu_;
  std::array<Record, kRecords> records_{};  // recorded on this stream only, re-recorded at will
  mutable SpinLock waited_lock_;
  std::array<Waited, 8> waited_{};  // replaced round robin
  std::size_t next_waited_ = 0;
};

}  // namespace gvm::detail
