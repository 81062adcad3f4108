#include "pool_checkpoint.hpp"

#include <cstdint>
#include <unordered_map>

namespace gvm::torch_backend {

CheckpointPlan plan_restore(const PoolCheckpoint& checkpoint, const std::vector<BlockView>& now) {
  std::unordered_map<std::uintptr_t, std::size_t> then_size;
  for (const BlockView& b : checkpoint.live) then_size.emplace(b.addr, b.size);
  std::unordered_map<std::uintptr_t, std::size_t> now_size;
  for (const BlockView& b : now) now_size.emplace(b.addr, b.size);
  CheckpointPlan plan;
  for (const BlockView& b : now) {
    auto it = then_size.find(b.addr);
    if (it == then_size.end() || it->second != b.size)
      plan.to_free.push_back(reinterpret_cast<void*>(b.addr));
  }
  for (const BlockView& b : checkpoint.live) {
    auto it = now_size.find(b.addr);
    if (it == now_size.end() || it->second != b.size) plan.to_restore.push_back(b);
  }
  return plan;
}

}  // namespace gvm::torch_backend
