// The driver boundary written once: one table per interface, each entry
//   X(name, "cuName", (parameters), (arguments))
// with its contract in the comment before it. From these tables come the
// Driver and TestDriver interfaces, the Call enum and call_name()
// (driver.hpp), the forwarding base (forwarding_driver.hpp), SimDriver's
// declarations and the decorators (counting_driver.hpp, the tests' own).
// Adding an entry point is one line here, then its implementation in
// CudaDriver and SimDriver; the build finds what is missing (CudaDriver stays
// abstract, SimDriver's definition is unresolved).
//
// Types are those of types.hpp and result.hpp, named without their namespace:
// expand the tables inside namespace gvm::vmm, or where a using-directive
// makes its names visible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gvm/vmm/result.hpp"
#include "gvm/vmm/types.hpp"

// The entry points of Driver (driver.hpp): everything the allocator calls.
// clang-format off
#define GVM_VMM_DRIVER_CALLS(X)                                                                    \
  /* --- devices ------------------------------------------------------------------------- */   \
  X(device_count, "cuDeviceGetCount", (int* count), (count))                                      \
  X(device_name, "cuDeviceGetName", (int device, std::string* name), (device, name))             \
  X(device_attribute, "cuDeviceGetAttribute",                                                     \
    (int device, DeviceAttribute attr, int* value), (device, attr, value))                        \
  X(device_total_memory, "cuDeviceTotalMem", (int device, std::size_t* bytes), (device, bytes))  \
  X(mem_get_info, "cuMemGetInfo",                                                                 \
    (int device, std::size_t* free_bytes, std::size_t* total_bytes),                              \
    (device, free_bytes, total_bytes))                                                            \
  /* Granularity of pinned device memory on `device` (cuMemGetAllocationGranularity). */         \
  X(allocation_granularity, "cuMemGetAllocationGranularity",                                      \
    (int device, GranularityKind kind, std::size_t* bytes), (device, kind, bytes))                \
  /* False for device == peer (a device is not its own peer). */                                  \
  X(can_access_peer, "cuDeviceCanAccessPeer", (int device, int peer, bool* can),                 \
    (device, peer, can))                                                                          \
  /* --- contexts (the primary context of each device) -------------------------------- */       \
  X(ctx_synchronize, "cuCtxSynchronize", (int device), (device))                                  \
  /* Lets `device`'s context access memory allocated on `peer` (global toggle). */                \
  X(enable_peer_access, "cuCtxEnablePeerAccess", (int device, int peer), (device, peer))         \
  X(disable_peer_access, "cuCtxDisablePeerAccess", (int device, int peer), (device, peer))       \
  /* --- virtual memory --------------------------------------------------------------------- */ \
  X(address_reserve, "cuMemAddressReserve",                                                       \
    (std::size_t size, std::size_t alignment, DevicePtr* addr), (size, alignment, addr))          \
  X(address_free, "cuMemAddressFree", (DevicePtr addr, std::size_t size), (addr, size))          \
  /* Pinned device memory on `device`; `exportable` asks for the handle types the device     */  \
  /* supports (POSIX fd, fabric) so that it can be shared with another process.              */  \
  X(mem_create, "cuMemCreate",                                                                    \
    (int device, std::size_t size, ShareableHandleType exportable, PhysHandle* handle),           \
    (device, size, exportable, handle))                                                           \
  X(mem_release, "cuMemRelease", (PhysHandle handle), (handle))                                   \
  X(mem_map, "cuMemMap", (DevicePtr addr, std::size_t size, PhysHandle handle),                  \
    (addr, size, handle))                                                                         \
  X(mem_unmap, "cuMemUnmap", (DevicePtr addr, std::size_t size), (addr, size))                   \
  X(mem_set_access, "cuMemSetAccess",                                                             \
    (DevicePtr addr, std::size_t size, const AccessDesc* descs, std::size_t count),               \
    (addr, size, descs, count))                                                                   \
  /* --- classic allocation (devices without VMM) --------------------------------------- */      \
  X(mem_alloc, "cuMemAlloc", (int device, std::size_t size, DevicePtr* addr),                    \
    (device, size, addr))                                                                         \
  /* Not an implicit synchronization: memory with work still queued on it (any stream of     */  \
  /* any device) must not be freed.                                                           */  \
  X(mem_free, "cuMemFree", (int device, DevicePtr addr), (device, addr))                         \
  /* --- streams ------------------------------------------------------------------------ */     \
  /* The stream's id: unique for the life of the process, never reused, even when the        */  \
  /* handle is (a destroyed stream's handle may come back from the next cuStreamCreate).     */  \
  /* Each device's legacy stream (nullptr) has one too. Of a capturing stream it fails and    */  \
  /* fails the capture, in every mode (docs/measurements.md, "Stream capture").               */  \
  X(stream_get_id, "cuStreamGetId", (int device, StreamHandle stream, std::uint64_t* id),        \
    (device, stream, id))                                                                         \
  /* Whether `stream` is capturing a CUDA graph: none, active, or invalidated (a call the     */  \
  /* capture forbids was made; the capture fails at its end). `capture_id` (may be null)     */  \
  /* receives the capture sequence's id, unique for the life of the process, when active.    */  \
  X(stream_capture_status, "cuStreamGetCaptureInfo",                                              \
    (int device, StreamHandle stream, CaptureStatus* status, std::uint64_t* capture_id),          \
    (device, stream, status, capture_id))                                                         \
  X(stream_wait_event, "cuStreamWaitEvent",                                                       \
    (int device, StreamHandle stream, EventHandle event), (device, stream, event))                \
  /* --- events (created without timing: cheap record and wait) ------------------------- */     \
  X(event_create, "cuEventCreate", (int device, EventHandle* event), (device, event))            \
  X(event_destroy, "cuEventDestroy", (EventHandle event), (event))                                \
  X(event_record, "cuEventRecord", (int device, EventHandle event, StreamHandle stream),         \
    (device, event, stream))                                                                      \
  /* success when complete, not_ready while work before it is pending. */                         \
  X(event_query, "cuEventQuery", (EventHandle event), (event))                                    \
  X(event_synchronize, "cuEventSynchronize", (EventHandle event), (event))                        \
  /* --- copies ------------------------------------------------------------------------- */     \
  /* A copy run by `device`'s engines on `stream` (a stream of `device`). Both ranges must   */  \
  /* be reachable by `device` itself: VMM memory it was not granted fails (the driver does   */  \
  /* not stage it), where memcpy_peer_async stages.                                          */  \
  X(memcpy_async, "cuMemcpyAsync",                                                                \
    (int device, DevicePtr dst, DevicePtr src, std::size_t bytes, StreamHandle stream),           \
    (device, dst, src, bytes, stream))                                                            \
  /* stream: a stream of dst_device; nullptr is dst_device's legacy stream. Staged by the    */  \
  /* driver through the owners where dst_device has no access to the source.                 */  \
  X(memcpy_peer_async, "cuMemcpyPeerAsync",                                                       \
    (DevicePtr dst, int dst_device, DevicePtr src, int src_device, std::size_t bytes,             \
     StreamHandle stream),                                                                        \
    (dst, dst_device, src, src_device, bytes, stream))

// The entry points of TestDriver (test_driver.hpp): what only tests,
// benchmarks and tools call, never the allocator.
#define GVM_VMM_TEST_CALLS(X)                                                                      \
  /* --- access and sharing --------------------------------------------------------------- */  \
  X(mem_get_access, "cuMemGetAccess", (DevicePtr addr, int device, Access* access),              \
    (addr, device, access))                                                                       \
  /* For posix_fd, *out is an int file descriptor. */                                             \
  X(export_shareable_handle, "cuMemExportToShareableHandle",                                      \
    (PhysHandle handle, ShareableHandleType type, void* out), (handle, type, out))                \
  /* For posix_fd, `shareable` is the descriptor cast to a pointer ((void*)(intptr_t)fd), as  */  \
  /* cuMemImportFromShareableHandle takes it; for fabric, it points at the 64 bytes.          */  \
  X(import_shareable_handle, "cuMemImportFromShareableHandle",                                    \
    (void* shareable, ShareableHandleType type, PhysHandle* handle), (shareable, type, handle))   \
  /* --- streams of the program's own ------------------------------------------------------- */ \
  /* A non-blocking stream (no implicit order with the legacy stream). After stream_destroy   */  \
  /* the handle is dead: any use of it is undefined until a stream_create returns it again.   */  \
  X(stream_create, "cuStreamCreate", (int device, StreamHandle* stream), (device, stream))       \
  X(stream_destroy, "cuStreamDestroy", (int device, StreamHandle stream), (device, stream))      \
  X(stream_synchronize, "cuStreamSynchronize", (int device, StreamHandle stream),                \
    (device, stream))                                                                             \
  /* Starts capturing `stream` (not a legacy stream) into a CUDA graph. */                        \
  X(stream_begin_capture, "cuStreamBeginCapture",                                                 \
    (int device, StreamHandle stream, CaptureMode mode), (device, stream, mode))                  \
  /* Ends the capture of `stream` and destroys the graph it made: success, or the error the  */  \
  /* capture ended with (stream_capture_invalidated after a call it forbids). On another     */  \
  /* thread than the one that began it (not relaxed): stream_capture_wrong_thread, and the   */  \
  /* capture is over all the same.                                                           */  \
  X(stream_end_capture, "cuStreamEndCapture", (int device, StreamHandle stream),                 \
    (device, stream))                                                                             \
  /* --- synchronous copies and fills ------------------------------------------------------ */  \
  /* Synchronous: ordered on `device`'s legacy stream, complete on return. */                     \
  X(memcpy_htod, "cuMemcpyHtoD", (int device, DevicePtr dst, const void* src, std::size_t bytes), \
    (device, dst, src, bytes))                                                                    \
  X(memcpy_dtoh, "cuMemcpyDtoH", (int device, void* dst, DevicePtr src, std::size_t bytes),      \
    (device, dst, src, bytes))                                                                    \
  X(memset_d8_async, "cuMemsetD8Async",                                                           \
    (int device, DevicePtr dst, unsigned char value, std::size_t bytes, StreamHandle stream),     \
    (device, dst, value, bytes, stream))                                                          \
  /* --- test kernels (PTX, JIT-compiled by the driver for any GPU) ------------------------ */  \
  X(module_load_data, "cuModuleLoadData", (int device, const char* ptx, ModuleHandle* module),   \
    (device, ptx, module))                                                                        \
  X(module_unload, "cuModuleUnload", (int device, ModuleHandle module), (device, module))        \
  X(module_get_function, "cuModuleGetFunction",                                                   \
    (ModuleHandle module, const char* name, FunctionHandle* function), (module, name, function))  \
  X(launch_kernel, "cuLaunchKernel",                                                              \
    (int device, FunctionHandle function, unsigned grid_x, unsigned block_x, StreamHandle stream, \
     void** args),                                                                                \
    (device, function, grid_x, block_x, stream, args))
// clang-format on
