// DeviceHeap: the small-block front end (per-stream caches of spans).
//
// The hot path: allocate_small pops a slot from the stream's current span of
// the size class, free_small pushes it back, each under the cache's spin
// lock. No driver call, no device lock, no allocation.
#include <algorithm>
#include <string>

#include "device_heap.hpp"

namespace gvm::detail {
namespace {

void partial_push(StreamCache& c, Span* s) {
  s->partial_prev = nullptr;
  s->partial_next = c.partial[static_cast<std::size_t>(s->size_class)];
  if (s->partial_next != nullptr) s->partial_next->partial_prev = s;
  c.partial[static_cast<std::size_t>(s->size_class)] = s;
  s->in_partial = true;
}

void partial_remove(StreamCache& c, Span* s) {
  if (!s->in_partial) return;
  if (s->partial_prev != nullptr)
    s->partial_prev->partial_next = s->partial_next;
  else
    c.partial[static_cast<std::size_t>(s->size_class)] = s->partial_next;
  if (s->partial_next != nullptr) s->partial_next->partial_prev = s->partial_prev;
  s->partial_next = s->partial_prev = nullptr;
  s->in_partial = false;
}

std::string hex(std::uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

}  // namespace

std::int64_t DeviceHeap::live_total() const noexcept {
  std::lock_guard<SpinLock> guard(cache_list_lock_);
  std::int64_t total = large_live_bytes_.load(std::memory_order_relaxed);
  for (const StreamCache* c : cache_list_) total += c->live_bytes.load(std::memory_order_relaxed);
  return total;
}

// The peak of live bytes without a shared counter on the hot path: each
// cache compares its own bytes with a watermark, and only a cache that
// passes it (or a large allocation) sums the device. With one allocating
// thread the peak is exact; with several, an increase by one cache between
// another's refreshes is seen at the next refresh, so the peak can lag by
// what the others allocated meanwhile (each cache's watermark is its own
// bytes at its last refresh plus the headroom to the peak then). A shared atomic counter would cost
// two locked read-modify-writes per alloc+free pair on every thread.
void DeviceHeap::refresh_peak() noexcept {
  std::lock_guard<SpinLock> guard(cache_list_lock_);
  std::int64_t total = large_live_bytes_.load(std::memory_order_relaxed);
  for (const StreamCache* c : cache_list_) total += c->live_bytes.load(std::memory_order_relaxed);
  std::int64_t peak = peak_live_.load(std::memory_order_relaxed);
  while (total > peak && !peak_live_.compare_exchange_weak(peak, total, std::memory_order_relaxed)) {
  }
  peak = std::max(peak, total);
  headroom_.store(peak - total, std::memory_order_relaxed);
}

StreamCache& DeviceHeap::cache_for(vmm::StreamHandle stream) {
  std::lock_guard<std::mutex> guard(caches_lock_);
  auto& c = caches_[stream];
  if (!c) {
    c = std::make_unique<StreamCache>();
    c->heap = this;
    c->stream = stream;
    std::lock_guard<SpinLock> list_guard(cache_list_lock_);
    cache_list_.push_back(c.get());
  }
  return *c;
}

Span* DeviceHeap::new_span(StreamCache& cache, int size_class, std::size_t bytes) {
  std::lock_guard<std::mutex> guard(lock_);
  // `bytes` (the caller's request) is what an out-of-memory message names.
  Block* b = allocate_block(kGranule, kGranule, cache.stream, bytes);
  auto span = std::make_unique<Span>(b->addr, class_size(size_class), size_class, &cache, b);
  Span* s = span.get();
  b->span = s;
  spans_.push_back(std::move(span));
  pages_.at(b->addr).span.store(s, std::memory_order_release);
  return s;
}

void DeviceHeap::release_span_locked(Span* s) {
  pages_.at(s->base).span.store(nullptr, std::memory_order_release);
  Block* b = s->block;
  b->span = nullptr;
  uncommit(b);
  free_block(b, s->owner->stream);
  auto it = std::find_if(spans_.begin(), spans_.end(), [&](const auto& p) { return p.get() == s; });
  if (it != spans_.end()) {
    std::swap(*it, spans_.back());
    spans_.pop_back();
  }
}

void DeviceHeap::release_span(Span* s) {
  std::lock_guard<std::mutex> guard(lock_);
  release_span_locked(s);
}

void* DeviceHeap::allocate_small(StreamCache& c, std::size_t bytes) {
  const int cls = size_class_of(bytes);
  const auto ci = static_cast<std::size_t>(cls);
  const std::size_t slot = class_size(cls);
  for (int attempt = 0;; ++attempt) {
    try {
      std::unique_lock<SpinLock> guard(c.lock);
      Span* s = c.current[ci];
      bool grew = false;
      if (s == nullptr || s->full()) [[unlikely]] {
        // The current span is full (it is on no list: a free will put it back
        // on the partial list). Take a partial span, the spare, or a new one;
        // a class that is still cold goes to the large heap instead
        // (Config::span_warmup_allocations), outside this cache's lock
        // (allocate_large may reclaim spans, which takes every cache's lock).
        s = c.partial[ci];
        if (s != nullptr) {
          partial_remove(c, s);
        } else if (c.spare[ci] != nullptr) {
          s = c.spare[ci];
          c.spare[ci] = nullptr;
        } else if (c.cold_allocations[ci] < config_.span_warmup_allocations) {
          ++c.cold_allocations[ci];
          guard.unlock();
          return allocate_large(bytes, c.stream);
        } else {
          s = new_span(c, cls, bytes);
          grew = true;
        }
        c.current[ci] = s;
      }
      const std::uintptr_t p = s->pop();
      ++c.allocations;
      if (!grew) ++c.hits;
      const std::int64_t live =
          c.live_bytes.load(std::memory_order_relaxed) + static_cast<std::int64_t>(slot);
      c.live_bytes.store(live, std::memory_order_relaxed);
      if (live > c.peak_watermark.load(std::memory_order_relaxed)) [[unlikely]] {
        refresh_peak();
        // Only this cache's own watermark moves: writing every cache's would
        // bounce their cache lines between threads on each refresh.
        c.peak_watermark.store(live + headroom_.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
      }
      return reinterpret_cast<void*>(p);
    } catch (const out_of_memory&) {
      // No room for a new span: empty spans of every cache (this one's too)
      // go back to the large pool, outside this cache's lock, then one retry.
      if (attempt > 0 || reclaim_spans() == 0) throw;
    }
  }
}

void DeviceHeap::free_small(Span* s, std::uintptr_t addr, std::size_t bytes,
                            vmm::StreamHandle stream) {
  const std::uintptr_t off = addr - s->base;
  StreamCache& c = *s->owner;
  std::lock_guard<SpinLock> guard(c.lock);
  const auto idx = static_cast<std::uint32_t>(off / s->slot_size);
  if (off % s->slot_size != 0 || !s->is_allocated(idx))
    throw usage_error("gvmalloc: deallocate(" + hex(addr) + ") on device " +
                      std::to_string(device()) +
                      ": not a live block (already freed, never allocated, or an interior pointer)");
  if (bytes != kUnknownSize && (bytes == 0 || bytes > s->slot_size ||
                                size_class_of(bytes) != s->size_class))
    throw usage_error("gvmalloc: deallocate(" + hex(addr) + ", " + std::to_string(bytes) +
                      " bytes) on device " + std::to_string(device()) +
                      ": the block was allocated with a size in another class (slot of " +
                      std::to_string(s->slot_size) + " bytes)");
  // Other streams that used the slot: its owner stream reuses it at once, so
  // the owner must first wait for their work (rare: record_stream, or a free
  // on another stream).
  if (stream != c.stream || !c.recorded.empty()) {
    StreamTags others;
    if (auto it = c.recorded.find(addr); it != c.recorded.end()) {
      others = it->second;
      c.recorded.erase(it);
    }
    if (stream != c.stream) others.add(stream);
    if (!others.empty()) {
      std::lock_guard<std::mutex> device_guard(lock_);
      if (stream != c.stream) note_stream(stream);
      try {
        order_after(others, c.stream);
      } catch (const vmm::DriverError&) {
        // Not even a device sync worked: the context is dead and nothing
        // queued will run again. deallocate reports bad input only.
      }
    }
  }
  s->push(idx);
  ++c.frees;
  c.live_bytes.store(
      c.live_bytes.load(std::memory_order_relaxed) - static_cast<std::int64_t>(s->slot_size),
      std::memory_order_relaxed);
  const auto ci = static_cast<std::size_t>(s->size_class);
  if (s == c.current[ci]) return;
  if (s->free_count == 1 && !s->unused()) {
    partial_push(c, s);  // it was full
  } else if (s->unused()) {
    partial_remove(c, s);
    if (c.spare[ci] == nullptr) {
      c.spare[ci] = s;
    } else {
      release_span(s);
    }
  }
}

std::size_t DeviceHeap::reclaim_spans() {
  std::size_t released = 0;
  std::vector<StreamCache*> caches;
  {
    std::lock_guard<std::mutex> guard(caches_lock_);
    for (auto& [stream, c] : caches_) caches.push_back(c.get());
  }
  for (StreamCache* c : caches) {
    std::lock_guard<SpinLock> cache_guard(c->lock);
    std::lock_guard<std::mutex> guard(lock_);
    for (std::size_t ci = 0; ci < c->current.size(); ++ci) {
      if (Span* s = c->spare[ci]; s != nullptr) {
        c->spare[ci] = nullptr;
        release_span_locked(s);
        ++released;
      }
      if (Span* s = c->current[ci]; s != nullptr && s->unused()) {
        c->current[ci] = nullptr;
        release_span_locked(s);
        ++released;
      }
      for (Span* s = c->partial[ci]; s != nullptr;) {
        Span* next = s->partial_next;
        if (s->unused()) {
          partial_remove(*c, s);
          release_span_locked(s);
          ++released;
        }
        s = next;
      }
    }
  }
  return released;
}

}  // namespace gvm::detail
