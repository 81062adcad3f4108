#include "small_blocks.hpp"

#include <algorithm>

namespace gvm::detail {

void SmallBlocks::partial_push(Span* s) {
  const auto c = static_cast<std::size_t>(s->size_class);
  s->partial_prev = nullptr;
  s->partial_next = partial_[c];
  if (s->partial_next != nullptr) s->partial_next->partial_prev = s;
  partial_[c] = s;
  s->in_partial = true;
}

void SmallBlocks::partial_remove(Span* s) {
  if (!s->in_partial) return;
  if (s->partial_prev != nullptr)
    s->partial_prev->partial_next = s->partial_next;
  else
    partial_[static_cast<std::size_t>(s->size_class)] = s->partial_next;
  if (s->partial_next != nullptr) s->partial_next->partial_prev = s->partial_prev;
  s->partial_next = s->partial_prev = nullptr;
  s->in_partial = false;
}

std::uintptr_t SmallBlocks::pop_slow(int cls) noexcept {
  const auto c = static_cast<std::size_t>(cls);
  Span* s = current_[c];
  {
    // The current span is full (it is on no list: a free puts it back on the
    // partial list). A partial span, else the spare.
    s = partial_[c];
    if (s != nullptr) {
      partial_remove(s);
    } else if (spare_[c] != nullptr) {
      s = spare_[c];
      spare_[c] = nullptr;
    } else {
      return 0;
    }
    current_[c] = s;
  }
  return s->pop();
}

Span* SmallBlocks::make_span(std::uintptr_t base, std::size_t slot, int cls, Heap* owner,
                             Block* block, std::size_t span_bytes) {
  std::unique_ptr<Span> s;
  if (!graveyard_.empty()) {
    s = std::move(graveyard_.back());
    graveyard_.pop_back();
    s->init(base, slot, cls, owner, block, span_bytes);
  } else {
    s = std::make_unique<Span>(base, slot, cls, owner, block, span_bytes);
  }
  class_bytes_[static_cast<std::size_t>(cls)] += span_bytes;
  Span* p = s.get();
  spans_.push_back(std::move(s));
  return p;
}

void SmallBlocks::add_span(Span* s) {
  const auto c = static_cast<std::size_t>(s->size_class);
  // The old current span (full, or it would not need a new one) stays off the
  // lists until a free puts it on the partial list.
  current_[c] = s;
}

Span* SmallBlocks::pushed_slow(Span* s) {
  const auto c = static_cast<std::size_t>(s->size_class);
  if (s->free_count == 1 && !s->unused()) {
    partial_push(s);  // it was full
    return nullptr;
  }
  if (s->unused()) {
    partial_remove(s);
    if (spare_[c] == nullptr) {
      spare_[c] = s;
      return nullptr;
    }
    return s;
  }
  return nullptr;
}

void SmallBlocks::release_span(Span* s) {
  const auto c = static_cast<std::size_t>(s->size_class);
  partial_remove(s);
  if (current_[c] == s) current_[c] = nullptr;
  if (spare_[c] == s) spare_[c] = nullptr;
  class_bytes_[c] -= s->bytes;
  auto it = std::find_if(spans_.begin(), spans_.end(), [&](const auto& p) { return p.get() == s; });
  if (it != spans_.end()) {
    graveyard_.push_back(std::move(*it));
    std::swap(*it, spans_.back());
    spans_.pop_back();
  }
}

std::vector<Span*> SmallBlocks::unused_spans() const {
  std::vector<Span*> out;
  for (const auto& s : spans_)
    if (s->unused() && s->pending == 0 && !s->in_flight) out.push_back(s.get());
  return out;
}

}  // namespace gvm::detail
