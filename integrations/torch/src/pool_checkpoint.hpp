// Pool checkpoints for torch.compile's CUDA graph trees (mode="reduce-overhead").
//
// After recording a graph, the tree saves the state of its pool
// (getCheckpointState). Replays update no allocator state, so before it
// records a new graph after replays it puts the pool back to a saved state
// (setCheckpointPoolState): blocks live now but not then are freed, blocks
// live then but freed since are made live again at the same addresses, and
// PyTorch gives the second kind to the tensors that still use them.
//
// A checkpoint is the list of the pool's live blocks. Making a block live
// again at its address needs the allocator's allocate_at, not part of
// gvmalloc yet: until it is, restoring fails before it changes anything, and
// says so (docs/pytorch.md).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <vector>

#include "allocator_adapter.hpp"
#include "pool_table.hpp"

namespace gvm::torch_backend {

struct PoolCheckpoint final : c10::cuda::CUDACachingAllocator::AllocatorState {
  int device = 0;
  MempoolKey key;
  PoolId pool = 0;
  std::vector<BlockView> live;
};

struct CheckpointPlan {
  std::vector<void*> to_free;         // live now, not in the checkpoint (or another size)
  std::vector<BlockView> to_restore;  // live in the checkpoint, not now
};

// What restoring `checkpoint` takes, given the pool's live blocks `now`.
CheckpointPlan plan_restore(const PoolCheckpoint& checkpoint, const std::vector<BlockView>& now);

}  // namespace gvm::torch_backend
