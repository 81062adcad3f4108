// Statistics: per device, plus driver calls by entry point.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <stddef.h>
#include <stdint.h>

#include "gvm/device_stats_fields.h"
#include "gvm/vmm/driver.hpp"

namespace gvm {

// Every field comes from one table (device_stats_fields.h). Peaks: with one
// allocating thread peak_live_bytes is exact; with several it can lag by what
// other threads allocated since a heap last summed the device
// (docs/design-notes.md, "Small blocks"). peak_reserved_bytes is exact.
struct DeviceStats {
#define GVM_STATS_MEMBER(type, name, doc) type name = 0;
  GVM_DEVICE_STATS_FIELDS(GVM_STATS_MEMBER)
#undef GVM_STATS_MEMBER
  DeviceStats() noexcept { device = -1; }
};

struct DriverCallStats {
  std::array<std::uint64_t, vmm::kCallCount> calls{};
  std::array<std::uint64_t, vmm::kCallCount> nanoseconds{};
  std::uint64_t total_calls() const noexcept;
  std::uint64_t total_nanoseconds() const noexcept;
};

struct Stats {
  std::vector<DeviceStats> devices;
  DriverCallStats driver;
};

// One JSON object: {"devices":[{...}], "driver_calls":{"cuMemCreate":{"calls":n,"ns":t},...}}
std::string to_json(const Stats& s);

}  // namespace gvm
