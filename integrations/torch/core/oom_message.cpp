#include "oom_message.hpp"

#include "size_format.hpp"

namespace gvm::torch_backend {

std::string oom_message(const OomFacts& f) {
  std::string m = "CUDA out of memory. Tried to allocate " + format_size(f.requested) + ". GPU " +
                  std::to_string(f.device) + " has a total capacity of " +
                  format_size(f.device_total) + " of which " + format_size(f.device_free) +
                  " is free. Of the allocated memory " + format_size(f.allocated) +
                  " is allocated by PyTorch, and " +
                  format_size(f.reserved > f.allocated ? f.reserved - f.allocated : 0) +
                  " is reserved by gvmalloc but unallocated.";
  if (!f.reason.empty()) m += " gvmalloc: " + f.reason;
  return m;
}

}  // namespace gvm::torch_backend
