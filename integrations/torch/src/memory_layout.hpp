// What PyTorch asks about the allocator's memory layout - snapshots
// (torch.cuda.memory._snapshot, memory_snapshot, MemPool.snapshot, the
// memory_viz page), base allocations, segment sizes, a pool's live blocks -
// answered from gvmalloc's memory_map of a device: one segment per contiguous
// mapped range, its blocks in address order.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator_adapter.hpp"
#include "history.hpp"
#include "pool_table.hpp"

namespace gvm::torch_backend {

namespace cca = c10::cuda::CUDACachingAllocator;

// The segments of `device` as PyTorch's snapshot has them; only those of
// PyTorch's pool `want` unless it is {0, 0}. Live blocks carry the stacks the
// history kept for them.
std::vector<cda::SegmentInfo> snapshot_segments(const std::vector<SegmentView>& segments,
                                                int device, const PoolTable& pools,
                                                const History& history, MempoolKey want);

// PyTorch's "allocator_settings" of a snapshot, for gvmalloc.
cca::AllocatorConfigInfo snapshot_settings(const std::string& gvm_config);

// The segment holding `ptr`: its address and size.
std::optional<std::pair<void*, std::size_t>> containing_segment(
    const std::vector<SegmentView>& segments, const void* ptr);

// getExpandableSegmentSizes: each arena segment's stream, kind and size.
std::vector<cca::StreamSegmentSize> segment_sizes(const std::vector<SegmentView>& segments);

// The live blocks of gvmalloc pool `pool`.
std::vector<BlockView> live_blocks(const std::vector<SegmentView>& segments, PoolId pool);

}  // namespace gvm::torch_backend
