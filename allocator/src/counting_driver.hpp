// CountingDriver: a Driver decorator that counts every call and its time.
//
// The allocator wraps the user's driver in one, so Stats can say which driver
// entry points ran, how often and for how long. Only driver calls pass through
// it, never the cache-hit path, and each call adds two steady_clock reads and
// two relaxed atomic adds (tens of ns) to a call that costs microseconds
// (MEASUREMENTS.md: cuMemMap 1-2 us, cuMemCreate 13-19 us for 2 MiB).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "gvm/stats.hpp"
#include "gvm/vmm/driver.hpp"

namespace gvm::detail {

class CountingDriver final : public vmm::Driver {
 public:
  // `inner` must outlive this object.
  explicit CountingDriver(vmm::Driver& inner) noexcept : inner_(inner) {}

  vmm::Driver& inner() const noexcept { return inner_; }

  // Counts so far. Each counter is read on its own (relaxed), so a snapshot
  // taken while other threads call the driver may be a call or two apart
  // between entries; every count is exact once the callers are quiet.
  DriverCallStats snapshot() const noexcept;

  const char* name() const noexcept override { return inner_.name(); }

  vmm::Result device_count(int* count) override;
  vmm::Result device_name(int device, std::string* name) override;
  vmm::Result device_attribute(int device, vmm::DeviceAttribute attr, int* value) override;
  vmm::Result device_total_memory(int device, std::size_t* bytes) override;
  vmm::Result mem_get_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) override;
  vmm::Result allocation_granularity(int device, vmm::GranularityKind kind,
                                     std::size_t* bytes) override;
  vmm::Result can_access_peer(int device, int peer, bool* can) override;

  vmm::Result ctx_synchronize(int device) override;
  vmm::Result enable_peer_access(int device, int peer) override;
  vmm::Result disable_peer_access(int device, int peer) override;

  vmm::Result address_reserve(std::size_t size, std::size_t alignment,
                              vmm::DevicePtr* addr) override;
  vmm::Result address_free(vmm::DevicePtr addr, std::size_t size) override;
  vmm::Result mem_create(int device, std::size_t size, vmm::ShareableHandleType exportable,
                         vmm::PhysHandle* handle) override;
  vmm::Result mem_release(vmm::PhysHandle handle) override;
  vmm::Result mem_map(vmm::DevicePtr addr, std::size_t size, vmm::PhysHandle handle) override;
  vmm::Result mem_unmap(vmm::DevicePtr addr, std::size_t size) override;
  vmm::Result mem_set_access(vmm::DevicePtr addr, std::size_t size, const vmm::AccessDesc* descs,
                             std::size_t count) override;
  vmm::Result mem_get_access(vmm::DevicePtr addr, int device, vmm::Access* access) override;
  vmm::Result export_shareable_handle(vmm::PhysHandle handle, vmm::ShareableHandleType type,
                                      void* out) override;
  vmm::Result import_shareable_handle(void* shareable, vmm::ShareableHandleType type,
                                      vmm::PhysHandle* handle) override;

  vmm::Result mem_alloc(int device, std::size_t size, vmm::DevicePtr* addr) override;
  vmm::Result mem_free(int device, vmm::DevicePtr addr) override;

  vmm::Result stream_create(int device, vmm::StreamHandle* stream) override;
  vmm::Result stream_destroy(int device, vmm::StreamHandle stream) override;
  vmm::Result stream_synchronize(int device, vmm::StreamHandle stream) override;
  vmm::Result stream_wait_event(int device, vmm::StreamHandle stream,
                                vmm::EventHandle event) override;
  vmm::Result event_create(int device, vmm::EventHandle* event) override;
  vmm::Result event_destroy(vmm::EventHandle event) override;
  vmm::Result event_record(int device, vmm::EventHandle event, vmm::StreamHandle stream) override;
  vmm::Result event_query(vmm::EventHandle event) override;
  vmm::Result event_synchronize(vmm::EventHandle event) override;

  vmm::Result memcpy_async(int device, vmm::DevicePtr dst, vmm::DevicePtr src, std::size_t bytes,
                           vmm::StreamHandle stream) override;
  vmm::Result memcpy_peer_async(vmm::DevicePtr dst, int dst_device, vmm::DevicePtr src,
                                int src_device, std::size_t bytes,
                                vmm::StreamHandle stream) override;
  vmm::Result memcpy_htod(int device, vmm::DevicePtr dst, const void* src,
                          std::size_t bytes) override;
  vmm::Result memcpy_dtoh(int device, void* dst, vmm::DevicePtr src, std::size_t bytes) override;
  vmm::Result memset_d8_async(int device, vmm::DevicePtr dst, unsigned char value,
                              std::size_t bytes, vmm::StreamHandle stream) override;

  vmm::Result module_load_data(int device, const char* ptx, vmm::ModuleHandle* module) override;
  vmm::Result module_unload(int device, vmm::ModuleHandle module) override;
  vmm::Result module_get_function(vmm::ModuleHandle module, const char* name,
                                  vmm::FunctionHandle* function) override;
  vmm::Result launch_kernel(int device, vmm::FunctionHandle function, unsigned grid_x,
                            unsigned block_x, vmm::StreamHandle stream, void** args) override;

 private:
  template <class F>
  vmm::Result timed(vmm::Call call, F&& forward);

  vmm::Driver& inner_;
  std::array<std::atomic<std::uint64_t>, vmm::kCallCount> calls_{};
  std::array<std::atomic<std::uint64_t>, vmm::kCallCount> nanoseconds_{};
};

}  // namespace gvm::detail
