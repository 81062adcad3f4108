// Sizes as PyTorch's messages write them ("20.00 MiB", "7.45 GiB"), so that an
// out-of-memory message from gvmalloc reads like PyTorch's and tools that parse
// "Tried to allocate <n> <unit>" keep working.
#pragma once

#include <cstdint>
#include <string>

namespace gvm::torch_backend {

std::string format_size(std::uint64_t bytes);

}  // namespace gvm::torch_backend
