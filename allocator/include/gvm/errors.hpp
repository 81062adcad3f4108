// The errors gvmalloc's C++ API throws. Deallocation and destructors never
// throw for driver trouble; bad input (a pointer we never gave out, a double
// free) is reported as usage_error and changes nothing.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

#include "gvm/vmm/result.hpp"

namespace gvm {

// A driver call failed (carries the driver's result and the call).
using driver_error = vmm::DriverError;

// The device could not supply the memory, even after the cache was released.
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// A call the allocator refuses: unknown or interior pointer, double free, size
// mismatch, size 0 or too large, a device that does not exist.
class usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A configuration string or value gvmalloc does not accept; names the key.
class config_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace gvm
