// Block: one contiguous byte range of a region, allocated or free.
//
// The blocks of a region tile it exactly, chained by address (prev/next), so
// a freed block merges with free neighbours in O(1) - across chunk
// boundaries too, which is what one contiguous reservation buys over
// PyTorch's separate segments. Free blocks also sit in their arena's best-fit
// set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "gvm/vmm/owners.hpp"
#include "wait_set.hpp"

namespace gvm::detail {

struct Span;
struct Region;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Block* prev = nullptr;  // address neighbours within the region
  Block* next = nullptr;
  Block* page_next = nullptr;  // PageEntry::starts chain (allocated blocks)
  Region* region = nullptr;
  Span* span = nullptr;       // set when this block is a small-block span
  std::size_t requested = 0;  // bytes the caller asked for (allocated blocks)
  StreamState* stream = nullptr;  // allocation stream (allocated blocks)
  // Free: what a taker must wait for. Allocated: other streams that use it
  // (record_stream, peer copies), which become tokens when it is freed.
  WaitSet waits;
  bool free = true;
  // Allocated on behalf of the allocator itself: the range of a chunk being
  // released (never handed out, never freed by a caller).
  bool releasing = false;
  // Taken but not yet handed out: its growth (or its span) is under way,
  // with the heap's lock released. The checker allows what that may leave
  // half done.
  bool pending = false;
  // Free: its bin in the arena's FreeBins (free_bins.hpp).
  Block* bin_prev = nullptr;
  Block* bin_next = nullptr;
  int bin = 0;
  bool in_bins = false;

  std::uintptr_t end() const noexcept { return addr + size; }
};

// Recycles Block objects: blocks come and go on every large allocation and
// the pool saves a heap allocation each time. Under the owning heap's lock.
class BlockPool {
 public:
  Block* make() {
    if (free_.empty()) {
      storage_.push_back(std::make_unique<Block[]>(kBatch));
      for (std::size_t i = 0; i < kBatch; ++i) free_.push_back(&storage_.back()[i]);
    }
    Block* b = free_.back();
    free_.pop_back();
    // Built in place: assigning a temporary built it on the stack and
    // copied it (67 instructions a block in the mixed workload).
    static_assert(std::is_trivially_destructible_v<Block>);
    return std::construct_at(b);
  }
  void recycle(Block* b) { free_.push_back(b); }

 private:
  static constexpr std::size_t kBatch = 256;
  std::vector<std::unique_ptr<Block[]>> storage_;
  std::vector<Block*> free_;
};

// A contiguous virtual range of one heap: a VMM reservation (mapped on
// demand, chunk by chunk) or, without VMM, one cuMemAlloc segment (backed as
// a whole). Its blocks tile it.
struct Region {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Block* first = nullptr;
  std::size_t index = 0;     // position in the arena's region list
  vmm::ReservedRange va;     // VMM: the reservation
  vmm::DevicePtr segment = 0;  // no VMM: the cuMemAlloc segment
  std::uint32_t segment_chunk = 0;  // no VMM: 1 + the chunk that stands for the segment
};

}  // namespace gvm::detail
