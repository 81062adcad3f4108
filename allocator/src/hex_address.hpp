// hex_address.hpp: an address as the allocator's error messages print it.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gvm::detail {

// "0x7f..." - the form CUDA tools and PyTorch's messages print addresses in,
// so a user can match one message against another.
inline std::string hex(std::uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, p);
  return buf;
}

}  // namespace gvm::detail
