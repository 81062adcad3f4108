// The C entry points of libgvmalloc_torch.so, which gvmalloc.torch.enable()
// calls through ctypes before CUDA starts in the process:
//
//   gvm_torch_built_for()      torch.__version__ the library was built against
//   gvm_torch_install(v, ...)  checks v (the running torch.__version__), then
//                              makes the backend PyTorch's CUDA allocator
//   gvm_torch_is_installed()   1 once installed
//
// The built-for version is also in the file as the text
// "gvmalloc-torch-built-for:<version>" (kBuiltForMarker), which the Python
// side reads before loading the library: loaded into another torch, the
// library could fail to resolve its symbols before anything could be said.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

#include "backend.hpp"
#include "version_check.hpp"

#ifndef GVM_TORCH_BUILT_FOR
#error "GVM_TORCH_BUILT_FOR (torch.__version__ at build time) must be defined by the build"
#endif

#define GVM_TORCH_API extern "C" __attribute__((visibility("default")))

namespace {

// Kept in the file (used) for the Python side to find without loading it.
__attribute__((used)) const char kBuiltForMarker[] =
    "gvmalloc-torch-built-for:" GVM_TORCH_BUILT_FOR;

std::mutex g_install_mutex;
bool g_installed = false;

// Status codes of gvm_torch_install, mirrored in gvmalloc/_torch_backend.py.
enum InstallStatus : int {
  kInstalled = 0,
  kVersionMismatch = 1,
  kTooLate = 2,
  kFailed = 3,
};

int report(int status, const std::string& message, char* out, std::size_t out_size) {
  if (out != nullptr && out_size > 0) {
    std::snprintf(out, out_size, "%s", message.c_str());
  }
  return status;
}

}  // namespace

GVM_TORCH_API const char* gvm_torch_built_for(void) {
  return kBuiltForMarker + std::strlen("gvmalloc-torch-built-for:");
}

GVM_TORCH_API int gvm_torch_is_installed(void) {
  std::lock_guard lock(g_install_mutex);
  return g_installed ? 1 : 0;
}

GVM_TORCH_API int gvm_torch_install(const char* running_torch_version, char* message,
                                    std::size_t message_size) {
  using gvm::torch_backend::Backend;
  namespace cca = c10::cuda::CUDACachingAllocator;
  const std::string mismatch = gvm::torch_backend::version_mismatch(
      GVM_TORCH_BUILT_FOR, running_torch_version ? running_torch_version : "(unknown)");
  if (!mismatch.empty()) return report(kVersionMismatch, mismatch, message, message_size);
  try {
    std::lock_guard lock(g_install_mutex);
    Backend& backend = Backend::instance();
    if (g_installed) return report(kInstalled, "", message, message_size);
    cca::CUDAAllocator* current = cca::allocator.load();
    if (current != nullptr && current != &backend && current->initialized()) {
      return report(kTooLate,
                    "PyTorch's CUDA allocator (" + current->name() +
                        ") has already started in this process, and PyTorch cannot change its "
                        "allocator after that",
                    message, message_size);
    }
    // Both ways PyTorch finds its CUDA allocator: the CUDACachingAllocator
    // pointer (tensors, torch.cuda.memory_*) and c10::GetAllocator(kCUDA)
    // (torch.accelerator's memory functions and code written against
    // c10::Allocator).
    cca::allocator.store(&backend);
    c10::SetAllocator(c10::DeviceType::CUDA, &backend, /*priority=*/0);
    g_installed = true;
    if (c10::GetAllocator(c10::DeviceType::CUDA) != &backend) {
      // Tensors and torch.cuda.memory_* use the pointer above; only code that
      // asks c10::GetAllocator(kCUDA) (torch.accelerator's memory functions)
      // would still see the other allocator.
      return report(kInstalled,
                    "gvmalloc is PyTorch's CUDA allocator, but another allocator holds "
                    "c10::GetAllocator(kCUDA) at a higher priority: torch.accelerator's memory "
                    "functions will not see gvmalloc",
                    message, message_size);
    }
    return report(kInstalled, "", message, message_size);
  } catch (const std::exception& e) {
    return report(kFailed, e.what(), message, message_size);
  }
}
