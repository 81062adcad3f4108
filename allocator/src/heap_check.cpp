// DeviceHeap: statistics and the invariant checker.
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "device_heap.hpp"

namespace gvm::detail {

DeviceStats DeviceHeap::stats() const {
  DeviceStats s;
  s.device = device();
  {
    std::lock_guard<std::mutex> guard(caches_lock_);
    for (const auto& [stream, c] : caches_) {
      std::lock_guard<SpinLock> cache_guard(c->lock);
      s.allocations += c->allocations;
      s.frees += c->frees;
      s.cache_hits += c->hits;
    }
  }
  std::lock_guard<std::mutex> guard(lock_);
  const auto live = static_cast<std::size_t>(std::max<std::int64_t>(0, live_total()));
  s.live_bytes = live;
  s.peak_live_bytes = static_cast<std::size_t>(peak_live_.load());
  s.reserved_bytes = reserved_;
  s.peak_reserved_bytes = peak_reserved_;
  s.cached_bytes = reserved_ > live ? reserved_ - live : 0;
  if (kind_ == Kind::scratch) s.scratch_reserved_bytes = reserved_;
  s.allocations += large_allocations_;
  s.frees += large_frees_;
  s.cache_hits += large_hits_;
  s.chunks_mapped = chunks_mapped_;
  s.chunks_unmapped = chunks_unmapped_;
  s.oom_retries = oom_retries_;
  s.fences = fences_;
  s.cross_stream_waits = cross_stream_waits_;
  return s;
}

std::vector<std::pair<std::uintptr_t, std::size_t>> DeviceHeap::regions() const {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<std::pair<std::uintptr_t, std::size_t>> out;
  for (const auto& r : regions_) out.emplace_back(r->region.base, r->region.size);
  return out;
}

bool DeviceHeap::check_invariants(std::string* why) const {
  auto fail = [&](const std::string& msg) {
    if (why != nullptr) *why = "device " + std::to_string(device()) + ": " + msg;
    return false;
  };
  // Every lock, in the documented order: caches, then the device.
  std::vector<const StreamCache*> caches;
  std::unique_lock<std::mutex> caches_guard(caches_lock_);
  for (const auto& [stream, c] : caches_) caches.push_back(c.get());
  for (const StreamCache* c : caches) const_cast<StreamCache*>(c)->lock.lock();
  struct Unlock {
    std::vector<const StreamCache*>& cs;
    ~Unlock() {
      for (const StreamCache* c : cs) const_cast<StreamCache*>(c)->lock.unlock();
    }
  } unlock{caches};
  std::lock_guard<std::mutex> guard(lock_);

  // Blocks tile each region; no two free neighbours; the free set is exact.
  std::size_t free_blocks = 0;
  std::size_t large_live = 0;
  std::unordered_map<std::uint32_t, std::uint32_t> expected_live;  // chunk -> blocks over it
  for (const auto& rec : regions_) {
    const Region& r = rec->region;
    std::uintptr_t at = r.base;
    const Block* prev = nullptr;
    for (const Block* b = r.first; b != nullptr; prev = b, b = b->next) {
      if (b->addr != at) return fail("blocks do not tile the region at " + std::to_string(at));
      if (b->prev != prev) return fail("broken prev link");
      if (b->region != &r) return fail("block in the wrong region");
      if (b->size == 0) return fail("empty block");
      at += b->size;
      if (b->free) {
        ++free_blocks;
        if (prev != nullptr && prev->free && mergeable(prev->tags, b->tags))
          return fail("two free neighbours were not merged");
        if (free_.find(const_cast<Block*>(b)) == free_.end()) return fail("free block not in the free set");
        continue;
      }
      for_each_chunk(b, [&](std::uint32_t c) { ++expected_live[c]; });
      if (b->span == nullptr) {
        large_live += b->size;
        if (find_start(b->addr) != b) return fail("live block not found by its address");
      } else if (pages_.find(b->addr) == nullptr ||
                 pages_.find(b->addr)->span.load() != b->span) {
        return fail("span not in the page map");
      }
      if (vmm_) {
        for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end(); g += kGranule) {
          const PageEntry* e = pages_.find(g);
          if (e == nullptr || e->chunk == 0) return fail("live block over an unmapped granule");
        }
      }
    }
    if (at != r.base + r.size) return fail("blocks do not cover the region");
  }
  if (free_blocks != free_.size()) return fail("free set holds blocks that are not free");
  if (large_live != large_live_) return fail("large live bytes disagree with the blocks");

  // Chunks: the page map names them, and their live counts match the blocks.
  std::size_t reserved = 0;
  for (std::uint32_t i = 0; i < chunks_.size(); ++i) {
    const ChunkRec& c = chunks_[i];
    if (!c.in_use) continue;
    reserved += c.size;
    auto it = expected_live.find(i);
    if (c.live != (it == expected_live.end() ? 0 : it->second))
      return fail("chunk live count is wrong");
    if (!vmm_) continue;
    for (std::uintptr_t g = c.addr; g < c.addr + c.size; g += kGranule) {
      const PageEntry* e = pages_.find(g);
      if (e == nullptr || e->chunk != i + 1) return fail("chunk granule not marked in the page map");
    }
  }
  for (const auto& [c, n] : expected_live)
    if (c >= chunks_.size() || !chunks_[c].in_use) return fail("a live block over a chunk that is gone");
  if (reserved != reserved_) return fail("reserved bytes disagree with the chunks");

  // Spans and caches.
  std::int64_t small_live = 0;
  for (const auto& sp : spans_) {
    const Span& s = *sp;
    std::uint32_t allocated = 0;
    for (std::uint32_t i = 0; i < s.slots; ++i) allocated += s.is_allocated(i) ? 1 : 0;
    if (allocated != s.slots - s.free_count) return fail("span bitmap and free stack disagree");
    if (s.block == nullptr || s.block->free || s.block->span != &s) return fail("span's block");
    small_live += static_cast<std::int64_t>(allocated * s.slot_size);
  }
  std::int64_t cache_live = 0;
  for (const StreamCache* c : caches) cache_live += c->live_bytes.load();
  if (cache_live != small_live) return fail("cache live bytes disagree with the spans");
  if (large_live_bytes_.load() != static_cast<std::int64_t>(large_live_))
    return fail("large live bytes disagree with the counter");
  if (live_total() != small_live + static_cast<std::int64_t>(large_live_))
    return fail("live bytes disagree with the blocks");
  return true;
}

}  // namespace gvm::detail
