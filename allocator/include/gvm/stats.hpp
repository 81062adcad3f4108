// Statistics: per device, plus driver calls by entry point.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gvm/vmm/driver.hpp"

namespace gvm {

struct DeviceStats {
  int device = -1;
  std::size_t live_bytes = 0;      // handed out to callers (requested sizes rounded up)
  std::size_t reserved_bytes = 0;  // physically mapped (arena + scratch)
  std::size_t cached_bytes = 0;    // reserved but not live
  // Peaks. With one allocating thread, peak_live_bytes is exact; with
  // several, it can lag by what other threads allocated since a thread last
  // summed the device (docs/design-notes.md, "Small blocks"). With a scratch
  // buffer, both peaks are the arena's plus the scratch's: an upper bound.
  std::size_t peak_live_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::size_t scratch_reserved_bytes = 0;  // part of reserved_bytes
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t cache_hits = 0;  // allocations served without growing
  std::uint64_t chunks_mapped = 0;
  std::uint64_t chunks_unmapped = 0;
  std::uint64_t oom_retries = 0;
  std::uint64_t fences = 0;
  std::uint64_t cross_stream_waits = 0;  // blocks handed to another stream behind an event
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
