#include "excess.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <unordered_set>

namespace gvm::bench {
namespace {

std::string hex(std::uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

struct ChunkRef {
  std::uintptr_t addr;
  std::size_t size;
  bool has_live = false;
};

// The chunk holding addr (chunks sorted by address), or nullptr.
ChunkRef* chunk_at(std::vector<ChunkRef>& chunks, std::uintptr_t addr) {
  auto it = std::upper_bound(chunks.begin(), chunks.end(), addr,
                             [](std::uintptr_t a, const ChunkRef& c) { return a < c.addr; });
  if (it == chunks.begin()) return nullptr;
  --it;
  return addr - it->addr < it->size ? &*it : nullptr;
}

// The driver's mappings inside the arena's (not the scratch's) segments, in
// address order.
std::vector<ChunkRef> arena_chunks(const std::vector<SegmentInfo>& segments,
                                   const std::map<std::uintptr_t, std::size_t>& mapped) {
  std::vector<ChunkRef> chunks;
  for (const auto& [addr, size] : mapped) {
    const bool in_arena = std::any_of(segments.begin(), segments.end(), [&](const SegmentInfo& s) {
      return !s.scratch && addr - s.addr < s.size;
    });
    if (in_arena) chunks.push_back(ChunkRef{addr, size});
  }
  return chunks;
}

}  // namespace

ExcessBreakdown analyze_excess(const std::vector<SegmentInfo>& segments,
                               const std::map<std::uintptr_t, std::size_t>& mapped,
                               const std::unordered_map<std::uintptr_t, LiveRef>& live,
                               const std::unordered_map<const void*, std::uint64_t>& stream_names,
                               std::size_t granule) {
  if (granule == 0 || (granule & (granule - 1)) != 0)
    throw std::logic_error("analyze_excess: granule must be a power of two");
  ExcessBreakdown r;
  r.granule = granule;
  const std::uintptr_t mask = ~static_cast<std::uintptr_t>(granule - 1);

  std::vector<const SegmentInfo*> arena;
  for (const SegmentInfo& s : segments)
    if (!s.scratch) arena.push_back(&s);
  std::vector<ChunkRef> chunks = arena_chunks(segments, mapped);

  // Pass 1: which granules and chunks hold live bytes.
  std::unordered_set<std::uintptr_t> live_granules;
  for (const SegmentInfo* s : arena) {
    r.reserved += s->size;
    for (const BlockInfo& b : s->blocks) {
      if (!b.allocated) continue;
      for (std::uintptr_t g = b.addr & mask; g < b.addr + b.size; g += granule) {
        live_granules.insert(g);
        if (ChunkRef* c = chunk_at(chunks, g)) c->has_live = true;
      }
    }
  }
  std::size_t chunk_bytes = 0;
  for (const ChunkRef& c : chunks) chunk_bytes += c.size;
  if (chunk_bytes != r.reserved)
    throw std::logic_error("analyze_excess: the driver maps " + std::to_string(chunk_bytes) +
                           " bytes in the arena, the memory map shows " +
                           std::to_string(r.reserved));
  r.chunks = chunks.size();
  for (const ChunkRef& c : chunks) r.chunks_wholly_free += c.has_live ? 0 : 1;

  auto stream_name = [&](vmm::StreamHandle h) -> std::string {
    if (h == nullptr) return "0 / none / several";
    auto it = stream_names.find(h);
    return it == stream_names.end() ? "unknown" : std::to_string(it->second);
  };

  // Spans in use, by granule: their slot size (from a live slot) and free bytes.
  struct SpanUse {
    std::size_t slot = 0, live_slots = 0, free_bytes = 0;
  };
  std::map<std::uintptr_t, SpanUse> spans;

  // Pass 2: every block into its category.
  for (const SegmentInfo* s : arena) {
    for (const BlockInfo& b : s->blocks) {
      if (b.allocated) {
        auto it = live.find(b.addr);
        if (it == live.end())
          throw std::logic_error("analyze_excess: live block at " + hex(b.addr) +
                                 " is not one the trace holds");
        const std::size_t req = it->second.requested;
        if (req > b.size)
          throw std::logic_error("analyze_excess: block at " + hex(b.addr) + " of " +
                                 std::to_string(b.size) + " bytes holds a request of " +
                                 std::to_string(req));
        r.live += req;
        if (b.small) {
          SpanUse& u = spans[b.addr & mask];
          u.slot = b.size;
          ++u.live_slots;
          r.rounding_small += b.size - req;
          ++r.live_blocks_small;
          r.live_bytes_small += req;
        } else {
          r.rounding_large += b.size - req;
          ++r.live_blocks_large;
        }
        continue;
      }
      if (b.small) {
        if (live_granules.count(b.addr & mask)) {
          r.span_free += b.size;
          spans[b.addr & mask].free_bytes += b.size;
        } else {
          r.empty_spans += b.size;
        }
        continue;
      }
      Hole h;
      h.addr = b.addr;
      h.size = b.size;
      h.stream = stream_name(b.stream);
      const ChunkRef* first = chunk_at(chunks, b.addr);
      const ChunkRef* last = chunk_at(chunks, b.addr + b.size - 1);
      h.crosses_chunks = first != last;
      for (std::uintptr_t g = b.addr & mask; g < b.addr + b.size; g += granule) {
        const std::uintptr_t lo = std::max<std::uintptr_t>(g, b.addr);
        const std::uintptr_t hi = std::min<std::uintptr_t>(g + granule, b.addr + b.size);
        const std::size_t piece = hi - lo;
        const ChunkRef* c = chunk_at(chunks, lo);
        const bool chunk_live = c != nullptr && c->has_live;
        h.chunk_has_live = h.chunk_has_live || chunk_live;
        if (live_granules.count(g)) {
          r.hole_shared += piece;
        } else {
          h.free_granule_bytes += piece;
          (chunk_live ? r.hole_granules_live : r.free_chunks) += piece;
        }
      }
      r.holes.push_back(h);
    }
  }
  for (const auto& [granule_addr, u] : spans) {
    SpanClass& c = r.span_classes[u.slot];
    ++c.spans;
    c.live_slots += u.live_slots;
    c.free_bytes += u.free_bytes;
  }
  const std::size_t sum = r.live + r.rounding_large + r.rounding_small + r.span_free +
                          r.empty_spans + r.hole_shared + r.hole_granules_live + r.free_chunks;
  if (sum != r.reserved)
    throw std::logic_error("analyze_excess: categories add up to " + std::to_string(sum) +
                           " bytes, reserved is " + std::to_string(r.reserved));
  return r;
}

ChunkEnds chunk_free_ends(const std::vector<SegmentInfo>& segments,
                          const std::map<std::uintptr_t, std::size_t>& mapped) {
  const std::vector<ChunkRef> chunks = arena_chunks(segments, mapped);
  // The first and last byte in use of each chunk (lo > hi: nothing in use).
  std::vector<std::uintptr_t> lo, hi;
  for (const ChunkRef& c : chunks) {
    lo.push_back(c.addr + c.size);
    hi.push_back(c.addr);
  }
  auto index_at = [&](std::uintptr_t a) -> std::size_t {
    auto it = std::upper_bound(chunks.begin(), chunks.end(), a,
                               [](std::uintptr_t x, const ChunkRef& c) { return x < c.addr; });
    return static_cast<std::size_t>(it - chunks.begin());  // one past the chunk at or below a
  };
  for (const SegmentInfo& s : segments) {
    if (s.scratch) continue;
    for (const BlockInfo& b : s.blocks) {
      if (!b.allocated && !b.small) continue;
      // Every chunk the block overlaps: from the one holding its start on.
      std::size_t i = index_at(b.addr);
      i = i == 0 ? 0 : i - 1;
      for (; i < chunks.size() && chunks[i].addr < b.addr + b.size; ++i) {
        const ChunkRef& c = chunks[i];
        if (c.addr + c.size <= b.addr) continue;
        lo[i] = std::min(lo[i], std::max(b.addr, c.addr));
        hi[i] = std::max(hi[i], std::min(b.addr + b.size, c.addr + c.size));
      }
    }
  }
  ChunkEnds r;
  // The two largest free ends and starts, with their chunks: the best pair
  // takes them from two different chunks.
  struct Top {
    std::size_t bytes = 0;
    std::size_t chunk = SIZE_MAX;
  };
  Top end1, end2, start1, start2;
  auto keep = [](Top& first, Top& second, std::size_t bytes, std::size_t chunk) {
    if (bytes > first.bytes || first.chunk == SIZE_MAX) {
      second = first;
      first = Top{bytes, chunk};
    } else if (bytes > second.bytes || second.chunk == SIZE_MAX) {
      second = Top{bytes, chunk};
    }
  };
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const ChunkRef& c = chunks[i];
    if (lo[i] > hi[i]) {
      r.wholly_free += c.size;
      continue;
    }
    keep(end1, end2, c.addr + c.size - hi[i], i);
    keep(start1, start2, lo[i] - c.addr, i);
  }
  r.largest_end = end1.bytes;
  r.largest_start = start1.bytes;
  for (const Top& e : {end1, end2})
    for (const Top& st : {start1, start2})
      if (e.chunk != SIZE_MAX && st.chunk != SIZE_MAX && e.chunk != st.chunk)
        r.best_pair = std::max(r.best_pair, e.bytes + st.bytes);
  return r;
}

}  // namespace gvm::bench
