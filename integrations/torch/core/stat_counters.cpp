#include "stat_counters.hpp"

#include <algorithm>

namespace gvm::torch_backend {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}

void StatCell::increase(std::int64_t n) noexcept {
  const std::int64_t now = increases_.fetch_add(n, kRelaxed) + n - decreases_.load(kRelaxed);
  std::int64_t peak = peak_.load(kRelaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, kRelaxed)) {
  }
}

void StatCell::decrease(std::int64_t n) noexcept {
  decreases_.fetch_add(n, kRelaxed);
}

StatValue StatCell::read() const noexcept {
  // Decreases first: read the other way, a free between the two loads could
  // show a current below zero.
  const std::int64_t dec = decreases_.load(kRelaxed);
  const std::int64_t inc = increases_.load(kRelaxed);
  StatValue v;
  v.current = inc - dec;
  v.peak = std::max(peak_.load(kRelaxed), v.current);
  v.allocated = inc - base_increases_.load(kRelaxed);
  v.freed = dec - base_decreases_.load(kRelaxed);
  return v;
}

void StatCell::reset_peak() noexcept {
  peak_.store(increases_.load(kRelaxed) - decreases_.load(kRelaxed), kRelaxed);
}

void StatCell::reset_accumulated() noexcept {
  base_decreases_.store(decreases_.load(kRelaxed), kRelaxed);
  base_increases_.store(increases_.load(kRelaxed), kRelaxed);
}

void DeviceCounters::on_alloc(std::size_t requested) noexcept {
  const int pool = stat_pool(requested);
  const auto bytes = static_cast<std::int64_t>(torch_rounded(requested));
  const auto asked = static_cast<std::int64_t>(requested);
  for (int t : {kStatAll, pool}) {
    allocation_[t].increase(1);
    allocated_bytes_[t].increase(bytes);
    requested_bytes_[t].increase(asked);
  }
}

void DeviceCounters::on_free(std::size_t requested) noexcept {
  const int pool = stat_pool(requested);
  const auto bytes = static_cast<std::int64_t>(torch_rounded(requested));
  const auto asked = static_cast<std::int64_t>(requested);
  for (int t : {kStatAll, pool}) {
    allocation_[t].decrease(1);
    allocated_bytes_[t].decrease(bytes);
    requested_bytes_[t].decrease(asked);
  }
}

void DeviceCounters::on_oom() noexcept {
  num_ooms_.fetch_add(1, kRelaxed);
}

CountersSnapshot DeviceCounters::read() const noexcept {
  CountersSnapshot s;
  for (int t = 0; t < kStatTypes; ++t) {
    s.allocation[t] = allocation_[t].read();
    s.allocated_bytes[t] = allocated_bytes_[t].read();
    s.requested_bytes[t] = requested_bytes_[t].read();
  }
  s.num_ooms = num_ooms_.load(kRelaxed) - base_ooms_.load(kRelaxed);
  return s;
}

void DeviceCounters::reset_peak() noexcept {
  for (int t = 0; t < kStatTypes; ++t) {
    allocation_[t].reset_peak();
    allocated_bytes_[t].reset_peak();
    requested_bytes_[t].reset_peak();
  }
}

void DeviceCounters::reset_accumulated() noexcept {
  for (int t = 0; t < kStatTypes; ++t) {
    allocation_[t].reset_accumulated();
    allocated_bytes_[t].reset_accumulated();
    requested_bytes_[t].reset_accumulated();
  }
  base_ooms_.store(num_ooms_.load(kRelaxed), kRelaxed);
}

}  // namespace gvm::torch_backend
