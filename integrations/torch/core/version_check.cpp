#include "version_check.hpp"

namespace gvm::torch_backend {

std::string version_mismatch(std::string_view built_for, std::string_view running) {
  if (built_for == running) return {};
  std::string m = "gvmalloc's PyTorch backend was built for torch ";
  m.append(built_for).append(", but this process runs torch ").append(running);
  m.append(
      ": its C++ interface differs between versions. Rebuild gvmalloc with this torch "
      "importable by python3 (cmake finds it there), or call "
      "gvmalloc.torch.enable(backend=\"pluggable\"), which needs no rebuild but loses "
      "record_stream, CUDA graphs and PyTorch's memory statistics");
  return m;
}

}  // namespace gvm::torch_backend
