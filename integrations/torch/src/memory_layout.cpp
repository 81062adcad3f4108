#include "memory_layout.hpp"

#include <c10/cuda/CUDAAllocatorConfig.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace gvm::torch_backend {

namespace {

bool all_small(const SegmentView& s) {
  return !s.blocks.empty() &&
         std::all_of(s.blocks.begin(), s.blocks.end(), [](const BlockView& b) { return b.small; });
}

void* segment_stream(const SegmentView& s) {
  for (const BlockView& b : s.blocks) {
    if (b.allocated) return b.stream;
  }
  return s.blocks.empty() ? nullptr : s.blocks.front().stream;
}

}  // namespace

std::vector<cda::SegmentInfo> snapshot_segments(const std::vector<SegmentView>& segments,
                                                int device, const PoolTable& pools,
                                                const History& history, MempoolKey want) {
  std::vector<cda::SegmentInfo> out;
  for (const SegmentView& s : segments) {
    // A pool released while blocks of it were live hands them back to the
    // device: they show in the default pool.
    const MempoolKey key = pools.key_of(s.pool).value_or(MempoolKey{});
    if (!want.is_default() && key != want) continue;
    cda::SegmentInfo si;
    si.device = static_cast<c10::DeviceIndex>(device);
    si.address = s.addr;
    si.total_size = s.size;
    si.stream = segment_stream(s);
    si.is_large = !all_small(s);
    si.is_expandable = true;  // the arena grows in place, as expandable segments do
    si.owner_private_pool_id = {key.first, key.second};
    si.blocks.reserve(s.blocks.size());
    for (const BlockView& b : s.blocks) {
      cda::BlockInfo bi;
      bi.size = b.size;
      bi.requested_size = b.requested;
      bi.allocated = b.allocated;
      bi.active = b.allocated;
      if (b.allocated) {
        bi.context_when_allocated = history.block_context(device, b.addr);
        si.allocated_size += b.size;
        si.active_size += b.size;
        si.requested_size += b.requested;
      }
      si.blocks.push_back(std::move(bi));
    }
    out.push_back(std::move(si));
  }
  return out;
}

cca::AllocatorConfigInfo snapshot_settings(const std::string& gvm_config) {
  using Config = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
  cca::AllocatorConfigInfo c{};
  c.garbage_collection_threshold = 0.0;
  c.max_split_size = std::numeric_limits<size_t>::max();
  // The pinned-memory settings are PyTorch's host allocator's, which stays in use.
  c.pinned_num_register_threads = Config::pinned_num_register_threads();
  c.pinned_use_host_register = Config::pinned_use_cuda_host_register();
  c.expandable_segments = true;
  c.release_lock_on_malloc = false;
  c.graph_capture_record_stream_reuse = false;
  c.last_allocator_settings = "gvmalloc GVM_CONF: " + gvm_config;
  c.roundup_power2_divisions.assign(16, 0);  // gvmalloc does not round that way
  return c;
}

std::optional<std::pair<void*, std::size_t>> containing_segment(
    const std::vector<SegmentView>& segments, const void* ptr) {
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  for (const SegmentView& s : segments) {
    if (a >= s.addr && a < s.addr + s.size)
      return std::pair{reinterpret_cast<void*>(s.addr), s.size};
  }
  return std::nullopt;
}

std::vector<cca::StreamSegmentSize> segment_sizes(const std::vector<SegmentView>& segments) {
  std::vector<cca::StreamSegmentSize> out;
  for (const SegmentView& s : segments) {
    if (s.scratch) continue;
    out.emplace_back(static_cast<cudaStream_t>(segment_stream(s)), all_small(s), s.size);
  }
  return out;
}

std::vector<BlockView> live_blocks(const std::vector<SegmentView>& segments, PoolId pool) {
  std::vector<BlockView> out;
  for (const SegmentView& s : segments) {
    if (s.pool != pool || s.scratch) continue;
    for (const BlockView& b : s.blocks) {
      if (b.allocated) out.push_back(b);
    }
  }
  return out;
}

}  // namespace gvm::torch_backend
