// Fence: the one place that decides when an access change, an unmap or a
// peer-access toggle is safe.
//
// Rule: before changing what a range may be touched by, wait for every stream
// on every device that may have touched it - not only the current device.
// MEASUREMENTS.md: disabling peer access with a peer copy queued failed 20 of
// 20 runs on two H200s (a sticky CUDA_ERROR_LAUNCH_FAILED); with both devices
// synchronised first, 0 of 20. Revoking a peer's access while a peer kernel
// reads gives a sticky illegal address.
//
// wait() records an event on each stream and synchronises it: it waits for
// the work queued on those streams so far and nothing else, where a device
// synchronisation would also wait for unrelated streams (docs/peer-access.md
// measures both). A stream the driver rejects (destroyed by its owner, or a
// peer device's stream recorded on a block) makes the fence fall back to
// synchronising every device.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "gvm/vmm/driver.hpp"
#include "gvm/vmm/owners.hpp"

namespace gvm::detail {

struct StreamRef {
  int device = -1;
  vmm::StreamHandle stream = nullptr;
  friend bool operator==(const StreamRef&, const StreamRef&) = default;
};

class Fence {
 public:
  Fence(vmm::Driver& driver, int device_count, bool enabled);

  // Returns when all work queued so far on each stream is complete.
  // Throws DriverError when the driver cannot tell (a sticky error): the
  // caller must then leave the range as it is.
  void wait(const std::vector<StreamRef>& streams);
  // Synchronises each device's context (the fallback, and what a fence
  // without stream tracking would do).
  void wait_devices(const std::vector<int>& devices);

  bool enabled() const noexcept { return enabled_; }
  std::uint64_t count() const noexcept;

 private:
  vmm::Event& event_for(int device);  // lock_ held

  vmm::Driver& driver_;
  bool enabled_;
  mutable std::mutex lock_;
  std::vector<vmm::Event> events_;  // one per device, created on first use
  std::uint64_t count_ = 0;
};

}  // namespace gvm::detail
