// LargeArena: the blocks of one heap - best fit with coalescing over the
// heap's regions - and the physical chunks mapped under them.
//
//   region (one reservation, or one cuMemAlloc segment without VMM)
//   +-----------------------------------------------------------------+
//   | blk | span | blk (free) | blk ... |        free (unmapped)      |
//   +-----------------------------------------------------------------+
//   |<- chunk 0 ->|<-- chunk 1 -->|<- chunk 2 ->|   (mapped on demand)
//
// Pure bookkeeping: it never calls the driver. Its heap (heap.hpp) reserves,
// maps and unmaps through the physical backing with no lock held, then hands
// the results in. Not thread-safe: the heap's lock guards every call.
//
// Chunk lifecycle: install_chunk (mapped, live 0) -> commit/uncommit count the
// blocks over it -> begin_release carves its wholly free range out of the free
// set (so nothing is handed out from it while the fence runs) -> end_release
// gives the range back, unmapped or, when the unmap failed, as it was.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "block.hpp"
#include "gvm/memory_map.hpp"
#include "gvm/vmm/driver.hpp"
#include "gvm/vmm/owners.hpp"
#include "free_bins.hpp"
#include "page_map.hpp"

namespace gvm::detail {

using Run = std::pair<std::uintptr_t, std::size_t>;

class LargeArena {
 public:
  // `owner`: what the page map names for granules mapped here. `on_demand`:
  // VMM (regions are address space, chunks mapped under blocks) or not
  // (each region is a segment backed as a whole).
  LargeArena(vmm::Driver& driver, int device, PageMap& pages, Heap* owner, bool on_demand);
  ~LargeArena();  // the caller has fenced: unmaps, releases and unreserves
  LargeArena(const LargeArena&) = delete;
  LargeArena& operator=(const LargeArena&) = delete;

  bool on_demand() const noexcept { return on_demand_; }

  // --- regions ----------------------------------------------------------
  // VMM: a new reservation, all of it one free (unmapped) block.
  void add_region(vmm::ReservedRange va);
  // No VMM: a segment, backed as a whole: one region and one chunk.
  // `release` frees it again (the backing's cuMemFree).
  void add_segment(vmm::DevicePtr base, std::size_t size);
  // Extra reservations that are wholly free and unmapped go (the first
  // stays: it is where the next allocation goes). Returns how many.
  std::size_t drop_unused_regions();
  std::size_t region_count() const noexcept { return regions_.size(); }

  // --- blocks -----------------------------------------------------------
  // The best free block of at least `size` at `alignment`, carved out and
  // returned allocated (not yet committed; its waits are what its taker
  // must order after). Among the few best fits one whose waits name only
  // `taker` wins (a stream reuses its own memory without waiting). Where
  // that fit would need a growth, a fully mapped free block of at most 1.5x
  // `size` is taken instead if there is one (rule 9, docs/design-notes.md).
  // mapped_only: only blocks whose every granule is mapped (a steal).
  // Null when nothing fits.
  // strict: only blocks that need no wait for `taker` (a capture).
  // mapped: set to whether the block returned is fully mapped (the caller's
  // next question, answered once).
  Block* take(std::size_t size, std::size_t alignment, const StreamState* taker, bool mapped_only,
              bool strict = false, bool* mapped = nullptr);
  // Exactly [addr, addr + size) of a free block, carved out like take's; null
  // if the range is not all inside one free block.
  Block* take_at(std::uintptr_t addr, std::size_t size);
  // A block handed out from `take` or freed by its user goes back: free,
  // with b->waits as the work a taker must wait for, merged with free
  // neighbours where mergeable.
  void give_back(Block* b);
  // The same for a block its user freed (unlinked from its start or not,
  // still counted on its chunks), with the merge deferred: the block waits
  // as it is - free, outside the bins, still linked at its start and
  // counted on its chunks - and reuse_deferred gives it back to the next
  // allocation of exactly its size without a search, a split, a merge or a
  // bin (a caching allocator's pair: free, then the same size again).
  // Anything else merges it first (settle: into its bin, uncounted), and so
  // does the next such free: at most one block of the arena is unmerged
  // that way.
  // Inline: the large pair's free (the call was 16 of its 276 instructions).
  void give_back_deferred(Block* b) {
    // Still counted on its chunks: uncounted when it merges (erase_free), so
    // a pair that takes it back neither uncounts nor counts it.
    settle();
    b->free = true;
    b->releasing = false;
    b->pending = false;
    b->span = nullptr;
    b->stream = nullptr;
    // In no bin: the free set's changes (free_changes_) stay as they were,
    // and a take settles it first. Still linked at its start (find_start
    // skips free blocks).
    deferred_ = b;
  }
  // The deferred block, allocated again (still counted on its chunks; its
  // waits are the taker's to clear), if it is what a merge and a best fit
  // would give `taker` for `size` bytes (deferred_is_best_fit); else null.
  Block* reuse_deferred(std::size_t size, const StreamState* taker) {
    Block* d = deferred_;
    if (d == nullptr || d->size != size || d->waits.sole_stream() != taker) return nullptr;
    // The verdict holds while the free set is as it was when it was given
    // for this block, size and taker (a loop of pairs asks it once).
    const bool known = d == fit_block_ && free_changes_ == fit_changes_ && size == fit_size_ &&
                       taker == fit_taker_;
    if (!known && !deferred_is_best_fit(size, taker)) return nullptr;
    deferred_ = nullptr;  // not erase_free: it stays linked and counted
    d->free = false;
    return d;
  }
  // Merges the deferred block with its free neighbours now (a release's walk
  // carves free blocks at chunk edges and must see them merged).
  void settle() {
    if (Block* b = deferred_; b != nullptr) {
      erase_free(b);
      give_back(b);
    }
  }
  // Free neighbours kept apart by work not known finished: the heap asks
  // the driver what finished (outside its lock) before it grows, then
  // recheck_stuck() lets the next take merge them.
  bool has_stuck() const noexcept { return stuck_pairs_ != 0; }
  void recheck_stuck() noexcept {
    split_pairs_ += stuck_pairs_;
    stuck_pairs_ = 0;
  }
  // The largest free block's size, mapped bytes only (cacheInfo).
  std::size_t largest_mapped_free() const;
  // The longest run of mapped bytes in free block b.
  std::size_t mapped_stretch(const Block* b) const;
  std::size_t mapped_stretch(std::uintptr_t addr, std::uintptr_t end) const;

  void link_start(Block* b);
  void unlink_start(Block* b);
  Block* find_start(std::uintptr_t addr) const;
  // The same in the page map's entry of addr's granule (deallocate's hot
  // path found it already).
  static Block* start_in(const PageEntry& e, std::uintptr_t addr) noexcept {
    for (Block* b = e.starts; b != nullptr; b = b->page_next)
      if (b->addr == addr && !b->free) return b;  // the deferred block is free
    return nullptr;
  }
  // The live block holding [addr, addr + bytes), or null (peer_copy checks).
  const Block* live_block_holding(std::uintptr_t addr, std::size_t bytes) const;
  Block* live_block_holding(std::uintptr_t addr, std::size_t bytes) {
    return const_cast<Block*>(std::as_const(*this).live_block_holding(addr, bytes));
  }
  bool holds(std::uintptr_t addr) const noexcept;

  // No granule of b is mapped / every granule is.
  bool unmapped(const Block* b) const { return unmapped(b->addr, b->end()); }
  bool fully_mapped(const Block* b) const { return fully_mapped(b->addr, b->end()); }
  // The same for [addr, end) (find_fit asks of the part it would carve).
  bool unmapped(std::uintptr_t addr, std::uintptr_t end) const;
  bool fully_mapped(std::uintptr_t addr, std::uintptr_t end) const;
  // Runs of unmapped granules under b.
  std::vector<Run> unmapped_runs(const Block* b) const;
  // Their bytes: what a growth of b would map.
  std::size_t unmapped_bytes(const Block* b) const;
  // Whether a fully mapped free block would take a request of `size` now, as
  // take(..., mapped_only) would find it (rule 10 asks before it gives its
  // best fit back: Heap::mapped_fit_instead_of_peak).
  bool has_mapped_fit(std::size_t size, std::size_t alignment, const StreamState* taker) {
    std::uintptr_t at = 0;
    return find_fit(size, alignment, taker, true, false, &at) != nullptr;
  }
  // Counts b on the chunks under it (all mapped) / uncounts it.
  void commit(const Block* b);
  void uncommit(const Block* b);
  // The same, remembering which chunks were counted: a block that grows is
  // counted again once its growth is serialised (heap.cpp, map_under),
  // because another growth may have mapped part of it meanwhile.
  void commit(const Block* b, std::vector<std::uint32_t>& counted);
  void uncommit(const std::vector<std::uint32_t>& counted);

  // --- chunks -----------------------------------------------------------
  // A chunk mapped under a block being committed: `live` blocks over it.
  std::uint32_t install_chunk(vmm::MappedChunk mem, std::uint32_t live);
  // The mapped chunks' ranges (an access change applies to each).
  std::vector<Run> chunk_ranges() const;
  // f(block) for every block of every region, in address order per region.
  template <typename F>
  void for_each_block(F&& f) const {
    for (const auto& r : regions_)
      for (const Block* b = r->first; b != nullptr; b = b->next) f(*b);
  }
  // Wholly free chunks (no block over them but the deferred one, not being
  // released), largest first.
  std::vector<std::uint32_t> cached_chunks() const;
  // Their bytes: a running sum (idle_bytes_) and the deferred block's few
  // chunks, not a scan - every growth asks (the growth policy's idle pool).
  std::size_t cached_bytes() const;
  // The mapped ranges, clipped to [lo, hi), of the chunks there that are not
  // wholly free (those being released included), in address order: from the
  // address index, not a scan of every chunk.
  std::vector<Run> live_chunk_runs(std::uintptr_t lo, std::uintptr_t hi) const;
  std::size_t chunk_size(std::uint32_t c) const { return chunks_[c].size; }
  std::uintptr_t chunk_addr(std::uint32_t c) const { return chunks_[c].addr; }
  std::size_t mapped_bytes() const noexcept { return mapped_; }
  // A chunk on its way out: its range is carved out of the free set and its
  // driver handles are held here, so the driver call runs with no lock.
  struct Release {
    std::uint32_t chunk = 0;
    std::size_t size = 0;
    Block* first = nullptr;      // the first of the pieces carved out (in address order)
    vmm::MappedChunk mem;        // VMM
    vmm::DevicePtr segment = 0;  // no VMM
  };
  // Begins the release of chunk c, adding what it must wait for to *waits;
  // false, changing nothing, when a block that is not free still lies over
  // part of it (one whose count is not in yet: begin_release says why).
  // `cursor`: where the walk to c's first block may start - a block of the
  // same lock hold (blocks are only split meanwhile, never merged) - and
  // where the walk ended, for the next call; chunks begun in address order
  // so walk each region once. Null: from the region's start.
  bool begin_release(std::uint32_t c, Release* out, WaitSet* waits, Block** cursor = nullptr);
  // For each of `chunks`, whether begin_release would take it now, in one
  // walk of each region. With both, a trim of 32,768 chunks of 2 MiB no
  // longer walks the region from its start for each one (quadratic: 4.2x
  // its driver time on an H200).
  std::vector<bool> releasable(const std::vector<std::uint32_t>& chunks) const;
  // The driver call that drops it (VMM: unmap + release; no VMM: cuMemFree
  // of the segment). No lock needed. `keep` (VMM only): unmap and move the
  // physical handle there instead of releasing it (HandleStash).
  vmm::Result drop(Release& r, vmm::PhysicalChunk* keep = nullptr) noexcept;
  // After drop: on success the range is free and unmapped (no waits); on
  // failure it is free again as it was and the chunk stays mapped.
  void end_release(Release& r, bool dropped);
  // Instead of drop and end_release, for a handle that its growth maps again
  // elsewhere before the work queued on this range is known finished (VMM
  // only; Heap::hand_over_unfenced): the handle goes to *handle and the
  // mapping, still standing, to *mapping, and the arena ends the release as
  // if it had been unmapped - the range free and unmapped in its books. The
  // caller unmaps *mapping before anything maps that range again.
  void hand_over(Release& r, vmm::PhysicalChunk* handle, vmm::Mapping* mapping);

  // Counters for stats.
  std::uint64_t chunks_mapped() const noexcept { return chunks_mapped_; }
  std::uint64_t chunks_unmapped() const noexcept { return chunks_unmapped_; }

  // Appends this arena's segments (runs of mapped chunks) and blocks.
  // Spans are described by `describe_span` (the heap knows their slots).
  template <typename F>
  void memory_map(std::vector<SegmentInfo>& out, SegmentInfo proto, F&& describe_span) const;
  // Blocks tile the regions, the free set is exact, chunk counts and the
  // page map agree. Returns the live bytes of large blocks via *large_live.
  bool check(std::string* why, std::size_t* large_live, std::size_t* spans) const;

  // f(chunk index) for each chunk under b.
  template <typename F>
  void for_each_chunk(const Block* b, F&& f) const;

 private:
  struct ChunkRec {
    vmm::MappedChunk mem;  // VMM
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::uint32_t live = 0;  // allocated blocks (and spans) overlapping it
    Region* segment = nullptr;  // no VMM: the region it stands for
    bool in_use = false;
    bool releasing = false;
    // Counted in idle_bytes_: mapped, no block over it, not on its way out.
    bool idle() const noexcept { return in_use && !releasing && live == 0; }
  };
  // Every change to a chunk's in_use, releasing or live count goes through
  // here, so that idle_bytes_ stays exact (LargeArena::check compares it
  // with a scan).
  template <typename F>
  void change_chunk(std::uint32_t i, F&& f) {
    ChunkRec& c = chunks_[i];
    const bool was = c.idle();
    const std::size_t size = c.size;
    f(c);
    if (was) idle_bytes_ -= size;
    if (c.idle()) idle_bytes_ += c.size;
  }

  Block* find_fit(std::size_t size, std::size_t alignment, const StreamState* taker,
                  bool mapped_only, bool strict, std::uintptr_t* at);
  // find_fit passes over free blocks larger than this (take's close mapped fit).
  std::size_t fit_max_ = SIZE_MAX;
  Block* split_to(Block* b, std::uintptr_t at, std::size_t size);
  Block* split_after(Block* x, std::size_t keep);
  // The deferred block, of `size` bytes and whose waits name only `taker`
  // (the caller, reuse_deferred, checked both), is what an eager
  // merge and a best fit would give a take of `size` (unaligned) by
  // `taker`: large_arena.cpp says when. A yes is remembered (fit_*).
  bool deferred_is_best_fit(std::size_t size, const StreamState* taker);
  // Merges b's free next neighbour into b (b's own bin entry is the caller's).
  void absorb_next(Block* b);
  // Merges every pair of free neighbours that give_back left apart because
  // different streams used them (a wait set that would overflow excepted).
  // Returns how many merges it made.
  std::size_t merge_split_pairs();
  void insert_free(Block* b) {
    free_.insert(b);
    ++free_changes_;
  }
  // A block leaving the free set (merged into a neighbour, carved, or
  // released: each path made it consistent). The deferred block is in no
  // bin: it is no longer deferred, linked at its start or counted.
  void erase_free(Block* b) {
    if (b == deferred_) {
      deferred_ = nullptr;
      unlink_start(b);
      uncommit(b);
    } else {
      free_.erase(b);
    }
    ++free_changes_;
  }
  // Whether chunk i holds no block but the deferred one (counted on its
  // chunks) and is not being released.
  bool wholly_free(std::uint32_t i) const;

  Region& new_region(std::uintptr_t base, std::size_t size);
  void remove_region(Region* r);
  std::uint32_t new_chunk_slot();
  void set_granules(std::uintptr_t addr, std::size_t size, std::uint32_t chunk_plus_1, Heap* owner);

  vmm::Driver& driver_;  // only for the segments of the no-VMM path
  const int device_;
  PageMap& pages_;
  Heap* const owner_;
  const bool on_demand_;
  BlockPool blocks_;
  std::vector<std::unique_ptr<Region>> regions_;
  FreeBins free_;
  // Pairs of free neighbours give_back left apart since the last
  // merge_split_pairs (a hint: some may have merged since), and those that
  // walk could not merge either.
  std::size_t split_pairs_ = 0;
  std::size_t stuck_pairs_ = 0;
  // The block give_back_deferred left unmerged, free and in no bin (or null).
  Block* deferred_ = nullptr;
  // Changes to the free set other than the deferred block's own leaving and
  // coming back, and the last yes of deferred_is_best_fit with the count
  // it was given at.
  std::uint64_t free_changes_ = 0;
  const Block* fit_block_ = nullptr;
  std::uint64_t fit_changes_ = 0;
  std::size_t fit_size_ = 0;
  const StreamState* fit_taker_ = nullptr;
  std::vector<ChunkRec> chunks_;
  std::vector<std::uint32_t> free_chunk_slots_;
  // The chunks in use by address (a growth asks which lie inside one free
  // block), and the bytes of those that are idle().
  std::map<std::uintptr_t, std::uint32_t> by_addr_;
  std::size_t idle_bytes_ = 0;
  std::size_t mapped_ = 0;
  std::uint64_t chunks_mapped_ = 0;
  std::uint64_t chunks_unmapped_ = 0;
};

template <typename F>
inline void LargeArena::for_each_chunk(const Block* b, F&& f) const {
  if (!on_demand_) {
    f(b->region->segment_chunk - 1);
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

template <typename F>
void LargeArena::memory_map(std::vector<SegmentInfo>& out, SegmentInfo proto,
                            F&& describe_span) const {
  std::vector<Run> segs;
  for (const ChunkRec& c : chunks_)
    if (c.in_use) segs.emplace_back(c.addr, c.size);
  std::sort(segs.begin(), segs.end());
  std::vector<Run> runs;
  for (const auto& s : segs) {
    if (on_demand_ && !runs.empty() && runs.back().first + runs.back().second == s.first)
      runs.back().second += s.second;
    else
      runs.push_back(s);
  }
  std::vector<const Block*> all;
  for (const auto& r : regions_)
    for (const Block* b = r->first; b != nullptr; b = b->next) all.push_back(b);
  std::sort(all.begin(), all.end(), [](const Block* a, const Block* b) { return a->addr < b->addr; });
  std::size_t bi = 0;
  for (const auto& [addr, size] : runs) {
    SegmentInfo seg = proto;
    seg.addr = addr;
    seg.size = size;
    const std::uintptr_t end = addr + size;
    while (bi < all.size() && all[bi]->end() <= addr) ++bi;
    for (std::size_t k = bi; k < all.size() && all[k]->addr < end; ++k) {
      const Block* b = all[k];
      if (!b->free && b->span != nullptr) {
        describe_span(seg, *b->span);
        continue;
      }
      // A free block may run past the mapped range: clip it to the segment.
      const std::uintptr_t lo = std::max(b->addr, addr);
      const std::uintptr_t hi = std::min(b->end(), end);
      BlockInfo info;
      info.addr = lo;
      info.size = static_cast<std::size_t>(hi - lo);
      info.allocated = !b->free && !b->releasing;
      info.requested = info.allocated ? b->requested : 0;
      const StreamState* s = b->free ? b->waits.sole_stream() : b->stream;
      info.stream = s == nullptr ? nullptr : s->handle();
      seg.blocks.push_back(info);
    }
    out.push_back(std::move(seg));
  }
}

}  // namespace gvm::detail
