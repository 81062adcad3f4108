#include "large_arena.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "span.hpp"

namespace gvm::detail {
namespace {

constexpr std::size_t round_up(std::size_t x, std::size_t a) noexcept { return (x + a - 1) / a * a; }

}  // namespace

LargeArena::LargeArena(vmm::Driver& driver, int device, PageMap& pages, Heap* owner,
                       bool on_demand)
    : driver_(driver), device_(device), pages_(pages), owner_(owner), on_demand_(on_demand) {}

LargeArena::~LargeArena() {
  for (auto& c : chunks_) {
    if (!c.in_use) continue;
    if (on_demand_)
      (void)c.mem.reset();
    else
      (void)driver_.mem_free(device_, c.segment->segment);
    set_granules(c.addr, c.size, 0, nullptr);
  }
  // VMM reservations go with regions_.
  chunks_.clear();
  free_.clear();
  regions_.clear();
}

// ---------------------------------------------------------------- regions --

Region& LargeArena::new_region(std::uintptr_t base, std::size_t size) {
  auto rec = std::make_unique<Region>();
  Region& r = *rec;
  r.base = base;
  r.size = size;
  Block* b = blocks_.make();
  b->addr = base;
  b->size = size;
  b->region = &r;
  b->free = true;
  r.first = b;
  free_.insert(b);
  r.index = regions_.size();
  regions_.push_back(std::move(rec));
  return r;
}

void LargeArena::add_region(vmm::ReservedRange va) {
  const std::uintptr_t base = va.base();
  const std::size_t size = va.size();
  Region& r = new_region(base, size);
  r.va = std::move(va);
}

void LargeArena::add_segment(vmm::DevicePtr base, std::size_t size) {
  Region& r = new_region(base, size);
  r.segment = base;
  const std::uint32_t idx = new_chunk_slot();
  ChunkRec& c = chunks_[idx];
  c.addr = base;
  c.size = size;
  c.in_use = true;
  c.live = 0;
  c.segment = &r;
  r.segment_chunk = idx + 1;
  set_granules(base, size, idx + 1, owner_);
  mapped_ += size;
  ++chunks_mapped_;
}

void LargeArena::remove_region(Region* r) {
  for (Block* b = r->first; b != nullptr;) {
    Block* next = b->next;
    if (b->free) free_.erase(b);
    blocks_.recycle(b);
    b = next;
  }
  auto it = std::find_if(regions_.begin(), regions_.end(),
                         [&](const auto& p) { return p.get() == r; });
  if (it != regions_.end()) regions_.erase(it);
  for (std::size_t i = 0; i < regions_.size(); ++i) regions_[i]->index = i;
}

std::size_t LargeArena::drop_unused_regions() {
  if (!on_demand_) return 0;
  std::size_t dropped = 0;
  for (std::size_t i = regions_.size(); i-- > 1;) {
    Region* r = regions_[i].get();
    if (!(r->first->free && r->first->next == nullptr)) continue;
    bool mapped = false;
    for (const auto& c : chunks_)
      if (c.in_use && c.addr - r->base < r->size) mapped = true;
    if (mapped) continue;
    remove_region(r);
    ++dropped;
  }
  return dropped;
}

// ----------------------------------------------------------------- blocks --

Block* LargeArena::find_fit(std::size_t size, std::size_t alignment, const StreamState* taker,
                            bool mapped_only) {
  Block probe;
  probe.size = size;
  probe.addr = 0;
  auto it = free_.lower_bound(&probe);
  auto own = [&](const Block* b) { return !b->waits.empty() && b->waits.only(taker); };
  auto fits = [&](const Block* b) {
    const std::uintptr_t a = round_up(b->addr, alignment);
    if (a + size > b->end()) return false;
    if (!mapped_only) return true;
    Block view;  // the part the taker would get
    view.addr = a;
    view.size = size;
    return fully_mapped(&view);
  };
  // Among the few best fits, one last used by `taker` alone wins. Untouched
  // blocks get no preference: they are mostly the unmapped rest of a region,
  // and a wait for another stream costs less than growing.
  constexpr int kLook = 8;
  Block* first = nullptr;
  const int limit = alignment > kGranule / 4 || mapped_only ? 64 : kLook;
  for (int scanned = 0; it != free_.end() && scanned < limit; ++it, ++scanned) {
    if (!fits(*it)) continue;
    if (own(*it)) return *it;
    if (first == nullptr) first = *it;
  }
  if (first != nullptr) return first;
  // Aligned requests (spans) that found nothing among the best fits try the
  // largest block, which is mostly the unmapped rest of a region.
  if (alignment > kGranule / 4 && !mapped_only && !free_.empty() && fits(*free_.rbegin()))
    return *free_.rbegin();
  return nullptr;
}

Block* LargeArena::split_after(Block* x, std::size_t keep) {
  Block* n = blocks_.make();
  n->addr = x->addr + keep;
  n->size = x->size - keep;
  n->region = x->region;
  n->free = true;
  n->waits = x->waits;
  n->prev = x;
  n->next = x->next;
  if (x->next != nullptr) x->next->prev = n;
  x->next = n;
  x->size = keep;
  return n;
}

Block* LargeArena::split_to(Block* b, std::uintptr_t at, std::size_t size) {
  if (at > b->addr) {
    Block* rest = split_after(b, at - b->addr);
    free_.insert(b);  // the head stays free
    b = rest;
  }
  if (b->size > size) free_.insert(split_after(b, size));
  return b;
}

Block* LargeArena::take(std::size_t size, std::size_t alignment, const StreamState* taker,
                        bool mapped_only) {
  Block* b = find_fit(size, alignment, taker, mapped_only);
  if (b == nullptr) return nullptr;
  free_.erase(b);
  b = split_to(b, round_up(b->addr, alignment), size);
  b->free = false;
  b->releasing = false;
  b->pending = true;
  b->span = nullptr;
  b->requested = size;
  // Memory that is not mapped has no work pending on it (every unmap is
  // behind the fence): a block carved from the unmapped part of a free
  // block needs no wait, whatever streams merged into that free block.
  if (unmapped(b)) b->waits.clear();
  return b;
}

void LargeArena::give_back(Block* b) {
  b->free = true;
  b->releasing = false;
  b->pending = false;
  b->span = nullptr;
  b->stream = nullptr;
  if (Block* n = b->next; n != nullptr && n->free && mergeable(b->waits, n->waits)) {
    free_.erase(n);
    b->size += n->size;
    b->waits.merge(n->waits);
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    blocks_.recycle(n);
  }
  if (Block* p = b->prev; p != nullptr && p->free && mergeable(p->waits, b->waits)) {
    free_.erase(p);
    p->size += b->size;
    p->waits.merge(b->waits);
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    blocks_.recycle(b);
    b = p;
  }
  free_.insert(b);
}

std::size_t LargeArena::largest_mapped_free() const {
  for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
    const Block* b = *it;
    if (fully_mapped(b)) return b->size;
    // A partly mapped free block: its largest mapped stretch.
    std::size_t best = 0, cur = 0;
    for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end(); g += kGranule) {
      const PageEntry* e = pages_.find(g);
      if (e != nullptr && e->chunk != 0) {
        cur += kGranule;
        best = std::max(best, cur);
      } else {
        cur = 0;
      }
    }
    if (best != 0) return std::min(best, b->size);
  }
  return 0;
}

void LargeArena::link_start(Block* b) {
  PageEntry& e = pages_.at(b->addr);
  b->page_next = e.starts;
  e.starts = b;
}

void LargeArena::unlink_start(Block* b) {
  PageEntry& e = pages_.at(b->addr);
  for (Block** p = &e.starts; *p != nullptr; p = &(*p)->page_next) {
    if (*p == b) {
      *p = b->page_next;
      b->page_next = nullptr;
      return;
    }
  }
}

Block* LargeArena::find_start(std::uintptr_t addr) const {
  const PageEntry* e = pages_.find(addr);
  if (e == nullptr) return nullptr;
  for (Block* b = e->starts; b != nullptr; b = b->page_next)
    if (b->addr == addr) return b;
  return nullptr;
}

const Block* LargeArena::live_block_holding(std::uintptr_t addr, std::size_t bytes) const {
  // A walk of the region's blocks: for peer_copy, record_stream of a peer's
  // stream and memory_map (the heaps that get these hold few blocks), never
  // the allocation path.
  for (const auto& r : regions_) {
    if (addr - r->base >= r->size) continue;
    for (const Block* b = r->first; b != nullptr; b = b->next)
      if (!b->free && !b->releasing && addr >= b->addr && addr < b->end() &&
          bytes <= b->end() - addr)
        return b;
  }
  return nullptr;
}

bool LargeArena::holds(std::uintptr_t addr) const noexcept {
  for (const auto& r : regions_)
    if (addr - r->base < r->size) return true;
  return false;
}

bool LargeArena::unmapped(const Block* b) const {
  if (!on_demand_) return false;
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end();) {
    const PageEntry* e = pages_.find(g);
    if (e != nullptr && e->chunk != 0) return false;
    g += kGranule;
  }
  return true;
}

bool LargeArena::fully_mapped(const Block* b) const {
  if (!on_demand_) return true;
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end();) {
    const PageEntry* e = pages_.find(g);
    const std::uint32_t c = e == nullptr ? 0 : e->chunk;
    if (c == 0) return false;
    g = chunks_[c - 1].addr + chunks_[c - 1].size;  // hop over the chunk
  }
  return true;
}

std::vector<Run> LargeArena::unmapped_runs(const Block* b) const {
  std::vector<Run> runs;
  if (!on_demand_) return runs;
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end();) {
    const PageEntry* e = pages_.find(g);
    if (const std::uint32_t c = e == nullptr ? 0 : e->chunk; c != 0) {
      g = chunks_[c - 1].addr + chunks_[c - 1].size;
      continue;
    }
    if (!runs.empty() && runs.back().first + runs.back().second == g)
      runs.back().second += kGranule;
    else
      runs.emplace_back(g, kGranule);
    g += kGranule;
  }
  return runs;
}

void LargeArena::commit(const Block* b) {
  for_each_chunk(b, [&](std::uint32_t c) { ++chunks_[c].live; });
}

void LargeArena::uncommit(const Block* b) {
  for_each_chunk(b, [&](std::uint32_t c) { --chunks_[c].live; });
}

void LargeArena::commit(const Block* b, std::vector<std::uint32_t>& counted) {
  for_each_chunk(b, [&](std::uint32_t c) {
    ++chunks_[c].live;
    counted.push_back(c);
  });
}

void LargeArena::uncommit(const std::vector<std::uint32_t>& counted) {
  for (std::uint32_t c : counted) --chunks_[c].live;
}

// ----------------------------------------------------------------- chunks --

std::uint32_t LargeArena::new_chunk_slot() {
  if (!free_chunk_slots_.empty()) {
    const std::uint32_t idx = free_chunk_slots_.back();
    free_chunk_slots_.pop_back();
    return idx;
  }
  chunks_.emplace_back();
  return static_cast<std::uint32_t>(chunks_.size() - 1);
}

void LargeArena::set_granules(std::uintptr_t addr, std::size_t size, std::uint32_t chunk_plus_1,
                              Heap* owner) {
  for (std::uintptr_t g = addr; g < addr + size; g += kGranule) {
    PageEntry& e = pages_.at(g);
    e.chunk = chunk_plus_1;
    e.owner.store(owner, std::memory_order_release);
  }
}

std::uint32_t LargeArena::install_chunk(vmm::MappedChunk mem, std::uint32_t live) {
  const std::uint32_t idx = new_chunk_slot();
  ChunkRec& c = chunks_[idx];
  c.addr = mem.addr();
  c.size = mem.size();
  c.mem = std::move(mem);
  c.in_use = true;
  c.releasing = false;
  c.live = live;
  set_granules(c.addr, c.size, idx + 1, owner_);
  mapped_ += c.size;
  ++chunks_mapped_;
  return idx;
}

std::vector<Run> LargeArena::chunk_ranges() const {
  std::vector<Run> out;
  for (const auto& c : chunks_)
    if (c.in_use) out.emplace_back(c.addr, c.size);
  return out;
}

std::vector<std::uint32_t> LargeArena::cached_chunks() const {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < chunks_.size(); ++i)
    if (chunks_[i].in_use && !chunks_[i].releasing && chunks_[i].live == 0) out.push_back(i);
  // Largest first: fewest driver calls for the bytes wanted.
  std::sort(out.begin(), out.end(),
            [&](std::uint32_t a, std::uint32_t b) { return chunks_[a].size > chunks_[b].size; });
  return out;
}

std::size_t LargeArena::cached_bytes() const {
  std::size_t n = 0;
  for (const auto& c : chunks_)
    if (c.in_use && !c.releasing && c.live == 0) n += c.size;
  return n;
}

WaitSet LargeArena::begin_release(std::uint32_t idx, Release* out) {
  ChunkRec& c = chunks_[idx];
  c.releasing = true;
  out->chunk = idx;
  out->size = c.size;
  out->mem = std::move(c.mem);
  out->segment = c.segment != nullptr ? c.segment->segment : 0;
  WaitSet waits;
  const std::uintptr_t lo = c.addr, hi = c.addr + c.size;
  // The chunk is wholly free: free blocks cover it. Cut each at the chunk's
  // edges and take the pieces inside out of the free set.
  Region* r = c.segment;
  if (r == nullptr) {
    for (const auto& reg : regions_)
      if (lo - reg->base < reg->size) r = reg.get();
  }
  if (r == nullptr) return waits;
  Block* b = r->first;
  while (b != nullptr && b->end() <= lo) b = b->next;
  while (b != nullptr && b->addr < hi) {
    Block* next = b->next;
    if (b->free) {
      free_.erase(b);
      if (b->addr < lo) {
        Block* rest = split_after(b, lo - b->addr);
        free_.insert(b);
        b = rest;
      }
      if (b->end() > hi) free_.insert(split_after(b, hi - b->addr));
      next = b->next;
      waits.merge(b->waits);
      b->free = false;
      b->releasing = true;
    }
    b = next;
  }
  return waits;
}

vmm::Result LargeArena::drop(Release& r) noexcept {
  if (on_demand_) {
    const vmm::Result res = r.mem.reset();
    // A cuMemRelease that fails after the cuMemUnmap went through leaves the
    // range unmapped all the same: it counts as dropped (the fault sweep's
    // trim / cuMemRelease case), or the next block served from it faults.
    return res != vmm::Result::success && r.mem.empty() ? vmm::Result::success : res;
  }
  return driver_.mem_free(device_, r.segment);
}

void LargeArena::end_release(Release& rel, bool dropped) {
  const std::uint32_t idx = rel.chunk;
  ChunkRec& c = chunks_[idx];
  const std::uintptr_t lo = c.addr, hi = c.addr + c.size;
  if (!dropped) {
    c.mem = std::move(rel.mem);
    c.releasing = false;
  } else {
    set_granules(lo, c.size, 0, nullptr);
    mapped_ -= c.size;
    ++chunks_unmapped_;
  }
  if (dropped && !on_demand_) {
    // The segment is gone, and the region it was with it.
    Region* r = c.segment;
    c = ChunkRec{};
    free_chunk_slots_.push_back(idx);
    remove_region(r);
    return;
  }
  if (dropped) {
    c = ChunkRec{};
    free_chunk_slots_.push_back(idx);
  }
  // The pieces go back: unmapped memory waits for nothing.
  Region* r = nullptr;
  for (const auto& reg : regions_)
    if (lo - reg->base < reg->size) r = reg.get();
  if (r == nullptr) return;
  std::vector<Block*> pieces;
  for (Block* b = r->first; b != nullptr && b->addr < hi; b = b->next)
    if (b->releasing && b->addr >= lo) pieces.push_back(b);
  for (Block* b : pieces) {
    if (dropped) b->waits.clear();
    give_back(b);
  }
}

// ------------------------------------------------------------- invariants --

bool LargeArena::check(std::string* why, std::size_t* large_live, std::size_t* spans) const {
  auto fail = [&](const std::string& msg) {
    if (why != nullptr) *why = msg;
    return false;
  };
  std::size_t free_blocks = 0;
  *large_live = 0;
  *spans = 0;
  std::unordered_map<std::uint32_t, std::uint32_t> expected_live;
  std::unordered_map<std::uint32_t, bool> in_flight;  // chunks under a pending block
  for (const auto& rec : regions_) {
    const Region& r = *rec;
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
        if (prev != nullptr && prev->free && mergeable(prev->waits, b->waits))
          return fail("two free neighbours were not merged");
        if (free_.find(const_cast<Block*>(b)) == free_.end())
          return fail("free block not in the free set");
        continue;
      }
      if (b->releasing) continue;  // a release under way: its chunk is checked below
      if (b->pending) {
        // A growth or a span under way with the lock released: counted on
        // some of its chunks, linked nowhere yet.
        for_each_chunk(b, [&](std::uint32_t c) { in_flight[c] = true; });
        continue;
      }
      for_each_chunk(b, [&](std::uint32_t c) { ++expected_live[c]; });
      if (b->span == nullptr) {
        *large_live += b->size;
        if (find_start(b->addr) != b) return fail("live block not found by its address");
      } else {
        ++*spans;
        const PageEntry* e = pages_.find(b->addr);
        if (e == nullptr || e->span.load() != b->span) return fail("span not in the page map");
      }
      if (on_demand_) {
        for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end(); g += kGranule) {
          const PageEntry* e = pages_.find(g);
          if (e == nullptr || e->chunk == 0) return fail("live block over an unmapped granule");
          if (e->owner.load() != owner_) return fail("live block's granule names another heap");
        }
      }
    }
    if (at != r.base + r.size) return fail("blocks do not cover the region");
  }
  if (free_blocks != free_.size()) return fail("free set holds blocks that are not free");
  std::size_t mapped = 0;
  for (std::uint32_t i = 0; i < chunks_.size(); ++i) {
    const ChunkRec& c = chunks_[i];
    if (!c.in_use) continue;
    mapped += c.size;
    for (std::uintptr_t g = c.addr; g < c.addr + c.size; g += kGranule) {
      const PageEntry* e = pages_.find(g);
      if (e == nullptr || e->chunk != i + 1) return fail("chunk granule not marked in the page map");
    }
    if (c.releasing) continue;
    auto it = expected_live.find(i);
    const std::uint32_t expected = it == expected_live.end() ? 0 : it->second;
    if (in_flight.count(i) != 0 ? c.live < expected : c.live != expected)
      return fail("chunk live count is wrong");
  }
  for (const auto& [c, n] : expected_live)
    if (c >= chunks_.size() || !chunks_[c].in_use) return fail("a live block over a chunk that is gone");
  if (mapped != mapped_) return fail("mapped bytes disagree with the chunks");
  return true;
}

}  // namespace gvm::detail
