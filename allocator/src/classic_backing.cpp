// ClassicBacking: cuMemAlloc segments, for devices without VMM
// (physical_backing.hpp).
#include "physical_backing.hpp"

namespace gvm::detail {
namespace {

class ClassicBacking final : public PhysicalBacking {
 public:
  ClassicBacking(vmm::Driver& driver, const vmm::DeviceCaps& caps) : driver_(driver), caps_(caps) {}

  bool on_demand() const noexcept override { return false; }

  vmm::ReservedRange reserve(std::size_t, std::size_t, RegionKind) override {
    throw vmm::DriverError(vmm::Result::not_supported, "cuMemAddressReserve (no VMM)");
  }

  vmm::Result allocate_segment(std::size_t* bytes, std::size_t alignment,
                               vmm::DevicePtr* out) override {
    vmm::DevicePtr p = 0;
    vmm::Result r = driver_.mem_alloc(caps_.device, *bytes, &p);
    if (r != vmm::Result::success) return r;
    if (p % alignment != 0) {
      // Spans need granule alignment; cuMemAlloc gives it for whole granules
      // in practice, but the API promises only 256 bytes.
      (void)driver_.mem_free(caps_.device, p);
      r = driver_.mem_alloc(caps_.device, *bytes + alignment, &p);
      if (r != vmm::Result::success) return r;
      *bytes += alignment;
    }
    *out = p;
    return vmm::Result::success;
  }

  std::vector<vmm::MappedChunk> map(std::vector<ChunkPlan>&,
                                    const std::vector<vmm::AccessDesc>&) override {
    throw vmm::DriverError(vmm::Result::not_supported, "cuMemMap (no VMM)");
  }

 private:
  vmm::Driver& driver_;
  const vmm::DeviceCaps& caps_;
};

}  // namespace

std::unique_ptr<PhysicalBacking> make_classic_backing(vmm::Driver& driver,
                                                      const vmm::DeviceCaps& caps) {
  return std::make_unique<ClassicBacking>(driver, caps);
}

}  // namespace gvm::detail
