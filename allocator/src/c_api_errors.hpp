// How the C ABI turns failures into a status and a per-thread message
// (internal; declared here so a unit test can check the exception mapping).
#pragma once

#include "gvm/gvm.h"

namespace gvm::detail {

// Records `status` and "<fn>: <what>" as the calling thread's last failure
// (gvm_last_status / gvm_last_error) and returns `status`. Never throws.
gvm_status record_failure(gvm_status status, const char* fn, const char* what) noexcept;

// Call only inside a catch block. Records the exception being handled:
//   vmm::DriverUnavailable          -> GVM_ERROR_NO_DRIVER
//   driver_error (vmm::DriverError) -> GVM_ERROR_DRIVER
//   out_of_memory, std::bad_alloc   -> GVM_ERROR_OUT_OF_MEMORY
//   config_error                    -> GVM_ERROR_CONFIG
//   usage_error                     -> GVM_ERROR_INVALID_ARGUMENT
//   anything else                   -> GVM_ERROR_INTERNAL
gvm_status record_current_exception(const char* fn) noexcept;

}  // namespace gvm::detail
