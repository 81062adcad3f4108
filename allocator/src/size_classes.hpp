// Size classes of the small-block front end.
//
// Every class is a multiple of 512 B (kBlockAlignment), because the slots of a
// span sit at base + i * class size and every block must be 512-aligned. Up to
// 2 KiB the classes step by 512 (512, 1024, 1536, 2048); from there, four
// classes per power of two (2560, 3072, 3584, 4096, 5120, ...), so a request
// above 2 KiB wastes at most 25% to rounding. The class of a size is found
// with a count-leading-zeros and two shifts: O(1), no table search. Classes
// end at the configured small-block maximum (at most 64 MiB).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace gvm::detail {

inline constexpr std::size_t kMinClassBytes = 512;
inline constexpr int kStepsPerDoubling = 4;
// Below this, a quarter-power-of-two step would be less than 512 B: linear
// classes of 512 B instead (4 of them).
inline constexpr int kLinearShift = 11;  // log2(2048)
inline constexpr int kLinearClasses = (1 << kLinearShift) / kMinClassBytes;
// Enough classes for sizes up to 64 MiB.
inline constexpr int kMaxClasses = kLinearClasses + (26 - kLinearShift) * kStepsPerDoubling;

// The class index of `bytes` (> 0).
constexpr int size_class_of(std::size_t bytes) noexcept {
  if (bytes <= (std::size_t{1} << kLinearShift))
    return static_cast<int>((bytes + kMinClassBytes - 1) / kMinClassBytes) - 1;
  const std::size_t n = bytes - 1;
  const int msb = 63 - std::countl_zero(static_cast<std::uint64_t>(n));  // floor(log2(n))
  // Within [2^msb, 2^(msb+1)), four steps of 2^(msb-2) (>= 512 B).
  const int step = static_cast<int>((n >> (msb - 2)) & 3);
  return kLinearClasses + (msb - kLinearShift) * kStepsPerDoubling + step;
}

// The block size of class `c`: the largest size that maps to it.
constexpr std::size_t class_size(int c) noexcept {
  if (c < kLinearClasses) return static_cast<std::size_t>(c + 1) * kMinClassBytes;
  const int k = c - kLinearClasses;
  const int msb = k / kStepsPerDoubling + kLinearShift;
  const int step = k % kStepsPerDoubling;
  return (std::size_t{1} << msb) + (static_cast<std::size_t>(step + 1) << (msb - 2));
}

// The smallest request of class `c` (the hot free path checks a size with
// one compare: min_request(c) <= bytes <= class_size(c)).
constexpr std::size_t min_request(int c) noexcept { return c == 0 ? 1 : class_size(c - 1) + 1; }

// class_size as a table: the allocation hot path reads it with one load.
inline constexpr auto kClassBytes = [] {
  std::array<std::size_t, kMaxClasses> t{};
  for (int c = 0; c < kMaxClasses; ++c) t[static_cast<std::size_t>(c)] = class_size(c);
  return t;
}();

// True when every class up to `c` is a multiple of 512 and maps back to itself.
constexpr bool classes_are_aligned(int upto) noexcept {
  for (int c = 0; c <= upto; ++c)
    if (class_size(c) % kMinClassBytes != 0 || size_class_of(class_size(c)) != c ||
        size_class_of(class_size(c) + 1) != c + 1)
      return false;
  return true;
}

static_assert(classes_are_aligned(kMaxClasses - 2));
static_assert(size_class_of(std::size_t{64} << 20) == kMaxClasses - 1);
static_assert(class_size(size_class_of(1)) == 512);
static_assert(class_size(size_class_of(512)) == 512);
static_assert(class_size(size_class_of(513)) == 1024);
static_assert(class_size(size_class_of(2049)) == 2560);
static_assert(class_size(size_class_of(1024)) == 1024);
static_assert(class_size(size_class_of(1025)) == 1536);
static_assert(class_size(size_class_of(std::size_t{1} << 20)) == std::size_t{1} << 20);
static_assert(min_request(size_class_of(2049)) == 2049 && min_request(0) == 1);

}  // namespace gvm::detail
