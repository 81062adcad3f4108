// PhysicalBacking: where a heap's memory comes from - the only part of the
// heap wing that calls the driver to get or give memory. Two kinds behind
// one interface:
//
//   VmmBacking      address space reserved per region (cuMemAddressReserve),
//                   physical chunks mapped under blocks as they are needed
//                   (cuMemCreate + cuMemMap + cuMemSetAccess), dropped when
//                   wholly free (vmm_backing.cpp);
//   ClassicBacking  no VMM (old drivers, some vGPU/WSL setups): each region
//                   is one cuMemAlloc segment, backed as a whole, freed when
//                   wholly free (classic_backing.cpp).
//
// Thread-safe and lock-free itself: callers hold no heap lock while calling
// it (a driver call costs microseconds to milliseconds, docs/measurements.md),
// and the reserve cap is kept by the DeviceBudget they charge first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gvm/config.hpp"
#include "handle_stash.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/driver.hpp"
#include "gvm/vmm/owners.hpp"

namespace gvm::detail {

// What a new region is for: sizes differ (docs/design-notes.md).
enum class RegionKind { first_arena, stream_arena, scratch, pool };

class PhysicalBacking {
 public:
  virtual ~PhysicalBacking() = default;
  // VMM: regions are address space and chunks are mapped on demand.
  virtual bool on_demand() const noexcept = 0;
  // VMM: the address space of a region of at least min_bytes + alignment.
  // Throws DriverError.
  virtual vmm::ReservedRange reserve(std::size_t min_bytes, std::size_t alignment,
                                     RegionKind kind) = 0;
  // No VMM: a segment of *bytes (a multiple of the granule) in which a
  // block at `alignment` fits from its start; *out its address, *bytes what
  // was really allocated. Returns the driver's result (out_of_memory is the
  // caller's to handle).
  virtual vmm::Result allocate_segment(std::size_t* bytes, std::size_t alignment,
                                       vmm::DevicePtr* out) = 0;
  // VMM: the chunks of `plan` (plan_chunks, handle_stash.hpp) mapped and
  // granted to `access` (the owner first): each a new physical chunk of its
  // size, or the kept handle it carries. All or nothing: on a failure the
  // chunks made are undone (never touched: no fence), the kept handles not
  // yet mapped are released with them, and DriverError says which call
  // failed.
  virtual std::vector<vmm::MappedChunk> map(std::vector<ChunkPlan>& plan,
                                            const std::vector<vmm::AccessDesc>& access) = 0;
};

std::unique_ptr<PhysicalBacking> make_vmm_backing(vmm::Driver& driver, const vmm::DeviceCaps& caps,
                                                  const Config& config);
std::unique_ptr<PhysicalBacking> make_classic_backing(vmm::Driver& driver,
                                                      const vmm::DeviceCaps& caps);

}  // namespace gvm::detail
