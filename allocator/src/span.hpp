// Span: one granule (2 MiB) cut into equal slots of one size class, owned by
// one heap's small-block front end. Slots are handed out from a stack of free indices; a
// bitmap of allocated slots catches double and foreign frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "page_map.hpp"
#include "size_classes.hpp"

namespace gvm::detail {

struct Block;
class Heap;

struct Span {
  std::uintptr_t base = 0;
  std::size_t slot_size = 0;
  // The smallest request of the span's class, so that a free's size is
  // checked with one unsigned compare (fits).
  std::size_t min_request = 0;
  std::size_t request_range = 0;  // slot_size - min_request
  // off / slot_size as a multiply and a shift for every off within the
  // granule (exact: off < 2^21, slot_size < 2^21, 42-bit reciprocal): the
  // free path's division costs tens of cycles, the multiply a few.
  std::uint64_t slot_reciprocal = 0;
  std::uint32_t slots = 0;
  std::uint32_t free_count = 0;  // entries in free_stack
  std::uint32_t pending = 0;     // freed, waiting to join free_stack (push_cleared)
  bool in_flight = false;        // a borrowed span not yet in its front end's lists
  int size_class = 0;
  Heap* owner = nullptr;       // the heap whose stream allocates from it
  Heap* arena_heap = nullptr;  // the heap whose arena holds its granule (a lent one: another)
  Block* block = nullptr;  // the large block this span occupies
  bool in_partial = false;  // on the owner's partial list
  Span* partial_next = nullptr;
  Span* partial_prev = nullptr;
  std::unique_ptr<std::uint32_t[]> free_stack;
  std::vector<std::uint64_t> allocated;  // bitmap

  Span(std::uintptr_t b, std::size_t slot, int cls, Heap* own, Block* blk)
      : base(b),
        slot_size(slot),
        min_request(gvm::detail::min_request(cls)),
        request_range(slot - gvm::detail::min_request(cls)),
        slot_reciprocal(((std::uint64_t{1} << 42) + slot - 1) / slot),
        slots(static_cast<std::uint32_t>(kGranule / slot)),
        free_count(slots),
        size_class(cls),
        owner(own),
        arena_heap(own),
        block(blk),
        free_stack(new std::uint32_t[slots]),
        allocated((slots + 63) / 64, 0) {
    // Hand out low addresses first (pop from the back).
    for (std::uint32_t i = 0; i < slots; ++i) free_stack[i] = slots - 1 - i;
  }

  bool contains(std::uintptr_t p) const noexcept { return p - base < kGranule; }
  // The slot index of offset `off` (< kGranule) if a slot starts there, else
  // slots (no slot).
  std::uint32_t slot_at(std::uintptr_t off) const noexcept {
    const auto i = static_cast<std::uint32_t>((off * slot_reciprocal) >> 42);
    return static_cast<std::uintptr_t>(i) * slot_size == off && i < slots ? i : slots;
  }
  // `bytes` (a free's size; kUnknownSize: not given) names this class.
  bool fits(std::size_t bytes) const noexcept {
    return bytes - min_request <= request_range || bytes == static_cast<std::size_t>(-1);
  }
  bool full() const noexcept { return free_count == 0; }
  bool unused() const noexcept { return free_count == slots; }
  bool is_allocated(std::uint32_t i) const noexcept { return (allocated[i >> 6] >> (i & 63)) & 1; }

  std::uintptr_t pop() noexcept {
    const std::uint32_t i = free_stack[--free_count];
    allocated[i >> 6] |= std::uint64_t{1} << (i & 63);
    return base + static_cast<std::uintptr_t>(i) * slot_size;
  }
  void push(std::uint32_t i) noexcept {
    allocated[i >> 6] &= ~(std::uint64_t{1} << (i & 63));
    free_stack[free_count++] = i;
  }
  // A free in two steps, for a slot whose reuse must wait for another
  // stream: the bit goes first (a second free of it is refused), the slot
  // joins the free stack once the wait is queued.
  void clear_allocated(std::uint32_t i) noexcept {
    allocated[i >> 6] &= ~(std::uint64_t{1} << (i & 63));
    ++pending;
  }
  void push_cleared(std::uint32_t i) noexcept {
    free_stack[free_count++] = i;
    --pending;
  }
};

}  // namespace gvm::detail
