// A bounded history: the last `capacity` entries pushed, oldest dropped first.
// What torch.cuda.memory._record_memory_history(max_entries=N) keeps. Not
// thread-safe: the owner holds its lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace gvm::torch_backend {

template <class T>
class TraceRing {
 public:
  explicit TraceRing(std::size_t capacity = 1) : capacity_(std::max<std::size_t>(capacity, 1)) {}

  // A new capacity keeps the newest entries that fit.
  void set_capacity(std::size_t capacity) {
    std::vector<T> kept = ordered();
    capacity_ = std::max<std::size_t>(capacity, 1);
    if (kept.size() > capacity_)
      kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(capacity_));
    entries_ = std::move(kept);
    next_ = 0;
  }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t size() const noexcept { return entries_.size(); }

  void push(T entry) {
    if (entries_.size() < capacity_) {
      entries_.push_back(std::move(entry));
      return;
    }
    entries_[next_] = std::move(entry);
    next_ = (next_ + 1) % capacity_;
  }

  // Oldest first.
  std::vector<T> ordered() const {
    std::vector<T> out;
    out.reserve(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i)
      out.push_back(entries_[(next_ + i) % entries_.size()]);
    return out;
  }

  void clear() noexcept {
    entries_.clear();
    next_ = 0;
  }

 private:
  std::size_t capacity_;
  std::vector<T> entries_;
  std::size_t next_ = 0;  // the oldest entry once the ring is full
};

}  // namespace gvm::torch_backend
