// Heap: blocks of one stream, or of a shared heap (heap.hpp).
#include "heap.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <new>
#include <string>

#include "device_heap.hpp"
#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"

namespace gvm::detail {
namespace {

constexpr std::size_t round_up(std::size_t x, std::size_t a) noexcept { return (x + a - 1) / a * a; }

std::string hex(std::uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, p);
  return buf;
}

// A block that must grow, carved by take() at its free block's head, moves
// further into that free block when the head is unmapped and mapped granules
// of a chunk that holds live data lie behind it: they are free memory that no
// release can return (their chunk is live), and the head would map new
// granules beside them instead. Wholly free chunks are not slid onto (the
// release before growth returns those; sliding onto them measured worse on
// the synthetic KV-cache trace, 1.046 -> 1.066). The synthetic side-stream
// trace's peak was such a growth: 48 MiB grew by 30 MiB beside a 48 MiB hole
// (1.078 -> 1.039 reserved per live byte with this; the shipped and the other
// traces unchanged, docs/design-notes.md "Fragmentation"). Only on the way to
// a growth: the chunks inside the free block (from the arena's address index)
// and take_at's walk cost far less than the growth.
Block* slide_onto_live_chunks(LargeArena& arena, Block* b, std::size_t size) {
  const Block* n = b->next;  // take() leaves the rest of the free block here
  if (n == nullptr || !n->free) return b;
  const std::uintptr_t lo = b->addr, hi = n->end();
  const std::vector<Run> live = arena.live_chunk_runs(lo, hi);  // in address order
  if (live.empty()) return b;
  const std::uintptr_t at = live.front().first;
  if (at == lo || at + size > hi) return b;
  auto on_live = [&](std::uintptr_t p) {
    std::size_t m = 0;
    for (const Run& r : live) {
      const std::uintptr_t s = std::max<std::uintptr_t>(r.first, p);
      const std::uintptr_t e = std::min<std::uintptr_t>(r.first + r.second, p + size);
      if (s < e) m += e - s;
    }
    return m;
  };
  if (on_live(at) <= on_live(lo)) return b;
  arena.give_back(b);
  if (Block* moved = arena.take_at(at, size); moved != nullptr) return moved;
  return arena.take_at(lo, size);  // b's own range is free again
}

}  // namespace

Heap::Heap(DeviceHeap& device, Kind kind, StreamState* stream, std::uint64_t pool, bool first)
    : device_(device),
      kind_(kind),
      stream_(stream),
      pool_(pool),
      first_(first),
      // A span is one granule with at least two slots.
      small_max_(kind == Kind::stream
                     ? std::min(device.config().small_block_max_bytes, kGranule / 2)
                     : 0),
      span_max_(device.config().span_max_bytes),
      span_route_max_(std::min(small_max_, span_max_ < kMinClassBytes
                                               ? 0
                                               : class_size(size_class_of(span_max_ + 1) - 1))),
      release_after_free_(device.config().release_threshold_bytes != SIZE_MAX),
      access_{{device.device(), vmm::Access::read_write}},
      arena_(device.driver(), device.device(), device.pages(), this, device.backing().on_demand()) {}

Heap::~Heap() = default;

int Heap::device() const noexcept { return device_.device(); }

void Heap::refresh_watermark(std::int64_t live) noexcept {
  // Only this heap's own watermark moves: writing every heap's would bounce
  // their cache lines between threads on each refresh.
  peak_watermark_.store(live + device_.refresh_peak(), std::memory_order_relaxed);
}

// Tokens for the work a block's users have queued so far: the allocation
// stream, the other streams that used it (record_stream, peer copies) and
// `also` (the freeing stream).
WaitSet Heap::tokens_now(const Block* b, StreamState* also) const {
  WaitSet w;
  if (b->stream != nullptr) w.add(Token{b->stream, b->stream->epoch()});
  for (int i = 0; i < b->waits.size(); ++i) {
    StreamState* u = b->waits[i].stream;
    w.add(Token{u, u->epoch()});
  }
  w.add_overflow(b->waits.overflow_devices());
  if (also != nullptr) w.add(Token{also, also->epoch()});
  return w;
}

// --------------------------------------------------------------- regions --

void Heap::add_region_for(std::size_t size, std::size_t alignment, std::size_t requested) {
  if (arena_.on_demand()) {
    vmm::ReservedRange va = device_.reserve_for(*this, size, alignment);
    std::lock_guard<SpinLock> guard(lock_);
    arena_.add_region(std::move(va));
    return;
  }
  std::size_t bytes = round_up(size, kGranule);
  const vmm::DevicePtr p = device_.segment_for(*this, &bytes, alignment, requested);
  {
    std::lock_guard<SpinLock> guard(lock_);
    arena_.add_segment(p, bytes);
    mapped_.store(arena_.mapped_bytes(), std::memory_order_relaxed);
  }
  device_.transit(-static_cast<std::int64_t>(bytes));
  mark_growth();
}

void Heap::mark_growth() {
  // What was freed before this growth and is released at a later one is
  // waited for up to here only (stream_state.hpp, "Records kept").
  if (StreamState* s = stream(); s != nullptr) device_.tracker().mark(*s);
}

// ------------------------------------------------------------ large path --

// Maps what is missing under b (allocated to the caller, its mapped part
// committed). growing_ serialises this heap's growths: two blocks may share a
// granule, and the runs are read again under it.
void Heap::map_under(Block* b, std::vector<std::uint32_t>& counted, std::size_t requested) {
  std::lock_guard<std::mutex> grow(growing_);
  std::vector<Run> runs;
  {
    // Counted again: a growth that ran while this one waited may have
    // mapped a granule b shares with its block (two blocks can share one).
    std::lock_guard<SpinLock> guard(lock_);
    arena_.uncommit(counted);
    counted.clear();
    arena_.commit(b, counted);
    runs = arena_.unmapped_runs(b);
  }
  std::size_t need = 0;
  for (const auto& r : runs) need += r.second;
  if (need == 0) return;
  if (grants_fenced_ && access_.size() > 1) {
    // Pre-Ampere: granting the new chunk to the peers acts like toggling
    // context peer access, which kills the context under in-flight peer
    // work (docs/measurements.md, hazards): the same fence as an access
    // change first.
    if (device_.capturing())
      device_.throw_oom(requested, "a CUDA graph capture: growing the peer scratch on this GPU "
                                   "needs a fence the capture forbids");
    WaitSet w = touching();
    if (!device_.config().scratch_fence_tracked) {
      for (const auto& a : access_) w.add_overflow(WaitSet::device_bit(a.device));
      for (int i = 0; i < w.size(); ++i) w.add_overflow(WaitSet::device_bit(w[i].stream->device()));
    }
    device_.tracker().fence(w);
  }
  {
    // An old mapping left by a handover (hand_over_unfenced) goes before
    // anything is mapped over its range: a wait for its work, if any is left.
    std::lock_guard<std::mutex> chunks(chunks_mu_);
    settle_handovers_locked(true, true, &runs);
    if (overlaps_handover(runs))  // only during a capture, which forbids the wait
      device_.throw_oom(requested, "a CUDA graph capture: the address range it would map still "
                                   "holds an old mapping whose work the capture forbids waiting "
                                   "for");
  }
  std::vector<vmm::MappedChunk> made =
      device_.map_for(*this, runs, need, requested, b->end(), b->stream);
  {
    std::lock_guard<SpinLock> guard(lock_);
    for (auto& m : made) counted.push_back(arena_.install_chunk(std::move(m), 1));  // counts b
    mapped_.store(arena_.mapped_bytes(), std::memory_order_relaxed);
  }
  device_.transit(-static_cast<std::int64_t>(need));
  mark_growth();
}

void* Heap::finish_large(Block* b, StreamState& user, std::size_t bytes, bool hit) {
  // lock_ held.
  b->stream = &user;
  b->requested = bytes;
  b->waits.clear();
  b->pending = false;
  arena_.link_start(b);
  ++allocations_;
  if (hit) ++hits_;
  add_live(static_cast<std::int64_t>(b->size));
  return reinterpret_cast<void*>(b->addr);
}

void Heap::device_release_above_threshold() noexcept { device_.maybe_release_above_threshold(); }

void* Heap::allocate_large_slow(std::size_t bytes, StreamState& user) {
  try {
    return allocate_large_once(bytes, user);
  } catch (const OomAfterReclaim&) {
    // As in allocate_small_slow: memory given back by the out-of-memory
    // path may now be stolen; once more.
    return allocate_large_once(bytes, user);
  }
}

bool Heap::learn_finished() {
  if (device_.capturing()) return false;
  {
    std::lock_guard<SpinLock> guard(lock_);
    if (!arena_.has_stuck()) return false;
  }
  if (device_.tracker().poll(device()) == 0) return false;
  std::lock_guard<SpinLock> guard(lock_);
  arena_.recheck_stuck();
  return true;
}

bool Heap::unused_spans_before_peak(const Block* b) {
  // No driver call and no wait: a span without live slots is mapped free
  // memory of this heap, as a free block is (a capture may take it too).
  std::size_t need = 0;
  {
    std::lock_guard<SpinLock> guard(lock_);
    if (small_.unused_spans().empty()) return false;
    for (const auto& r : arena_.unmapped_runs(b)) need += r.second;
  }
  return device_.growth_raises_peak(need) && reclaim_spans() != 0;
}

void* Heap::allocate_large_once(std::size_t bytes, StreamState& user, bool first_try,
                                bool reclaim) {
  const std::size_t size = round_up(bytes, kBlockAlignment);
  Block* b = nullptr;
  WaitSet waits;  // what the memory's last users left for `user` to wait for
  bool mapped = false;
  std::vector<std::uint32_t> counted;  // a growing block's chunks, as counted
  for (int attempt = 0; b == nullptr; ++attempt) {
    {
      std::lock_guard<SpinLock> guard(lock_);
      // During a capture on the device no stream waits for another's work
      // (the wait may cross the capture's boundary): only memory this
      // stream used last, or none did, is taken.
      b = arena_.take(size, kBlockAlignment, &user, false, device_.capturing());
      if (b != nullptr) {
        mapped = arena_.fully_mapped(b);
        if (!mapped && !device_.capturing()) {
          b = slide_onto_live_chunks(arena_, b, size);
          mapped = arena_.fully_mapped(b);
        }
        waits = b->waits;
        b->waits.clear();
        b->stream = &user;
        // Its mapped chunks cannot go while it is ours.
        if (mapped) {
          arena_.commit(b);
          (void)finish_large(b, user, bytes, true);
        } else {
          arena_.commit(b, counted);
        }
      }
    }
    if (b == nullptr) {
      // No room in the regions. Mapped free memory of another stream's heap
      // first, then address space (VMM) or a segment (no VMM).
      if (kind_ == Kind::stream && attempt == 0 && !device_.capturing()) {
        if (void* p = device_.steal(size, bytes, user, this); p != nullptr) return p;
      }
      if (attempt > 2) device_.throw_oom(bytes, "address space");
      add_region_for(size, kBlockAlignment, bytes);
    }
  }
  bool finished = mapped;
  auto undo = [&] {
    std::lock_guard<SpinLock> guard(lock_);
    if (finished) {
      arena_.unlink_start(b);
      --allocations_;
      if (mapped) --hits_;
      add_live(-static_cast<std::int64_t>(b->size));
    }
    if (mapped)
      arena_.uncommit(b);
    else
      arena_.uncommit(counted);
    b->waits = waits;
    arena_.give_back(b);
  };
  if (!mapped && reclaim && unused_spans_before_peak(b)) {
    // The rule of a span's granule (new_span) for a large block: a growth
    // that would raise the device's peak of reserved bytes first gives this
    // heap's unused spans' granules back to the arena - mapped memory held
    // for classes that no longer use it - and the fit is made again.
    undo();
    return allocate_large_once(bytes, user, first_try, false);
  }
  if (!mapped && first_try && learn_finished()) {
    // Free memory that streams' tokens kept in pieces may merge now that
    // their work is known finished: once more before growing.
    undo();
    return allocate_large_once(bytes, user, false, reclaim);
  }
  if (!mapped) {
    // Before growing: mapped free memory of another stream's heap.
    try {
      if (kind_ == Kind::stream && !device_.capturing()) {
        if (void* p = device_.steal(size, bytes, user, this); p != nullptr) {
          undo();
          return p;
        }
      }
      // (A steal whose stream wait fails throws: b goes back as well.)
      map_under(b, counted, bytes);
    } catch (...) {
      undo();
      throw;
    }
    std::lock_guard<SpinLock> guard(lock_);
    (void)finish_large(b, user, bytes, false);
    finished = true;
  }
  // Another stream's work on the memory first (stream waits, no host sync).
  if (!waits.only(&user)) {
    try {
      device_.count_cross_stream_waits(device_.tracker().order(waits, user));
    } catch (...) {
      undo();
      throw;
    }
  }
  return reinterpret_cast<void*>(b->addr);
}

void* Heap::steal(std::size_t size, std::size_t bytes, StreamState& taker) {
  WaitSet waits;
  Block* b = nullptr;
  {
    // A heap in the middle of a growth is skipped, not waited for.
    std::unique_lock<SpinLock> guard(lock_, std::try_to_lock);
    if (!guard.owns_lock()) return nullptr;
    b = arena_.take(size, kBlockAlignment, &taker, true, false);
    if (b == nullptr) return nullptr;
    waits = b->waits;
    arena_.commit(b);
    (void)finish_large(b, taker, bytes, true);
  }
  try {
    device_.count_cross_stream_waits(device_.tracker().order(waits, taker));
  } catch (...) {
    std::lock_guard<SpinLock> guard(lock_);
    arena_.unlink_start(b);
    arena_.uncommit(b);
    --allocations_;
    --hits_;
    add_live(-static_cast<std::int64_t>(b->size));
    b->waits = waits;
    arena_.give_back(b);
    throw;
  }
  return reinterpret_cast<void*>(b->addr);
}

bool Heap::deallocate_large_slow(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream,
                                 bool own_stream, std::size_t* requested) {
  // The freeing stream's state, when it is not the block's own stream (rare:
  // looked up before taking the lock, which is a leaf).
  StreamState* own = this->stream();
  StreamState* freer = nullptr;
  if (!own_stream && (own == nullptr || stream != own->handle()))
    freer = &device_.streams().get(stream);
  bool had_users = false;
  WaitSet users;
  {
    std::lock_guard<SpinLock> guard(lock_);
    Block* b = arena_.find_start(addr);
    if (b == nullptr) return false;  // the caller names what it is
    if (bytes != kUnknownSize && bytes != b->requested)
      throw usage_error("gvmalloc: deallocate(" + hex(addr) + ", " + std::to_string(bytes) +
                        " bytes) on device " + std::to_string(device()) +
                        ": the block was allocated with " + std::to_string(b->requested) + " bytes");
    if (requested != nullptr) *requested = b->requested;
    StreamState* also = freer != nullptr && freer != b->stream ? freer : nullptr;
    had_users = !b->waits.empty();
    if (had_users) users = b->waits;
    b->waits = tokens_now(b, also);
    ++frees_;
    add_live(-static_cast<std::int64_t>(b->size));
    arena_.give_back_deferred(b);
  }
  if (had_users && !device_.capturing()) {
    // record_stream's promise, as PyTorch's allocator keeps it: an event on
    // every recorded stream at free time, so that a later taker waits for
    // their work up to now and no further. (Not during a capture: the
    // stream may be capturing; a later taker records it then.)
    WaitSet fresh;
    for (int i = 0; i < users.size(); ++i) fresh.add(Token{users[i].stream, users[i].stream->epoch()});
    try {
      device_.tracker().cover_now(fresh);
    } catch (...) {
      // deallocate reports bad input only; a later taker records or syncs.
    }
  }
  if (released() && !device_.capturing()) {
    // A released pool gives its memory back as its blocks come home.
    try {
      (void)release_cached(0, true);
      drop_unused_regions();
    } catch (...) {
      // deallocate reports bad input only; the next trim tries again.
    }
  }
  device_.maybe_release_above_threshold();
  return true;
}

bool Heap::slot_is_live(Span* s, std::uintptr_t addr) const {
  std::lock_guard<SpinLock> guard(lock_);
  const std::uint32_t idx = s->slot_at(addr - s->base);
  return idx != s->slots && s->is_allocated(idx);
}

bool Heap::live_large(std::uintptr_t addr, std::size_t* requested) const {
  std::lock_guard<SpinLock> guard(lock_);
  const Block* b = arena_.find_start(addr);
  if (b == nullptr) return false;
  *requested = b->requested;
  return true;
}

void Heap::release_pool() {
  released_.store(true, std::memory_order_release);
  (void)release_cached(0, true);
  drop_unused_regions();
}

void* Heap::allocate_at(std::uintptr_t addr, std::size_t bytes, StreamState& user) {
  const std::size_t size = round_up(bytes, kBlockAlignment);
  WaitSet waits;
  std::vector<std::uint32_t> counted;
  Block* b = nullptr;
  bool mapped = false;
  {
    std::lock_guard<SpinLock> guard(lock_);
    b = arena_.take_at(addr, size);
    if (b == nullptr)
      throw usage_error("gvmalloc: allocate_at(" + hex(addr) + ", " + std::to_string(bytes) +
                        " bytes): the range is not free memory of pool " + std::to_string(pool_));
    waits = b->waits;
    b->waits.clear();
    b->stream = &user;
    arena_.commit(b, counted);
    mapped = arena_.fully_mapped(b);
    if (mapped) (void)finish_large(b, user, bytes, true);
  }
  auto undo = [&](bool finished) {
    std::lock_guard<SpinLock> guard(lock_);
    if (finished) {
      arena_.unlink_start(b);
      --allocations_;
      add_live(-static_cast<std::int64_t>(b->size));
    }
    arena_.uncommit(counted);
    b->waits = waits;
    arena_.give_back(b);
  };
  if (!mapped) {
    try {
      map_under(b, counted, bytes);
    } catch (...) {
      undo(false);
      throw;
    }
    std::lock_guard<SpinLock> guard(lock_);
    (void)finish_large(b, user, bytes, false);
  }
  if (!waits.only(&user)) {
    try {
      if (device_.capturing())
        device_.throw_oom(bytes, "CUDA graph capture: the range was last used by another stream, "
                                 "whose work a capture cannot wait for");
      device_.count_cross_stream_waits(device_.tracker().order(waits, user));
    } catch (...) {
      undo(true);  // the range is free again, as it was
      throw;
    }
  }
  return reinterpret_cast<void*>(b->addr);
}

void Heap::record_slot(Span* s, std::uintptr_t addr, StreamState& user) {
  std::lock_guard<SpinLock> guard(lock_);
  const std::uint32_t idx = s->slot_at(addr - s->base);
  if (idx == s->slots || !s->is_allocated(idx))
    throw usage_error("gvmalloc: record_stream(" + hex(addr) + "): not a live block");
  if (&user != stream()) small_.recorded()[addr].add(Token{&user, 0});
}

void Heap::note_slot(Span* s, std::uintptr_t addr, StreamState& user) {
  // A slot of a span: the span's owner stream orders its reuse; another
  // stream's use (a peer's copy may start inside a slot) is recorded on the
  // slot it lies in.
  std::lock_guard<SpinLock> guard(lock_);
  const std::uintptr_t slot = s->base + (addr - s->base) / s->slot_size * s->slot_size;
  if (!s->is_allocated(static_cast<std::uint32_t>((slot - s->base) / s->slot_size))) return;
  if (&user != stream()) small_.recorded()[slot].add(Token{&user, 0});
}

bool Heap::record_large(std::uintptr_t addr, StreamState& user) {
  std::lock_guard<SpinLock> guard(lock_);
  Block* b = arena_.find_start(addr);
  if (b == nullptr) return false;
  if (&user != b->stream) b->waits.add(Token{&user, 0});
  return true;
}

void Heap::note_large(std::uintptr_t addr, StreamState& user) {
  std::lock_guard<SpinLock> guard(lock_);
  // Any pointer into a live block: a copy may start inside one.
  Block* b = arena_.live_block_holding(addr, 1);
  if (b == nullptr || b->span != nullptr) return;
  if (&user != b->stream) b->waits.add(Token{&user, 0});
}

bool Heap::is_live_block(std::uintptr_t addr, std::size_t bytes) const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.live_block_holding(addr, bytes) != nullptr;
}

bool Heap::holds(std::uintptr_t addr) const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.holds(addr);
}

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
      b = arena_.take(kGranule, kGranule, &own, false, device_.capturing());
      if (b != nullptr) {
        waits = b->waits;
        b->waits.clear();
        b->stream = &own;
        arena_.commit(b, counted);
        mapped = arena_.fully_mapped(b);
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

// --------------------------------------------------------------- release --

std::size_t Heap::release_cached(std::size_t want, bool all, HandleStash* keep) {
  std::lock_guard<std::mutex> chunks(chunks_mu_);
  // Old mappings left by handovers before: gone if their work is done; a
  // release of everything (a trim, the out-of-memory path) waits for them.
  settle_handovers_locked(all, true);
  std::vector<LargeArena::Release> picked;
  WaitSet waits;
  {
    std::lock_guard<SpinLock> guard(lock_);
    arena_.settle();  // the walks below carve merged free blocks only
    // Which chunks go: the largest first until `want` is met, those a
    // growth waiting for them can take first (handover_first). Then they
    // are begun in address order (one walk of the region), and dropped and
    // ended in the order chosen.
    const std::vector<std::uint32_t> cached =
        keep == nullptr || all
            ? arena_.cached_chunks()
            : handover_first(arena_.cached_chunks(), keep->wanted(), want,
                             [&](std::uint32_t c) { return arena_.chunk_size(c); });
    const std::vector<bool> ok = arena_.releasable(cached);
    std::vector<std::uint32_t> chosen;
    std::size_t sum = 0;
    for (std::size_t i = 0; i < cached.size(); ++i) {
      if (!all && sum >= want) break;
      if (!ok[i]) continue;
      chosen.push_back(cached[i]);
      sum += arena_.chunk_size(cached[i]);
    }
    std::vector<std::size_t> by_address(chosen.size());
    for (std::size_t i = 0; i < by_address.size(); ++i) by_address[i] = i;
    std::sort(by_address.begin(), by_address.end(), [&](std::size_t a, std::size_t b) {
      return arena_.chunk_addr(chosen[a]) < arena_.chunk_addr(chosen[b]);
    });
    std::vector<LargeArena::Release> begun(chosen.size());
    std::vector<bool> taken(chosen.size(), false);
    Block* cursor = nullptr;
    for (std::size_t i : by_address) taken[i] = arena_.begin_release(chosen[i], &begun[i], &waits, &cursor);
    for (std::size_t i = 0; i < chosen.size(); ++i)
      if (taken[i]) picked.push_back(std::move(begun[i]));
  }
  if (picked.empty()) return 0;
  if (kind_ == Kind::scratch && !device_.config().scratch_fence_tracked) {
    // Peers' work on the scratch is not seen by the allocator unless the
    // caller names it: every device that has access is drained, and the
    // devices of the streams known to have touched it.
    for (const auto& a : access_) waits.add_overflow(WaitSet::device_bit(a.device));
    for (int i = 0; i < waits.size(); ++i)
      waits.add_overflow(WaitSet::device_bit(waits[i].stream->device()));
  }
  if (const std::size_t handed = hand_over_unfenced(picked, waits, keep); handed != 0)
    return handed;
  // The fence: every stream whose work may still touch the chunks. They are
  // carved out of the free set, so nothing is handed out from them meanwhile,
  // and no lock is held while the host waits. It covers the old mappings
  // left by earlier handovers too: a handle released below may be one of
  // theirs, and its memory goes back only with its last mapping.
  for (const Handover& h : handovers_) waits.merge(h.waits);
  bool fenced = true;
  if (!waits.empty()) device_.count_fence();
  try {
    device_.tracker().fence(waits);
  } catch (const vmm::DriverError&) {
    fenced = false;
  }
  if (fenced) {
    for (Handover& h : handovers_) h.waits.clear();
    try {
      settle_handovers_locked(false, false);
    } catch (const vmm::DriverError&) {  // no wait left to fail
    }
  }
  std::size_t dropped = 0;
  vmm::Result failure = vmm::Result::success;
  for (LargeArena::Release& r : picked) {
    vmm::PhysicalChunk kept;
    // A handle whose old mapping still stands (its unmap failed) is neither
    // released - its memory would stay while the budget said it went - nor
    // kept for the growth, which may leave it to be released. Its chunk
    // stays mapped until that mapping goes.
    const bool held = arena_.on_demand() && has_old_mapping(r.mem.handle());
    const vmm::Result res = fenced && !held
                                ? arena_.drop(r, keep != nullptr ? &kept : nullptr)
                                : vmm::Result::unknown;
    const std::size_t size = r.size;
    const bool ok = res == vmm::Result::success;
    if (ok) device_.transit(static_cast<std::int64_t>(size));  // gone here, not yet credited
    {
      std::lock_guard<SpinLock> guard(lock_);
      arena_.end_release(r, ok);
      mapped_.store(arena_.mapped_bytes(), std::memory_order_relaxed);
    }
    if (ok) {
      dropped += size;
      // A handle kept for the growth stays charged and in transit until the
      // growth maps or releases it (DeviceHeap::map_for); any other is
      // released now (drop did, or here when it could not be kept).
      const bool for_growth = !kept.empty() && keep->add(std::move(kept));
      if (!for_growth) {
        (void)kept.reset();  // cuMemRelease (an empty one does nothing)
        device_.credit(size);
        device_.transit(-static_cast<std::int64_t>(size));
      }
    } else if (failure == vmm::Result::success && !held) {
      failure = res;
    }
  }
  if (!fenced) device_.tracker().fence(waits);  // throws again: the driver cannot tell
  if (failure != vmm::Result::success)
    throw vmm::DriverError(failure, std::string(arena_.on_demand() ? "cuMemUnmap/cuMemRelease"
                                                                   : "cuMemFree") +
                                        "(device " + std::to_string(device()) + ", a cached chunk)");
  return dropped;
}

// Handed over before the work is done (docs/design-notes.md). A release
// before a growth unmaps its chunks only after a host wait for the work that
// may still read them: the fence. When every chunk it picked goes to the
// growth (their sizes are the growth's: handle_stash.hpp), and that work is
// all queued on the stream the growth's block is for, the wait buys nothing
// for the new block - its user's next work runs after the old work in stream
// order, as a caching allocator's reuse of a block does - and is needed only
// before the old addresses are unmapped. So the handles go to the growth at
// once, mapped a second time at their new addresses while the old mappings
// stand (the driver allows a handle at two addresses: docs/measurements.md,
// "Mapping part of a handle"), and the old mappings are unmapped later, when
// a query sees a record made now done, or after a wait in a release of
// everything or a fence of a later release. The arena counts their ranges
// free and unmapped at once, as an unmap would leave them (the same layout,
// the same ratios); a growth over one waits for its work and unmaps it first
// (map_under). Their bytes are the growth's: one handle, one charge.
std::size_t Heap::hand_over_unfenced(std::vector<LargeArena::Release>& picked,
                                     const WaitSet& waits, HandleStash* keep) {
  // This heap's own growth only: another heap's release of the handle
  // later would not see the old mapping standing here.
  if (keep == nullptr || keep->heap() != this || kind_ != Kind::stream || !arena_.on_demand() ||
      keep->user() == nullptr || !waits.only(keep->user()) ||
      !device_.tracker().fence_enabled() || device_.capturing())
    return 0;
  WaitSet pending = waits;
  pending.drop_finished();
  if (pending.empty()) return 0;  // the fence would not wait: unmap now
  std::vector<std::size_t> sizes;
  sizes.reserve(picked.size());
  for (const LargeArena::Release& r : picked) sizes.push_back(r.size);
  if (!keep->takes_all(sizes)) return 0;
  try {
    // Room first: past this point nothing may fail, or a handle would be
    // released while its old mapping stands.
    handovers_.reserve(handovers_.size() + picked.size());
    keep->reserve_unfenced(picked.size());
    // A record now, which a later query can see done (the frees' token may
    // have none after it yet).
    device_.tracker().cover_now(pending);
  } catch (...) {
    return 0;  // the fenced way
  }
  std::size_t handed = 0;
  for (LargeArena::Release& r : picked) {
    Handover h;
    vmm::PhysicalChunk handle;
    {
      std::lock_guard<SpinLock> guard(lock_);
      arena_.hand_over(r, &handle, &h.old);
      mapped_.store(arena_.mapped_bytes(), std::memory_order_relaxed);
    }
    const std::size_t size = r.size;
    device_.transit(static_cast<std::int64_t>(size));  // gone here, not yet credited
    h.waits = pending;
    h.handle = handle.get();
    keep->note_unfenced(handle.get());   // room reserved above
    handovers_.push_back(std::move(h));  // room reserved above
    (void)keep->add(std::move(handle));  // room reserved above
    handed += size;
  }
  return handed;
}

void Heap::settle_handovers_locked(bool wait, bool poll, const std::vector<Run>* over) {
  if (handovers_.empty()) return;
  auto must_wait = [&](const Handover& h) {
    if (!wait || h.waits.empty()) return false;
    if (over == nullptr) return true;
    const std::uintptr_t lo = h.old.addr(), hi = lo + h.old.size();
    for (const Run& r : *over)
      if (r.first < hi && lo < r.first + r.second) return true;
    return false;
  };
  bool waiting = false;
  for (Handover& h : handovers_) {
    h.waits.drop_finished();
    waiting |= !h.waits.empty();
  }
  if (waiting && !device_.capturing()) {  // a capture forbids queries and waits
    AccessTracker& tracker = device_.tracker();
    if (poll && tracker.poll(device()) != 0)
      for (Handover& h : handovers_) h.waits.drop_finished();
    WaitSet w;
    for (const Handover& h : handovers_)
      if (must_wait(h)) w.merge(h.waits);
    if (!w.empty()) {
      tracker.fence(w);  // throws: nothing changed
      for (Handover& h : handovers_)
        if (must_wait(h)) h.waits.clear();
    }
  }
  std::vector<Handover> left;
  left.reserve(handovers_.size());
  std::vector<std::pair<vmm::PhysHandle, std::size_t>> gone_owed;  // room first: no throw below
  gone_owed.reserve(static_cast<std::size_t>(
      std::count_if(handovers_.begin(), handovers_.end(), [](const Handover& h) { return h.owed; })));
  for (Handover& h : handovers_) {
    const std::size_t size = h.old.size();
    // An unmap the driver refuses leaves the mapping here, for a later try.
    if (!h.waits.empty() || h.old.reset() != vmm::Result::success)
      left.push_back(std::move(h));
    else if (h.owed)  // its handle went before it
      gone_owed.emplace_back(h.handle, size);
  }
  handovers_ = std::move(left);
  for (const auto& [handle, size] : gone_owed) {
    // A handle handed over twice before its first old mapping went has two;
    // the device keeps its memory until the last of them goes, and the debt
    // (one per handle: give_up_handovers) moves to that one.
    Handover* standing = nullptr;
    for (Handover& h : handovers_)
      if (h.handle == handle) standing = &h;
    if (standing != nullptr) {
      standing->owed = true;
      continue;
    }
    device_.credit(size);
    device_.transit(-static_cast<std::int64_t>(size));
  }
}

bool Heap::has_old_mapping(vmm::PhysHandle handle) const noexcept {
  for (const Handover& h : handovers_)
    if (h.handle == handle) return true;
  return false;
}

std::size_t Heap::give_up_handovers(const std::vector<vmm::PhysHandle>& handles) noexcept {
  std::lock_guard<std::mutex> chunks(chunks_mu_);
  try {
    settle_handovers_locked(true, true);
  } catch (...) {  // a wait that failed: those still standing are owed below
  }
  std::size_t owed = 0;
  for (vmm::PhysHandle handle : handles)
    for (Handover& h : handovers_)
      if (h.handle == handle && !h.owed) {
        h.owed = true;
        owed += h.old.size();
        break;
      }
  return owed;
}

bool Heap::overlaps_handover(const std::vector<Run>& runs) const {
  for (const Handover& h : handovers_) {
    const std::uintptr_t lo = h.old.addr(), hi = lo + h.old.size();
    for (const Run& r : runs)
      if (r.first < hi && lo < r.first + r.second) return true;
  }
  return false;
}

void Heap::drop_unused_regions() {
  {
    // A region goes back with cuMemAddressFree, which a mapping inside refuses.
    std::lock_guard<std::mutex> chunks(chunks_mu_);
    settle_handovers_locked(true, true);
    if (!handovers_.empty()) return;  // a capture, or a wait that failed: later
  }
  std::lock_guard<SpinLock> guard(lock_);
  (void)arena_.drop_unused_regions();
}

std::size_t Heap::cached_bytes() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.cached_bytes();
}

std::size_t Heap::largest_cached_block() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.largest_mapped_free();
}

std::size_t Heap::mapped_bytes() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.mapped_bytes();
}

std::vector<Run> Heap::chunk_ranges() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.chunk_ranges();
}

WaitSet Heap::touching() const {
  std::lock_guard<SpinLock> guard(lock_);
  WaitSet w;
  arena_.for_each_block([&](const Block& b) {
    if (b.free) {
      w.merge(b.waits);
    } else if (!b.releasing) {
      w.merge(tokens_now(&b, nullptr));
    }
  });
  return w;
}

// ------------------------------------------------------------ accounting --

void Heap::add_stats(DeviceStats& s) const {
  std::lock_guard<SpinLock> guard(lock_);
  s.allocations += allocations_;
  s.frees += frees_;
  s.cache_hits += hits_;
  s.chunks_mapped += arena_.chunks_mapped();
  s.chunks_unmapped += arena_.chunks_unmapped();
  if (kind_ == Kind::scratch) s.scratch_reserved_bytes += arena_.mapped_bytes();
}

void Heap::memory_map_locked(std::vector<SegmentInfo>& out) const {
  SegmentInfo proto;
  proto.device = device();
  proto.scratch = kind_ == Kind::scratch;
  proto.pool = pool_;
  arena_.memory_map(out, proto, [&](SegmentInfo& seg, const Span& s) {
    const StreamState* st = s.owner->stream();
    describe_span(seg, s, st == nullptr ? nullptr : st->handle());
  });
}

void Heap::describe_span(SegmentInfo& seg, const Span& s, vmm::StreamHandle h) {
  BlockInfo run;  // free slots merge into one entry
  auto flush = [&] {
    if (run.size != 0) seg.blocks.push_back(run);
    run = BlockInfo{};
  };
  for (std::uint32_t i = 0; i < s.slots; ++i) {
    const std::uintptr_t a = s.base + static_cast<std::uintptr_t>(i) * s.slot_size;
    if (i < kHostSlots) {
      if (const Span* c = s.children[i].load(std::memory_order_acquire); c != nullptr) {
        flush();
        describe_span(seg, *c, h);  // a shared span in this slot: its slots
        continue;
      }
    }
    if (s.is_allocated(i)) {
      flush();
      seg.blocks.push_back(BlockInfo{a, s.slot_size, s.slot_size, true, true, h});
    } else {
      if (run.size == 0) run = BlockInfo{a, 0, 0, false, true, h};
      run.size += s.slot_size;
    }
  }
  // The tail a slot size leaves over in the span.
  const std::size_t used = static_cast<std::size_t>(s.slots) * s.slot_size;
  if (used < s.bytes) {
    if (run.size == 0) run = BlockInfo{s.base + used, 0, 0, false, true, h};
    run.size += s.bytes - used;
  }
  flush();
}

bool Heap::check_locked(std::string* why, std::int64_t* live, std::size_t* arena_spans,
                        std::size_t* front_spans) const {
  std::size_t large_live = 0;
  if (!arena_.check(why, &large_live, arena_spans)) return false;
  std::int64_t small_live = 0;
  std::size_t granule_spans = 0;
  for (const auto& sp : small_.spans()) {
    const Span& s = *sp;
    std::uint32_t allocated = 0, hosted = 0;
    for (std::uint32_t i = 0; i < s.slots; ++i) {
      const bool hosts_one =
          i < kHostSlots && s.children[i].load(std::memory_order_relaxed) != nullptr;
      if (hosts_one && !s.is_allocated(i)) {
        if (why != nullptr) *why = "a shared span in a free slot of its host";
        return false;
      }
      allocated += s.is_allocated(i) ? 1 : 0;
      hosted += hosts_one ? 1 : 0;
    }
    if (allocated + s.pending != s.slots - s.free_count) {
      if (why != nullptr) *why = "span bitmap and free stack disagree";
      return false;
    }
    if (s.host != nullptr) {
      // A shared span: a slot of a span of this heap, which names it.
      if (s.block != nullptr || s.bytes != kSharedSpanBytes || s.host->owner != this ||
          s.host_slot >= kHostSlots ||
          s.host->children[s.host_slot].load(std::memory_order_relaxed) != &s ||
          s.host->base + std::uintptr_t{s.host_slot} * kSharedSpanBytes != s.base) {
        if (why != nullptr) *why = "shared span's host";
        return false;
      }
    } else if (s.block == nullptr || s.block->free || (s.block->span != &s && !s.in_flight) ||
               s.owner != this || s.arena_heap == nullptr || s.bytes != kGranule) {
      // A borrowed span waits for its lender to attach it (borrow_span).
      if (why != nullptr) *why = "span's block";
      return false;
    } else {
      ++granule_spans;
    }
    small_live += static_cast<std::int64_t>((allocated - hosted) * s.slot_size);
  }
  *front_spans = granule_spans;
  const std::int64_t blocks_live = small_live + static_cast<std::int64_t>(large_live);
  if (live_.load() != blocks_live) {
    if (why != nullptr)
      *why = "live bytes disagree with the blocks (" + std::to_string(live_.load()) + " vs " +
             std::to_string(blocks_live) + ")";
    return false;
  }
  if (mapped_.load() != arena_.mapped_bytes()) {
    if (why != nullptr) *why = "the heap's mapped-bytes mirror is stale";
    return false;
  }
  *live = blocks_live;
  return true;
}

}  // namespace gvm::detail
