#include "gvm/vmm/counting_driver.hpp"

#include <chrono>

namespace gvm::vmm {

Result CountingDriver::intercept(Call call, ForwardedCall forward) {
  const auto start = std::chrono::steady_clock::now();
  const Result r = forward();
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  const auto i = static_cast<std::size_t>(call);
  calls_[i].fetch_add(1, std::memory_order_relaxed);
  nanoseconds_[i].fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  return r;
}

CallCounts CountingDriver::snapshot() const noexcept {
  CallCounts s;
  for (std::size_t i = 0; i < calls_.size(); ++i) {
    s.calls[i] = calls_[i].load(std::memory_order_relaxed);
    s.nanoseconds[i] = nanoseconds_[i].load(std::memory_order_relaxed);
  }
  return s;
}

}  // namespace gvm::vmm
