// Span: one granule (2 MiB) cut into equal slots of one size class, owned by
// one heap's small-block front end. Slots are handed out from a stack of free indices; a
// bitmap of allocated slots catches double and foreign frees.
//
// A shared span is smaller: one slot (kSharedSpanBytes) of a span of that
// slot size - its host - cut into slots of a small class, so that a class
// of a few dozen live blocks holds 256 KiB instead of a granule, and up to
// eight such classes share one granule with the host's own slots. The page
// map names the host; a host's children are found from it by the slot
// index (child_at), one more load on the free path.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "page_map.hpp"
#include "size_classes.hpp"

namespace gvm::detail {

struct Block;
class Heap;

// The size of a shared span: a slot of its host, a power of two so that a
// free finds the child by a shift. Classes of at most kSharedSlotMax bytes
// (eight slots or more) get shared spans.
inline constexpr int kSharedSpanShift = 18;
inline constexpr std::size_t kSharedSpanBytes = std::size_t{1} << kSharedSpanShift;
inline constexpr std::size_t kSharedSlotMax = kSharedSpanBytes / 8;
inline constexpr std::size_t kHostSlots = kGranule / kSharedSpanBytes;
// The class whose spans host shared spans (their slots are kSharedSpanBytes).
inline constexpr int kHostClass = size_class_of(kSharedSpanBytes);
static_assert(class_size(kHostClass) == kSharedSpanBytes);

struct Span {
  std::uintptr_t base = 0;
  std::size_t bytes = 0;  // kGranule, or kSharedSpanBytes for a shared span
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
  Block* block = nullptr;  // the large block this span occupies (a shared span: none)
  Span* host = nullptr;    // a shared span: the span whose slot it is
  std::uint32_t host_slot = 0;
  // Set once a slot of this span holds a shared span (then children names
  // it by slot index). Read without a lock by the free path: a span object
  // is never freed while its heap lives (SmallBlocks::make_span), so a stale
  // read finds no child, or one that does not contain the address, and the
  // free goes the slow way, which looks again under the lock.
  std::atomic<bool> hosts{false};
  std::array<std::atomic<Span*>, kHostSlots> children{};
  bool in_partial = false;  // on the owner's partial list
  Span* partial_next = nullptr;
  Span* partial_prev = nullptr;
  std::unique_ptr<std::uint32_t[]> free_stack;
  std::vector<std::uint64_t> allocated;  // bitmap

  Span(std::uintptr_t b, std::size_t slot, int cls, Heap* own, Block* blk,
       std::size_t span_bytes = kGranule) {
    init(b, slot, cls, own, blk, span_bytes);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // (Re)makes the span: a recycled object is initialised in place, its
  // atomics included (readers may still hold a pointer to it).
  void init(std::uintptr_t b, std::size_t slot, int cls, Heap* own, Block* blk,
            std::size_t span_bytes = kGranule) {
    base = b;
    bytes = span_bytes;
    slot_size = slot;
    min_request = gvm::detail::min_request(cls);
    request_range = slot - min_request;
    slot_reciprocal = ((std::uint64_t{1} << 42) + slot - 1) / slot;
    slots = static_cast<std::uint32_t>(span_bytes / slot);
    free_count = slots;
    pending = 0;
    in_flight = false;
    size_class = cls;
    owner = own;
    arena_heap = own;
    block = blk;
    host = nullptr;
    host_slot = 0;
    hosts.store(false, std::memory_order_relaxed);
    for (auto& c : children) c.store(nullptr, std::memory_order_relaxed);
    in_partial = false;
    partial_next = partial_prev = nullptr;
    free_stack.reset(new std::uint32_t[slots]);
    allocated.assign((slots + 63) / 64, 0);
    // Hand out low addresses first (pop from the back).
    for (std::uint32_t i = 0; i < slots; ++i) free_stack[i] = slots - 1 - i;
  }

  bool contains(std::uintptr_t p) const noexcept { return p - base < bytes; }
  // The shared span in whose host slot p lies, or null (none, or p outside
  // this span).
  Span* child_at(std::uintptr_t p) const noexcept {
    const std::uintptr_t off = p - base;
    if (off >= bytes) return nullptr;
    return children[off >> kSharedSpanShift].load(std::memory_order_acquire);
  }
  // The span that holds p, starting from the page map's span of p's granule.
  Span* holding(std::uintptr_t p) noexcept {
    if (hosts.load(std::memory_order_acquire)) [[unlikely]]
      if (Span* c = child_at(p); c != nullptr) return c;
    return this;
  }
  // The slot index of offset `off` (< bytes) if a slot starts there, else
  // slots (no slot).
  std::uint32_t slot_at(std::uintptr_t off) const noexcept {
    const auto i = static_cast<std::uint32_t>((off * slot_reciprocal) >> 42);
    return static_cast<std::uintptr_t>(i) * slot_size == off && i < slots ? i : slots;
  }
  // `request` (a free's size; kUnknownSize: not given) names this class.
  bool fits(std::size_t request) const noexcept {
    return request - min_request <= request_range || request == static_cast<std::size_t>(-1);
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

// The span holding p from p's page-map entry (its granule's span or a shared
// span in one of its slots), or null. Lock-free; see Span::hosts.
inline Span* span_holding(const PageEntry& e, std::uintptr_t p) noexcept {
  Span* s = e.span.load(std::memory_order_acquire);
  if (s == nullptr) return nullptr;
  s = s->holding(p);
  return s->contains(p) ? s : nullptr;
}

}  // namespace gvm::detail
