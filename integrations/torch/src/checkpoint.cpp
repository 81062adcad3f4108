// Pool checkpoints for torch.compile's CUDA graph trees (mode="reduce-overhead").
//
// After recording a graph, the tree saves the state of its pool
// (getCheckpointState). Replays update no allocator state, so before it
// records a new graph after replays it puts the pool back to a saved state
// (setCheckpointPoolState): blocks live now but not then are freed, blocks
// live then but freed since are made live again at the same addresses, and
// PyTorch gives the second kind to the tensors that still use them.
//
// A checkpoint here is the list of the pool's live blocks (from memory_map).
// Making a block live again at its address needs the allocator's
// allocate_at, which is not part of gvmalloc yet: until it is, restoring
// fails before it changes anything, and says so (docs/pytorch.md).
#include <algorithm>
#include <unordered_map>

#include "backend.hpp"
#include "errors.hpp"

namespace gvm::torch_backend {

namespace {

struct PoolCheckpoint final : cca::AllocatorState {
  int device = 0;
  MempoolKey key;
  PoolId pool = 0;
  std::vector<BlockView> live;
};

}  // namespace

std::shared_ptr<cca::AllocatorState> Backend::getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) {
  TORCH_CHECK(device >= 0 && device < History::kMaxDevices, "gvmalloc: invalid CUDA device ", static_cast<int>(device));
  const MempoolKey key{id.first, id.second};
  const auto t = device_state(device).pools.find(key);
  TORCH_CHECK(t.has_value() && !t->custom, "gvmalloc: getCheckpointState: no gvmalloc pool (", id.first, ", ",
              id.second, ") on device ", static_cast<int>(device));
  auto state = std::make_shared<PoolCheckpoint>();
  state->device = device;
  state->key = key;
  state->pool = t->pool;
  for (const SegmentView& s : pool_segments(device, t->pool)) {
    for (const BlockView& b : s.blocks) {
      if (b.allocated) state->live.push_back(b);
    }
  }
  return state;
}

cca::CheckpointDelta Backend::setCheckpointPoolState(c10::DeviceIndex device,
                                                     std::shared_ptr<cca::AllocatorState> pps) {
  auto* state = dynamic_cast<PoolCheckpoint*>(pps.get());
  TORCH_CHECK(state != nullptr, "gvmalloc: setCheckpointPoolState: not a checkpoint of gvmalloc's backend");
  TORCH_CHECK(state->device == device, "gvmalloc: setCheckpointPoolState: checkpoint of device ",
              state->device, " restored on device ", static_cast<int>(device));
  const Capabilities caps = AllocatorAdapter::capabilities();
  if (!caps.allocate_at || !caps.deallocate_by_ptr) {
    fail(
        "gvmalloc: restoring a pool checkpoint (torch.compile mode=\"reduce-overhead\" recording a "
        "new CUDA graph after replays) needs gvm::Allocator::allocate_at and deallocate(ptr), which "
        "this gvmalloc build does not have yet (docs/pytorch.md); nothing was changed");
  }
  const auto t = device_state(device).pools.find(state->key);
  TORCH_CHECK(t.has_value() && t->pool == state->pool, "gvmalloc: setCheckpointPoolState: pool (",
              state->key.first, ", ", state->key.second, ") is gone");

  std::unordered_map<std::uintptr_t, const BlockView*> then;
  for (const BlockView& b : state->live) then.emplace(b.addr, &b);
  std::unordered_map<std::uintptr_t, BlockView> now;
  for (const SegmentView& s : pool_segments(device, state->pool)) {
    for (const BlockView& b : s.blocks) {
      if (b.allocated) now.emplace(b.addr, b);
    }
  }
  cca::CheckpointDelta delta;
  for (const auto& [addr, b] : now) {
    auto it = then.find(addr);
    if (it != then.end() && it->second->size == b.size) continue;
    void* p = reinterpret_cast<void*>(addr);
    free_block(p);
    delta.ptrs_freed.push_back(p);
  }
  for (const BlockView& b : state->live) {
    auto it = now.find(b.addr);
    if (it != now.end() && it->second.size == b.size) continue;
    void* p = torch_errors("restoring a pool checkpoint", [&] {
      return gvm_.allocate_at(reinterpret_cast<void*>(b.addr), b.requested, b.stream, state->pool);
    });
    device_state(device).counters.on_alloc(b.requested);
    delta.dataptrs_allocd.emplace_back(p, p, &Backend::delete_block, c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

}  // namespace gvm::torch_backend
