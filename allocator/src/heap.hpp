// Heap: the memory one stream allocates from (small and large blocks), or a
// shared heap - a device's peer scratch buffer, a private pool (CUDA graphs,
// MemPool) - serving large blocks to any stream.
//
// Composition: a LargeArena (blocks and chunks) and, for a stream's heap, a
// SmallBlocks front end, behind one spin lock that no other stream's heap
// shares: threads on different streams never queue behind each other on a
// cached allocation, large blocks included. Everything slow happens with
// that lock released: growth (the physical backing, through the device heap),
// stream-order waits (the access tracker), releases and their fences.
//
// Locking: lock_ guards the arena, the spans and the page-map fields of this
// heap's granules. It is a leaf lock: nothing else is taken while it is held
// except the page map's leaf creation (lock-free). growing_ serialises the
// growths of this heap (two blocks of one heap may share an unmapped granule)
// and is taken with lock_ released.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gvm/allocator.hpp"
#include "gvm/memory_map.hpp"
#include "gvm/stats.hpp"
#include "handle_stash.hpp"
#include "large_arena.hpp"
#include "small_blocks.hpp"
#include "spin_lock.hpp"
#include "stream_state.hpp"

namespace gvm::detail {

class DeviceHeap;

class Heap {
 public:
  enum class Kind { stream, scratch, pool };

  // `stream`: the stream a stream heap serves (null for shared heaps).
  Heap(DeviceHeap& device, Kind kind, StreamState* stream, std::uint64_t pool, bool first);
  ~Heap();  // the owner has fenced every device
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  Kind kind() const noexcept { return kind_; }
  int device() const noexcept;
  DeviceHeap& device_heap() const noexcept { return device_; }
  std::uint64_t pool() const noexcept { return pool_; }
  StreamState* stream() const noexcept { return stream_.load(std::memory_order_acquire); }
  // A retired stream's heap given to a new stream (its old stream is
  // complete: nothing of it is pending). Device heap only.
  void adopt(StreamState& s) noexcept { stream_.store(&s, std::memory_order_release); }
  // Requests up to this size go to allocate_small (0: none do): the
  // classes that may get spans (small_max and span_max both bound it).
  std::size_t span_route_max() const noexcept { return span_route_max_; }
  // A request above span_route_max: a class above span_max gets no span
  // (allocate_small_slow, rule 8), so it goes to the arena straight, one
  // lock instead of two (the 64 KiB pair took 373 instructions, 304 now).
  // The host class still pops its spans' free slots first.
  void* allocate_unspanned(std::size_t bytes) {
    if (bytes <= small_max_ && size_class_of(bytes) == kHostClass) [[unlikely]]
      return allocate_host_class(bytes);
    return allocate_large(bytes, *stream());
  }
  // The first stream heap of its device (its region is the large one).
  bool first() const noexcept { return first_; }
  bool backing_on_demand() const noexcept { return arena_.on_demand(); }

  // --- blocks -------------------------------------------------------------
  // Inline, with free_slot: the cache-hit pair is the allocator's hottest
  // path, and a call per layer cost as much as the work (one lock, one pop).
  void* allocate_small(std::size_t bytes) {
    const int cls = size_class_of(bytes);
    {
      std::lock_guard<SpinLock> guard(lock_);
      if (const std::uintptr_t p = small_.pop(cls); p != 0) [[likely]] {
        ++allocations_;
        ++hits_;
        add_live(static_cast<std::int64_t>(kClassBytes[static_cast<std::size_t>(cls)]));
        return reinterpret_cast<void*>(p);
      }
    }
    return allocate_small_slow(cls, bytes);
  }
  // A block of at least `bytes` ordered on `user`'s stream. Throws
  // out_of_memory, driver_error. Inline, with deallocate_large, for the
  // pair of a caching allocator: the block its stream freed last, at
  // exactly this size, where the arena's best fit would put it anyway
  // (LargeArena::reuse_deferred), with no search, split or merge.
  void* allocate_large(std::size_t bytes, StreamState& user) {
    const std::size_t size = (bytes + gvm::kBlockAlignment - 1) & ~(gvm::kBlockAlignment - 1);
    {
      std::lock_guard<SpinLock> guard(lock_);
      if (Block* b = arena_.reuse_deferred(size, &user); b != nullptr) [[likely]] {
        b->stream = &user;
        b->requested = bytes;
        b->waits.clear();
        ++allocations_;
        ++hits_;
        add_live(static_cast<std::int64_t>(size));
        return reinterpret_cast<void*>(b->addr);
      }
    }
    return allocate_large_slow(bytes, user);
  }
  // Frees the live large block starting at addr and returns true; returns
  // false, changing nothing, when none of this heap starts there. Throws
  // usage_error (nothing changed) for a size that does not match.
  // `*requested`: what the block was allocated with.
  // own_stream: on the block's allocation stream (`stream` unused).
  // `e`: the page map's entry of addr's granule (the caller looked it up).
  bool deallocate_large(const PageEntry& e, std::uintptr_t addr, std::size_t bytes,
                        vmm::StreamHandle stream, bool own_stream, std::size_t* requested) {
    // The hot path: a block of this stream's heap freed on that stream,
    // used by no other: its only token is the stream's own.
    StreamState* own = this->stream();
    if (own != nullptr && (own_stream || stream == own->handle())) [[likely]] {
      lock_.lock();
      Block* b = LargeArena::start_in(e, addr);
      if (b != nullptr && b->stream == own && b->waits.empty() &&
          (bytes == kUnknownSize || bytes == b->requested)) [[likely]] {
        if (requested != nullptr) *requested = b->requested;
        b->waits.assign(Token{own, own->epoch()});  // it was empty
        ++frees_;
        add_live(-static_cast<std::int64_t>(b->size));
        arena_.give_back_deferred(b);
        lock_.unlock();
        if (release_after_free_) [[unlikely]]
          device_release_above_threshold();
        return true;
      }
      lock_.unlock();
    }
    return deallocate_large_slow(addr, bytes, stream, own_stream, requested);
  }
  // The live block at addr, for a free deferred during a capture: its
  // requested size, or false if there is none (nothing changes).
  bool live_large(std::uintptr_t addr, std::size_t* requested) const;
  // Exactly [addr, addr + bytes) as a live block again (Allocator::allocate_at).
  void* allocate_at(std::uintptr_t addr, std::size_t bytes, StreamState& user);
  // Frees a slot of span s (this heap is its owner). Throws usage_error for
  // a slot that is not live or a size of another class.
  void free_slot(Span* s, std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream) {
    const StreamState* own = this->stream();
    if (own == nullptr || stream != own->handle()) [[unlikely]]
      return free_slot_slow(s, addr, bytes, stream);
    // The hot path: freed on the heap's own stream, nobody recorded on it:
    // the slot is reusable by this stream at once. Anything else (a bad
    // free included: the slow path words its error) goes the slow way.
    lock_.lock();
    const std::uint32_t idx = s->slot_at(addr - s->base);
    if (idx == s->slots || !s->is_allocated(idx) || !s->fits(bytes) || !small_.recorded().empty())
        [[unlikely]] {
      lock_.unlock();
      return free_slot_slow(s, addr, bytes, stream);
    }
    ++frees_;
    add_live(-static_cast<std::int64_t>(s->slot_size));
    s->push(idx);
    if (Span* unused = small_.pushed(s); unused != nullptr) [[unlikely]]
      return span_unused(unused);  // releases lock_
    lock_.unlock();
  }
  // `user` (a stream of this device) also uses the live slot / block at
  // addr. record_large: false if no live large block starts there.
  void record_slot(Span* s, std::uintptr_t addr, StreamState& user);
  bool record_large(std::uintptr_t addr, StreamState& user);
  // `user` (of any device) uses the live slot / block holding addr: its
  // free, and any fence before this memory's access changes, wait for it.
  void note_slot(Span* s, std::uintptr_t addr, StreamState& user);
  bool slot_is_live(Span* s, std::uintptr_t addr) const;
  void note_large(std::uintptr_t addr, StreamState& user);
  bool is_live_block(std::uintptr_t addr, std::size_t bytes) const;
  bool holds(std::uintptr_t addr) const;

  // --- a private pool ----------------------------------------------------------
  // A capture into this pool is under way (Allocator::begin_capture).
  void capture(int delta) noexcept { capturing_.fetch_add(delta, std::memory_order_acq_rel); }
  bool capturing() const noexcept { return capturing_.load(std::memory_order_acquire) > 0; }
  // No allocation names the pool again; its memory goes back as it is freed.
  void release_pool();
  // As release_pool, but its memory goes back from the next free on (a
  // capture on the device forbids the fence now).
  void release_pool_later() noexcept { released_.store(true, std::memory_order_release); }
  bool released() const noexcept { return released_.load(std::memory_order_acquire); }

  // --- for the device heap ----------------------------------------------------
  // A wholly mapped free block of `size` for `taker`, a stream of another
  // heap: carved here, live here, ordered after this heap's work on it.
  // Null if none fits. Never waits for a lock held by a growth.
  void* steal(std::size_t size, std::size_t bytes, StreamState& taker);
  // A mapped free granule for another heap's span (the span is the
  // borrower's; the granule stays in this arena until the span is unused).
  // Null if none, or if this heap's lock is busy.
  Block* lend_granule(StreamState& taker);
  void attach_span(Block* b, Span* s);
  // A lent granule comes back, waiting for `waits`.
  void return_lent(Block* b, const WaitSet& waits);
  // Returns whole cached chunks to the driver, behind the fence, until
  // `want` bytes are dropped (all: every one). Returns the bytes dropped.
  // `keep`: the chunks are unmapped and their handles go there, still
  // charged to the device and in transit (a growth maps them again,
  // DeviceHeap::map_for); without it they are released.
  std::size_t release_cached(std::size_t want, bool all, HandleStash* keep = nullptr);
  // A growth that took the handles `handles` from hand_over_unfenced failed
  // and releases them: their old mappings are settled first (with a wait);
  // returns the bytes of those that still stand (a driver fault), which
  // stay charged and in transit until they go - the caller credits the rest.
  std::size_t give_up_handovers(const std::vector<vmm::PhysHandle>& handles) noexcept;
  // Unused spans back to the large arena; how many.
  std::size_t reclaim_spans();
  void drop_unused_regions();
  std::size_t cached_bytes() const;
  std::size_t largest_cached_block() const;
  std::size_t mapped_bytes() const;
  // mapped_bytes() without the lock, possibly a moment old (steal's filter).
  std::size_t mapped_estimate() const noexcept { return mapped_.load(std::memory_order_relaxed); }

  // --- the peer scratch -------------------------------------------------------
  // Who may access this heap's chunks (the owner first). Changed only by the
  // peer-access part under the allocator's exclusive policy lock; growth
  // reads it under the shared one.
  const std::vector<vmm::AccessDesc>& access() const noexcept { return access_; }
  void set_access_list(std::vector<vmm::AccessDesc> a) { access_ = std::move(a); }
  // A grant of a new chunk to peers is emulated by the driver as a global
  // toggle (pre-Ampere: it races in-flight peer work like one): growth is
  // then fenced like an access change. Set by the peer-access part.
  void set_grants_fenced(bool on) noexcept { grants_fenced_ = on; }
  // The mapped chunks, for an access change. Hold chunks_lock() across the
  // change: no release drops a chunk meanwhile.
  std::vector<Run> chunk_ranges() const;
  std::mutex& chunks_lock() noexcept { return chunks_mu_; }
  // Every stream that may touch this heap's memory now: live blocks' streams
  // and users, free blocks' waits (the fence before an access change).
  WaitSet touching() const;

  // --- accounting -------------------------------------------------------------
  std::int64_t live_bytes() const noexcept { return live_.load(std::memory_order_relaxed); }
  void add_stats(DeviceStats& s) const;
  // With every heap of the device locked (a lent span's slots are its
  // borrower's): device_heap.cpp's memory_map and check take them all.
  SpinLock& lock() const noexcept { return lock_; }
  void memory_map_locked(std::vector<SegmentInfo>& out) const;
  // Spans counted in this arena and in this front end: the device compares
  // the sums (a lent span is in one heap's arena and another's front end).
  bool check_locked(std::string* why, std::int64_t* live, std::size_t* arena_spans,
                    std::size_t* front_spans) const;

 private:
  void* finish_large(Block* b, StreamState& user, std::size_t bytes, bool hit);
  void* allocate_large_slow(std::size_t bytes, StreamState& user);
  bool deallocate_large_slow(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream,
                             bool own_stream, std::size_t* requested);
  // DeviceHeap::maybe_release_above_threshold (device_heap.hpp is not
  // included here).
  void device_release_above_threshold() noexcept;
  // Before growing it may take again, once for each: after learning which
  // streams' work finished (first_try: learn_finished may still be asked),
  // after giving unused spans back (reclaim: unused_spans_before_peak), and
  // from a fully mapped free block however much larger than the request
  // (any_mapped: rule 10, where the growth would set a new peak of reserved
  // bytes).
  void* allocate_large_once(std::size_t bytes, StreamState& user, bool first_try = true,
                            bool reclaim = true, bool any_mapped = false);
  // This heap has unused spans and mapping what b lacks would raise the
  // device's peak of reserved bytes: the spans go back to the arena (true).
  bool unused_spans_before_peak(const Block* b);
  // Rule 10: a fully mapped free block of this heap would take the request
  // (`size`, rounded, for `bytes`), and mapping what b lacks would raise the
  // device's peak of reserved bytes with no release first.
  bool mapped_fit_instead_of_peak(const Block* b, std::size_t size, std::size_t bytes,
                                  const StreamState& user);
  // Before a growth: if free neighbours are kept apart by tokens, asks the
  // driver which streams' work finished (AccessTracker::poll, lock_
  // released) and, if any did, lets the arena merge them. True: take again.
  bool learn_finished();
  void* allocate_small_slow(int cls, std::size_t bytes);
  // allocate_small out of line (the hot path inlines it once).
  void* allocate_host_class(std::size_t bytes);
  void free_slot_slow(Span* s, std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream);
  // free_slot left span `unused` without a live slot: it goes back to the
  // arena. Called with lock_ held; releases it.
  void span_unused(Span* unused);
  [[noreturn, gnu::cold, gnu::noinline]] void throw_bad_slot(Span* s, std::uintptr_t addr,
                                                             std::size_t bytes, bool live) const;
  Block* grow_for(std::size_t size, std::size_t alignment, StreamState& user, std::size_t requested,
                  WaitSet* waits);
  void map_under(Block* b, std::vector<std::uint32_t>& counted, std::size_t requested);
  void add_region_for(std::size_t size, std::size_t alignment, std::size_t requested);
  // A new span of the class (its first slot in *first). first_try: before
  // growing, this heap's unused spans may go back to the arena, or finished
  // work be learnt (learn_finished), and the span taken again (once).
  // shared_class >= 0: the new span is a host (size_class is kHostClass),
  // its first slot becomes a shared span of shared_class, and *first is
  // that span's first slot.
  Span* new_span(int size_class, std::size_t bytes, std::uintptr_t* first, bool first_try = true,
                 int shared_class = -1);
  Span* borrow_span(int size_class, StreamState& own, std::uintptr_t* first, int shared_class);
  // A class that takes its next span as a shared one (Config::shared_spans).
  bool shares_spans(int cls) const noexcept;
  // The first slot of new span s, counted live; for a host (shared_class
  // >= 0), the first slot of the shared span made in it. lock_ held.
  std::uintptr_t take_first_slot(Span* s, int shared_class);
  // Slot `slot` of span `host` (taken, not counted live) becomes a shared
  // span of class `cls`; returns its first slot, counted. lock_ held.
  std::uintptr_t attach_shared(Span* host, std::uintptr_t slot, int cls);
  // The span's slots, for memory_map (a host's shared spans slot by slot).
  static void describe_span(SegmentInfo& seg, const Span& s, vmm::StreamHandle h);
  void drain_lent();
  void give_back_span(Span* s);  // lock_ held
  // Live bytes up or down (lock_ held); past the watermark the device's
  // peak is refreshed (device_heap.hpp).
  void add_live(std::int64_t n) noexcept {
    const std::int64_t live = live_.load(std::memory_order_relaxed) + n;
    live_.store(live, std::memory_order_relaxed);
    if (live > peak_watermark_.load(std::memory_order_relaxed)) [[unlikely]]
      refresh_watermark(live);
  }
  [[gnu::noinline]] void refresh_watermark(std::int64_t live) noexcept;
  // A record on the heap's stream after it grew (AccessTracker::mark).
  void mark_growth();
  // release_cached's way when every picked chunk's handle goes to the growth
  // and only the growth's own stream may still read them: no host wait
  // (returns the bytes handed over; 0, changing nothing, when it may not).
  std::size_t hand_over_unfenced(std::vector<LargeArena::Release>& picked, const WaitSet& waits,
                                 HandleStash* keep);
  // The old mappings of handles handed over with no host wait ("Handed over
  // before the work is done" in docs/design-notes.md): unmapped now if their
  // work is known finished, or after a host wait for it (wait). chunks_mu_
  // held; `poll`: ask the driver which streams' work finished first; `over`:
  // wait only for the old mappings that overlap these runs (a growth about to
  // map them). Throws DriverError when the wait fails (nothing changed).
  void settle_handovers_locked(bool wait, bool poll, const std::vector<Run>* over = nullptr);
  // An old mapping of a handover lies over part of `runs` (chunks_mu_ held).
  bool overlaps_handover(const std::vector<Run>& runs) const;
  WaitSet tokens_now(const Block* b, StreamState* also) const;

  DeviceHeap& device_;
  const Kind kind_;
  std::atomic<StreamState*> stream_;
  const std::uint64_t pool_;
  const bool first_;  // the first heap of its device: the large region
  const std::size_t small_max_;
  const std::size_t span_max_;  // classes of larger slots get no spans
  const std::size_t span_route_max_;  // see span_route_max()
  // Config::release_threshold_bytes is set: a free may release (the
  // config is fixed for the allocator's life).
  const bool release_after_free_;
  std::vector<vmm::AccessDesc> access_;
  bool grants_fenced_ = false;

  mutable SpinLock lock_;
  std::mutex growing_;
  // Held by a release of this heap's chunks and by an access change of them
  // (the peer scratch: a release for another heap's growth may come from any
  // thread, with no policy lock).
  std::mutex chunks_mu_;
  LargeArena arena_;
  // Old mappings of handles handed over to a growth before the work queued
  // on them was known finished (hand_over_unfenced): the arena counts their
  // ranges free and unmapped already; each is unmapped once `waits` is known
  // finished, and before anything maps its range again (settle_handovers_locked).
  // Under chunks_mu_. Destroyed before the arena: the owner has fenced every
  // device by then (~Heap), and each Mapping unmaps itself.
  struct Handover {
    vmm::Mapping old;
    WaitSet waits;
    vmm::PhysHandle handle = 0;  // which handle it maps (the growth owns it)
    // The handle was released while this mapping stood (a growth that
    // failed, give_up_handovers): its memory is still the device's, charged
    // and in transit until this mapping goes - or, for a handle handed over
    // twice, until the last of its old mappings goes (the debt moves there).
    bool owed = false;
  };
  // A handle another mapping of which still stands (release_cached keeps its
  // chunk mapped rather than release it). chunks_mu_ held.
  bool has_old_mapping(vmm::PhysHandle h) const noexcept;
  std::vector<Handover> handovers_;
  SmallBlocks small_;
  // Lent granules whose spans went unused, to go home with lock_ released.
  struct LentBlock {
    Heap* heap;
    Block* block;
    WaitSet waits;
  };
  std::vector<LentBlock> lent_back_;

  // Live bytes (written under lock_, read by anyone) and the watermark above
  // which this heap may be setting a new device peak (device_heap.hpp).
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::size_t> mapped_{0};  // arena_.mapped_bytes(), written under lock_
  std::atomic<std::int64_t> peak_watermark_{-1};
  // Counters, under lock_.
  std::uint64_t allocations_ = 0;
  std::uint64_t frees_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t cross_stream_waits_ = 0;
  std::atomic<std::uint64_t> waits_outside_{0};  // counted with lock_ released
  std::atomic<int> capturing_{0};
  std::atomic<bool> released_{false};
};

}  // namespace gvm::detail
