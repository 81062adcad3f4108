// VmmBacking: reservations and mapped chunks (physical_backing.hpp).
#include <algorithm>

#include "page_map.hpp"
#include "physical_backing.hpp"

namespace gvm::detail {
namespace {

constexpr std::size_t round_up(std::size_t x, std::size_t a) noexcept { return (x + a - 1) / a * a; }

class VmmBacking final : public PhysicalBacking {
 public:
  VmmBacking(vmm::Driver& driver, const vmm::DeviceCaps& caps, const Config& config)
      : driver_(driver), caps_(caps), config_(config) {}

  bool on_demand() const noexcept override { return true; }

  vmm::ReservedRange reserve(std::size_t min_bytes, std::size_t alignment,
                             RegionKind kind) override {
    // Address space is cheap (1 TiB reserves in ~3 us, docs/measurements.md):
    // the first arena of a device gets four times its memory, so that one
    // stream's heap never needs a second region; other streams' heaps and
    // the pools one device's worth; the scratch its configured size.
    std::size_t size = 0;
    switch (kind) {
      case RegionKind::first_arena:
        size = config_.arena_bytes != 0 ? config_.arena_bytes : 4 * caps_.total_memory;
        break;
      case RegionKind::stream_arena:
      case RegionKind::pool:
        size = config_.arena_bytes != 0 ? config_.arena_bytes : caps_.total_memory;
        break;
      case RegionKind::scratch:
        size = config_.scratch_arena_bytes != 0 ? config_.scratch_arena_bytes : caps_.total_memory;
        break;
    }
    size = std::max(round_up(size, std::size_t{1} << 30), round_up(min_bytes + alignment, kGranule));
    vmm::ReservedRange va(driver_, size, kGranule);
    if (!PageMap::in_range(va.base() + va.size() - 1))
      throw vmm::DriverError(vmm::Result::invalid_value,
                             "cuMemAddressReserve returned a range beyond the 49-bit space the "
                             "page map covers");
    return va;
  }

  vmm::Result allocate_segment(std::size_t*, std::size_t, vmm::DevicePtr*) override {
    return vmm::Result::not_supported;
  }

  std::vector<vmm::MappedChunk> map(std::vector<ChunkPlan>& plan,
                                    const std::vector<vmm::AccessDesc>& access) override {
    std::vector<vmm::MappedChunk> made;
    made.reserve(plan.size());
    for (ChunkPlan& c : plan) {
      // Create (or take the kept handle), map and grant in one step; a
      // failure undoes itself, the chunks made before it go when `made`
      // does, and the kept handles still in `plan` when the caller's plan
      // does.
      if (!c.reused.empty())
        made.emplace_back(driver_, c.addr, std::move(c.reused), access);
      else
        made.emplace_back(driver_, caps_.device, c.addr, c.size, access);
    }
    return made;
  }

 private:
  vmm::Driver& driver_;
  const vmm::DeviceCaps& caps_;
  const Config& config_;
};

}  // namespace

std::unique_ptr<PhysicalBacking> make_vmm_backing(vmm::Driver& driver, const vmm::DeviceCaps& caps,
                                                  const Config& config) {
  return std::make_unique<VmmBacking>(driver, caps, config);
}

}  // namespace gvm::detail
