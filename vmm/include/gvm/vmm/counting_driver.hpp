// CountingDriver: a ForwardingDriver that counts every call and its time.
//
// The allocator wraps the user's driver in one, so its stats can say which
// driver entry points ran, how often and for how long. Only driver calls pass
// through it, never the cache-hit path, and each call adds two steady_clock
// reads and two relaxed atomic adds (tens of ns) to a call that costs
// microseconds (docs/measurements.md: cuMemMap 1-2 us, cuMemCreate 13-19 us
// for 2 MiB).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "gvm/vmm/forwarding_driver.hpp"

namespace gvm::vmm {

// Calls and nanoseconds per entry point of Driver, by Call.
struct CallCounts {
  std::array<std::uint64_t, kCallCount> calls{};
  std::array<std::uint64_t, kCallCount> nanoseconds{};
  std::uint64_t total_calls() const noexcept {
    std::uint64_t n = 0;
    for (std::uint64_t c : calls) n += c;
    return n;
  }
  std::uint64_t total_nanoseconds() const noexcept {
    std::uint64_t n = 0;
    for (std::uint64_t t : nanoseconds) n += t;
    return n;
  }
};

class CountingDriver final : public ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;

  // Counts so far. Each counter is read on its own (relaxed), so a snapshot
  // taken while other threads call the driver may be a call or two apart
  // between entries; every count is exact once the callers are quiet.
  CallCounts snapshot() const noexcept;

 protected:
  // Failed calls count too: their time is spent all the same.
  Result intercept(Call call, ForwardedCall forward) override;

 private:
  std::array<std::atomic<std::uint64_t>, kCallCount> calls_{};
  std::array<std::atomic<std::uint64_t>, kCallCount> nanoseconds_{};
};

}  // namespace gvm::vmm
