// FreeBins: the free blocks of one arena, for best fit in O(1) bins instead
// of a balanced tree.
//
// Sizes fall into bins that tile the size axis in order: 512-byte steps below
// 32 KiB, then 64 bins per power of two (steps of 1/64 = 1.6%). Every block
// of a bin is smaller than every block of the next, so the best fit - the
// smallest block of at least n bytes - lies in the first non-empty bin at or
// after n's bin that holds a block of at least n: a two-level bitmap finds
// that bin in a few instructions and a short scan of it finds the block.
// The tree this replaces (std::set by size and address) spent ~90 of ~480
// instructions per operation of the mixed workload in its insert and erase
// rebalancing (callgrind, docs/design-notes.md).
//
// Blocks are linked into their bin through Block::bin_prev / bin_next; the
// caller's lock guards everything.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "block.hpp"

namespace gvm::detail {

class FreeBins {
 public:
  static constexpr int kLinear = 64;      // 512 B .. 32 KiB in 512-byte steps
  static constexpr int kLinearShift = 15;  // 32 KiB
  static constexpr int kSubBits = 6;       // 64 bins per power of two above
  static constexpr int kMaxShift = 50;     // sizes below 2^51
  static constexpr int kBins = kLinear + (kMaxShift - kLinearShift + 1) * (1 << kSubBits);
  static constexpr int kWords = (kBins + 63) / 64;

  static int bin_of(std::size_t size) noexcept {
    // Block sizes are multiples of 512 (kBlockAlignment).
    if (size < (std::size_t{1} << kLinearShift)) return size < 1024 ? 0 : static_cast<int>(size >> 9) - 1;
    const int msb = 63 - std::countl_zero(static_cast<std::uint64_t>(size));
    const auto sub = static_cast<int>((size >> (msb - kSubBits)) & ((1 << kSubBits) - 1));
    return kLinear + (msb - kLinearShift) * (1 << kSubBits) + sub;
  }

  bool empty() const noexcept { return count_ == 0; }
  std::size_t size() const noexcept { return count_; }

  void insert(Block* b) noexcept {
    const int i = bin_of(b->size);
    b->bin = i;
    b->bin_prev = nullptr;
    b->bin_next = heads_[static_cast<std::size_t>(i)];
    if (b->bin_next != nullptr) b->bin_next->bin_prev = b;
    heads_[static_cast<std::size_t>(i)] = b;
    words_[static_cast<std::size_t>(i) >> 6] |= std::uint64_t{1} << (i & 63);
    top_ |= std::uint64_t{1} << (i >> 6);
    b->in_bins = true;
    ++count_;
  }

  void erase(Block* b) noexcept {
    const int i = b->bin;
    if (b->bin_prev != nullptr)
      b->bin_prev->bin_next = b->bin_next;
    else
      heads_[static_cast<std::size_t>(i)] = b->bin_next;
    if (b->bin_next != nullptr) b->bin_next->bin_prev = b->bin_prev;
    if (heads_[static_cast<std::size_t>(i)] == nullptr) {
      std::uint64_t& w = words_[static_cast<std::size_t>(i) >> 6];
      w &= ~(std::uint64_t{1} << (i & 63));
      if (w == 0) top_ &= ~(std::uint64_t{1} << (i >> 6));
    }
    b->bin_prev = b->bin_next = nullptr;
    b->in_bins = false;
    --count_;
  }

  // The first non-empty bin at or after `from`, or kBins.
  int next_bin(int from) const noexcept {
    if (from >= kBins) return kBins;
    int w = from >> 6;
    std::uint64_t bits = words_[static_cast<std::size_t>(w)] & (~std::uint64_t{0} << (from & 63));
    if (bits != 0) return (w << 6) + std::countr_zero(bits);
    const std::uint64_t rest = w + 1 < 64 ? top_ & (~std::uint64_t{0} << (w + 1)) : 0;
    if (rest == 0) return kBins;
    w = std::countr_zero(rest);
    return (w << 6) + std::countr_zero(words_[static_cast<std::size_t>(w)]);
  }
  // The last non-empty bin, or -1.
  int last_bin() const noexcept {
    if (top_ == 0) return -1;
    const int w = 63 - std::countl_zero(top_);
    return (w << 6) + 63 - std::countl_zero(words_[static_cast<std::size_t>(w)]);
  }
  Block* head(int bin) const noexcept { return heads_[static_cast<std::size_t>(bin)]; }

 private:
  static_assert(kWords <= 64, "the top-level bitmap has 64 bits");
  std::array<Block*, kBins> heads_{};
  std::array<std::uint64_t, kWords> words_{};
  std::uint64_t top_ = 0;
  std::size_t count_ = 0;
};

}  // namespace gvm::detail
