// DeviceHeap: everything gvmalloc holds on one device, composed of parts
// with one job each:
//
//   Heap              one per stream (small and large blocks, its own lock),
//                     one for the peer scratch, one per private pool
//   PhysicalBacking   VMM chunks or cuMemAlloc segments (the driver calls)
//   GrowthPolicy      cap, slack, OOM retry; DeviceBudget keeps the cap
//   PageMap           address -> heap, span, chunk (the free path's lookup)
//   StreamRegistry    the streams seen on this device
//   AccessTracker     (allocator-wide) every wait and fence
//
// The device heap itself is thin: it finds or makes a stream's heap, lends
// memory between heaps (a steal before a growth), runs growth and releases
// for them - with no heap lock held - and sums the accounting.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "access_tracker.hpp"
#include "growth_policy.hpp"
#include "gvm/config.hpp"
#include "gvm/errors.hpp"
#include "gvm/memory_map.hpp"
#include "gvm/stats.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "heap.hpp"
#include "page_map.hpp"
#include "physical_backing.hpp"
#include "spin_lock.hpp"
#include "stream_registry.hpp"

namespace gvm::detail {

// An out_of_memory after which one more try may succeed (throw_oom).
class OomAfterReclaim : public out_of_memory {
 public:
  using out_of_memory::out_of_memory;
};

// "1.50 GiB", for messages.
std::string format_bytes(std::size_t n);

class DeviceHeap {
 public:
  // `use_vmm`: VMM chunks (else cuMemAlloc segments).
  DeviceHeap(vmm::Driver& driver, const vmm::DeviceCaps& caps, const Config& config,
             AccessTracker& tracker, StreamRegistry& streams, bool use_vmm);
  ~DeviceHeap();  // the owner has fenced every device
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  int device() const noexcept { return caps_.device; }
  const vmm::DeviceCaps& caps() const noexcept { return caps_; }
  const Config& config() const noexcept { return config_; }
  vmm::Driver& driver() noexcept { return driver_; }
  AccessTracker& tracker() noexcept { return tracker_; }
  StreamRegistry& streams() noexcept { return streams_; }
  PageMap& pages() noexcept { return pages_; }
  const PageMap& pages() const noexcept { return pages_; }
  PhysicalBacking& backing() noexcept { return *backing_; }
  GrowthPolicy& policy() noexcept { return policy_; }
  const GrowthPolicy& policy() const noexcept { return policy_; }

  // --- heaps ------------------------------------------------------------------
  // The heap of stream `s` (made on first use, or a retired stream's heap
  // adopted). Slow path: the allocator's thread-local slot remembers it.
  Heap& heap_for(StreamState& s);
  // The peer scratch (made on first use with `access`: the caller holds the
  // allocator's policy lock).
  Heap& scratch(const std::vector<vmm::AccessDesc>& access);
  Heap* existing_scratch() const noexcept { return scratch_.load(std::memory_order_acquire); }
  // The private pool `id` (made on first use) / an existing one.
  Heap& pool(std::uint64_t id);
  Heap* existing_pool(std::uint64_t id) const;
  // The heap whose chunk covers addr, or null (a lock-free page-map read).
  Heap* owner_of(std::uintptr_t addr) const noexcept {
    const PageEntry* e = pages_.find(addr);
    return e == nullptr ? nullptr : e->owner.load(std::memory_order_acquire);
  }
  // Every heap (a snapshot; heaps live as long as the device heap).
  std::vector<Heap*> heaps() const;

  // --- services for heaps (called with no heap lock held) ---------------------
  // Physical memory for `runs` (need bytes) of heap h: the growth rules, the
  // budget, release-before-growth and the OOM retry. `block_end`: the end of
  // the block the runs are for (plan_chunks, handle_stash.hpp), `user` the
  // stream it is for. Throws out_of_memory naming `requested`, driver_error.
  std::vector<vmm::MappedChunk> map_for(Heap& h, const std::vector<Run>& runs, std::size_t need,
                                        std::size_t requested, std::uintptr_t block_end,
                                        const StreamState* user);
  // Address space for a new region of h (VMM).
  vmm::ReservedRange reserve_for(Heap& h, std::size_t min_bytes, std::size_t alignment);
  // A segment for a new region of h (no VMM): *bytes in, what was allocated out.
  vmm::DevicePtr segment_for(Heap& h, std::size_t* bytes, std::size_t alignment,
                             std::size_t requested);
  // Routes a free, record_stream or peer note by address: a slot to its
  // span's owner, a large block to the heap whose arena holds it.
  // own_stream: on the block's allocation stream (`stream` unused);
  // *requested: what it was allocated with. During a capture on this device
  // a block outside a capturing pool is kept until the capture ends.
  bool deallocate(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream,
                  bool own_stream = false, std::size_t* requested = nullptr);
  // deallocate's hot path, inline: while no capture runs here, a slot of a
  // span goes straight to the span's owner, and a block in a granule with no
  // span to the heap whose arena holds it (each checks the rest).
  bool free(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream) {
    const PageEntry* e = pages_.find(addr);
    if (e == nullptr) [[unlikely]]
      return false;
    if (!capturing_here()) [[likely]] {
      if (Span* s = e->span.load(std::memory_order_acquire); s != nullptr) {
        s = s->holding(addr);
        if (s->contains(addr)) [[likely]] {
          s->owner->free_slot(s, addr, bytes, stream);
          return true;
        }
      } else if (Heap* h = e->owner.load(std::memory_order_acquire); h != nullptr) {
        return h->deallocate_large(*e, addr, bytes, stream, false, nullptr);
      }
    }
    return deallocate_in(*e, addr, bytes, stream, false, nullptr);
  }
  bool record_stream(std::uintptr_t addr, StreamState& user);
  void note_use(std::uintptr_t addr, StreamState& user);
  // A mapped free granule of another stream's heap for a span of `taker`'s
  // heap `except`; *lender: where it lives.
  Block* lend_granule(StreamState& taker, const Heap* except, Heap** lender);
  // Mapped free memory of another stream's heap, for `taker` (before growing).
  // `size` rounded, `bytes` as requested.
  void* steal(std::size_t size, std::size_t bytes, StreamState& taker, const Heap* except);
  // Whole cached chunks of every heap back to the driver, fenced, until
  // `want` bytes are dropped (all: every one). Returns the bytes dropped.
  // The scratch is left out unless include_scratch: its chunks carry peer
  // grants that cost ~1 ms per 64 MiB to make again (docs/measurements.md).
  std::size_t release_cached(std::size_t want, bool all, bool include_scratch,
                             HandleStash* keep = nullptr);
  void credit(std::size_t bytes) noexcept { budget_.credit(bytes); }
  // Bytes charged to the budget but not yet in a heap's chunks, or gone
  // from a heap's chunks but not yet credited: the checker allows them.
  void transit(std::int64_t n) noexcept { transit_.fetch_add(n, std::memory_order_acq_rel); }
  // A span on its way between a heap's arena and another heap's front end.
  void begin_handoff() noexcept { handoffs_.fetch_add(1, std::memory_order_acq_rel); }
  void end_handoff() noexcept { handoffs_.fetch_sub(1, std::memory_order_acq_rel); }
  class Handoff {
   public:
    explicit Handoff(DeviceHeap& d) noexcept : d_(d) { d_.begin_handoff(); }
    ~Handoff() { d_.end_handoff(); }
    Handoff(const Handoff&) = delete;
    Handoff& operator=(const Handoff&) = delete;

   private:
    DeviceHeap& d_;
  };
  // Called after a free: above Config::release_threshold_bytes of cached
  // memory, the excess goes back. Never throws.
  void maybe_release_above_threshold() noexcept;
  // Empty spans and every cached chunk back; unused regions go.
  void trim();


  // --- CUDA graph capture -------------------------------------------------------
  // A capture under way on any device (AccessTracker::capturing says why any):
  // while one is, nothing here queries events, synchronises, fences or
  // releases, and no stream is made to wait for another's work.
  bool capturing() const noexcept { return tracker_.capturing(); }
  // A capture under way on this device: frees outside its pool are kept
  // until the last one here ends.
  bool capturing_here() const noexcept { return captures_.load(std::memory_order_acquire) > 0; }
  void begin_capture() noexcept {
    captures_.fetch_add(1, std::memory_order_acq_rel);
    tracker_.capture(+1);
  }
  // The last capture's end frees what was freed outside the pools meanwhile.
  void end_capture();

  // --- accounting -------------------------------------------------------------
  // Sums the live bytes of every heap, raises the peak, and returns the
  // headroom left to it: a heap whose live bytes pass its watermark (its
  // bytes at its last refresh plus the headroom) refreshes. With one
  // allocating thread the peak is exact; with several it can lag by what the
  // others allocated since (a shared counter would cost two locked
  // read-modify-writes per alloc+free pair on every thread).
  std::int64_t refresh_peak() noexcept;
  std::int64_t live_total() const noexcept;
  std::size_t reserved() const noexcept { return budget_.reserved(); }
  // GrowthPolicy::raises_peak for a growth of `need` bytes now.
  bool growth_raises_peak(std::size_t need) const noexcept {
    return GrowthPolicy::raises_peak(need, reserved(), budget_.peak());
  }
  // A growth of h by `need` bytes for a block of `requested` bytes would
  // raise the peak of reserved bytes and the growth policy would release
  // nothing before it: the growth would stay as the new peak (rule 10,
  // Heap::allocate_large_once). Takes h's lock: call without it.
  bool growth_would_set_peak(const Heap& h, std::size_t need, std::size_t requested) const;
  void reset_peaks() noexcept;
  void count_fence() noexcept { fences_.fetch_add(1, std::memory_order_relaxed); }
  void count_cross_stream_waits(std::uint64_t n) noexcept {
    cross_stream_waits_.fetch_add(n, std::memory_order_relaxed);
  }
  // `reclaimed`: the out-of-memory path gave back unused spans, whose
  // granules are mapped free memory another heap may now borrow or steal -
  // which the failed attempt looked for before they were there: the
  // allocator tries once more (OomAfterReclaim).
  [[noreturn]] void throw_oom(std::size_t bytes, const char* why, bool reclaimed = false) const;

  DeviceStats stats() const;
  void memory_map(std::vector<SegmentInfo>& out) const;
  bool check(std::string* why) const;

 private:
  Heap& add_heap(std::unique_ptr<Heap> h);
  // The release a growth of h plans first: h's own chunks or the device's
  // (GrowthPlan::own_heap). Throws DriverError for a cap release that failed.
  void release_for_growth(Heap& h, const GrowthPlan& plan, HandleStash* keep);
  // h's wholly free chunk bytes that a growth of h may release (rule 5):
  // none for the scratch or a private pool still in use.
  std::size_t idle_for_growth(const Heap& h) const;
  // What GrowthPolicy::plan says for a growth of h by `need` bytes for a
  // block of `requested` bytes, on the device's figures now.
  GrowthPlan plan_growth(const Heap& h, std::size_t need, std::size_t requested) const;
  // deallocate in the page map's entry of addr's granule (found already).
  bool deallocate_in(const PageEntry& e, std::uintptr_t addr, std::size_t bytes,
                     vmm::StreamHandle stream, bool own_stream, std::size_t* requested);
  bool defer_free(Heap* h, Span* s, std::uintptr_t addr, std::size_t bytes,
                  vmm::StreamHandle stream, bool own_stream, std::size_t* requested);
  static const char* const kCaptureCap;
  static const char* const kCaptureDevice;
  std::size_t reclaim_for_oom();

  vmm::Driver& driver_;
  const vmm::DeviceCaps& caps_;
  const Config& config_;
  AccessTracker& tracker_;
  StreamRegistry& streams_;
  std::unique_ptr<PhysicalBacking> backing_;
  GrowthPolicy policy_;
  DeviceBudget budget_;
  PageMap pages_;

  mutable std::mutex heaps_mu_;  // heap creation; never held with a heap lock
  std::unordered_map<StreamState*, Heap*> by_stream_;
  std::unordered_map<std::uint64_t, Heap*> pools_;
  std::atomic<Heap*> scratch_{nullptr};
  // Every heap, for sums and steals; a leaf lock. Declared before heaps_, so
  // that heaps (whose destructors fence nothing) go first.
  mutable SpinLock list_lock_;
  std::vector<Heap*> list_;
  std::vector<std::unique_ptr<Heap>> heaps_;

  std::atomic<std::int64_t> peak_live_{0};
  std::atomic<std::int64_t> headroom_{0};
  std::atomic<std::uint64_t> oom_retries_{0};
  std::atomic<std::uint64_t> handles_reused_{0};  // kept handles mapped again (map_for)
  std::atomic<std::uint64_t> fences_{0};
  std::atomic<std::uint64_t> cross_stream_waits_{0};
  std::atomic<std::int64_t> transit_{0};
  std::atomic<std::int64_t> handoffs_{0};
  std::atomic<int> captures_{0};
  // Frees kept back by a capture: address, size, stream, own stream.
  struct DeferredFree {
    std::uintptr_t addr;
    std::size_t bytes;
    vmm::StreamHandle stream;
    bool own_stream;
  };
  std::mutex deferred_mu_;
  std::vector<DeferredFree> deferred_;

};

}  // namespace gvm::detail
