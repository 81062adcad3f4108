// Block: one contiguous byte range of a region, allocated or free.
//
// The blocks of a region tile it exactly, chained by address (prev/next), so
// a freed block merges with free neighbours in O(1) - across chunk
// boundaries too, which is what one contiguous arena buys over PyTorch's
// separate segments. Free blocks also sit in the device's best-fit set.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gvm/vmm/types.hpp"

namespace gvm::detail {

struct Span;

// The streams whose work may still touch a block: taking it on another
// stream first makes that stream wait for each of these (an event recorded
// on it). A handful inline; past that, `all` means every stream of the device.
class StreamTags {
 public:
  static constexpr int kInline = 4;

  bool empty() const noexcept { return count_ == 0 && !all_; }
  bool all() const noexcept { return all_; }
  int size() const noexcept { return count_; }
  vmm::StreamHandle operator[](int i) const noexcept { return streams_[static_cast<std::size_t>(i)]; }

  void add(vmm::StreamHandle s) noexcept {
    if (all_) return;
    for (int i = 0; i < count_; ++i)
      if (streams_[static_cast<std::size_t>(i)] == s) return;
    if (count_ == kInline) {
      all_ = true;
      return;
    }
    streams_[static_cast<std::size_t>(count_++)] = s;
  }
  void merge(const StreamTags& o) noexcept {
    if (o.all_) all_ = true;
    for (int i = 0; i < o.count_; ++i) add(o[i]);
  }
  // True if only `s` (or nothing) may touch the block.
  bool only(vmm::StreamHandle s) const noexcept {
    return !all_ && (count_ == 0 || (count_ == 1 && streams_[0] == s));
  }
  void clear() noexcept {
    count_ = 0;
    all_ = false;
  }
  bool contains(vmm::StreamHandle s) const noexcept {
    for (int i = 0; i < count_; ++i)
      if (streams_[static_cast<std::size_t>(i)] == s) return true;
    return false;
  }
  // Free neighbours merge when one side's streams include the other's: one
  // side untouched, the same streams, or (a block used by a side stream and
  // freed on the main one, next to the main stream's memory) {main} beside
  // {main, side}. Merging two streams' memory that neither shares would make
  // every later taker wait for both (an event record and a stream wait each,
  // and a false dependency between the streams); the subset case adds at
  // most the waits the larger side already asks for, and without it the
  // memory of a prefetching side stream never coalesces with the main
  // stream's: 1.49 reserved/live on tools/synth_traces.py's side_stream
  // trace, 1.08 with it (docs/design-notes.md, "Fragmentation").
  friend bool mergeable(const StreamTags& a, const StreamTags& b) noexcept {
    if (a.empty() || b.empty()) return true;
    if (a.all_ || b.all_) return a.all_ && b.all_;
    auto within = [](const StreamTags& x, const StreamTags& y) {
      for (int i = 0; i < x.count_; ++i)
        if (!y.contains(x[i])) return false;
      return true;
    };
    return within(a, b) || within(b, a);
  }

 private:
  std::array<vmm::StreamHandle, kInline> streams_{};
  int count_ = 0;
  bool all_ = false;
};

struct Region;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Block* prev = nullptr;  // address neighbours within the region
  Block* next = nullptr;
  Block* page_next = nullptr;  // PageEntry::starts chain (allocated blocks)
  Region* region = nullptr;
  Span* span = nullptr;  // set when this block is a small-block span
  std::size_t requested = 0;  // bytes the caller asked for (allocated blocks)
  vmm::StreamHandle stream = nullptr;  // allocation stream (allocated blocks)
  StreamTags tags;  // free: streams to wait for; allocated: record_stream extras
  bool free = true;

  std::uintptr_t end() const noexcept { return addr + size; }
};

// Recycles Block objects: blocks come and go on every large allocation and
// the pool saves a heap allocation each time. Device lock.
class BlockPool {
 public:
  Block* make() {
    if (free_.empty()) {
      storage_.push_back(std::make_unique<Block[]>(kBatch));
      for (std::size_t i = 0; i < kBatch; ++i) free_.push_back(&storage_.back()[i]);
    }
    Block* b = free_.back();
    free_.pop_back();
    *b = Block{};
    return b;
  }
  void recycle(Block* b) { free_.push_back(b); }

 private:
  static constexpr std::size_t kBatch = 256;
  std::vector<std::unique_ptr<Block[]>> storage_;
  std::vector<Block*> free_;
};

// A contiguous virtual range served by the front end: the arena reservation
// (VMM) or one cuMemAlloc segment (no VMM). Its blocks tile it.
struct Region {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Block* first = nullptr;
  bool vmm = true;  // VMM: mapped on demand; classic: mapped as a whole
  std::size_t index = 0;  // position in the device's region list
};

}  // namespace gvm::detail
