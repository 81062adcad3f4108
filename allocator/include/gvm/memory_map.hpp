// What gvmalloc holds on a device, block by block: for memory snapshots
// (PyTorch's torch.cuda.memory._snapshot(), the memory_viz page) and for the
// fragmentation study (docs/design-notes.md). Built under the allocator's
// locks: never on a hot path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gvm/vmm/types.hpp"

namespace gvm {

struct BlockInfo {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // bytes the block occupies (rounded)
  std::size_t requested = 0;  // bytes the caller asked for (0 for free blocks)
  bool allocated = false;     // live (handed out) or free (cached)
  bool small = false;         // a slot (or free run of slots) of a small-block span
  // Allocation stream of a live block; for a free block the stream that last
  // used it (nullptr when none or several did).
  vmm::StreamHandle stream = nullptr;
};

// One contiguous range of memory backed by physical pages: with VMM a run of
// adjacent mapped chunks of one reservation, without VMM one cuMemAlloc
// segment. Its blocks tile [addr, addr + size) in address order.
struct SegmentInfo {
  int device = 0;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  bool scratch = false;    // the peer scratch buffer
  std::uint64_t pool = 0;  // 0: the device's default pool
  std::vector<BlockInfo> blocks;
};

}  // namespace gvm
