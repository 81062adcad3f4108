// GrowthPolicy: the rules for growing a device's memory, in one place, for
// every heap and both backings:
//
//   cap     reserved bytes (every heap of the device: arenas, scratch, pools)
//           stay at or below Config::max_reserved_bytes and
//           memory_fraction x device memory; cached chunks go back first;
//   slack   before an arena grows, whole cached chunks go back while reserved
//           bytes would exceed the peak of live bytes x (1 + reserve_slack);
//   idle    a growth at a new peak of reserved bytes beside wholly free
//           chunks of its heap 16 times its size returns those first;
//   OOM     when the driver is out of memory: every cached chunk of the
//           device goes back (behind the fence) and the growth is tried once
//           more; then a typed out_of_memory that says why.
//
// Pure: it decides, the device heap acts (device_heap.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "gvm/config.hpp"

namespace gvm::detail {

// Reserved bytes of one device, charged before any growth and credited after
// any drop, so that the cap holds under concurrent growth.
class DeviceBudget {
 public:
  std::size_t reserved() const noexcept { return reserved_.load(std::memory_order_acquire); }
  std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  // Adds n unless that would pass `cap` (0: none); false (nothing added) if so.
  bool charge(std::size_t n, std::size_t cap) noexcept;
  void credit(std::size_t n) noexcept { reserved_.fetch_sub(n, std::memory_order_acq_rel); }
  void reset_peak() noexcept { peak_.store(reserved(), std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> peak_{0};
};

struct GrowthPlan {
  std::size_t release = 0;  // cached bytes to give back before growing
  bool slack = false;       // the release is for the slack bound (best effort)
  // Only the growing heap's own chunks go (kIdlePoolFactor's release).
  bool own_heap = false;
};

class GrowthPolicy {
 public:
  // Release-before-growth runs only for a growth that would set a new peak
  // of reserved bytes and is at least 1/128 of what is reserved: a release
  // costs a fence (a host sync) and driver calls, which pays when the growth
  // would raise the peak, not for the growths of a fragmented steady state
  // below it (releasing on every growth of the mixed workload: 9,280 chunk
  // maps in 2M operations - driver churn). It used to need a growth of one
  // whole chunk too, which kept heaps under a few GiB from ever releasing
  // (BERT's trace: 0 chunks unmapped, 1.377 reserved/live; with this rule and
  // the cold size classes 1.102, at 428 chunks mapped instead of 88:
  // docs/design-notes.md, "Fragmentation").
  static constexpr std::size_t kReleaseGrowthFraction = 128;
  // ... and at least four granules (8 MiB). A release and the re-growth it
  // forces cost a fence and five driver calls (cuMemUnmap, cuMemRelease,
  // cuMemCreate, cuMemMap, cuMemSetAccess: 0.1-1 ms on an H200,
  // docs/measurements.md); for a growth of a granule or two that is paid
  // again and again at a fragmented steady state. One thread replacing 100
  // live blocks of 256 B-4 MiB: a release every 167 operations and 0.44-0.9
  // us per operation on an H200 without this floor, 0.0003 driver calls per
  // operation with it; the shipped traces' ratios are the same with it.
  static constexpr std::size_t kReleaseGrowthMinBytes = std::size_t{8} << 20;
  // Neither applies when the wholly free chunks are at least this many times
  // the growth, and nor does the slack bound: the growth is the best fit's
  // choice of a small unmapped hole over a large mapped pool, and growing at
  // a new peak while the pool sits idle is fragmentation, not need (the
  // slack is room for growths that need memory; inside it, the synthetic
  // checkpoint_train trace crept to its peak so: 1.0132 -> 1.0091 with the
  // bound lifted, 812 -> 816 driver calls, every other trace unchanged).
  // The Llama generate program's trace
  // (recorded with record_trace on an H200) crept to its peak by growths of
  // one or two granules beside 74 MiB of wholly free chunks: 1.080 -> 1.026
  // reserved per live byte with this (simulated H200), BERT 1.091 -> 1.089,
  // the synthetic mixed trace 1.226 -> 1.198 (1,812 -> 2,387 driver calls),
  // the other traces unchanged; the same at 4 and 8, GPT-2 1.032 at 32 and
  // 1.021 at 64 (docs/design-notes.md, "Fragmentation"). A fragmented steady
  // state (the floor's reason) holds few wholly free chunks. The pool is the
  // growing heap's own, and so is what goes: its best fit passed over that
  // pool, where other streams' idle chunks are their headroom. Counted over
  // every heap, 8 and 16 threads on their own streams (the floor's workload,
  // one stream each) released each other's headroom at every new peak, and
  // the heaps then took memory from each other, a stream wait each time:
  // 10,600-32,800 driver calls per million operations on an H200 and 31 and
  // 25-27 M operations/s, no more than one thread's 27-35. Own chunks only:
  // 33-41 and 141-208 calls, 159-172 and 249-292 M/s (side by side,
  // docs/design-notes.md "Known limits"); the traces' ratios did not move.
  static constexpr std::size_t kIdlePoolFactor = 16;

  GrowthPolicy(const Config& config, std::size_t device_memory) noexcept
      : config_(config), device_memory_(device_memory) {}

  // The cap in bytes, 0 = none (the smaller of max_reserved and the fraction).
  std::size_t cap() const noexcept;
  // The plan for growing by `need` bytes with `reserved` mapped now (and
  // `peak_reserved` at most so far), `live` bytes live (plus the request)
  // and `peak_live` the peak so far; `arena`:
  // the slack rule applies (not to the scratch, whose chunks carry peer
  // grants that cost ~1 ms per 64 MiB to make again, docs/measurements.md);
  // `cached`: the growing heap's wholly free chunk bytes (kIdlePoolFactor).
  GrowthPlan plan(std::size_t need, std::size_t reserved, std::size_t peak_reserved,
                  std::size_t live_after, std::size_t peak_live, bool arena,
                  std::size_t cached = 0) const noexcept;

  // A growth of `need` bytes with `reserved` mapped would set a new peak of
  // reserved bytes: the condition of the release before growth (plan) and
  // of reusing an unused span's granule first (Heap::new_span).
  static bool raises_peak(std::size_t need, std::size_t reserved, std::size_t peak_reserved) noexcept {
    return reserved + need > peak_reserved;
  }

  void set_fraction(double f) noexcept { fraction_override_.store(f, std::memory_order_relaxed); }
  double fraction() const noexcept;

 private:
  const Config& config_;
  const std::size_t device_memory_;
  // set_memory_fraction at run time (negative: use the config's).
  std::atomic<double> fraction_override_{-1.0};
};

}  // namespace gvm::detail
