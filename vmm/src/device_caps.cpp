// DeviceCaps from the Driver interface alone, so the same code reads a real
// GPU and a simulated one.
#include "gvm/vmm/device_caps.hpp"

#include <string>

namespace gvm::vmm {
namespace {

const char* attribute_name(DeviceAttribute a) noexcept {
  switch (a) {
    case DeviceAttribute::compute_capability_major: return "compute_capability_major";
    case DeviceAttribute::compute_capability_minor: return "compute_capability_minor";
    case DeviceAttribute::vmm_supported: return "vmm_supported";
    case DeviceAttribute::posix_fd_handle_supported: return "posix_fd_handle_supported";
    case DeviceAttribute::fabric_handle_supported: return "fabric_handle_supported";
    case DeviceAttribute::generic_compression_supported: return "generic_compression_supported";
    case DeviceAttribute::unified_addressing: return "unified_addressing";
    case DeviceAttribute::multiprocessor_count: return "multiprocessor_count";
  }
  return "?";
}

std::string on(const char* call, int device, const std::string& detail = {}) {
  return std::string(call) + "(device " + std::to_string(device) + (detail.empty() ? "" : ", ") +
         detail + ")";
}

int attribute(Driver& driver, int device, DeviceAttribute a) {
  int v = 0;
  Result r = driver.device_attribute(device, a, &v);
  if (r != Result::success)
    throw DriverError(r, on(call_name(Call::device_attribute), device, attribute_name(a)));
  return v;
}

std::size_t granularity(Driver& driver, int device, GranularityKind kind) {
  std::size_t g = 0;
  Result r = driver.allocation_granularity(device, kind, &g);
  if (r != Result::success) {
    throw DriverError(r, on(call_name(Call::allocation_granularity), device,
                            kind == GranularityKind::minimum ? "minimum" : "recommended"));
  }
  return g;
}

int count_devices(Driver& driver) {
  int n = 0;
  Result r = driver.device_count(&n);
  if (r != Result::success) throw DriverError(r, call_name(Call::device_count));
  return n;
}

}  // namespace

DeviceCaps read_device_caps(Driver& driver, int device) {
  DeviceCaps c;
  c.device = device;
  Result r = driver.device_name(device, &c.name);
  if (r != Result::success) throw DriverError(r, on(call_name(Call::device_name), device));
  c.cc_major = attribute(driver, device, DeviceAttribute::compute_capability_major);
  c.cc_minor = attribute(driver, device, DeviceAttribute::compute_capability_minor);
  c.vmm = attribute(driver, device, DeviceAttribute::vmm_supported) != 0;
  c.posix_fd_handles = attribute(driver, device, DeviceAttribute::posix_fd_handle_supported) != 0;
  c.fabric_handles = attribute(driver, device, DeviceAttribute::fabric_handle_supported) != 0;
  c.compression = attribute(driver, device, DeviceAttribute::generic_compression_supported) != 0;
  // Granularity is a VMM notion; without VMM the driver has none to report.
  if (c.vmm) {
    c.granularity = granularity(driver, device, GranularityKind::minimum);
    c.recommended_granularity = granularity(driver, device, GranularityKind::recommended);
  }
  r = driver.device_total_memory(device, &c.total_memory);
  if (r != Result::success) throw DriverError(r, on(call_name(Call::device_total_memory), device));

  const int n = count_devices(driver);
  c.can_access_peer.assign(static_cast<std::size_t>(n), false);
  for (int p = 0; p < n; ++p) {
    if (p == device) continue;
    bool can = false;
    r = driver.can_access_peer(device, p, &can);
    if (r != Result::success) {
      throw DriverError(r,
                        on(call_name(Call::can_access_peer), device, "peer " + std::to_string(p)));
    }
    c.can_access_peer[static_cast<std::size_t>(p)] = can;
  }
  return c;
}

std::vector<DeviceCaps> read_all_device_caps(Driver& driver) {
  const int n = count_devices(driver);
  if (n <= 0)
    throw DriverError(Result::no_device,
                      std::string(call_name(Call::device_count)) + " (no device)");
  std::vector<DeviceCaps> all;
  all.reserve(static_cast<std::size_t>(n));
  for (int d = 0; d < n; ++d) all.push_back(read_device_caps(driver, d));
  return all;
}

}  // namespace gvm::vmm
