// gvmalloc as PyTorch's CUDA allocator: a complete
// c10::cuda::CUDACachingAllocator::CUDAAllocator over the process's
// gvm::Allocator (through AllocatorAdapter), installed by install.cpp.
//
// What the backend adds to the allocator is PyTorch's bookkeeping: the
// statistics PyTorch reports (DeviceCounters), PyTorch's pool ids and the
// routing of allocations into them (PoolTable), the memory history
// (History), snapshots and pool checkpoints in PyTorch's structures, the
// out-of-memory error and its observers. Blocks, streams, caching, capture
// and pools themselves are the allocator's.
//
// docs/pytorch.md says what each PyTorch memory feature does with it.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator_adapter.hpp"
#include "block_table.hpp"
#include "history.hpp"
#include "pool_table.hpp"
#include "stat_counters.hpp"

namespace gvm::torch_backend {

namespace cca = c10::cuda::CUDACachingAllocator;

class Backend final : public cca::CUDAAllocator {
 public:
  // The one backend of the process (never destroyed: PyTorch frees tensors
  // from static destructors).
  static Backend& instance();

  // ---- c10::Allocator
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // ---- c10::DeviceAllocator
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // ---- c10::cuda::CUDACachingAllocator::CUDAAllocator
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id = {0, 0},
                             bool include_traces = true) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator = nullptr) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(
      c10::DeviceIndex device, c10::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override;
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void pushCompileContext(std::string& md) override;
  void popCompileContext() override;
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;
  std::string name() override;

  // A block for `bytes` on `device`, ordered on `stream`, from the pool the
  // stream is routed to. nullptr for 0 bytes. torch.OutOfMemoryError when
  // the device cannot supply it.
  void* malloc(size_t bytes, c10::DeviceIndex device, cudaStream_t stream);
  // The DataPtr deleter: frees, and reports a failure on stderr (a deleter
  // runs in destructors, where an exception would end the process).
  static void delete_block(void* ptr) noexcept;

  AllocatorAdapter& allocator() noexcept { return gvm_; }

 private:
  Backend();

  struct Device {
    DeviceCounters counters;
    PoolTable pools;
    // gvmalloc's counters at the last resetAccumulatedStats, and the most
    // segments (mapped chunks) seen: PyTorch's accumulated and peak values.
    std::mutex base_mutex;
    DeviceStats base{};
    std::atomic<std::int64_t> segment_peak{0};
  };

  Device& device_state(int device);
  void free_block(void* ptr);
  void* allocate_target(size_t bytes, int device, cudaStream_t stream, const Target& target);
  void* allocate_after_oom(size_t bytes, int device, cudaStream_t stream, const Target& target,
                           const std::exception& why);
  [[noreturn]] void raise_oom(size_t bytes, int device, cudaStream_t stream, const Target& target,
                              const std::string& reason);
  PoolTable::MakePool pool_maker(int device);
  std::vector<SegmentView> memory_map(int device) const;
  int device_count() const;

  AllocatorAdapter& gvm_;
  History history_;
  std::array<std::unique_ptr<Device>, History::kMaxDevices> devices_;
  // Blocks that came from a pool's own allocator (MemPool(allocator=...)).
  BlockTable custom_blocks_;
  std::atomic<bool> any_custom_{false};
  std::atomic<bool> caching_{true};
  std::atomic<bool> initialized_{false};
  std::atomic<int> device_count_{0};
  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
};

}  // namespace gvm::torch_backend
