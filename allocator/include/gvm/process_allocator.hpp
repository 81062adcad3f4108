// The one process-wide Allocator that the C ABI (gvm.h) serves, for C++ code
// that plugs gvmalloc into a runtime (the PyTorch backend in
// integrations/torch/) and must share its heaps with the C entry points.
#pragma once

#include "gvm/allocator.hpp"

namespace gvm {

// The running allocator; started on the real driver from GVM_CONF when none
// is running yet (as the framework entry points of gvm.h do). Valid until
// gvm_shutdown(). Throws config_error, driver_error (no driver: the message
// says so) like Allocator's constructor.
Allocator& process_allocator();

}  // namespace gvm
