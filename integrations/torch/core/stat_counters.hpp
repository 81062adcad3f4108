// The statistics PyTorch's allocator keeps (c10::CachingDeviceAllocator::
// DeviceStats: allocation counts, allocated and requested bytes, by pool),
// counted by the backend for every block it hands out and takes back.
//
// PyTorch's own meaning is kept: a request of up to 1 MiB belongs to the
// "small pool", a larger one to the "large pool", and "allocated bytes" are
// the request rounded up to 512 bytes, as PyTorch's allocator rounds it. So
// torch.cuda.memory_allocated() says what it says with PyTorch's allocator;
// the bytes gvmalloc's own size classes give each block are in
// gvmalloc.device_stats() (live_bytes).
//
// Hot path: no lock. Each statistic is two monotonic counters (increases,
// decreases) updated with relaxed atomics; current = increases - decreases,
// so an allocation and a free each touch one counter per statistic. Peaks are
// raised by the allocating thread; with several threads a peak can lag by what
// another thread allocated in between (the same precision as gvmalloc's own
// peaks, allocator/include/gvm/stats.hpp).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gvm::torch_backend {

// PyTorch's boundary between its small and large pools (requests of at most
// 1 MiB are small) and its rounding of every request (512 bytes).
inline constexpr std::size_t kTorchSmallRequestMax = std::size_t{1} << 20;
inline constexpr std::size_t kTorchRounding = 512;

// Indices as c10::CachingAllocator::StatType: aggregate, small pool, large pool.
inline constexpr int kStatAll = 0;
inline constexpr int kStatSmall = 1;
inline constexpr int kStatLarge = 2;
inline constexpr int kStatTypes = 3;

constexpr int stat_pool(std::size_t requested) noexcept {
  return requested <= kTorchSmallRequestMax ? kStatSmall : kStatLarge;
}
constexpr std::size_t torch_rounded(std::size_t requested) noexcept {
  return (requested + kTorchRounding - 1) / kTorchRounding * kTorchRounding;
}

// One statistic as c10::CachingAllocator::Stat reports it.
struct StatValue {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // increases since the last reset_accumulated
  std::int64_t freed = 0;      // decreases since the last reset_accumulated
};

class StatCell {
 public:
  void increase(std::int64_t n) noexcept;
  void decrease(std::int64_t n) noexcept;
  StatValue read() const noexcept;
  void reset_peak() noexcept;
  void reset_accumulated() noexcept;

 private:
  std::atomic<std::int64_t> increases_{0};
  std::atomic<std::int64_t> decreases_{0};
  std::atomic<std::int64_t> peak_{0};
  // Counts at the last reset_accumulated: the reported totals start there,
  // while current (increases - decreases) is untouched by a reset.
  std::atomic<std::int64_t> base_increases_{0};
  std::atomic<std::int64_t> base_decreases_{0};
};

struct CountersSnapshot {
  std::array<StatValue, kStatTypes> allocation{};       // live blocks
  std::array<StatValue, kStatTypes> allocated_bytes{};  // requests rounded to 512
  std::array<StatValue, kStatTypes> requested_bytes{};  // requests as made
  std::int64_t num_ooms = 0;
};

// The counters of one device.
class DeviceCounters {
 public:
  void on_alloc(std::size_t requested) noexcept;
  void on_free(std::size_t requested) noexcept;
  void on_oom() noexcept;
  CountersSnapshot read() const noexcept;
  void reset_peak() noexcept;
  void reset_accumulated() noexcept;

 private:
  std::array<StatCell, kStatTypes> allocation_;
  std::array<StatCell, kStatTypes> allocated_bytes_;
  std::array<StatCell, kStatTypes> requested_bytes_;
  std::atomic<std::int64_t> num_ooms_{0};
  std::atomic<std::int64_t> base_ooms_{0};
};

}  // namespace gvm::torch_backend
