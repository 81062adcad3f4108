// Size classes of the small-block front end.
//
// Four classes per power of two (512, 640, 768, 896, 1024, 1280, ...), so a
// request wastes at most 25% to rounding, and the class of a size is found
// with a count-leading-zeros and two shifts: O(1), no table search.
// Classes start at 512 B (the block alignment) and end at the configured
// small-block maximum (at most 64 MiB).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace gvm::detail {

inline constexpr std::size_t kMinClassBytes = 512;
inline constexpr int kMinClassShift = 9;  // log2(512)
inline constexpr int kStepsPerDoubling = 4;
// Enough classes for sizes up to 64 MiB.
inline constexpr int kMaxClasses = (26 - kMinClassShift + 1) * kStepsPerDoubling;

// The class index of `bytes` (> 0).
constexpr int size_class_of(std::size_t bytes) noexcept {
  if (bytes <= kMinClassBytes) return 0;
  const std::size_t n = bytes - 1;
  const int msb = 63 - std::countl_zero(static_cast<std::uint64_t>(n));  // floor(log2(n))
  // Within [2^msb, 2^(msb+1)), four steps of 2^(msb-2).
  const int step = static_cast<int>((n >> (msb - 2)) & 3);
  return (msb - kMinClassShift) * kStepsPerDoubling + step + 1;
}

// The block size of class `c`: the largest size that maps to it.
constexpr std::size_t class_size(int c) noexcept {
  if (c == 0) return kMinClassBytes;
  const int k = c - 1;
  const int msb = k / kStepsPerDoubling + kMinClassShift;
  const int step = k % kStepsPerDoubling;
  return (std::size_t{1} << msb) + (static_cast<std::size_t>(step + 1) << (msb - 2));
}

static_assert(class_size(size_class_of(512)) == 512);
static_assert(class_size(size_class_of(513)) == 640);
static_assert(class_size(size_class_of(1024)) == 1024);
static_assert(class_size(size_class_of(1025)) == 1280);
static_assert(class_size(size_class_of(std::size_t{1} << 20)) == std::size_t{1} << 20);

}  // namespace gvm::detail
