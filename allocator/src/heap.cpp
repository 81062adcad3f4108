// Heap: blocks of one stream, or of a shared heap (heap.hpp): construction,
// regions and the large path. The small path is in heap_small.cpp, the
// release of cached chunks in heap_release.cpp, accounting below.
#include "heap.hpp"

#include <algorithm>
#include <new>
#include <string>

#include "device_heap.hpp"
#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"
#include "hex_address.hpp"

namespace gvm::detail {
namespace {

constexpr std::size_t round_up(std::size_t x, std::size_t a) noexcept { return (x + a - 1) / a * a; }

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
    need = arena_.unmapped_bytes(b);
  }
  return device_.growth_raises_peak(need) && reclaim_spans() != 0;
}

bool Heap::mapped_fit_instead_of_peak(const Block* b, std::size_t size, std::size_t bytes,
                                      const StreamState& user) {
  std::size_t need = 0;
  {
    std::lock_guard<SpinLock> guard(lock_);
    // First whether there is anything to take instead: most growths (a
    // first step's) find no mapped block, and the walk over b's pages and
    // the plan are left out for them.
    if (!arena_.has_mapped_fit(size, kBlockAlignment, &user)) return false;
    need = arena_.unmapped_bytes(b);
  }
  return device_.growth_would_set_peak(*this, need, bytes);
}

void* Heap::allocate_large_once(std::size_t bytes, StreamState& user, bool first_try,
                                bool reclaim, bool any_mapped) {
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
      // stream used last, or none did, is taken. Rule 10's second look
      // (any_mapped) takes a fully mapped free block, or as before if that
      // went meanwhile.
      if (any_mapped) [[unlikely]]
        b = arena_.take(size, kBlockAlignment, &user, true, device_.capturing(), &mapped);
      if (b == nullptr)
        b = arena_.take(size, kBlockAlignment, &user, false, device_.capturing(), &mapped);
      if (b != nullptr) {
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
    return allocate_large_once(bytes, user, first_try, false, any_mapped);
  }
  if (!mapped && first_try && learn_finished()) {
    // Free memory that streams' tokens kept in pieces may merge now that
    // their work is known finished: once more before growing.
    undo();
    return allocate_large_once(bytes, user, false, reclaim, any_mapped);
  }
  if (!mapped && !any_mapped && !device_.capturing() &&
      mapped_fit_instead_of_peak(b, size, bytes, user)) {
    // Rule 10 (docs/design-notes.md): this growth would raise the device's
    // peak of reserved bytes, and no release comes before it, so the bytes
    // it maps would stay as the new peak. A fully mapped free block of this
    // heap costs no peak, however much larger than the request (the best
    // of the bins find_fit looks at): it is taken instead. (Where the policy
    // releases, the release keeps the peak and the best fit stays: taking
    // large mapped holes there split them, and BERT inference went from
    // 1.10 to 1.22 reserved per live byte.)
    undo();
    return allocate_large_once(bytes, user, first_try, reclaim, true);
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
