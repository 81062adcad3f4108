// SmallBlocks: the small-block front end of one stream's heap - O(1) size
// classes served from spans (span.hpp, size_classes.hpp).
//
// The hot path: pop a slot from the class's current span, push it back on
// free. No driver call, no allocation, nothing shared with other streams'
// heaps. Bookkeeping only, under the heap's lock; a span's granule comes
// from the heap's large arena, and an unused span goes back to it.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "size_classes.hpp"
#include "span.hpp"
#include "wait_set.hpp"

namespace gvm::detail {

class SmallBlocks {
 public:
  // A free slot of class `cls`, or 0 when no span of the class has one
  // (the heap then adds a span).
  std::uintptr_t pop(int cls) noexcept {
    Span* s = current_[static_cast<std::size_t>(cls)];
    if (s != nullptr && !s->full()) [[likely]]
      return s->pop();
    return pop_slow(cls);
  }
  // A span object for a new span (a recycled one where there is one: a span
  // object, once made, lives as long as the heap, so a stale pointer to it in
  // the page map can never reach freed memory - a late double free then finds
  // it covering another granule and is refused).
  Span* make_span(std::uintptr_t base, std::size_t slot, int cls, Heap* owner, Block* block,
                  std::size_t span_bytes = kGranule);
  // The span class `cls` hands slots out from (pop's last span).
  Span* current(int cls) const noexcept { return current_[static_cast<std::size_t>(cls)]; }
  // Bytes of every span of class `cls` (shared spans at their own size).
  std::size_t class_span_bytes(int cls) const noexcept {
    return class_bytes_[static_cast<std::size_t>(cls)];
  }
  // A span made by make_span becomes the class's current span.
  void add_span(Span* s);
  // Slot `idx` of `s` is free (its bit already cleared). Returns a span that
  // is now unused and not kept as the class's spare - its granule goes back
  // to the large arena (release_span) - or null.
  Span* pushed(Span* s) {
    if (s == current_[static_cast<std::size_t>(s->size_class)]) [[likely]]
      return nullptr;
    return pushed_slow(s);
  }
  // Takes s out of every list; its object goes to the graveyard (its block
  // is the caller's).
  void release_span(Span* s);
  // Every unused span (spares, current, partial): for trim and OOM.
  std::vector<Span*> unused_spans() const;
  // True while class `cls` has made fewer than `warmup` allocations through
  // the large arena (and counts this one): a cold class gets no span yet
  // (Config::span_warmup_allocations).
  bool cold(int cls, std::uint32_t warmup) noexcept {
    std::uint32_t& n = cold_allocations_[static_cast<std::size_t>(cls)];
    if (n >= warmup) return false;
    ++n;
    return true;
  }

  // Streams recorded on live slots (record_stream), by slot address; rare.
  std::unordered_map<std::uintptr_t, WaitSet>& recorded() noexcept { return recorded_; }
  const std::vector<std::unique_ptr<Span>>& spans() const noexcept { return spans_; }

 private:
  std::uintptr_t pop_slow(int cls) noexcept;
  Span* pushed_slow(Span* s);
  void partial_push(Span* s);
  void partial_remove(Span* s);

  std::array<Span*, kMaxClasses> current_{};  // span being handed out from
  std::array<Span*, kMaxClasses> partial_{};  // spans with free slots (list heads)
  std::array<Span*, kMaxClasses> spare_{};    // one unused span kept per class
  std::array<std::uint32_t, kMaxClasses> cold_allocations_{};  // served best fit while cold
  std::array<std::size_t, kMaxClasses> class_bytes_{};  // class_span_bytes
  std::unordered_map<std::uintptr_t, WaitSet> recorded_;
  std::vector<std::unique_ptr<Span>> spans_;  // every span of this heap
  std::vector<std::unique_ptr<Span>> graveyard_;  // released, for reuse
};

}  // namespace gvm::detail
