// DeviceHeap: everything gvmalloc holds on one device.
//
//   arena (one reservation, 4x device memory by default)
//   +-----------------------------------------------------------------+
//   | blk | span | blk (free) | blk ... |        free (unmapped)      |
//   +-----------------------------------------------------------------+
//   |<- chunk 0 ->|<-- chunk 1 -->|<- chunk 2 ->|   (mapped on demand)
//
// Large blocks (above Config::small_block_max_bytes) are carved best-fit
// from the region's free blocks, which merge with free neighbours on free.
// Small blocks come from spans: one granule cut into slots of one size class,
// owned by one stream's cache (stream_cache.hpp). Physical chunks are mapped
// under the blocks that need them and returned when wholly free: on trim, on
// OOM, above the release threshold, and before growing past the
// reserve_slack bound.
//
// Locking: the device lock (lock_) guards regions, blocks, chunks and the page
// map's non-atomic fields. A stream cache's spin lock may be held while the
// device lock is taken, never the reverse.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "block.hpp"
#include "fence.hpp"
#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/memory_map.hpp"
#include "gvm/stats.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/owners.hpp"
#include "node_pool.hpp"
#include "page_map.hpp"
#include "size_classes.hpp"
#include "span.hpp"
#include "spin_lock.hpp"

namespace gvm::detail {

class DeviceHeap;

// "1.50 GiB", for messages.
std::string format_bytes(std::size_t n);

// The small-block cache of one stream on one device.
struct StreamCache {
  SpinLock lock;
  DeviceHeap* heap = nullptr;
  vmm::StreamHandle stream = nullptr;
  std::array<Span*, kMaxClasses> current{};  // span being handed out from
  std::array<Span*, kMaxClasses> partial{};  // spans with free slots (list heads)
  std::array<Span*, kMaxClasses> spare{};    // one unused span kept per class
  // Allocations of each class served by the large heap while the class is
  // cold (Config::span_warmup_allocations).
  std::array<std::uint32_t, kMaxClasses> cold_allocations{};
  // Streams recorded on live slots (record_stream), by slot address; rare.
  std::unordered_map<std::uintptr_t, StreamTags> recorded;
  // Statistics of this cache, under its lock.
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t hits = 0;
  // Small-block bytes live from this cache: written under its lock (a plain
  // load and store, no read-modify-write), read by anyone.
  std::atomic<std::int64_t> live_bytes{0};
  // Above this many live bytes this cache may be setting a new device peak:
  // DeviceHeap::refresh_peak then sums every cache. Below it, the hot path
  // touches nothing shared (see refresh_peak).
  std::atomic<std::int64_t> peak_watermark{-1};
};

class DeviceHeap {
 public:
  // Release-before-growth runs only for a growth of at least 1/128 of what
  // is reserved. A release costs a fence (a host sync) and driver calls; it
  // pays when the growth is large enough to set the peak (the GPT-2 trace:
  // 1.026 reserved/live, 432 chunks mapped), not for the small growths of a
  // fragmented steady state (mixed workload: 555 chunk maps in 2M operations;
  // releasing on every growth: 1.023 but 9,280 maps - driver churn).
  static constexpr std::size_t kReleaseGrowthFraction = 128;
  // Thrown by ensure_mapped on allocate_large's first attempt, when a growth
  // would release chunks: the caches' empty spans go back first.
  struct ReclaimSpans {};
  enum class Kind { arena, scratch };

  // `access`: who may touch chunks mapped here (the owner first; for the
  // scratch heap, its peers too).
  // `device_reserved`: the bytes every heap of this device (arena and
  // scratch) holds, which the reserve cap bounds; shared, outlives the heap.
  DeviceHeap(vmm::Driver& driver, const vmm::DeviceCaps& caps, const Config& config, Fence& fence,
             Kind kind, std::vector<vmm::AccessDesc> access,
             std::atomic<std::size_t>& device_reserved);
  ~DeviceHeap();
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  int device() const noexcept { return caps_.device; }
  bool uses_vmm() const noexcept { return vmm_; }
  // Requests up to this size go to allocate_small.
  std::size_t small_max() const noexcept { return small_max_; }

  // The cache of `stream`, created on first use.
  StreamCache& cache_for(vmm::StreamHandle stream);

  void* allocate_small(StreamCache& cache, std::size_t bytes);
  void* allocate_large(std::size_t bytes, vmm::StreamHandle stream);
  // True if addr lies in one of this heap's regions (a live block or not);
  // takes the device lock: for error messages and record_stream.
  bool owns(std::uintptr_t addr) const noexcept;
  // Frees the live block starting at addr and returns true; returns false,
  // changing nothing, when no live block of this heap starts there. Throws
  // usage_error (nothing changed) for a double free of a small block or a
  // size that does not match.
  bool deallocate(std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream);
  void record_stream(std::uintptr_t addr, vmm::StreamHandle stream);

  // Returns every cached chunk (and empty span) to the driver, fenced.
  void trim();

  // --- peer scratch ---
  // Who may access this heap's chunks: applied now to every mapped chunk
  // (one cuMemSetAccess each; a device left out of `access` but present
  // before is revoked with PROT_NONE) and to chunks mapped later. The caller
  // has fenced every device that may touch them (Allocator::set_peer_policy).
  void set_access(std::vector<vmm::AccessDesc> access);
  std::vector<vmm::AccessDesc> access() const;
  // Work on `ref` uses the live block at addr: a fence before this memory's
  // access changes or is unmapped waits for it (Config::scratch_fence_tracked).
  void note_use(std::uintptr_t addr, StreamRef ref);
  // The streams a fence over every chunk of this heap must wait for; sets
  // *whole_devices when tracking cannot tell (then synchronise the devices).
  std::vector<StreamRef> streams_touching(bool* whole_devices) const;
  // The block starting at addr if it is live here (for peer_copy).
  bool is_live_block(std::uintptr_t addr, std::size_t bytes) const;

  DeviceStats stats() const;
  bool check_invariants(std::string* why) const;
  // Appends the heap's segments and their blocks (heap_memory_map.cpp).
  void memory_map(std::vector<SegmentInfo>& out) const;

  // Address range(s) of the heap's reservations, for tests.
  std::vector<std::pair<std::uintptr_t, std::size_t>> regions() const;

 private:
  friend struct StreamCacheOps;
  struct ChunkRec {
    vmm::MappedChunk mem;   // VMM
    vmm::DevicePtr classic = 0;  // no VMM: the cuMemAlloc segment
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    StreamTags streams;  // streams of this device that may have touched it
    std::vector<StreamRef> peer_streams;  // scratch: (device, stream) users
    std::uint32_t live = 0;  // allocated blocks (and spans) overlapping it
    bool in_use = false;
  };
  struct RegionRec {
    Region region;
    vmm::ReservedRange va;        // VMM
    std::uint32_t classic_chunk = 0;  // no VMM: 1 + chunk index of the segment
  };
  struct BySizeAddr {
    bool operator()(const Block* a, const Block* b) const noexcept {
      return a->size != b->size ? a->size < b->size : a->addr < b->addr;
    }
  };

  // --- large path (lock_ held) ---
  Block* take_free(std::size_t size, std::size_t alignment, vmm::StreamHandle stream);
  Block* find_fit(std::size_t size, std::size_t alignment, vmm::StreamHandle stream);
  Block* split_to(Block* b, std::uintptr_t at, std::size_t size);
  // `requested`: the caller's size, for an out-of-memory message.
  void add_region(std::size_t min_bytes, std::size_t alignment, std::size_t requested);
  Block* allocate_block(std::size_t size, std::size_t alignment, vmm::StreamHandle stream,
                        std::size_t requested);
  void free_block(Block* b, vmm::StreamHandle stream);
  void insert_free(Block* b);
  void erase_free(Block* b);
  void order_after(const StreamTags& tags, vmm::StreamHandle stream);
  void note_stream(vmm::StreamHandle stream);
  bool unmapped(const Block* b) const;  // no granule of b is mapped
  bool range_mapped(std::uintptr_t addr, std::size_t size) const;  // every granule is
  const Block* live_block_holding(std::uintptr_t addr, std::size_t bytes) const;
  void commit(Block* b);     // live counts up, map what is missing
  void uncommit(Block* b);   // live counts down
  void ensure_mapped(Block* b);
  void map_run(std::uintptr_t addr, std::size_t size, std::vector<std::uint32_t>& made);
  std::size_t release_cached(std::size_t want, bool all);
  void release_chunk(std::uint32_t index);
  vmm::Result release_chunk_noexcept(std::uint32_t index) noexcept;
  bool chunk_is_free(std::uint32_t index) const;
  std::size_t cached_chunk_bytes() const;  // wholly free chunks
  void release_unused_regions();
  void maybe_release_above_threshold();
  std::size_t reserve_cap() const noexcept;
  // What the device's heaps hold together (the cap counts them all).
  std::size_t device_reserved() const noexcept { return device_reserved_.load(); }
  void add_reserved(std::size_t n) noexcept;
  void sub_reserved(std::size_t n) noexcept;
  [[noreturn]] void throw_oom(std::size_t bytes, const char* why);
  void link_start(Block* b);
  void unlink_start(Block* b);
  Block* find_start(std::uintptr_t addr) const;
  void tag_chunks(const Block* b, vmm::StreamHandle stream);
  // f(chunk index) for each chunk under b (classic: its segment).
  template <typename F>
  void for_each_chunk(const Block* b, F&& f) const;
  void fence_chunks(const std::vector<std::uint32_t>& chunks);

  // --- small path ---
  Span* new_span(StreamCache& cache, int size_class, std::size_t bytes);  // takes lock_
  void release_span(Span* s);                           // takes lock_
  void release_span_locked(Span* s);
  // Empty spans of every cache back to the large pool; how many. Takes the
  // caches' locks and lock_: call with neither held.
  std::size_t reclaim_spans();
  void free_small(Span* s, std::uintptr_t addr, std::size_t bytes, vmm::StreamHandle stream);

  // Live bytes: large blocks plus every cache's small blocks.
  std::int64_t live_total() const noexcept;
  // Sums the live bytes, raises the peak, and notes the headroom left to it
  // (a cache that refreshes sets its watermark to its bytes + the headroom).
  void refresh_peak() noexcept;

  vmm::Driver& driver_;
  const vmm::DeviceCaps& caps_;
  const Config& config_;
  Fence& fence_;
  const Kind kind_;
  std::vector<vmm::AccessDesc> access_;  // lock_
  const bool vmm_;
  const std::size_t small_max_;

  mutable std::mutex lock_;
  PageMap pages_;
  BlockPool blocks_;
  std::vector<std::unique_ptr<RegionRec>> regions_;
  NodeArena free_nodes_;  // declared before free_: outlives it
  std::set<Block*, BySizeAddr, NodePool<Block*>> free_{BySizeAddr{}, NodePool<Block*>(free_nodes_)};
  std::vector<ChunkRec> chunks_;
  std::vector<std::uint32_t> free_chunk_slots_;
  // Every stream that may be in a block's tags (allocation, free and
  // record_stream streams): tags that overflowed to "all" wait for each.
  std::vector<vmm::StreamHandle> streams_seen_;
  vmm::Event order_event_;  // recorded on S, waited on by T; reusable at once
  // Set during allocate_large's first attempt: a growth that would release
  // chunks throws ReclaimSpans instead (lock_).
  bool reclaim_spans_first_ = false;

  mutable std::mutex caches_lock_;
  std::unordered_map<vmm::StreamHandle, std::unique_ptr<StreamCache>> caches_;
  std::vector<std::unique_ptr<Span>> spans_;  // every live span (lock_)

  // Statistics. live_ and peak_live_ are updated on the hot path.
  // Large-block live bytes (written under lock_), the peak of live bytes,
  // and the caches in a list that refresh_peak can walk. cache_list_lock_
  // is a leaf lock: nothing else is taken while it is held.
  std::atomic<std::int64_t> large_live_bytes_{0};
  std::atomic<std::int64_t> peak_live_{0};
  std::atomic<std::int64_t> headroom_{0};  // peak - total at the last refresh
  mutable SpinLock cache_list_lock_;
  std::vector<StreamCache*> cache_list_;
  std::size_t reserved_ = 0;  // this heap's part of device_reserved_
  std::atomic<std::size_t>& device_reserved_;
  std::size_t peak_reserved_ = 0;
  std::size_t large_live_ = 0;
  std::uint64_t large_allocations_ = 0;
  std::uint64_t large_frees_ = 0;
  std::uint64_t large_hits_ = 0;
  std::uint64_t chunks_mapped_ = 0;
  std::uint64_t chunks_unmapped_ = 0;
  std::uint64_t oom_retries_ = 0;
  std::uint64_t cross_stream_waits_ = 0;
  std::uint64_t fences_ = 0;
};

template <typename F>
inline void DeviceHeap::for_each_chunk(const Block* b, F&& f) const {
  if (!vmm_) {
    f(regions_[b->region->index]->classic_chunk - 1);
    return;
  }
  // Hop from chunk to chunk: a 1 GiB block over 128 MiB chunks is 8 steps,
  // not 512 granules.
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end();) {
    const PageEntry* e = pages_.find(g);
    const std::uint32_t c = e == nullptr ? 0 : e->chunk;
    if (c == 0) {
      g += kGranule;
      continue;
    }
    f(c - 1);
    g = chunks_[c - 1].addr + chunks_[c - 1].size;
  }
}

}  // namespace gvm::detail
