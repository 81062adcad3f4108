// Driver: the one interface to the CUDA driver.
//
// Every driver entry point gvmalloc uses is a virtual function here that
// returns the driver's result code. Two implementations:
//   CudaDriver  the real driver, loaded at run time (cuda_driver.hpp)
//   SimDriver   a CPU simulation for tests and replay (sim_driver.hpp)
// Nothing outside vmm/ includes <cuda.h> or names a cu* function.
//
// Threading: every method may be called from any thread. Calls that act on a
// device make that device's primary context current on the calling thread
// first (the context PyTorch and CuPy use), so callers never manage contexts.
#pragma once

#include <cstddef>
#include <string>

#include "gvm/vmm/result.hpp"
#include "gvm/vmm/types.hpp"

namespace gvm::vmm {

// Every entry point, by name: fault injection (SimDriver) and per-call
// statistics (the allocator) index by it. X(enum_name, "cuName").
#define GVM_VMM_DRIVER_CALLS(X)                              \
  X(device_count, "cuDeviceGetCount")                        \
  X(device_name, "cuDeviceGetName")                          \
  X(device_attribute, "cuDeviceGetAttribute")                \
  X(device_total_memory, "cuDeviceTotalMem")                 \
  X(mem_get_info, "cuMemGetInfo")                            \
  X(allocation_granularity, "cuMemGetAllocationGranularity") \
  X(can_access_peer, "cuDeviceCanAccessPeer")                \
  X(ctx_synchronize, "cuCtxSynchronize")                     \
  X(enable_peer_access, "cuCtxEnablePeerAccess")             \
  X(disable_peer_access, "cuCtxDisablePeerAccess")           \
  X(address_reserve, "cuMemAddressReserve")                  \
  X(address_free, "cuMemAddressFree")                        \
  X(mem_create, "cuMemCreate")                               \
  X(mem_release, "cuMemRelease")                             \
  X(mem_map, "cuMemMap")                                     \
  X(mem_unmap, "cuMemUnmap")                                 \
  X(mem_set_access, "cuMemSetAccess")                        \
  X(mem_get_access, "cuMemGetAccess")                        \
  X(export_shareable_handle, "cuMemExportToShareableHandle") \
  X(import_shareable_handle, "cuMemImportFromShareableHandle") \
  X(mem_alloc, "cuMemAlloc")                                 \
  X(mem_free, "cuMemFree")                                   \
  X(stream_create, "cuStreamCreate")                         \
  X(stream_destroy, "cuStreamDestroy")                       \
  X(stream_synchronize, "cuStreamSynchronize")               \
  X(stream_wait_event, "cuStreamWaitEvent")                  \
  X(event_create, "cuEventCreate")                           \
  X(event_destroy, "cuEventDestroy")                         \
  X(event_record, "cuEventRecord")                           \
  X(event_query, "cuEventQuery")                             \
  X(event_synchronize, "cuEventSynchronize")                 \
  X(memcpy_async, "cuMemcpyAsync")                           \
  X(memcpy_peer_async, "cuMemcpyPeerAsync")                  \
  X(memcpy_htod, "cuMemcpyHtoD")                             \
  X(memcpy_dtoh, "cuMemcpyDtoH")                             \
  X(memset_d8_async, "cuMemsetD8Async")                      \
  X(module_load_data, "cuModuleLoadData")                    \
  X(module_unload, "cuModuleUnload")                         \
  X(module_get_function, "cuModuleGetFunction")              \
  X(launch_kernel, "cuLaunchKernel")

enum class Call : int {
#define GVM_VMM_ENUM(name, cu_name) name,
  GVM_VMM_DRIVER_CALLS(GVM_VMM_ENUM)
#undef GVM_VMM_ENUM
      count_
};
constexpr int kCallCount = static_cast<int>(Call::count_);

// "cuMemCreate" for Call::mem_create.
const char* call_name(Call c) noexcept;

class Driver {
 public:
  virtual ~Driver() = default;
  Driver() = default;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // "cuda" or "sim".
  virtual const char* name() const noexcept = 0;

  // --- devices -------------------------------------------------------------
  virtual Result device_count(int* count) = 0;
  virtual Result device_name(int device, std::string* name) = 0;
  virtual Result device_attribute(int device, DeviceAttribute attr, int* value) = 0;
  virtual Result device_total_memory(int device, std::size_t* bytes) = 0;
  virtual Result mem_get_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) = 0;
  // Granularity of pinned device memory on `device` (cuMemGetAllocationGranularity).
  virtual Result allocation_granularity(int device, GranularityKind kind, std::size_t* bytes) = 0;
  virtual Result can_access_peer(int device, int peer, bool* can) = 0;

  // --- contexts (the primary context of each device) -----------------------
  virtual Result ctx_synchronize(int device) = 0;
  // Lets `device`'s context access memory allocated on `peer` (global toggle).
  virtual Result enable_peer_access(int device, int peer) = 0;
  virtual Result disable_peer_access(int device, int peer) = 0;

  // --- virtual memory ------------------------------------------------------
  virtual Result address_reserve(std::size_t size, std::size_t alignment, DevicePtr* addr) = 0;
  virtual Result address_free(DevicePtr addr, std::size_t size) = 0;
  // Pinned device memory on `device`; `exportable` asks for the handle types
  // the device supports (POSIX fd) so that it can be shared with another process.
  virtual Result mem_create(int device, std::size_t size, ShareableHandleType exportable,
                            PhysHandle* handle) = 0;
  virtual Result mem_release(PhysHandle handle) = 0;
  virtual Result mem_map(DevicePtr addr, std::size_t size, PhysHandle handle) = 0;
  virtual Result mem_unmap(DevicePtr addr, std::size_t size) = 0;
  virtual Result mem_set_access(DevicePtr addr, std::size_t size, const AccessDesc* descs,
                                std::size_t count) = 0;
  virtual Result mem_get_access(DevicePtr addr, int device, Access* access) = 0;
  // For posix_fd, *out is an int file descriptor.
  virtual Result export_shareable_handle(PhysHandle handle, ShareableHandleType type, void* out) = 0;
  virtual Result import_shareable_handle(void* shareable, ShareableHandleType type,
                                         PhysHandle* handle) = 0;

  // --- classic allocation (devices without VMM) ----------------------------
  virtual Result mem_alloc(int device, std::size_t size, DevicePtr* addr) = 0;
  virtual Result mem_free(int device, DevicePtr addr) = 0;

  // --- streams and events (fencing, stream order) --------------------------
  virtual Result stream_create(int device, StreamHandle* stream) = 0;
  virtual Result stream_destroy(int device, StreamHandle stream) = 0;
  // `device` names the device whose legacy default stream nullptr means.
  virtual Result stream_synchronize(int device, StreamHandle stream) = 0;
  virtual Result stream_wait_event(int device, StreamHandle stream, EventHandle event) = 0;
  // Events are created without timing (cheap record/wait).
  virtual Result event_create(int device, EventHandle* event) = 0;
  virtual Result event_destroy(EventHandle event) = 0;
  virtual Result event_record(int device, EventHandle event, StreamHandle stream) = 0;
  // success when complete, not_ready while work before it is pending.
  virtual Result event_query(EventHandle event) = 0;
  virtual Result event_synchronize(EventHandle event) = 0;

  // --- copies (staged peer copies, tests) ----------------------------------
  virtual Result memcpy_async(int device, DevicePtr dst, DevicePtr src, std::size_t bytes,
                              StreamHandle stream) = 0;
  virtual Result memcpy_peer_async(DevicePtr dst, int dst_device, DevicePtr src, int src_device,
                                   std::size_t bytes, StreamHandle stream) = 0;
  virtual Result memcpy_htod(int device, DevicePtr dst, const void* src, std::size_t bytes) = 0;
  virtual Result memcpy_dtoh(int device, void* dst, DevicePtr src, std::size_t bytes) = 0;
  virtual Result memset_d8_async(int device, DevicePtr dst, unsigned char value, std::size_t bytes,
                                 StreamHandle stream) = 0;

  // --- test kernels (PTX, JIT-compiled by the driver for any GPU) ----------
  virtual Result module_load_data(int device, const char* ptx, ModuleHandle* module) = 0;
  virtual Result module_unload(int device, ModuleHandle module) = 0;
  virtual Result module_get_function(ModuleHandle module, const char* name,
                                     FunctionHandle* function) = 0;
  virtual Result launch_kernel(int device, FunctionHandle function, unsigned grid_x,
                               unsigned block_x, StreamHandle stream, void** args) = 0;
};

}  // namespace gvm::vmm
