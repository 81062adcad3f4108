// torch.cuda.memory._record_memory_history for the gvmalloc backend: the trace
// of allocations, frees and out-of-memory events per device, with the stack
// (the CreateContextFn PyTorch hands over) where it was asked for, the stack
// of each live block for snapshots, the annotations of record_function
// scopes, and the trace trackers PyTorch attaches.
//
// Off by default and then free: the hot path reads one atomic flag. While on,
// every record takes one mutex (a debugging tool; PyTorch's allocator holds its
// device lock for the same work). Stacks are gathered by the caller before
// any lock, since the recorder may take locks of its own (Python's).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/ApproximateClock.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool_table.hpp"
#include "trace_ring.hpp"

namespace gvm::torch_backend {

namespace cda = c10::CachingDeviceAllocator;

class History {
 public:
  static constexpr int kMaxDevices = 128;

  void configure(bool enabled, cda::CreateContextFn recorder, std::size_t max_entries,
                 cda::RecordContext when, bool clear, const std::vector<std::string>& skip_actions);
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  // Something wants trace entries: history is on or a tracker is attached.
  bool recording() const noexcept { return recording_.load(std::memory_order_relaxed); }

  // The stack to keep with a new block (when contexts are kept at all) and
  // with a free's trace entry (context "all" only). Null when not wanted.
  std::shared_ptr<c10::GatheredContext> context_for_alloc() const;
  std::shared_ptr<c10::GatheredContext> context_for_free() const;

  // An allocation or free served: trace entries (and trackers), the live
  // block's stack for snapshots.
  void on_alloc(int device, std::uintptr_t addr, std::size_t size, void* stream, MempoolKey pool,
                std::shared_ptr<c10::GatheredContext> context);
  void on_free(int device, std::uintptr_t addr, std::size_t size, void* stream,
               std::shared_ptr<c10::GatheredContext> context);
  void on_oom(int device, std::size_t device_free, std::size_t size, void* stream, MempoolKey pool);
  void on_snapshot(int device);

  std::shared_ptr<c10::GatheredContext> block_context(int device, std::uintptr_t addr) const;

  void annotate(const std::vector<std::pair<std::string, std::string>>& md);
  static void push_compile_context(const std::string& name);
  static void pop_compile_context();
  static void set_user_metadata(const std::string& md);
  static std::string user_metadata();

  void attach_tracker(cda::AllocatorTraceTracker tracker);

  // Per device (device_count vectors), oldest first, times in microseconds
  // since the epoch (trace_time_.t_), as PyTorch's snapshot expects.
  std::vector<std::vector<cda::TraceEntry>> traces(int device_count) const;
  std::vector<cda::AnnotationEntry> annotations() const;

 private:
  void record_locked(cda::TraceEntry::Action action, int device, std::uintptr_t addr,
                     std::size_t size, void* stream, MempoolKey pool,
                     std::shared_ptr<c10::GatheredContext> context);
  TraceRing<cda::TraceEntry>& ring_locked(int device);

  std::atomic<bool> enabled_{false};
  std::atomic<bool> recording_{false};
  std::atomic<cda::CreateContextFn> recorder_{nullptr};
  std::atomic<int> when_{static_cast<int>(cda::RecordContext::NEVER)};

  mutable std::mutex mutex_;
  std::size_t max_entries_ = 1;
  std::array<bool, 16> skip_{};  // by TraceEntry::Action
  std::array<std::unique_ptr<TraceRing<cda::TraceEntry>>, kMaxDevices> rings_;
  TraceRing<cda::AnnotationEntry> annotations_{1};
  std::array<std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>>, kMaxDevices>
      block_contexts_;
  std::vector<cda::AllocatorTraceTracker> trackers_;
  // The clock converter of this history: approximate (TSC) times are turned
  // into Unix microseconds when a snapshot is taken, as PyTorch's allocator does.
  mutable c10::ApproximateClockToUnixTimeConverter clock_;
};

}  // namespace gvm::torch_backend
