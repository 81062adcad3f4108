// The backend layer's names and its one entry point (bench/backend.hpp).
#include "backend.hpp"

#include <utility>

#include "torch_baseline.hpp"

namespace gvm::bench {

const char* backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::gvm_cuda: return "gvm_cuda";
    case BackendKind::gvm_sim_h200: return "gvm_sim_h200";
    case BackendKind::cuda_malloc: return "cudaMalloc";
    case BackendKind::cuda_malloc_async: return "cudaMallocAsync";
    case BackendKind::torch: return torch_impl_name();
  }
  return "?";
}

BackendHost* backend_host(BackendKind kind, std::string* why_not) {
  switch (kind) {
    case BackendKind::gvm_cuda:
    case BackendKind::gvm_sim_h200: return detail::gvm_host(kind, why_not);
    case BackendKind::cuda_malloc:
    case BackendKind::cuda_malloc_async:
    case BackendKind::torch: return detail::runtime_host(kind, why_not);
  }
  if (why_not) *why_not = "unknown backend";
  return nullptr;
}

std::vector<std::string> left_out_lines(const std::vector<BackendKind>& wanted) {
  std::vector<std::pair<std::string, std::string>> groups;  // reason, names
  for (BackendKind kind : wanted) {
    std::string why;
    if (backend_host(kind, &why) != nullptr) continue;
    auto it = groups.begin();
    while (it != groups.end() && it->first != why) ++it;
    if (it == groups.end()) {
      groups.emplace_back(why, backend_name(kind));
    } else {
      it->second += std::string(", ") + backend_name(kind);
    }
  }
  std::vector<std::string> lines;
  for (const auto& [why, names] : groups) lines.push_back("left out " + names + ": " + why);
  return lines;
}

}  // namespace gvm::bench
