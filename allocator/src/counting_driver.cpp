#include "counting_driver.hpp"

#include <chrono>

namespace gvm::detail {

using vmm::Call;
using vmm::Result;

template <class F>
Result CountingDriver::timed(Call call, F&& forward) {
  const auto start = std::chrono::steady_clock::now();
  const Result r = forward();
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  const auto i = static_cast<std::size_t>(call);
  // Failed calls count too: their time is spent all the same.
  calls_[i].fetch_add(1, std::memory_order_relaxed);
  nanoseconds_[i].fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  return r;
}

DriverCallStats CountingDriver::snapshot() const noexcept {
  DriverCallStats s;
  for (std::size_t i = 0; i < calls_.size(); ++i) {
    s.calls[i] = calls_[i].load(std::memory_order_relaxed);
    s.nanoseconds[i] = nanoseconds_[i].load(std::memory_order_relaxed);
  }
  return s;
}

// Each forwarder names its Call explicitly; the test checks that every Call is
// counted under its own name, so a copy-paste slip here cannot go unnoticed.
#define GVM_FORWARD(call_enum, expr) return timed(Call::call_enum, [&] { return inner_.expr; })

Result CountingDriver::device_count(int* count) {
  GVM_FORWARD(device_count, device_count(count));
}
Result CountingDriver::device_name(int device, std::string* name) {
  GVM_FORWARD(device_name, device_name(device, name));
}
Result CountingDriver::device_attribute(int device, vmm::DeviceAttribute attr, int* value) {
  GVM_FORWARD(device_attribute, device_attribute(device, attr, value));
}
Result CountingDriver::device_total_memory(int device, std::size_t* bytes) {
  GVM_FORWARD(device_total_memory, device_total_memory(device, bytes));
}
Result CountingDriver::mem_get_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) {
  GVM_FORWARD(mem_get_info, mem_get_info(device, free_bytes, total_bytes));
}
Result CountingDriver::allocation_granularity(int device, vmm::GranularityKind kind,
                                              std::size_t* bytes) {
  GVM_FORWARD(allocation_granularity, allocation_granularity(device, kind, bytes));
}
Result CountingDriver::can_access_peer(int device, int peer, bool* can) {
  GVM_FORWARD(can_access_peer, can_access_peer(device, peer, can));
}

Result CountingDriver::ctx_synchronize(int device) {
  GVM_FORWARD(ctx_synchronize, ctx_synchronize(device));
}
Result CountingDriver::enable_peer_access(int device, int peer) {
  GVM_FORWARD(enable_peer_access, enable_peer_access(device, peer));
}
Result CountingDriver::disable_peer_access(int device, int peer) {
  GVM_FORWARD(disable_peer_access, disable_peer_access(device, peer));
}

Result CountingDriver::address_reserve(std::size_t size, std::size_t alignment,
                                       vmm::DevicePtr* addr) {
  GVM_FORWARD(address_reserve, address_reserve(size, alignment, addr));
}
Result CountingDriver::address_free(vmm::DevicePtr addr, std::size_t size) {
  GVM_FORWARD(address_free, address_free(addr, size));
}
Result CountingDriver::mem_create(int device, std::size_t size, vmm::ShareableHandleType exportable,
                                  vmm::PhysHandle* handle) {
  GVM_FORWARD(mem_create, mem_create(device, size, exportable, handle));
}
Result CountingDriver::mem_release(vmm::PhysHandle handle) {
  GVM_FORWARD(mem_release, mem_release(handle));
}
Result CountingDriver::mem_map(vmm::DevicePtr addr, std::size_t size, vmm::PhysHandle handle) {
  GVM_FORWARD(mem_map, mem_map(addr, size, handle));
}
Result CountingDriver::mem_unmap(vmm::DevicePtr addr, std::size_t size) {
  GVM_FORWARD(mem_unmap, mem_unmap(addr, size));
}
Result CountingDriver::mem_set_access(vmm::DevicePtr addr, std::size_t size,
                                      const vmm::AccessDesc* descs, std::size_t count) {
  GVM_FORWARD(mem_set_access, mem_set_access(addr, size, descs, count));
}
Result CountingDriver::mem_get_access(vmm::DevicePtr addr, int device, vmm::Access* access) {
  GVM_FORWARD(mem_get_access, mem_get_access(addr, device, access));
}
Result CountingDriver::export_shareable_handle(vmm::PhysHandle handle,
                                               vmm::ShareableHandleType type, void* out) {
  GVM_FORWARD(export_shareable_handle, export_shareable_handle(handle, type, out));
}
Result CountingDriver::import_shareable_handle(void* shareable, vmm::ShareableHandleType type,
                                               vmm::PhysHandle* handle) {
  GVM_FORWARD(import_shareable_handle, import_shareable_handle(shareable, type, handle));
}

Result CountingDriver::mem_alloc(int device, std::size_t size, vmm::DevicePtr* addr) {
  GVM_FORWARD(mem_alloc, mem_alloc(device, size, addr));
}
Result CountingDriver::mem_free(int device, vmm::DevicePtr addr) {
  GVM_FORWARD(mem_free, mem_free(device, addr));
}

Result CountingDriver::stream_create(int device, vmm::StreamHandle* stream) {
  GVM_FORWARD(stream_create, stream_create(device, stream));
}
Result CountingDriver::stream_destroy(int device, vmm::StreamHandle stream) {
  GVM_FORWARD(stream_destroy, stream_destroy(device, stream));
}
Result CountingDriver::stream_synchronize(int device, vmm::StreamHandle stream) {
  GVM_FORWARD(stream_synchronize, stream_synchronize(device, stream));
}
Result CountingDriver::stream_wait_event(int device, vmm::StreamHandle stream,
                                         vmm::EventHandle event) {
  GVM_FORWARD(stream_wait_event, stream_wait_event(device, stream, event));
}
Result CountingDriver::event_create(int device, vmm::EventHandle* event) {
  GVM_FORWARD(event_create, event_create(device, event));
}
Result CountingDriver::event_destroy(vmm::EventHandle event) {
  GVM_FORWARD(event_destroy, event_destroy(event));
}
Result CountingDriver::event_record(int device, vmm::EventHandle event, vmm::StreamHandle stream) {
  GVM_FORWARD(event_record, event_record(device, event, stream));
}
Result CountingDriver::event_query(vmm::EventHandle event) {
  GVM_FORWARD(event_query, event_query(event));
}
Result CountingDriver::event_synchronize(vmm::EventHandle event) {
  GVM_FORWARD(event_synchronize, event_synchronize(event));
}

Result CountingDriver::memcpy_async(int device, vmm::DevicePtr dst, vmm::DevicePtr src,
                                    std::size_t bytes, vmm::StreamHandle stream) {
  GVM_FORWARD(memcpy_async, memcpy_async(device, dst, src, bytes, stream));
}
Result CountingDriver::memcpy_peer_async(vmm::DevicePtr dst, int dst_device, vmm::DevicePtr src,
                                         int src_device, std::size_t bytes,
                                         vmm::StreamHandle stream) {
  GVM_FORWARD(memcpy_peer_async,
              memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream));
}
Result CountingDriver::memcpy_htod(int device, vmm::DevicePtr dst, const void* src,
                                   std::size_t bytes) {
  GVM_FORWARD(memcpy_htod, memcpy_htod(device, dst, src, bytes));
}
Result CountingDriver::memcpy_dtoh(int device, void* dst, vmm::DevicePtr src, std::size_t bytes) {
  GVM_FORWARD(memcpy_dtoh, memcpy_dtoh(device, dst, src, bytes));
}
Result CountingDriver::memset_d8_async(int device, vmm::DevicePtr dst, unsigned char value,
                                       std::size_t bytes, vmm::StreamHandle stream) {
  GVM_FORWARD(memset_d8_async, memset_d8_async(device, dst, value, bytes, stream));
}

Result CountingDriver::module_load_data(int device, const char* ptx, vmm::ModuleHandle* module) {
  GVM_FORWARD(module_load_data, module_load_data(device, ptx, module));
}
Result CountingDriver::module_unload(int device, vmm::ModuleHandle module) {
  GVM_FORWARD(module_unload, module_unload(device, module));
}
Result CountingDriver::module_get_function(vmm::ModuleHandle module, const char* name,
                                           vmm::FunctionHandle* function) {
  GVM_FORWARD(module_get_function, module_get_function(module, name, function));
}
Result CountingDriver::launch_kernel(int device, vmm::FunctionHandle function, unsigned grid_x,
                                     unsigned block_x, vmm::StreamHandle stream, void** args) {
  GVM_FORWARD(launch_kernel, launch_kernel(device, function, grid_x, block_x, stream, args));
}

#undef GVM_FORWARD

}  // namespace gvm::detail
