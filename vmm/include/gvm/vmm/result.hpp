// Result codes of the driver boundary, and the error type that carries them.
//
// The numeric values are the CUDA driver's own CUresult values, so CudaDriver
// passes a driver result through unchanged and SimDriver returns exactly what
// the real driver would. Nothing outside vmm/ needs <cuda.h> to read them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gvm::vmm {

enum class Result : int {
  success = 0,
  invalid_value = 1,
  out_of_memory = 2,
  not_initialized = 3,
  deinitialized = 4,
  no_device = 100,
  invalid_device = 101,
  invalid_context = 201,
  invalid_handle = 400,
  illegal_state = 401,
  not_found = 500,
  not_ready = 600,
  illegal_address = 700,
  peer_access_already_enabled = 704,
  peer_access_not_enabled = 705,
  // The context was destroyed. Seen on an H200 for cuEventRecord on a stream
  // the program had destroyed (docs/measurements.md); the simulated driver
  // answers it to any use of a destroyed stream handle.
  context_is_destroyed = 709,
  launch_failed = 719,
  not_permitted = 800,
  not_supported = 801,
  stream_capture_unsupported = 900,  // a call the capture forbids
  stream_capture_invalidated = 901,  // the capture failed earlier
  stream_capture_unmatched = 903,  // the capture was not begun on this stream
  stream_capture_unjoined = 904,
  stream_capture_isolation = 905,    // a dependency across the capture's boundary
  stream_capture_implicit = 906,     // an implicit dependency on a capturing stream
  captured_event = 907,              // an event last recorded inside a capture
  stream_capture_wrong_thread = 908,
  unknown = 999,
};

// "CUDA_ERROR_OUT_OF_MEMORY"-style name; "CUresult(<n>)" for a value we do not name.
std::string result_name(Result r);

// A result that leaves the context unusable: every later call fails too.
constexpr bool is_sticky(Result r) noexcept {
  return r == Result::illegal_address || r == Result::launch_failed ||
         r == Result::context_is_destroyed;
}

// A failed driver call, with the call's name and what it was asked to do
// ("cuMemCreate(device 1, 2097152 bytes)").
class DriverError : public std::runtime_error {
 public:
  DriverError(Result result, const std::string& what_was_called);
  Result result() const noexcept { return result_; }

 private:
  Result result_;
};

// Throws DriverError unless r is success. `context` is formatted lazily by the
// caller only on failure, so the success path costs one comparison.
inline void check(Result r, const char* call) {
  if (r != Result::success) throw DriverError(r, call);
}

}  // namespace gvm::vmm
