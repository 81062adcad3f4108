// MappingLogDriver: another Driver seen through a log of what is mapped.
//
// Every call goes to the inner driver unchanged; a cuMemMap (or, without VMM,
// a cuMemAlloc) that succeeds adds its range to the log and a cuMemUnmap (or
// cuMemFree) that succeeds removes it. The
// log is the allocator's chunks (one mapping per cuMemCreate handle), which
// Allocator::memory_map merges into segments: gvm-excess needs them to tell a
// hole inside a chunk that holds live blocks from a chunk that is wholly free.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "gvm/vmm/driver.hpp"

namespace gvm::bench {

class MappingLogDriver final : public vmm::Driver {
 public:
  explicit MappingLogDriver(vmm::Driver& inner) : inner_(inner) {}

  // Mapped ranges: start address -> bytes.
  const std::map<vmm::DevicePtr, std::size_t>& mapped() const noexcept { return mapped_; }

  const char* name() const noexcept override { return inner_.name(); }

#define GVM_FWD(call, ...) return inner_.call(__VA_ARGS__)

  using Result = vmm::Result;
  Result device_count(int* count) override {
    GVM_FWD(device_count, count);
  }
  Result device_name(int device, std::string* name) override {
    GVM_FWD(device_name, device, name);
  }
  Result device_attribute(int device, vmm::DeviceAttribute attr, int* value) override {
    GVM_FWD(device_attribute, device, attr, value);
  }
  Result device_total_memory(int device, std::size_t* bytes) override {
    GVM_FWD(device_total_memory, device, bytes);
  }
  Result mem_get_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) override {
    GVM_FWD(mem_get_info, device, free_bytes, total_bytes);
  }
  Result allocation_granularity(int device, vmm::GranularityKind kind,
                                std::size_t* bytes) override {
    GVM_FWD(allocation_granularity, device, kind, bytes);
  }
  Result can_access_peer(int device, int peer, bool* can) override {
    GVM_FWD(can_access_peer, device, peer, can);
  }
  Result ctx_synchronize(int device) override {
    GVM_FWD(ctx_synchronize, device);
  }
  Result enable_peer_access(int device, int peer) override {
    GVM_FWD(enable_peer_access, device, peer);
  }
  Result disable_peer_access(int device, int peer) override {
    GVM_FWD(disable_peer_access, device, peer);
  }
  Result address_reserve(std::size_t size, std::size_t alignment, vmm::DevicePtr* addr) override {
    GVM_FWD(address_reserve, size, alignment, addr);
  }
  Result address_free(vmm::DevicePtr addr, std::size_t size) override {
    GVM_FWD(address_free, addr, size);
  }
  Result mem_create(int device, std::size_t size, vmm::ShareableHandleType exportable,
                    vmm::PhysHandle* handle) override {
    GVM_FWD(mem_create, device, size, exportable, handle);
  }
  Result mem_release(vmm::PhysHandle handle) override {
    GVM_FWD(mem_release, handle);
  }
  Result mem_map(vmm::DevicePtr addr, std::size_t size, vmm::PhysHandle handle) override {
    const Result r = inner_.mem_map(addr, size, handle);
    if (r == Result::success) mapped_[addr] = size;
    return r;
  }
  Result mem_unmap(vmm::DevicePtr addr, std::size_t size) override {
    const Result r = inner_.mem_unmap(addr, size);
    if (r == Result::success) mapped_.erase(addr);
    return r;
  }
  Result mem_set_access(vmm::DevicePtr addr, std::size_t size, const vmm::AccessDesc* descs,
                        std::size_t count) override {
    GVM_FWD(mem_set_access, addr, size, descs, count);
  }
  Result mem_get_access(vmm::DevicePtr addr, int device, vmm::Access* access) override {
    GVM_FWD(mem_get_access, addr, device, access);
  }
  Result export_shareable_handle(vmm::PhysHandle handle, vmm::ShareableHandleType type,
                                 void* out) override {
    GVM_FWD(export_shareable_handle, handle, type, out);
  }
  Result import_shareable_handle(void* shareable, vmm::ShareableHandleType type,
                                 vmm::PhysHandle* handle) override {
    GVM_FWD(import_shareable_handle, shareable, type, handle);
  }
  // Without VMM a chunk is a cuMemAlloc segment.
  Result mem_alloc(int device, std::size_t size, vmm::DevicePtr* addr) override {
    const Result r = inner_.mem_alloc(device, size, addr);
    if (r == Result::success) mapped_[*addr] = size;
    return r;
  }
  Result mem_free(int device, vmm::DevicePtr addr) override {
    const Result r = inner_.mem_free(device, addr);
    if (r == Result::success) mapped_.erase(addr);
    return r;
  }
  Result stream_create(int device, vmm::StreamHandle* stream) override {
    GVM_FWD(stream_create, device, stream);
  }
  Result stream_destroy(int device, vmm::StreamHandle stream) override {
    GVM_FWD(stream_destroy, device, stream);
  }
  Result stream_synchronize(int device, vmm::StreamHandle stream) override {
    GVM_FWD(stream_synchronize, device, stream);
  }
  Result stream_wait_event(int device, vmm::StreamHandle stream, vmm::EventHandle event) override {
    GVM_FWD(stream_wait_event, device, stream, event);
  }
  Result event_create(int device, vmm::EventHandle* event) override {
    GVM_FWD(event_create, device, event);
  }
  Result event_destroy(vmm::EventHandle event) override {
    GVM_FWD(event_destroy, event);
  }
  Result event_record(int device, vmm::EventHandle event, vmm::StreamHandle stream) override {
    GVM_FWD(event_record, device, event, stream);
  }
  Result event_query(vmm::EventHandle event) override {
    GVM_FWD(event_query, event);
  }
  Result event_synchronize(vmm::EventHandle event) override {
    GVM_FWD(event_synchronize, event);
  }
  Result memcpy_async(int device, vmm::DevicePtr dst, vmm::DevicePtr src, std::size_t bytes,
                      vmm::StreamHandle stream) override {
    GVM_FWD(memcpy_async, device, dst, src, bytes, stream);
  }
  Result memcpy_peer_async(vmm::DevicePtr dst, int dst_device, vmm::DevicePtr src, int src_device,
                           std::size_t bytes, vmm::StreamHandle stream) override {
    GVM_FWD(memcpy_peer_async, dst, dst_device, src, src_device, bytes, stream);
  }
  Result memcpy_htod(int device, vmm::DevicePtr dst, const void* src, std::size_t bytes) override {
    GVM_FWD(memcpy_htod, device, dst, src, bytes);
  }
  Result memcpy_dtoh(int device, void* dst, vmm::DevicePtr src, std::size_t bytes) override {
    GVM_FWD(memcpy_dtoh, device, dst, src, bytes);
  }
  Result memset_d8_async(int device, vmm::DevicePtr dst, unsigned char value, std::size_t bytes,
                         vmm::StreamHandle stream) override {
    GVM_FWD(memset_d8_async, device, dst, value, bytes, stream);
  }
  Result module_load_data(int device, const char* ptx, vmm::ModuleHandle* module) override {
    GVM_FWD(module_load_data, device, ptx, module);
  }
  Result module_unload(int device, vmm::ModuleHandle module) override {
    GVM_FWD(module_unload, device, module);
  }
  Result module_get_function(vmm::ModuleHandle module, const char* name,
                             vmm::FunctionHandle* function) override {
    GVM_FWD(module_get_function, module, name, function);
  }
  Result launch_kernel(int device, vmm::FunctionHandle function, unsigned grid_x, unsigned block_x,
                       vmm::StreamHandle stream, void** args) override {
    GVM_FWD(launch_kernel, device, function, grid_x, block_x, stream, args);
  }
#undef GVM_FWD

 private:
  vmm::Driver& inner_;
  std::map<vmm::DevicePtr, std::size_t> mapped_;
};

}  // namespace gvm::bench
