// Heap, the small path: spans, lent granules and free slots (heap.hpp).
#include "heap.hpp"

#include <algorithm>
#include <string>

#include "device_heap.hpp"
#include "gvm/errors.hpp"
#include "hex_address.hpp"

namespace gvm::detail {

// ------------------------------------------------------------ small path --

Span* Heap::new_span(int size_class, std::size_t bytes, std::uintptr_t* first, bool first_try,
                     int shared_class) {
  // A granule from this heap's own arena - or lent by another stream's heap
  // that has one mapped and free, before this one grows - ordered on this
  // heap's stream; `bytes` (the request) is what an out-of-memory message names.
  StreamState& own = *stream();
  WaitSet waits;
  Block* b = nullptr;
  bool mapped = false;
  std::vector<std::uint32_t> counted;
  for (int attempt = 0; b == nullptr; ++attempt) {
    {
      std::lock_guard<SpinLock> guard(lock_);
      b = arena_.take(kGranule, kGranule, &own, false, device_.capturing(), &mapped);
      if (b != nullptr) {
        waits = b->waits;
        b->waits.clear();
        b->stream = &own;
        arena_.commit(b, counted);
      }
    }
    if (b == nullptr) {
      if (attempt > 2) device_.throw_oom(bytes, "address space");
      if (attempt == 0) {
        if (Span* s = borrow_span(size_class, own, first, shared_class); s != nullptr) return s;
      }
      add_region_for(kGranule, kGranule, bytes);
    }
  }
  auto give_back = [&] {
    std::lock_guard<SpinLock> guard(lock_);
    arena_.uncommit(counted);
    b->waits = waits;
    arena_.give_back(b);
  };
  // A span's granule that would raise the device's peak of reserved bytes
  // is looked for among this heap's unused spans first: each is a mapped
  // granule held for a class that no longer uses it (a class's last span
  // stays when its slots are freed). Back in the arena, one of them serves
  // this span, and the growth is not made. Only at a new peak: below it a
  // growth costs no peak memory, and a class whose span went back must make
  // a new one (BERT's trace: 1.102 -> 1.091 reserved per live byte, the other
  // traces unchanged; docs/design-notes.md, "Fragmentation").
  if (!mapped && first_try && unused_spans_before_peak(b)) {
    give_back();
    return new_span(size_class, bytes, first, false, shared_class);
  }
  // As for large blocks: free pieces kept apart by work now known finished
  // merge, and a granule may be among them.
  if (!mapped && first_try && learn_finished()) {
    give_back();
    return new_span(size_class, bytes, first, false, shared_class);
  }
  if (!mapped) {
    if (Span* s = borrow_span(size_class, own, first, shared_class); s != nullptr) {
      give_back();
      return s;
    }
  }
  try {
    if (!mapped) map_under(b, counted, bytes);
    if (!waits.only(&own)) device_.count_cross_stream_waits(device_.tracker().order(waits, own));
  } catch (...) {
    give_back();
    throw;
  }
  std::lock_guard<SpinLock> guard(lock_);
  Span* s = small_.make_span(b->addr, class_size(size_class), size_class, this, b);
  b->span = s;
  b->pending = false;
  b->requested = kGranule;
  // Published in the page map before any slot of it is handed out (a free
  // finds its span there), and its first slot taken under the same lock
  // (an unused span could be reclaimed by a trim the moment the lock goes).
  device_.pages().at(b->addr).span.store(s, std::memory_order_release);
  small_.add_span(s);
  *first = take_first_slot(s, shared_class);
  return s;
}

Block* Heap::lend_granule(StreamState& taker) {
  WaitSet waits;
  Block* b = nullptr;
  {
    std::unique_lock<SpinLock> guard(lock_, std::try_to_lock);
    if (!guard.owns_lock()) return nullptr;
    b = arena_.take(kGranule, kGranule, &taker, true, false);
    if (b == nullptr) return nullptr;
    waits = b->waits;
    b->waits.clear();
    b->stream = &taker;
    b->requested = kGranule;
    arena_.commit(b);
  }
  try {
    if (!waits.only(&taker))
      device_.count_cross_stream_waits(device_.tracker().order(waits, taker));
  } catch (...) {
    return_lent(b, waits);
    throw;
  }
  return b;
}

void Heap::attach_span(Block* b, Span* s) {
  std::lock_guard<SpinLock> guard(lock_);
  b->span = s;
  b->pending = false;
  // In the page map before any slot of it is handed out (a free finds its
  // span there).
  device_.pages().at(b->addr).span.store(s, std::memory_order_release);
}

Span* Heap::borrow_span(int size_class, StreamState& own, std::uintptr_t* first,
                        int shared_class) {
  if (device_.capturing()) return nullptr;  // a borrow may wait for the lender's stream
  // A span handed between two heaps' locks: the checker allows for it.
  DeviceHeap::Handoff handoff(device_);
  Heap* lender = nullptr;
  Block* b = device_.lend_granule(own, this, &lender);
  if (b == nullptr) return nullptr;
  Span* s = nullptr;
  {
    std::lock_guard<SpinLock> guard(lock_);
    s = small_.make_span(b->addr, class_size(size_class), size_class, this, b);
    s->arena_heap = lender;
    // In flight until its first slot is taken: a trim must not see it unused.
    s->in_flight = true;
  }
  lender->attach_span(b, s);  // in the page map, too
  std::lock_guard<SpinLock> guard(lock_);
  s->in_flight = false;
  small_.add_span(s);
  *first = take_first_slot(s, shared_class);
  return s;
}

void Heap::return_lent(Block* b, const WaitSet& waits) {
  std::lock_guard<SpinLock> guard(lock_);
  if (b->span != nullptr) device_.pages().at(b->addr).span.store(nullptr, std::memory_order_release);
  b->span = nullptr;
  arena_.uncommit(b);
  b->waits = waits;
  arena_.give_back(b);
}

void Heap::drain_lent() {
  std::vector<LentBlock> out;
  {
    std::lock_guard<SpinLock> guard(lock_);
    out.swap(lent_back_);
  }
  for (auto& l : out) {
    l.heap->return_lent(l.block, l.waits);
    device_.end_handoff();
  }
}

void Heap::give_back_span(Span* s) {
  // lock_ held. The span's granule goes back to the arena, ordered on the
  // stream whose work used its slots (other streams' frees were ordered onto
  // it when they happened).
  if (Span* host = s->host; host != nullptr) {
    // A shared span goes back into its host's slot, for this stream at once
    // (its slots' other users were ordered onto it when they freed); the
    // host may then be unused in turn.
    const std::uint32_t slot = s->host_slot;
    host->children[slot].store(nullptr, std::memory_order_release);
    small_.release_span(s);
    bool any = false;
    for (const auto& c : host->children) any = any || c.load(std::memory_order_relaxed) != nullptr;
    if (!any) host->hosts.store(false, std::memory_order_release);
    host->push(slot);
    if (Span* unused = small_.pushed(host); unused != nullptr) give_back_span(unused);
    return;
  }
  Block* b = s->block;
  Heap* home = s->arena_heap;
  if (home == this) device_.pages().at(s->base).span.store(nullptr, std::memory_order_release);
  small_.release_span(s);
  StreamState* own = stream();
  WaitSet w;
  if (own != nullptr) w.add(Token{own, own->epoch()});
  if (home != this) {
    // A lent granule goes home once this heap's lock is released (one heap
    // lock at a time): drain_lent() (the checker allows for it meanwhile).
    device_.begin_handoff();
    lent_back_.push_back(LentBlock{home, b, w});
    return;
  }
  b->span = nullptr;
  arena_.uncommit(b);
  b->waits = w;
  arena_.give_back(b);
}

bool Heap::shares_spans(int cls) const noexcept {
  return device_.config().shared_spans && small_max_ >= kSharedSpanBytes &&
         kClassBytes[static_cast<std::size_t>(cls)] <= kSharedSlotMax &&
         small_.class_span_bytes(cls) < kGranule;
}

std::uintptr_t Heap::attach_shared(Span* host, std::uintptr_t slot, int cls) {
  const auto idx = static_cast<std::uint32_t>((slot - host->base) >> kSharedSpanShift);
  Span* s = small_.make_span(slot, class_size(cls), cls, this, nullptr, kSharedSpanBytes);
  s->host = host;
  s->host_slot = idx;
  // Named in its host before any slot of it is handed out (a free finds it
  // there), under the lock that hands out its first slot.
  host->children[idx].store(s, std::memory_order_release);
  host->hosts.store(true, std::memory_order_release);
  small_.add_span(s);
  ++allocations_;
  add_live(static_cast<std::int64_t>(s->slot_size));
  return s->pop();
}

std::uintptr_t Heap::take_first_slot(Span* s, int shared_class) {
  const std::uintptr_t slot = s->pop();
  // A host's first slot is not counted live: only its shared span's are.
  if (shared_class >= 0) return attach_shared(s, slot, shared_class);
  ++allocations_;
  add_live(static_cast<std::int64_t>(s->slot_size));
  return slot;
}

void* Heap::allocate_host_class(std::size_t bytes) { return allocate_small(bytes); }

void* Heap::allocate_small_slow(int cls, std::size_t bytes) {
  // A class of slots above span_max never gets a span of its own: the
  // best-fit arena packs its blocks at 512 B rounding among the large ones,
  // where spans of a few slots each, once the class warms, moved the large
  // blocks around them (docs/design-notes.md, "Rule 8"). Only new spans are
  // refused here: a 256 KiB request (kHostClass) still takes a free slot of
  // a span that hosts shared spans on the fast path, when one is there.
  if (class_size(cls) > span_max_) return allocate_large(bytes, *stream());
  bool cold = false;
  bool shared = false;
  {
    std::lock_guard<SpinLock> guard(lock_);
    cold = small_.cold(cls, device_.config().span_warmup_allocations);
    // A class of small slots that holds less than a granule of spans takes
    // a shared span of 256 KiB (docs/design-notes.md, "Shared spans"): in a
    // free slot of a host span if one has it, else below in a new host.
    shared = !cold && shares_spans(cls);
    if (shared) {
      if (const std::uintptr_t slot = small_.pop(kHostClass); slot != 0)
        return reinterpret_cast<void*>(attach_shared(small_.current(kHostClass), slot, cls));
    }
  }
  // A class still cold is served best fit by the large arena: a span
  // commits a whole granule to one class of this stream, which a class of
  // a few blocks mostly wastes (docs/design-notes.md, "Fragmentation").
  if (cold) return allocate_large(bytes, *stream());
  // No free slot in any span of the class (or in any host): a new span (its
  // granule from this heap's arena or lent by another, with the lock
  // released), whose first slot is ours (counted there, under the lock that
  // took it) or, for a host, its first shared span.
  const int span_class = shared ? kHostClass : cls;
  const int shared_class = shared ? cls : -1;
  std::uintptr_t p = 0;
  try {
    (void)new_span(span_class, bytes, &p, true, shared_class);
  } catch (const OomAfterReclaim&) {
    // The out-of-memory path gave back unused spans of the device: their
    // granules may now be lent, which this attempt looked for before they
    // were there. Once more; then the refusal is final.
    (void)new_span(span_class, bytes, &p, true, shared_class);
  }
  return reinterpret_cast<void*>(p);
}

void Heap::throw_bad_slot(Span* s, std::uintptr_t addr, std::size_t bytes, bool live) const {
  if (!live)
    throw usage_error("gvmalloc: deallocate(" + hex(addr) + ") on device " + std::to_string(device()) +
                      ": not a live block (already freed, never allocated, or an interior pointer)");
  throw usage_error("gvmalloc: deallocate(" + hex(addr) + ", " + std::to_string(bytes) +
                    " bytes) on device " + std::to_string(device()) +
                    ": the block was allocated with a size in another class (slot of " +
                    std::to_string(s->slot_size) + " bytes)");
}

void Heap::span_unused(Span* unused) {
  bool drain = false;
  {
    std::unique_lock<SpinLock> guard(lock_, std::adopt_lock);
    give_back_span(unused);
    drain = !lent_back_.empty();
  }
  if (drain) drain_lent();
}

void Heap::free_slot_slow(Span* s, std::uintptr_t addr, std::size_t bytes,
                          vmm::StreamHandle stream) {
  StreamState* own = this->stream();
  const bool same = own != nullptr && stream == own->handle();
  StreamState* freer = same ? nullptr : &device_.streams().get(stream);
  WaitSet others;
  std::uint32_t idx = 0;
  bool drain = false;
  {
    std::lock_guard<SpinLock> guard(lock_);
    idx = s->slot_at(addr - s->base);
    if (idx == s->slots || !s->is_allocated(idx)) throw_bad_slot(s, addr, bytes, false);
    if (!s->fits(bytes)) throw_bad_slot(s, addr, bytes, true);
    ++frees_;
    add_live(-static_cast<std::int64_t>(s->slot_size));
    auto& rec = small_.recorded();
    if (!rec.empty()) {
      if (auto it = rec.find(addr); it != rec.end()) {
        others = it->second;
        rec.erase(it);
      }
    }
    if (freer == nullptr && others.empty()) {
      // The owner stream reuses the slot at once.
      s->push(idx);
      Span* unused = small_.pushed(s);
      if (unused == nullptr) return;
      give_back_span(unused);
      if (lent_back_.empty()) return;
      drain = true;
    } else {
      s->clear_allocated(idx);  // a second free is refused from now on
    }
  }
  if (drain) {
    drain_lent();
    return;
  }
  // Other streams used the slot: the owner stream waits for their work up to
  // now before the slot is reused - queued before the slot joins the free
  // stack (rare: record_stream, or a free on another stream).
  WaitSet w;
  for (int i = 0; i < others.size(); ++i) w.add(Token{others[i].stream, others[i].stream->epoch()});
  w.add_overflow(others.overflow_devices());
  if (freer != nullptr) w.add(Token{freer, freer->epoch()});
  try {
    if (own != nullptr) device_.count_cross_stream_waits(device_.tracker().order(w, *own));
  } catch (const vmm::DriverError&) {
    // Not even a device sync worked: the context is dead and nothing queued
    // will run again. deallocate reports bad input only.
  }
  {
    std::lock_guard<SpinLock> guard(lock_);
    s->push_cleared(idx);
    if (Span* unused = small_.pushed(s); unused != nullptr) give_back_span(unused);
    if (lent_back_.empty()) return;
  }
  drain_lent();
}

std::size_t Heap::reclaim_spans() {
  std::size_t n = 0;
  {
    std::lock_guard<SpinLock> guard(lock_);
    // Until none is left: a host whose shared spans went back is unused
    // only after them.
    for (auto unused = small_.unused_spans(); !unused.empty(); unused = small_.unused_spans()) {
      for (Span* s : unused) give_back_span(s);
      n += unused.size();
    }
  }
  drain_lent();
  return n;
}

}  // namespace gvm::detail
