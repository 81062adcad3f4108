// DeviceCaps: what one device can do, read once from the driver.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gvm/vmm/driver.hpp"

namespace gvm::vmm {

struct DeviceCaps {
  int device = -1;
  std::string name;
  int cc_major = 0;  // compute capability, e.g. 9.0 for H200
  int cc_minor = 0;
  bool vmm = false;  // cuMemCreate / cuMemMap / cuMemSetAccess supported
  bool posix_fd_handles = false;
  bool fabric_handles = false;
  bool compression = false;
  std::size_t granularity = 0;              // minimum allocation granularity
  std::size_t recommended_granularity = 0;  // recommended allocation granularity
  std::size_t total_memory = 0;
  // can_access_peer[p]: cuDeviceCanAccessPeer(this device, p); false for itself.
  std::vector<bool> can_access_peer;

  int compute_capability() const noexcept { return cc_major * 10 + cc_minor; }
};

// Reads every field of `device`. Throws DriverError naming the call that failed.
DeviceCaps read_device_caps(Driver& driver, int device);

// All devices, in order. Throws DriverError (no_device when there is none).
std::vector<DeviceCaps> read_all_device_caps(Driver& driver);

}  // namespace gvm::vmm
