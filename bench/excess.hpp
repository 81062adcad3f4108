// Where the excess is: what the reserved bytes of a device hold at one moment,
// from Allocator::memory_map, the driver's mappings and the trace's live blocks.
//
// Every reserved byte of the arena falls in exactly one category (they add up
// to the reserved bytes; analyze_excess checks it):
//
//   live                 bytes the program asked for, in live blocks
//   rounding             a live block's size beyond its request (512 B for large
//                        blocks, the size class for small ones)
//   span_free            free slots (and the unusable tail) of small-block spans
//                        that also hold live slots
//   empty_spans          spans with no live slot, kept by a stream cache
//   hole_shared          free large-block bytes in granules that also hold live bytes
//   hole_granules_live   whole free granules of a hole, in a chunk that also holds
//                        live bytes: memory only granule-sized handles could unmap
//   free_chunks          granules of chunks that hold nothing live: what releasing
//                        cached chunks (release_cached, trim) returns today
//
// A granule is the driver's allocation granularity (2 MiB); a chunk is one
// mapped handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "gvm/memory_map.hpp"

namespace gvm::bench {

struct LiveRef {
  std::size_t requested = 0;  // what the trace asked for
  std::uint64_t stream = 0;   // the trace's stream number
};

// One maximal free run of large-block memory, clipped to a segment.
struct Hole {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t free_granule_bytes = 0;  // in granules with no live byte
  bool chunk_has_live = false;          // some chunk under it holds live bytes
  bool crosses_chunks = false;
  std::string stream;  // the trace stream that last used it, or "none/several"
};

// The small-block spans of one slot size that hold live slots.
struct SpanClass {
  std::size_t spans = 0;
  std::size_t live_slots = 0;
  std::size_t free_bytes = 0;  // free slots and the tail
};

struct ExcessBreakdown {
  std::size_t granule = 0;
  std::size_t reserved = 0;
  std::size_t live = 0;
  std::size_t rounding_large = 0;
  std::size_t rounding_small = 0;
  std::size_t span_free = 0;
  std::size_t empty_spans = 0;
  std::size_t hole_shared = 0;
  std::size_t hole_granules_live = 0;
  std::size_t free_chunks = 0;
  std::size_t chunks = 0;              // mapped chunks
  std::size_t chunks_wholly_free = 0;
  std::size_t live_blocks_small = 0;
  std::size_t live_blocks_large = 0;
  std::size_t live_bytes_small = 0;    // requested bytes of live small blocks
  std::vector<Hole> holes;             // address order
  std::map<std::size_t, SpanClass> span_classes;  // by slot size
  std::size_t excess() const noexcept { return reserved - live; }
};

// `segments`: memory_map of the device (scratch segments are left out);
// `mapped`: the driver's mapped ranges (MappingLogDriver); `live`: every live
// block by address; `stream_names`: trace stream number by handle (nullptr is
// trace stream 0). Throws std::logic_error when the pieces do not add up
// (a block the trace does not hold, categories that miss reserved bytes).
ExcessBreakdown analyze_excess(const std::vector<SegmentInfo>& segments,
                               const std::map<std::uintptr_t, std::size_t>& mapped,
                               const std::unordered_map<std::uintptr_t, LiveRef>& live,
                               const std::unordered_map<const void*, std::uint64_t>& stream_names,
                               std::size_t granule);

// The free ends of the arena's chunks: what a block could be made of if the
// handles of two chunks that hold live data were mapped whole a second time,
// side by side at a new address (the driver lets a whole handle stand at two
// addresses at once: docs/measurements.md, "Mapping part of a handle"). The
// free end of the first and the free start of the second then meet, and
// hold a block of their sum without a new byte. Not a policy gvmalloc has: a
// measure of what one would be worth (docs/design-notes.md, "Free chunk
// ends"). "In use" is a live block or a small-block span (its free slots
// included: the span holds its granule).
struct ChunkEnds {
  std::size_t best_pair = 0;      // one chunk's free end + another's free start, the largest
  std::size_t largest_end = 0;    // the largest free end of a chunk in use
  std::size_t largest_start = 0;  // the largest free start of a chunk in use
  std::size_t wholly_free = 0;    // bytes of chunks with nothing in use
};

// `segments` and `mapped` as for analyze_excess (scratch left out).
ChunkEnds chunk_free_ends(const std::vector<SegmentInfo>& segments,
                          const std::map<std::uintptr_t, std::size_t>& mapped);

}  // namespace gvm::bench
