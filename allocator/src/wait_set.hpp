// WaitSet: the work a free block (or a range about to be unmapped) must wait
// for - one Token per stream that may still touch it.
//
// A handful inline: blocks live in per-stream heaps, so a block sees its own
// stream and rarely one or two more (a free on another stream, a
// record_stream). Past that the set overflows to "every stream of every
// device", which is waited for with device synchronisations.
#pragma once

#include <array>
#include <cstdint>

#include "stream_state.hpp"

namespace gvm::detail {

class WaitSet {
 public:
  static constexpr int kInline = 4;

  bool empty() const noexcept { return count_ == 0 && overflow_devices_ == 0; }
  int size() const noexcept { return count_; }
  const Token& operator[](int i) const noexcept { return tokens_[static_cast<std::size_t>(i)]; }
  // Devices whose every stream must be waited for (bit d: device d).
  std::uint64_t overflow_devices() const noexcept { return overflow_devices_; }

  // Adds t; a token of a stream already in the set keeps the later epoch.
  void add(const Token& t) noexcept {
    if (t.stream == nullptr) return;
    for (int i = 0; i < count_; ++i) {
      Token& x = tokens_[static_cast<std::size_t>(i)];
      if (x.stream == t.stream) {
        if (t.epoch > x.epoch) x.epoch = t.epoch;
        return;
      }
    }
    if (count_ == kInline) {
      // Every device: a stream named without its device (record_stream of
      // a peer's stream) may run on any of them.
      overflow_devices_ = ~std::uint64_t{0};
      return;
    }
    tokens_[static_cast<std::size_t>(count_++)] = t;
  }
  // Exactly {t} (t names a stream): the hot free's one token, no search.
  void assign(const Token& t) noexcept {
    tokens_[0] = t;
    count_ = 1;
    overflow_devices_ = 0;
  }
  void merge(const WaitSet& o) noexcept {
    overflow_devices_ |= o.overflow_devices_;
    for (int i = 0; i < o.count_; ++i) add(o[i]);
  }
  void add_overflow(std::uint64_t device_mask) noexcept { overflow_devices_ |= device_mask; }
  void clear() noexcept {
    count_ = 0;
    overflow_devices_ = 0;
  }
  // Nothing to wait for, or only work of `s` (which its own stream is behind).
  bool only(const StreamState* s) const noexcept {
    if (overflow_devices_ != 0) return false;
    for (int i = 0; i < count_; ++i)
      if (tokens_[static_cast<std::size_t>(i)].stream != s) return false;
    return true;
  }
  bool has_stream(const StreamState* s) const noexcept {
    for (int i = 0; i < count_; ++i)
      if (tokens_[static_cast<std::size_t>(i)].stream == s) return true;
    return false;
  }
  // The one stream whose work this is, or null (none, or several).
  StreamState* sole_stream() const noexcept {
    return count_ == 1 && overflow_devices_ == 0 ? tokens_[0].stream : nullptr;
  }
  // Drops the tokens whose work is known finished (StreamState::finished).
  // Returns whether any went.
  bool drop_finished() noexcept {
    int k = 0;
    for (int i = 0; i < count_; ++i)
      if (const Token& t = tokens_[static_cast<std::size_t>(i)]; !t.stream->finished(t))
        tokens_[static_cast<std::size_t>(k++)] = t;
    const bool dropped = k != count_;
    count_ = k;
    return dropped;
  }

  // Free neighbours merge only when the result asks no stream to wait for
  // more streams than either side did: one side untouched, or both touched by
  // the same streams (epochs may differ: the later one covers both). Merging
  // two streams' memory would make every later taker of any part of it wait
  // for both.
  friend bool mergeable(const WaitSet& a, const WaitSet& b) noexcept {
    if (a.empty() || b.empty()) return true;
    if (a.overflow_devices_ != b.overflow_devices_ || a.count_ != b.count_) return false;
    for (int i = 0; i < a.count_; ++i)
      if (!b.has_stream(a[i].stream)) return false;
    return true;
  }

  static std::uint64_t device_bit(int device) noexcept {
    return device >= 0 && device < 64 ? std::uint64_t{1} << device : ~std::uint64_t{0};
  }

 private:
  std::array<Token, kInline> tokens_{};
  int count_ = 0;
  std::uint64_t overflow_devices_ = 0;
};

}  // namespace gvm::detail
