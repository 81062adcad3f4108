// chunk_free_ends (bench/excess.hpp): the free ends of the arena's chunks that
// gvm-excess reports beside the growth that set a peak.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "excess.hpp"

namespace {

using gvm::BlockInfo;
using gvm::SegmentInfo;
using gvm::bench::chunk_free_ends;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;

BlockInfo block(std::size_t from_mib, std::size_t mib, bool allocated, bool small = false) {
  BlockInfo b;
  b.addr = kBase + from_mib * MiB;
  b.size = mib * MiB;
  b.allocated = allocated;
  b.requested = allocated ? b.size : 0;
  b.small = small;
  return b;
}

SegmentInfo segment(std::size_t mib, std::vector<BlockInfo> blocks) {
  SegmentInfo s;
  s.addr = kBase;
  s.size = mib * MiB;
  s.blocks = std::move(blocks);
  return s;
}

std::map<std::uintptr_t, std::size_t> chunks(std::initializer_list<std::size_t> sizes_mib) {
  std::map<std::uintptr_t, std::size_t> m;
  std::uintptr_t at = kBase;
  for (std::size_t s : sizes_mib) {
    m[at] = s * MiB;
    at += s * MiB;
  }
  return m;
}

TEST(ChunkFreeEnds, PairsOneChunksFreeEndWithAnothersFreeStart) {
  // Chunks of 8, 8, 4 and 4 MiB: the first ends in 5 free MiB, the second
  // starts with 2, the third holds nothing, the fourth a small-block span
  // (in use, free slots and all) between 1 free MiB and 2.
  const SegmentInfo s = segment(24, {block(0, 3, true), block(3, 7, false), block(10, 6, true),
                                     block(16, 5, false), block(21, 1, false, true),
                                     block(22, 2, false)});
  const auto r = chunk_free_ends({s}, chunks({8, 8, 4, 4}));
  EXPECT_EQ(r.largest_end, 5 * MiB);
  EXPECT_EQ(r.largest_start, 2 * MiB);
  EXPECT_EQ(r.best_pair, 7 * MiB);
  EXPECT_EQ(r.wholly_free, 4 * MiB);
}

TEST(ChunkFreeEnds, NeverPairsAChunkWithItself) {
  // The first chunk (32 MiB) has the largest free start (10) and end (20):
  // one handle mapped twice is not two, so its best partner is the second
  // chunk (free start 0, free end 7): 20 + 0 against 7 + 10.
  const SegmentInfo s =
      segment(40, {block(0, 10, false), block(10, 2, true), block(12, 20, false),
                   block(32, 1, true), block(33, 7, false)});
  const auto r = chunk_free_ends({s}, chunks({32, 8}));
  EXPECT_EQ(r.largest_end, 20 * MiB);
  EXPECT_EQ(r.largest_start, 10 * MiB);
  EXPECT_EQ(r.best_pair, 20 * MiB);
  EXPECT_EQ(r.wholly_free, 0u);
}

TEST(ChunkFreeEnds, ABlockAcrossChunksUsesEach) {
  // One live block over the seam of two 4 MiB chunks: the first's free end
  // and the second's free start are both 0; the free ends beyond count.
  const SegmentInfo s = segment(8, {block(0, 1, false), block(1, 6, true), block(7, 1, false)});
  const auto r = chunk_free_ends({s}, chunks({4, 4}));
  EXPECT_EQ(r.largest_start, 1 * MiB);
  EXPECT_EQ(r.largest_end, 1 * MiB);
  EXPECT_EQ(r.best_pair, 2 * MiB);
}

TEST(ChunkFreeEnds, LeavesTheScratchOut) {
  SegmentInfo scratch = segment(4, {block(0, 4, false)});
  scratch.scratch = true;
  const auto r = chunk_free_ends({scratch}, chunks({4}));
  EXPECT_EQ(r.wholly_free, 0u);
  EXPECT_EQ(r.best_pair, 0u);
}

}  // namespace
