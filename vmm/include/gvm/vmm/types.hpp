// Plain types shared across the driver boundary.
//
// Glossary (used with these meanings everywhere in gvmalloc):
//   granule  the driver's allocation granularity (2 MiB on every GPU we know);
//            the unit of mapping.
//   chunk    one physical allocation (one cuMemCreate handle), a whole number
//            of granules, mapped at one place in a reservation.
//   block    what a caller gets from allocate(): a byte range inside an arena.
//   arena    one large virtual reservation per device, served by the front end.
//   scratch  a separate reservation per device whose chunks peers may access.
//   fence    waiting for every stream on every device that may have touched a
//            range, before its access is changed or it is unmapped.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gvm::vmm {

using DevicePtr = std::uint64_t;   // a device virtual address (CUdeviceptr)
using PhysHandle = std::uint64_t;  // a physical allocation (CUmemGenericAllocationHandle)
using StreamHandle = void*;        // a CUstream / cudaStream_t; nullptr is the legacy default stream
using EventHandle = void*;         // a CUevent
using ModuleHandle = void*;        // a CUmodule (test kernels only)
using FunctionHandle = void*;      // a CUfunction (test kernels only)

// Same values as CUmemAccess_flags.
enum class Access : int { none = 0, read = 1, read_write = 3 };

// "none", "read", "read_write": for messages and test reports.
constexpr const char* access_name(Access a) noexcept {
  switch (a) {
    case Access::none: return "none";
    case Access::read: return "read";
    case Access::read_write: return "read_write";
  }
  return "?";
}

struct AccessDesc {
  int device;
  Access access;
  friend bool operator==(const AccessDesc&, const AccessDesc&) = default;
};

// Device attributes the project reads (mapped onto CUdevice_attribute in CudaDriver).
enum class DeviceAttribute : int {
  compute_capability_major,
  compute_capability_minor,
  vmm_supported,
  posix_fd_handle_supported,
  fabric_handle_supported,
  generic_compression_supported,
  unified_addressing,
  multiprocessor_count,
};

enum class GranularityKind : int { minimum = 0, recommended = 1 };

// Same values as CUmemAllocationHandleType.
enum class ShareableHandleType : int { none = 0, posix_fd = 1, fabric = 8 };

// Same values as CUstreamCaptureStatus.
enum class CaptureStatus : int { none = 0, active = 1, invalidated = 2 };

// Same values as CUstreamCaptureMode. Which calls a capture forbids, and on
// which threads: global forbids the unsafe calls on every thread, local_thread
// (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) on the capturing thread only, relaxed
// on none (calls that conflict with the capture itself stay forbidden).
enum class CaptureMode : int { global = 0, local_thread = 1, relaxed = 2 };

// "none", "active", "invalidated"; "global", "thread_local", "relaxed".
constexpr const char* capture_status_name(CaptureStatus s) noexcept {
  switch (s) {
    case CaptureStatus::none: return "none";
    case CaptureStatus::active: return "active";
    case CaptureStatus::invalidated: return "invalidated";
  }
  return "?";
}
constexpr const char* capture_mode_name(CaptureMode m) noexcept {
  switch (m) {
    case CaptureMode::global: return "global";
    case CaptureMode::local_thread: return "thread_local";
    case CaptureMode::relaxed: return "relaxed";
  }
  return "?";
}

// Kinds of access a test (or the simulated driver) enqueues on a stream.
enum class AccessKind : int { read, write };

}  // namespace gvm::vmm
