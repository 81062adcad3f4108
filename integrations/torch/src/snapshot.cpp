// What PyTorch asks about the allocator's memory layout - snapshots
// (torch.cuda.memory._snapshot, memory_snapshot, MemPool.snapshot, the
// memory_viz page), base allocations, segment sizes, a pool's live blocks -
// answered from gvmalloc's memory_map: one segment per contiguous mapped
// range, its blocks in address order.
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>

#include "backend.hpp"
#include "errors.hpp"

namespace gvm::torch_backend {

namespace {

c10::MempoolId_t id_of(MempoolKey k) { return {k.first, k.second}; }

bool all_small(const SegmentView& s) {
  return !s.blocks.empty() && std::all_of(s.blocks.begin(), s.blocks.end(), [](const BlockView& b) { return b.small; });
}

void* segment_stream(const SegmentView& s) {
  for (const BlockView& b : s.blocks) {
    if (b.allocated) return b.stream;
  }
  return s.blocks.empty() ? nullptr : s.blocks.front().stream;
}

cca::AllocatorConfigInfo config_info(const std::string& gvm_config) {
  namespace cfg = c10::cuda::CUDACachingAllocator;
  cca::AllocatorConfigInfo c{};
  c.garbage_collection_threshold = 0.0;
  c.max_split_size = std::numeric_limits<size_t>::max();
  // The pinned-memory settings are PyTorch's host allocator's, which stays in use.
  c.pinned_num_register_threads = cfg::CUDAAllocatorConfig::pinned_num_register_threads();
  c.pinned_use_host_register = cfg::CUDAAllocatorConfig::pinned_use_cuda_host_register();
  c.expandable_segments = true;  // gvmalloc's arena grows in place, as expandable segments do
  c.release_lock_on_malloc = false;
  c.graph_capture_record_stream_reuse = false;
  c.last_allocator_settings = "gvmalloc GVM_CONF: " + gvm_config;
  c.roundup_power2_divisions.assign(16, 0);  // gvmalloc does not round that way
  return c;
}

}  // namespace

std::vector<SegmentView> Backend::pool_segments(int device, PoolId pool) const {
  std::vector<SegmentView> segments = torch_errors("reading the memory map", [&] { return gvm_.memory_map(device); });
  std::erase_if(segments, [&](const SegmentView& s) { return s.pool != pool || s.scratch; });
  return segments;
}

cca::SnapshotInfo Backend::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  int n = device_count_.load(std::memory_order_relaxed);
  if (n == 0 && cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  const MempoolKey want{mempool_id.first, mempool_id.second};
  cca::SnapshotInfo info;
  for (int d = 0; d < n; ++d) {
    if (history_.recording()) history_.on_snapshot(d);
    const std::vector<SegmentView> segments =
        torch_errors("memory snapshot", [&] { return gvm_.memory_map(d); });
    Device& ds = device_state(d);
    for (const SegmentView& s : segments) {
      // A pool released while blocks of it were live hands them back to the
      // device: they show in the default pool.
      const MempoolKey key = ds.pools.key_of(s.pool).value_or(MempoolKey{});
      if (!want.is_default() && key != want) continue;
      cda::SegmentInfo si;
      si.device = static_cast<c10::DeviceIndex>(d);
      si.address = s.addr;
      si.total_size = s.size;
      si.stream = segment_stream(s);
      si.is_large = !all_small(s);
      si.is_expandable = true;
      si.owner_private_pool_id = id_of(key);
      si.blocks.reserve(s.blocks.size());
      for (const BlockView& b : s.blocks) {
        cda::BlockInfo bi;
        bi.size = b.size;
        bi.requested_size = b.requested;
        bi.allocated = b.allocated;
        bi.active = b.allocated;
        if (b.allocated) {
          bi.context_when_allocated = history_.block_context(d, b.addr);
          si.allocated_size += b.size;
          si.active_size += b.size;
          si.requested_size += b.requested;
        }
        si.blocks.push_back(std::move(bi));
      }
      info.segments.push_back(std::move(si));
    }
  }
  if (include_traces) {
    info.device_traces = history_.traces(n);
    info.external_annotations = history_.annotations();
  }
  info.config_metadata = config_info(gvm_.config_text());
  return info;
}

void* Backend::getBaseAllocation(void* ptr, size_t* size) {
  if (any_custom_.load(std::memory_order_relaxed)) {
    if (auto r = custom_blocks_.find(ptr)) {
      if (size != nullptr) *size = r->requested;
      return ptr;
    }
  }
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  const int n = device_count_.load(std::memory_order_relaxed);
  for (int d = 0; d < n; ++d) {
    for (const SegmentView& s : torch_errors("getBaseAllocation", [&] { return gvm_.memory_map(d); })) {
      if (a >= s.addr && a < s.addr + s.size) {
        if (size != nullptr) *size = s.size;
        return reinterpret_cast<void*>(s.addr);
      }
    }
  }
  fail("gvmalloc: getBaseAllocation: " + std::to_string(a) + " is not in memory gvmalloc holds");
}

std::vector<cca::StreamSegmentSize> Backend::getExpandableSegmentSizes(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < History::kMaxDevices, "gvmalloc: invalid CUDA device ", static_cast<int>(device));
  std::vector<cca::StreamSegmentSize> out;
  for (const SegmentView& s : torch_errors("segment sizes", [&] { return gvm_.memory_map(device); })) {
    if (s.scratch) continue;
    out.emplace_back(static_cast<cudaStream_t>(segment_stream(s)), all_small(s), s.size);
  }
  return out;
}

bool Backend::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                       const std::unordered_set<void*>& expected_live_allocations) {
  TORCH_CHECK(device >= 0 && device < History::kMaxDevices, "gvmalloc: invalid CUDA device ", static_cast<int>(device));
  const auto t = device_state(device).pools.find(MempoolKey{mempool_id.first, mempool_id.second});
  TORCH_CHECK(t.has_value(), "gvmalloc: no pool (", mempool_id.first, ", ", mempool_id.second, ") on device ",
              static_cast<int>(device));
  TORCH_CHECK(!t->custom, "gvmalloc: checkPoolLiveAllocations of a pool with its own allocator");
  std::size_t live = 0;
  for (const SegmentView& s : pool_segments(device, t->pool)) {
    for (const BlockView& b : s.blocks) {
      if (!b.allocated) continue;
      ++live;
      if (!expected_live_allocations.contains(reinterpret_cast<void*>(b.addr))) return false;
    }
  }
  return live == expected_live_allocations.size();
}

}  // namespace gvm::torch_backend
