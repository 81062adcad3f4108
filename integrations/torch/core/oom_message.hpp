// The message of torch.OutOfMemoryError when gvmalloc cannot serve a request:
// PyTorch's first sentences (what was asked, what the GPU has, what PyTorch
// holds), so that people and tools reading PyTorch's message find the same
// facts, then gvmalloc's own reason (which names the cap or setting involved).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gvm::torch_backend {

struct OomFacts {
  int device = 0;
  std::uint64_t requested = 0;
  std::uint64_t device_total = 0;
  std::uint64_t device_free = 0;
  std::uint64_t allocated = 0;  // bytes PyTorch holds (its memory_allocated)
  std::uint64_t reserved = 0;   // bytes gvmalloc has mapped on the device
  std::string reason;           // gvmalloc's message
};

std::string oom_message(const OomFacts& f);

}  // namespace gvm::torch_backend
