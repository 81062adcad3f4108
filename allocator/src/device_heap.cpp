// DeviceHeap: one device's heaps and the services they share (device_heap.hpp).
#include "device_heap.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "gvm/allocator.hpp"
#include "gvm/errors.hpp"
#include "hex_address.hpp"
#include "size_classes.hpp"

namespace gvm::detail {

std::string format_bytes(std::size_t n) {
  char buf[64];
  const double gib = static_cast<double>(n) / double(std::size_t{1} << 30);
  const double mib = static_cast<double>(n) / double(std::size_t{1} << 20);
  if (gib >= 1.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", gib);
  else if (mib >= 1.0)
    std::snprintf(buf, sizeof buf, "%.2f MiB", mib);
  else
    std::snprintf(buf, sizeof buf, "%zu bytes", n);
  return buf;
}

DeviceHeap::DeviceHeap(vmm::Driver& driver, const vmm::DeviceCaps& caps, const Config& config,
                       AccessTracker& tracker, StreamRegistry& streams, bool use_vmm)
    : driver_(driver),
      caps_(caps),
      config_(config),
      tracker_(tracker),
      streams_(streams),
      backing_(use_vmm ? make_vmm_backing(driver, caps, config) : make_classic_backing(driver, caps)),
      policy_(config, caps.total_memory) {}

DeviceHeap::~DeviceHeap() {
  // Heaps unmap what they hold as they go; the owner fenced every device.
  std::lock_guard<SpinLock> guard(list_lock_);
  list_.clear();
}

// ----------------------------------------------------------------- heaps --

Heap& DeviceHeap::add_heap(std::unique_ptr<Heap> h) {
  Heap* p = h.get();
  heaps_.push_back(std::move(h));
  std::lock_guard<SpinLock> guard(list_lock_);
  list_.push_back(p);
  return *p;
}

std::vector<Heap*> DeviceHeap::heaps() const {
  std::lock_guard<SpinLock> guard(list_lock_);
  return list_;
}

Heap& DeviceHeap::heap_for(StreamState& s) {
  std::lock_guard<std::mutex> guard(heaps_mu_);
  if (auto it = by_stream_.find(&s); it != by_stream_.end()) return *it->second;
  // A retired stream whose work is all done leaves a heap nothing of it
  // waits on: the new stream takes it (its cached memory and spans).
  for (auto it = by_stream_.begin(); it != by_stream_.end(); ++it) {
    if (!it->first->complete()) continue;
    Heap* h = it->second;
    by_stream_.erase(it);
    h->adopt(s);
    by_stream_.emplace(&s, h);
    return *h;
  }
  const bool first = by_stream_.empty() && std::none_of(heaps_.begin(), heaps_.end(), [](const auto& h) {
                       return h->kind() == Heap::Kind::stream;
                     });
  Heap& h = add_heap(std::make_unique<Heap>(*this, Heap::Kind::stream, &s, 0, first));
  by_stream_.emplace(&s, &h);
  return h;
}

Heap& DeviceHeap::scratch(const std::vector<vmm::AccessDesc>& access) {
  if (Heap* h = existing_scratch(); h != nullptr) return *h;
  std::lock_guard<std::mutex> guard(heaps_mu_);
  if (Heap* h = existing_scratch(); h != nullptr) return *h;
  auto h = std::make_unique<Heap>(*this, Heap::Kind::scratch, nullptr, 0, false);
  h->set_access_list(access);
  Heap& ref = add_heap(std::move(h));
  scratch_.store(&ref, std::memory_order_release);
  return ref;
}

Heap& DeviceHeap::pool(std::uint64_t id) {
  std::lock_guard<std::mutex> guard(heaps_mu_);
  if (auto it = pools_.find(id); it != pools_.end()) return *it->second;
  Heap& h = add_heap(std::make_unique<Heap>(*this, Heap::Kind::pool, nullptr, id, false));
  pools_.emplace(id, &h);
  return h;
}

Heap* DeviceHeap::existing_pool(std::uint64_t id) const {
  std::lock_guard<std::mutex> guard(heaps_mu_);
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : it->second;
}

// ---------------------------------------------------------------- growth --

std::size_t DeviceHeap::idle_for_growth(const Heap& h) const {
  // A private pool's free memory is its graphs' (release_cached): it is no
  // idle pool to release for a growth.
  if (h.kind() == Heap::Kind::scratch || (h.kind() == Heap::Kind::pool && !h.released())) return 0;
  return h.cached_bytes();
}

GrowthPlan DeviceHeap::plan_growth(const Heap& h, std::size_t need, std::size_t requested) const {
  const auto live_after =
      static_cast<std::size_t>(std::max<std::int64_t>(0, live_total())) + requested;
  return policy_.plan(need, reserved(), budget_.peak(), live_after,
                      static_cast<std::size_t>(peak_live_.load()),
                      h.kind() != Heap::Kind::scratch, idle_for_growth(h));
}

bool DeviceHeap::growth_would_set_peak(const Heap& h, std::size_t need,
                                       std::size_t requested) const {
  return growth_raises_peak(need) && plan_growth(h, need, requested).release == 0;
}

void DeviceHeap::release_for_growth(Heap& h, const GrowthPlan& plan, HandleStash* keep) {
  // Empty spans are cached memory too: back to their arenas first, so that
  // their granules can go with the chunks.
  if (plan.own_heap) {
    h.reclaim_spans();
  } else {
    for (Heap* x : heaps()) x->reclaim_spans();
  }
  try {
    if (plan.own_heap) {
      if (idle_for_growth(h) != 0) (void)h.release_cached(plan.release, false, keep);
    } else {  // the slack bound gives back arena memory only; the cap counts
              // the scratch too (docs/design-notes.md)
      (void)release_cached(plan.release, false, /*include_scratch=*/!plan.slack, keep);
    }
  } catch (const vmm::DriverError&) {
    if (!plan.slack) throw;
  }
}

std::vector<vmm::MappedChunk> DeviceHeap::map_for(Heap& h, const std::vector<Run>& runs,
                                                  std::size_t need, std::size_t requested,
                                                  std::uintptr_t block_end,
                                                  const StreamState* user) {
  const bool capture = capturing();
  const GrowthPlan plan = plan_growth(h, need, requested);
  // During a capture nothing is released (a release fences: a host wait the
  // capture forbids); past the cap that is an out-of-memory that says so.
  // The release keeps the handles it unmaps for this growth
  // (handle_stash.hpp): charged and in transit until mapped again or
  // released below.
  HandleStash stash;
  // Kept handles leave the device's accounts with their cuMemRelease,
  // whichever way this growth ends: a release that fails part-way (the cap
  // then fails the allocation with the driver's error) has kept some already.
  // A handle handed over with its old mapping standing (Heap::hand_over_unfenced)
  // leaves the device only with that mapping: a growth that gives up such
  // handles unmaps the old mappings first, after a wait for their work; what
  // still stands (a driver fault) stays charged and in transit until it goes.
  // Returns the bytes of `bytes` to credit now.
  auto give_up = [&](std::size_t bytes) {
    const std::size_t owed = stash.unfenced() ? h.give_up_handovers(stash.unfenced_handles()) : 0;
    return bytes - std::min(bytes, owed);
  };
  auto drop_kept = [&](std::size_t bytes) {
    const std::size_t gone = bytes != 0 ? give_up(bytes) : 0;
    budget_.credit(gone);
    transit(-static_cast<std::int64_t>(gone));
  };
  const std::size_t chunk = std::max(
      h.kind() == Heap::Kind::scratch ? config_.scratch_chunk_bytes : config_.max_chunk_bytes,
      kGranule);
  if (plan.release != 0 && !capture) {
    try {
      // The release first gives back chunks whose handles this growth's
      // chunks can take (handover_first).
      for (const ChunkPlan& c : plan_chunks(runs, chunk, nullptr, block_end))
        stash.wanted().push_back(c.size);
      stash.set_user(user, &h);
      release_for_growth(h, plan, &stash);
    } catch (...) {
      drop_kept(stash.release_all());
      throw;
    }
  }
  const std::size_t cap = policy_.cap();
  std::vector<ChunkPlan> pieces;
  const std::size_t kept = stash.bytes();
  try {
    pieces = plan_chunks(runs, chunk, &stash, block_end);
  } catch (...) {  // no memory for the plan: its handles went with it
    (void)stash.release_all();
    drop_kept(kept);
    throw;
  }
  std::size_t reused = 0, kept_handles = 0;
  for (const ChunkPlan& c : pieces) {
    reused += c.reused.size();
    kept_handles += c.reused.empty() ? 0 : 1;
  }
  // What no chunk took goes before any new chunk is made: the device never
  // holds more than the release and the growth leave. (A release hands over
  // without a wait only handles that every one a chunk takes: takes_all.)
  if (const std::size_t left = stash.release_all(); left != 0) {
    budget_.credit(left);
    transit(-static_cast<std::int64_t>(left));
  }
  // In transit (before the charge: the checker reads the budget, then this)
  // until the heap installs the chunks (Heap::map_under); the kept handles
  // are charged and in transit already.
  const std::size_t fresh = need - reused;
  transit(static_cast<std::int64_t>(fresh));
  if (!budget_.charge(fresh, cap)) {
    transit(-static_cast<std::int64_t>(fresh));
    pieces.clear();  // releases the kept handles
    const std::size_t gone = give_up(reused);
    budget_.credit(gone);
    transit(-static_cast<std::int64_t>(gone));
    throw_oom(requested, capture ? kCaptureCap : "the reserved-bytes cap");
  }
  try {
    std::vector<vmm::MappedChunk> made = backing_->map(pieces, h.access());
    handles_reused_.fetch_add(kept_handles, std::memory_order_relaxed);
    return made;
  } catch (const vmm::DriverError& e) {
    pieces.clear();  // a kept handle not mapped yet goes too
    const std::size_t gone = give_up(need);
    budget_.credit(gone);
    transit(-static_cast<std::int64_t>(gone));
    if (e.result() != vmm::Result::out_of_memory) throw;
    if (capture) throw_oom(requested, kCaptureDevice);
  }
  // Out of memory: fence, return every cached chunk of the device (empty
  // spans first), try once more.
  oom_retries_.fetch_add(1, std::memory_order_relaxed);
  const bool reclaimed = reclaim_for_oom() != 0;
  (void)release_cached(0, true, true);
  transit(static_cast<std::int64_t>(need));
  if (!budget_.charge(need, cap)) {
    transit(-static_cast<std::int64_t>(need));
    throw_oom(requested, "the reserved-bytes cap");
  }
  try {
    std::vector<ChunkPlan> fresh_pieces = plan_chunks(runs, chunk, nullptr, block_end);
    return backing_->map(fresh_pieces, h.access());
  } catch (const vmm::DriverError& e) {
    budget_.credit(need);
    transit(-static_cast<std::int64_t>(need));
    if (e.result() == vmm::Result::out_of_memory) throw_oom(requested, "the device", reclaimed);
    throw;
  }
}

vmm::ReservedRange DeviceHeap::reserve_for(Heap& h, std::size_t min_bytes, std::size_t alignment) {
  RegionKind kind = RegionKind::stream_arena;
  if (h.kind() == Heap::Kind::scratch) kind = RegionKind::scratch;
  if (h.kind() == Heap::Kind::pool) kind = RegionKind::pool;
  if (h.first()) kind = RegionKind::first_arena;
  return backing_->reserve(min_bytes, alignment, kind);
}

vmm::DevicePtr DeviceHeap::segment_for(Heap& h, std::size_t* bytes, std::size_t alignment,
                                       std::size_t requested) {
  // cuMemAlloc during a global capture is refused and fails it (docs/measurements.md,
  // "Stream capture"); which mode the caller's thread is in, gvmalloc cannot tell.
  if (capturing()) throw_oom(requested, kCaptureDevice);
  const std::size_t need = *bytes;
  // The same rules as the VMM path, by whole segments.
  const GrowthPlan plan = plan_growth(h, need, requested);
  const bool capture = capturing();
  if (plan.release != 0 && !capture) release_for_growth(h, plan, nullptr);
  const std::size_t cap = policy_.cap();
  transit(static_cast<std::int64_t>(need));  // until the heap adds the segment
  if (!budget_.charge(need, cap)) {
    transit(-static_cast<std::int64_t>(need));
    throw_oom(requested, capture ? kCaptureCap : "the reserved-bytes cap");
  }
  auto uncharge = [&] {
    budget_.credit(need);
    transit(-static_cast<std::int64_t>(need));
  };
  vmm::DevicePtr p = 0;
  bool reclaimed = false;
  vmm::Result r = backing_->allocate_segment(bytes, alignment, &p);
  if (r == vmm::Result::out_of_memory && capture) {
    uncharge();
    throw_oom(requested, kCaptureDevice);
  }
  if (r == vmm::Result::out_of_memory) {
    oom_retries_.fetch_add(1, std::memory_order_relaxed);
    uncharge();
    reclaimed = reclaim_for_oom() != 0;
    (void)release_cached(0, true, true);
    transit(static_cast<std::int64_t>(need));
    if (!budget_.charge(need, cap)) {
      transit(-static_cast<std::int64_t>(need));
      throw_oom(requested, "the reserved-bytes cap");
    }
    *bytes = need;
    r = backing_->allocate_segment(bytes, alignment, &p);
  }
  if (r != vmm::Result::success) {
    uncharge();
    if (r == vmm::Result::out_of_memory) throw_oom(requested, "the device", reclaimed);
    throw vmm::DriverError(r, "cuMemAlloc(device " + std::to_string(device()) + ", " +
                                  std::to_string(need) + " bytes)");
  }
  // An alignment retry allocates a little more than charged: counted, not capped.
  if (*bytes > need) {
    transit(static_cast<std::int64_t>(*bytes - need));
    (void)budget_.charge(*bytes - need, 0);
  }
  return p;
}

void* DeviceHeap::steal(std::size_t size, std::size_t bytes, StreamState& taker,
                        const Heap* except) {
  if (capturing()) return nullptr;  // a steal may wait for the other stream
  for (Heap* h : heaps()) {
    if (h == except || h->kind() != Heap::Kind::stream) continue;
    // A cheap look first: only a heap with that much mapped and free memory.
    if (h->mapped_estimate() < static_cast<std::size_t>(std::max<std::int64_t>(0, h->live_bytes())) + size)
      continue;
    if (void* p = h->steal(size, bytes, taker); p != nullptr) return p;
  }
  return nullptr;
}

bool DeviceHeap::deallocate(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream,
                            bool own_stream, std::size_t* requested) {
  const PageEntry* e = pages_.find(addr);
  return e != nullptr && deallocate_in(*e, addr, bytes, stream, own_stream, requested);
}

bool DeviceHeap::deallocate_in(const PageEntry& e, std::uintptr_t addr, std::size_t bytes,
                               vmm::StreamHandle stream, bool own_stream, std::size_t* requested) {
  Span* s = span_holding(e, addr);
  Heap* h = s != nullptr ? s->owner : e.owner.load(std::memory_order_acquire);
  if (h == nullptr) return false;
  if (capturing_here() && !(h->kind() == Heap::Kind::pool && h->capturing())) [[unlikely]]
    return defer_free(h, s, addr, bytes, stream, own_stream, requested);
  if (s != nullptr) {
    if (requested != nullptr) *requested = s->slot_size;
    s->owner->free_slot(s, addr, bytes, own_stream ? s->owner->stream()->handle() : stream);
    return true;
  }
  return h->deallocate_large(e, addr, bytes, stream, own_stream, requested);
}

bool DeviceHeap::defer_free(Heap* h, Span* s, std::uintptr_t addr, std::size_t bytes,
                            vmm::StreamHandle stream, bool own_stream, std::size_t* requested) {
  // The graph being captured may use this memory when it replays: it stays
  // live until the last capture on the device ends (then it is freed as
  // asked). Bad input is refused now, as it would be then.
  std::size_t size = 0;
  if (s != nullptr) {
    size = s->slot_size;
    if (!h->slot_is_live(s, addr))
      throw usage_error("gvmalloc: deallocate(" + hex(addr) +
                        "): not a live block (already freed, never allocated, or an interior "
                        "pointer)");
    if (!s->fits(bytes))
      throw usage_error("gvmalloc: deallocate(" + hex(addr) + ", " + std::to_string(bytes) +
                        " bytes) on device " + std::to_string(device()) +
                        ": the block was allocated with a size in another class (slot of " +
                        std::to_string(s->slot_size) + " bytes)");
  } else if (!h->live_large(addr, &size)) {
    return false;
  } else if (bytes != kUnknownSize && bytes != size) {
    throw usage_error("gvmalloc: deallocate(" + hex(addr) + ", " + std::to_string(bytes) +
                      " bytes) on device " + std::to_string(device()) +
                      ": the block was allocated with " + std::to_string(size) + " bytes");
  }
  {
    std::lock_guard<std::mutex> guard(deferred_mu_);
    for (const DeferredFree& d : deferred_)
      if (d.addr == addr)
        throw usage_error("gvmalloc: deallocate(" + hex(addr) +
                          "): already freed (during this CUDA graph capture)");
    if (captures_.load(std::memory_order_acquire) > 0) {
      // The freeing stream is named now, as a user of the block: its handle
      // may be forgotten and destroyed before the capture ends (CuPy and
      // Numba do that when a stream dies), and the replay must not touch it.
      if (!own_stream) (void)record_stream(addr, streams().get(stream));
      deferred_.push_back(DeferredFree{addr, bytes, nullptr, true});
      if (requested != nullptr) *requested = size;
      return true;
    }
  }
  // The capture ended meanwhile (end_capture swaps the list under the same
  // lock): an ordinary free.
  return deallocate(addr, bytes, stream, own_stream, requested);
}

void DeviceHeap::end_capture() {
  std::vector<DeferredFree> todo;
  tracker_.capture(-1);
  {
    std::lock_guard<std::mutex> guard(deferred_mu_);
    if (captures_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    todo.swap(deferred_);
  }
  for (const DeferredFree& d : todo) {
    try {
      (void)deallocate(d.addr, d.bytes, d.stream, d.own_stream, nullptr);
    } catch (...) {
      // Checked when it was asked for; a driver that died meanwhile is
      // nothing a free reports.
    }
  }
}

bool DeviceHeap::record_stream(std::uintptr_t addr, StreamState& user) {
  const PageEntry* e = pages_.find(addr);
  if (e == nullptr) return false;
  if (Span* s = span_holding(*e, addr); s != nullptr) {
    s->owner->record_slot(s, addr, user);
    return true;
  }
  Heap* h = e->owner.load(std::memory_order_acquire);
  return h != nullptr && h->record_large(addr, user);
}

void DeviceHeap::note_use(std::uintptr_t addr, StreamState& user) {
  const PageEntry* e = pages_.find(addr);
  if (e == nullptr) return;
  if (Span* s = span_holding(*e, addr); s != nullptr) {
    s->owner->note_slot(s, addr, user);
    return;
  }
  // A copy may start inside a large block, past the granule it starts in:
  // the heap that maps this granule holds the block.
  if (Heap* h = e->owner.load(std::memory_order_acquire); h != nullptr) h->note_large(addr, user);
}

Block* DeviceHeap::lend_granule(StreamState& taker, const Heap* except, Heap** lender) {
  for (Heap* h : heaps()) {
    if (h == except || h->kind() != Heap::Kind::stream) continue;
    if (h->mapped_estimate() <
        static_cast<std::size_t>(std::max<std::int64_t>(0, h->live_bytes())) + kGranule)
      continue;
    if (Block* b = h->lend_granule(taker); b != nullptr) {
      *lender = h;
      return b;
    }
  }
  return nullptr;
}

std::size_t DeviceHeap::release_cached(std::size_t want, bool all, bool include_scratch,
                                       HandleStash* keep) {
  std::size_t dropped = 0;
  for (Heap* h : heaps()) {
    if (!all && dropped >= want) break;
    if (h->kind() == Heap::Kind::scratch && !include_scratch) continue;
    // A private pool's free memory is the graphs' it was captured for: a
    // replay writes where the capture freed. It goes back only with the pool
    // (release_pool) or when its owner asks (trim_pool), as PyTorch's
    // allocator frees a graph pool's blocks only once the pool is released.
    if (h->kind() == Heap::Kind::pool && !h->released()) continue;
    dropped += h->release_cached(all ? 0 : want - dropped, all, keep);
  }
  return dropped;
}

void DeviceHeap::maybe_release_above_threshold() noexcept {
  if (config_.release_threshold_bytes == SIZE_MAX || capturing()) return;
  std::size_t scratch = 0;
  if (Heap* s = existing_scratch(); s != nullptr) scratch = s->mapped_estimate();
  const std::size_t res = reserved() > scratch ? reserved() - scratch : 0;
  std::int64_t live = live_total();
  if (Heap* s = existing_scratch(); s != nullptr) live -= s->live_bytes();
  const auto l = static_cast<std::size_t>(std::max<std::int64_t>(0, live));
  const std::size_t cached = res > l ? res - l : 0;
  if (cached <= config_.release_threshold_bytes) return;
  try {
    (void)release_cached(cached - config_.release_threshold_bytes, false, false);
  } catch (...) {
    // Called from deallocate, which reports bad input only: the block is
    // already free. A chunk that could not go back stays mapped and counted;
    // the next release or trim tries again.
  }
}

const char* const DeviceHeap::kCaptureCap =
    "the reserved-bytes cap, during a CUDA graph capture, when cached memory cannot be given "
    "back: raise max_reserved or memory_fraction, or run the captured work once before the "
    "capture so that its memory is mapped";
const char* const DeviceHeap::kCaptureDevice =
    "the device, during a CUDA graph capture, when cached memory cannot be given back: run the "
    "captured work once before the capture so that its memory is mapped, or free memory first";

std::size_t DeviceHeap::reclaim_for_oom() {
  std::size_t n = 0;
  for (Heap* x : heaps()) n += x->reclaim_spans();
  return n;
}

void DeviceHeap::trim() {
  for (Heap* h : heaps()) h->reclaim_spans();
  (void)release_cached(0, true, true);
  for (Heap* h : heaps()) h->drop_unused_regions();
}

// ------------------------------------------------------------ accounting --

std::int64_t DeviceHeap::live_total() const noexcept {
  std::lock_guard<SpinLock> guard(list_lock_);
  std::int64_t total = 0;
  for (const Heap* h : list_) total += h->live_bytes();
  return total;
}

std::int64_t DeviceHeap::refresh_peak() noexcept {
  const std::int64_t total = live_total();
  std::int64_t peak = peak_live_.load(std::memory_order_relaxed);
  while (total > peak && !peak_live_.compare_exchange_weak(peak, total, std::memory_order_relaxed)) {
  }
  peak = std::max(peak, total);
  headroom_.store(peak - total, std::memory_order_relaxed);
  return peak - total;
}

void DeviceHeap::reset_peaks() noexcept {
  peak_live_.store(live_total(), std::memory_order_relaxed);
  budget_.reset_peak();
}

void DeviceHeap::throw_oom(std::size_t bytes, const char* why, bool reclaimed) const {
  std::size_t free_bytes = 0, total_bytes = 0;
  const bool have_info = driver_.mem_get_info(device(), &free_bytes, &total_bytes) == vmm::Result::success;
  const auto live = static_cast<std::size_t>(std::max<std::int64_t>(0, live_total()));
  const std::size_t res = reserved();
  std::string msg = "gvmalloc: out of memory on device " + std::to_string(device()) + " (" +
                    caps_.name + "): tried to allocate " + format_bytes(bytes) + " (limited by " +
                    why + "); " + format_bytes(live) + " live, " +
                    format_bytes(res > live ? res - live : 0) + " cached, " + format_bytes(res) +
                    " reserved by gvmalloc";
  if (const std::size_t cap = policy_.cap(); cap != 0) msg += ", reserved-bytes cap " + format_bytes(cap);
  if (have_info)
    msg += "; the device has " + format_bytes(free_bytes) + " free of " + format_bytes(total_bytes);
  if (reclaimed) throw OomAfterReclaim(msg);
  throw out_of_memory(msg);
}

DeviceStats DeviceHeap::stats() const {
  DeviceStats s;
  s.device = device();
  for (const Heap* h : heaps()) h->add_stats(s);
  const auto live = static_cast<std::size_t>(std::max<std::int64_t>(0, live_total()));
  s.live_bytes = live;
  s.reserved_bytes = reserved();
  s.cached_bytes = s.reserved_bytes > live ? s.reserved_bytes - live : 0;
  s.peak_live_bytes = static_cast<std::size_t>(std::max<std::int64_t>(peak_live_.load(), 0));
  s.peak_reserved_bytes = budget_.peak();
  s.oom_retries = oom_retries_.load(std::memory_order_relaxed);
  s.fences = fences_.load(std::memory_order_relaxed);
  s.cross_stream_waits = cross_stream_waits_.load(std::memory_order_relaxed);
  s.chunks_reused = handles_reused_.load(std::memory_order_relaxed);
  return s;
}

namespace {

// Every heap of a device locked, in list order (only memory_map and check
// hold more than one heap lock, and both take them in this order).
class AllLocked {
 public:
  explicit AllLocked(std::vector<Heap*> heaps) : heaps_(std::move(heaps)) {
    for (Heap* h : heaps_) h->lock().lock();
  }
  ~AllLocked() {
    for (auto it = heaps_.rbegin(); it != heaps_.rend(); ++it) (*it)->lock().unlock();
  }
  const std::vector<Heap*>& heaps() const noexcept { return heaps_; }

 private:
  std::vector<Heap*> heaps_;
};

}  // namespace

void DeviceHeap::memory_map(std::vector<SegmentInfo>& out) const {
  AllLocked all(heaps());
  for (const Heap* h : all.heaps()) h->memory_map_locked(out);
}

bool DeviceHeap::check(std::string* why) const {
  // No heap is made while the check runs (every heap's bytes are counted).
  std::lock_guard<std::mutex> no_new_heaps(heaps_mu_);
  std::int64_t live = 0;
  std::size_t mapped = 0, arena_spans = 0, front_spans = 0;
  auto fail = [&](const std::string& msg) {
    if (why != nullptr) *why = "device " + std::to_string(device()) + ": " + msg;
    return false;
  };
  AllLocked all(heaps());
  for (const Heap* h : all.heaps()) {
    std::int64_t l = 0;
    std::size_t a = 0, f = 0;
    std::string w;
    if (!h->check_locked(&w, &l, &a, &f)) return fail(w);
    live += l;
    arena_spans += a;
    front_spans += f;
    mapped += h->mapped_estimate();
  }
  // A span between two heaps' locks (a borrow, a lent granule going home)
  // is counted by one side only.
  const auto diff = static_cast<std::int64_t>(arena_spans) - static_cast<std::int64_t>(front_spans);
  if ((diff < 0 ? -diff : diff) > handoffs_.load())
    return fail("spans in the arenas and in the front ends disagree (" + std::to_string(arena_spans) +
                " vs " + std::to_string(front_spans) + ")");
  if (live != live_total()) return fail("live bytes disagree with the heaps");
  // Growths and releases under way move bytes between the budget and the
  // heaps' chunks with no heap lock held (the heaps are locked here, so no
  // chunk comes or goes): what is in transit is allowed for, read around
  // the budget until both stand still.
  for (int tries = 0;; ++tries) {
    const std::int64_t t1 = transit_.load();
    const std::size_t res = reserved();
    const std::int64_t t2 = transit_.load();
    const std::int64_t allowed = std::max<std::int64_t>({t1, t2, 0});
    if (mapped <= res && static_cast<std::int64_t>(res - mapped) <= allowed) break;
    if (tries < 1000 && (t1 != t2 || res != reserved())) continue;
    return fail("reserved bytes disagree with the chunks (" + std::to_string(res) + " vs " +
                std::to_string(mapped) + ", " + std::to_string(allowed) + " in transit)");
  }
  return true;
}

}  // namespace gvm::detail
