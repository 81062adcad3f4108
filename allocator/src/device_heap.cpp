// DeviceHeap: regions, large blocks, stream order. See device_heap.hpp.
#include "device_heap.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "gvm/errors.hpp"

namespace gvm::detail {
namespace {

constexpr std::size_t round_up(std::size_t x, std::size_t a) noexcept { return (x + a - 1) / a * a; }

std::string hex(std::uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, p);
  return buf;
}

}  // namespace

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
                       Fence& fence, Kind kind, std::vector<vmm::AccessDesc> access,
                       std::atomic<std::size_t>& device_reserved)
    : driver_(driver),
      caps_(caps),
      config_(config),
      fence_(fence),
      kind_(kind),
      access_(std::move(access)),
      vmm_(caps.vmm && !config.force_no_vmm),
      // A span is one granule with at least two slots.
      small_max_(kind == Kind::arena ? std::min(config.small_block_max_bytes, kGranule / 2) : 0),
      device_reserved_(device_reserved) {}

void DeviceHeap::add_reserved(std::size_t n) noexcept {
  reserved_ += n;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  device_reserved_.fetch_add(n);
}

void DeviceHeap::sub_reserved(std::size_t n) noexcept {
  reserved_ -= n;
  device_reserved_.fetch_sub(n);
}

DeviceHeap::~DeviceHeap() {
  // The owner (Allocator::Impl) has fenced every device: unmap.
  for (auto& c : chunks_) {
    if (!c.in_use) continue;
    if (vmm_) {
      (void)c.mem.reset();
    } else {
      (void)driver_.mem_free(device(), c.classic);
    }
  }
  chunks_.clear();
  regions_.clear();  // frees the reservations
}

// ---------------------------------------------------------------- free set --

void DeviceHeap::insert_free(Block* b) { free_.insert(b); }

void DeviceHeap::erase_free(Block* b) { free_.erase(b); }

bool DeviceHeap::range_mapped(std::uintptr_t addr, std::size_t size) const {
  if (!vmm_) return true;
  for (std::uintptr_t g = addr & ~(kGranule - 1); g < addr + size;) {
    const PageEntry* e = pages_.find(g);
    const std::uint32_t c = e == nullptr ? 0 : e->chunk;
    if (c == 0) return false;
    g = chunks_[c - 1].addr + chunks_[c - 1].size;  // hop over the chunk
  }
  return true;
}

Block* DeviceHeap::find_fit(std::size_t size, std::size_t alignment, vmm::StreamHandle stream) {
  Block probe;
  probe.size = size;
  probe.addr = 0;
  auto it = free_.lower_bound(&probe);
  // Among the few best fits, one last used by `stream` alone wins: a stream
  // reuses its own memory without waiting for another (like PyTorch's
  // per-stream pools, without closing the pool to the others). Untouched
  // blocks get no preference: they are mostly the unmapped rest of the
  // arena, and a wait for another stream costs less than growing.
  //
  // But never at the price of growing: an own block that would need memory
  // mapped loses to a best fit that is mapped already (a block used by a
  // side stream next to the main stream's unmapped tail grew the arena by
  // 48 MiB while a mapped 976 MiB hole of both streams waited: 3.79
  // reserved/live on tools/synth_traces.py's side_stream trace).
  auto own = [&](const Block* b) { return !b->tags.empty() && b->tags.only(stream); };
  constexpr int kLook = 8;
  if (alignment <= kBlockAlignment) {
    if (it == free_.end()) return nullptr;
    Block* best = *it;
    int best_mapped = -1;  // not looked at yet
    for (int k = 0; it != free_.end() && k < kLook; ++it, ++k) {
      if (!own(*it)) continue;
      if (*it == best) return best;
      if (best_mapped < 0) best_mapped = range_mapped(best->addr, size) ? 1 : 0;
      if (best_mapped == 0 || range_mapped((*it)->addr, size)) return *it;
    }
    return best;
  }
  auto fits = [&](const Block* b) { return round_up(b->addr, alignment) + size <= b->end(); };
  // Aligned requests (spans) are rare: look at a few of the best fits, then
  // at the largest block, which is the unmapped rest of the arena.
  Block* first = nullptr;
  for (int scanned = 0; it != free_.end() && scanned < 64; ++it, ++scanned) {
    if (!fits(*it)) continue;
    if (own(*it)) return *it;
    if (first == nullptr) first = *it;
  }
  if (first != nullptr) return first;
  if (!free_.empty() && fits(*free_.rbegin())) return *free_.rbegin();
  return nullptr;
}

Block* DeviceHeap::split_to(Block* b, std::uintptr_t at, std::size_t size) {
  auto split_after = [&](Block* x, std::size_t keep) {
    Block* n = blocks_.make();
    n->addr = x->addr + keep;
    n->size = x->size - keep;
    n->region = x->region;
    n->free = true;
    n->tags = x->tags;
    n->prev = x;
    n->next = x->next;
    if (x->next != nullptr) x->next->prev = n;
    x->next = n;
    x->size = keep;
    return n;
  };
  if (at > b->addr) {
    Block* rest = split_after(b, at - b->addr);
    insert_free(b);  // the head stays free
    b = rest;
  }
  if (b->size > size) insert_free(split_after(b, size));
  return b;
}

Block* DeviceHeap::take_free(std::size_t size, std::size_t alignment, vmm::StreamHandle stream) {
  Block* b = find_fit(size, alignment, stream);
  if (b == nullptr) return nullptr;
  erase_free(b);
  return split_to(b, round_up(b->addr, alignment), size);
}

// ------------------------------------------------------------------ regions --

std::size_t DeviceHeap::reserve_cap() const noexcept {
  std::size_t cap = config_.max_reserved_bytes;
  if (config_.memory_fraction > 0.0) {
    const auto by_fraction =
        static_cast<std::size_t>(config_.memory_fraction * static_cast<double>(caps_.total_memory));
    if (cap == 0 || by_fraction < cap) cap = by_fraction;
  }
  return cap;
}

void DeviceHeap::add_region(std::size_t min_bytes, std::size_t alignment,
                            std::size_t requested) {
  auto rec = std::make_unique<RegionRec>();
  Region& r = rec->region;
  r.vmm = vmm_;
  if (vmm_) {
    std::size_t size = kind_ == Kind::scratch ? config_.scratch_arena_bytes : config_.arena_bytes;
    if (size == 0) size = (kind_ == Kind::scratch ? 1 : 4) * caps_.total_memory;
    size = std::max(round_up(size, std::size_t{1} << 30), round_up(min_bytes + alignment, kGranule));
    rec->va = vmm::ReservedRange(driver_, size, kGranule);
    r.base = rec->va.base();
    r.size = rec->va.size();
  } else {
    // No VMM: a region is one cuMemAlloc segment, mapped as a whole.
    std::size_t size = round_up(min_bytes, kGranule);
    const std::size_t cap = reserve_cap();
    if (cap != 0 && device_reserved() + size > cap)
      release_cached(device_reserved() + size - cap, false);
    if (config_.reserve_slack >= 0.0) {
      // The same bound as the VMM path (ensure_mapped), by whole segments.
      const double live_after = static_cast<double>(live_total()) +
                                static_cast<double>(min_bytes);
      const auto bound = static_cast<std::size_t>(live_after * (1.0 + config_.reserve_slack));
      if (reserved_ + size > bound) release_cached(reserved_ + size - bound, false);
    }
    if (cap != 0 && device_reserved() + size > cap) throw_oom(requested, "the reserved-bytes cap");
    vmm::DevicePtr p = 0;
    vmm::Result res = driver_.mem_alloc(device(), size, &p);
    if (res == vmm::Result::out_of_memory) {
      ++oom_retries_;
      release_cached(0, true);
      res = driver_.mem_alloc(device(), size, &p);
      if (res == vmm::Result::out_of_memory) throw_oom(requested, "the device");
    }
    if (res != vmm::Result::success)
      throw vmm::DriverError(res, "cuMemAlloc(device " + std::to_string(device()) + ", " +
                                      std::to_string(size) + " bytes)");
    if (p % alignment != 0) {
      // Spans need granule alignment; cuMemAlloc gives it for whole granules
      // in practice, but the API promises only 256 bytes.
      (void)driver_.mem_free(device(), p);
      size += alignment;
      res = driver_.mem_alloc(device(), size, &p);
      if (res != vmm::Result::success) {
        if (res == vmm::Result::out_of_memory) throw_oom(requested, "the device");
        throw vmm::DriverError(res, "cuMemAlloc(device " + std::to_string(device()) + ")");
      }
    }
    std::uint32_t idx;
    if (!free_chunk_slots_.empty()) {
      idx = free_chunk_slots_.back();
      free_chunk_slots_.pop_back();
    } else {
      idx = static_cast<std::uint32_t>(chunks_.size());
      chunks_.emplace_back();
    }
    ChunkRec& c = chunks_[idx];
    c.classic = p;
    c.addr = p;
    c.size = size;
    c.in_use = true;
    c.streams.clear();
    c.live = 0;
    rec->classic_chunk = idx + 1;
    r.base = p;
    r.size = size;
    add_reserved(size);
    ++chunks_mapped_;
  }
  if (!PageMap::in_range(r.base + r.size - 1))
    throw vmm::DriverError(vmm::Result::invalid_value,
                           "gvmalloc: the driver returned address range " + hex(r.base) +
                               " beyond the 49-bit space the page map covers; reserve at");
  Block* b = blocks_.make();
  b->addr = r.base;
  b->size = r.size;
  b->region = &r;
  b->free = true;
  r.first = b;
  insert_free(b);
  r.index = regions_.size();  // now: releasing cached segments above may have renumbered
  regions_.push_back(std::move(rec));
}

// ------------------------------------------------------------ stream order --

void DeviceHeap::note_stream(vmm::StreamHandle stream) {
  for (auto s : streams_seen_)
    if (s == stream) return;
  streams_seen_.push_back(stream);
}

void DeviceHeap::order_after(const StreamTags& tags, vmm::StreamHandle stream) {
  if (tags.only(stream)) return;
  bool device_synced = false;
  auto wait_for = [&](vmm::StreamHandle s) {
    if (s == stream || device_synced) return;
    // Recording on S and waiting on T orders T's next work after everything
    // S had queued, which includes every use of the block: no host sync. The
    // event may be re-recorded at once: a wait captures its state when issued.
    vmm::Result r = vmm::Result::success;
    if (order_event_.empty()) {
      try {
        order_event_ = vmm::Event(driver_, device());
      } catch (const vmm::DriverError& e) {
        r = e.result();
      }
    }
    if (r == vmm::Result::success) r = order_event_.record(s);
    if (r == vmm::Result::success) r = order_event_.wait_on(stream);
    if (r != vmm::Result::success) {
      // S is gone (a stream its owner destroyed is an invalid handle, and
      // its work may still be queued), is a peer device's stream (recorded
      // on the block; our event cannot be recorded there), or the event
      // failed: wait for every device on the host instead, as the fence
      // does. Rare and slow.
      r = vmm::Result::success;
      for (std::size_t d = 0; d < caps_.can_access_peer.size() && r == vmm::Result::success; ++d)
        r = driver_.ctx_synchronize(static_cast<int>(d));
      device_synced = r == vmm::Result::success;
    }
    if (r != vmm::Result::success)
      // Only the fallback's sync can fail here: name it.
      throw vmm::DriverError(r, "cuCtxSynchronize in the stream-order wait on device " +
                                    std::to_string(device()));
    ++cross_stream_waits_;
  };
  if (tags.all()) {
    for (auto s : streams_seen_) wait_for(s);
  } else {
    for (int i = 0; i < tags.size(); ++i) wait_for(tags[i]);
  }
}

// ----------------------------------------------------------- large blocks --

void DeviceHeap::link_start(Block* b) {
  PageEntry& e = pages_.at(b->addr);
  b->page_next = e.starts;
  e.starts = b;
}

void DeviceHeap::unlink_start(Block* b) {
  PageEntry& e = pages_.at(b->addr);
  for (Block** p = &e.starts; *p != nullptr; p = &(*p)->page_next) {
    if (*p == b) {
      *p = b->page_next;
      b->page_next = nullptr;
      return;
    }
  }
}

Block* DeviceHeap::find_start(std::uintptr_t addr) const {
  const PageEntry* e = pages_.find(addr);
  if (e == nullptr) return nullptr;
  for (Block* b = e->starts; b != nullptr; b = b->page_next)
    if (b->addr == addr) return b;
  return nullptr;
}

void DeviceHeap::tag_chunks(const Block* b, vmm::StreamHandle stream) {
  for_each_chunk(b, [&](std::uint32_t c) { chunks_[c].streams.add(stream); });
}

Block* DeviceHeap::allocate_block(std::size_t size, std::size_t alignment,
                                  vmm::StreamHandle stream, std::size_t requested) {
  note_stream(stream);
  Block* b = take_free(size, alignment, stream);
  if (b == nullptr) {
    add_region(size, alignment, requested);
    b = take_free(size, alignment, stream);
    if (b == nullptr) throw_oom(requested, "address space");
  }
  auto give_back = [&] {
    b->free = true;
    free_block(b, nullptr);
  };
  try {
    // Memory that is not mapped has no work pending on it (every unmap is
    // behind the fence): a block carved from the unmapped part of a free
    // block needs no wait, whatever streams merged into that free block.
    if (!unmapped(b)) order_after(b->tags, stream);
  } catch (...) {
    give_back();
    throw;
  }
  b->free = false;
  b->span = nullptr;
  b->stream = stream;
  b->requested = requested;
  b->tags.clear();
  try {
    commit(b);
  } catch (...) {
    // Never handed out, but `stream` already waited for every earlier user:
    // the next taker waits for `stream` (free_block tags it).
    free_block(b, stream);
    throw;
  }
  tag_chunks(b, stream);
  return b;
}

bool DeviceHeap::unmapped(const Block* b) const {
  if (!vmm_) return false;
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end(); g += kGranule) {
    const PageEntry* e = pages_.find(g);
    if (e != nullptr && e->chunk != 0) return false;
  }
  return true;
}

void DeviceHeap::commit(Block* b) {
  // Count the block on the chunks already under it (so nothing below can
  // release them), then map what is missing: those chunks start at one.
  for_each_chunk(b, [&](std::uint32_t c) { ++chunks_[c].live; });
  if (!vmm_) {
    ++large_hits_;
    return;
  }
  try {
    ensure_mapped(b);
  } catch (...) {
    uncommit(b);
    throw;
  }
}

void DeviceHeap::uncommit(Block* b) {
  for_each_chunk(b, [&](std::uint32_t c) { --chunks_[c].live; });
}

void DeviceHeap::free_block(Block* b, vmm::StreamHandle stream) {
  // b is not in free_. An allocated block is tagged with the streams that
  // may still run on it - the legacy stream (nullptr) is one like any other:
  // streams from cuStreamCreate do not wait for it. A block handed back
  // untouched (b->free already set) keeps the tags it had. Then merge.
  if (!b->free) {
    b->tags.add(b->stream);
    if (stream != b->stream) b->tags.add(stream);
  }
  b->free = true;
  // A merge can widen the tags, which can make the other neighbour
  // mergeable (mergeable is not transitive): look again until neither is.
  for (bool merged = true; merged;) {
    merged = false;
    if (Block* n = b->next; n != nullptr && n->free && mergeable(b->tags, n->tags)) {
      erase_free(n);
      b->size += n->size;
      b->tags.merge(n->tags);
      b->next = n->next;
      if (n->next != nullptr) n->next->prev = b;
      blocks_.recycle(n);
      merged = true;
    }
    if (Block* p = b->prev; p != nullptr && p->free && mergeable(p->tags, b->tags)) {
      erase_free(p);
      p->size += b->size;
      p->tags.merge(b->tags);
      p->next = b->next;
      if (b->next != nullptr) b->next->prev = p;
      blocks_.recycle(b);
      b = p;
      merged = true;
    }
  }
  insert_free(b);
}

void* DeviceHeap::allocate_large(std::size_t bytes, vmm::StreamHandle stream) {
  const std::size_t size = round_up(bytes, kBlockAlignment);
  bool spans_reclaimed = false;
  for (int attempt = 0;; ++attempt) {
    try {
      std::lock_guard<std::mutex> guard(lock_);
      struct Clear {
        bool& flag;
        ~Clear() { flag = false; }
      } clear{reclaim_spans_first_};
      reclaim_spans_first_ = !spans_reclaimed;
      Block* b = allocate_block(size, kBlockAlignment, stream, bytes);
      link_start(b);
      large_live_ += size;
      ++large_allocations_;
      large_live_bytes_.store(large_live_bytes_.load(std::memory_order_relaxed) +
                                  static_cast<std::int64_t>(size),
                              std::memory_order_relaxed);
      refresh_peak();
      return reinterpret_cast<void*>(b->addr);
    } catch (const ReclaimSpans&) {
      // Nothing was changed; the lock is released. Once per allocation.
      spans_reclaimed = true;
      reclaim_spans();
      --attempt;
    } catch (const out_of_memory&) {
      // Empty spans kept by the stream caches are cached memory too, but the
      // OOM path runs under the device lock and cannot take the caches'
      // locks: give them back here, with no lock held, and try once more.
      if (attempt > 0 || reclaim_spans() == 0) throw;
    }
  }
}

bool DeviceHeap::owns(std::uintptr_t addr) const noexcept {
  std::lock_guard<std::mutex> guard(lock_);
  for (const auto& r : regions_)
    if (addr - r->region.base < r->region.size) return true;
  return false;
}

bool DeviceHeap::deallocate(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream) {
  if (const PageEntry* e = pages_.find(addr); e != nullptr) {
    if (Span* s = e->span.load(std::memory_order_acquire); s != nullptr && s->contains(addr)) {
      free_small(s, addr, bytes, stream);
      return true;
    }
  }
  {
    std::lock_guard<std::mutex> guard(lock_);
    Block* b = find_start(addr);
    if (b == nullptr) return false;  // the caller names what it is
    if (bytes != kUnknownSize && bytes != b->requested)
      throw usage_error("gvmalloc: deallocate(" + hex(addr) + ", " + std::to_string(bytes) +
                        " bytes) on device " + std::to_string(device()) +
                        ": the block was allocated with " + std::to_string(b->requested) +
                        " bytes");
    unlink_start(b);
    uncommit(b);
    if (stream != b->stream) {
      note_stream(stream);
      tag_chunks(b, stream);
    }
    large_live_ -= b->size;
    ++large_frees_;
    large_live_bytes_.store(
        large_live_bytes_.load(std::memory_order_relaxed) - static_cast<std::int64_t>(b->size),
        std::memory_order_relaxed);
    free_block(b, stream);
    maybe_release_above_threshold();
  }
  return true;
}

void DeviceHeap::record_stream(std::uintptr_t addr, vmm::StreamHandle stream) {
  if (const PageEntry* e = pages_.find(addr); e != nullptr) {
    if (Span* s = e->span.load(std::memory_order_acquire); s != nullptr && s->contains(addr)) {
      StreamCache& c = *s->owner;
      std::lock_guard<SpinLock> cache_guard(c.lock);
      const std::uintptr_t off = addr - s->base;
      if (off % s->slot_size != 0 || !s->is_allocated(static_cast<std::uint32_t>(off / s->slot_size)))
        throw usage_error("gvmalloc: record_stream(" + hex(addr) + "): not a live block");
      if (stream == c.stream) return;
      c.recorded[addr].add(stream);
      std::lock_guard<std::mutex> guard(lock_);
      note_stream(stream);
      tag_chunks(s->block, stream);
      return;
    }
  }
  std::lock_guard<std::mutex> guard(lock_);
  Block* b = find_start(addr);
  if (b == nullptr) throw usage_error("gvmalloc: record_stream(" + hex(addr) + "): not a live block");
  if (stream == b->stream) return;
  note_stream(stream);
  b->tags.add(stream);
  tag_chunks(b, stream);
}

// ------------------------------------------------------------ OOM message --

void DeviceHeap::throw_oom(std::size_t bytes, const char* why) {
  std::size_t free_bytes = 0, total_bytes = 0;
  const bool have_info = driver_.mem_get_info(device(), &free_bytes, &total_bytes) == vmm::Result::success;
  const auto live = static_cast<std::size_t>(std::max<std::int64_t>(0, live_total()));
  std::string msg = "gvmalloc: out of memory on device " + std::to_string(device()) + " (" +
                    caps_.name + "): tried to allocate " + format_bytes(bytes) + " (limited by " +
                    why + "); " + format_bytes(live) + " live, " +
                    format_bytes(reserved_ > live ? reserved_ - live : 0) + " cached, " +
                    format_bytes(reserved_) + " reserved by gvmalloc";
  if (const std::size_t cap = reserve_cap(); cap != 0) msg += ", reserved-bytes cap " + format_bytes(cap);
  if (have_info)
    msg += "; the device has " + format_bytes(free_bytes) + " free of " + format_bytes(total_bytes);
  throw out_of_memory(msg);
}

}  // namespace gvm::detail
