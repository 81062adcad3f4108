#include "growth_policy.hpp"

#include <algorithm>

namespace gvm::detail {

bool DeviceBudget::charge(std::size_t n, std::size_t cap) noexcept {
  std::size_t cur = reserved_.load(std::memory_order_acquire);
  for (;;) {
    if (cap != 0 && (n > cap || cur > cap - n)) return false;
    if (reserved_.compare_exchange_weak(cur, cur + n, std::memory_order_acq_rel)) break;
  }
  std::size_t p = peak_.load(std::memory_order_relaxed);
  while (cur + n > p && !peak_.compare_exchange_weak(p, cur + n, std::memory_order_relaxed)) {
  }
  return true;
}

double GrowthPolicy::fraction() const noexcept {
  const double f = fraction_override_.load(std::memory_order_relaxed);
  return f >= 0.0 ? f : config_.memory_fraction;
}

std::size_t GrowthPolicy::cap() const noexcept {
  std::size_t cap = config_.max_reserved_bytes;
  if (const double f = fraction(); f > 0.0) {
    const auto by_fraction = static_cast<std::size_t>(f * static_cast<double>(device_memory_));
    if (cap == 0 || by_fraction < cap) cap = by_fraction;
  }
  return cap;
}

GrowthPlan GrowthPolicy::plan(std::size_t need, std::size_t reserved, std::size_t peak_reserved,
                              std::size_t live_after, std::size_t peak_live,
                              bool arena, std::size_t cached) const noexcept {
  GrowthPlan p;
  if (const std::size_t c = cap(); c != 0 && reserved + need > c) p.release = reserved + need - c;
  const std::size_t for_cap = p.release;
  if (arena && config_.reserve_slack >= 0.0) {
    // The bound follows the peak of live bytes, not the current live bytes:
    // a workload whose live bytes swing below their peak would otherwise
    // release and re-map chunks on every swing (measured on the mixed
    // workload: 42k chunk maps in 2M operations).
    const double peak = static_cast<double>(std::max(live_after, peak_live));
    const auto bound = static_cast<std::size_t>(peak * (1.0 + config_.reserve_slack));
    const bool large = need * kReleaseGrowthFraction >= reserved && need >= kReleaseGrowthMinBytes;
    // Beside an idle pool the growth needs no memory, slack or not: what goes
    // is at least the growth.
    const bool idle = cached >= kIdlePoolFactor * need;
    const bool past_bound = reserved + need > bound;
    if (raises_peak(need, reserved, peak_reserved) && ((past_bound && large) || idle)) {
      const std::size_t want = past_bound ? reserved + need - bound : need;
      if (want > p.release) {
        p.release = want;
        p.slack = true;
        // The cap's release may need every heap's chunks; one for the idle
        // pool alone (a small growth, or any inside the slack) takes the
        // growing heap's own, which is what its best fit passed over.
        p.own_heap = !(past_bound && large) && for_cap == 0;
      }
    }
  }
  return p;
}

}  // namespace gvm::detail
