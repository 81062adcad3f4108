// StreamRegistry: the StreamState of every stream one device's heaps have
// seen (stream_state.hpp says when a state is live, retired, complete).
//
// Looked up when a thread meets a stream it has not used before (the
// allocator's thread-local slot remembers the answer) and on the slow paths;
// never on a cache hit. States are never freed before the registry: tokens in
// free blocks point at them. A complete state gives its event back, so a
// program that creates and destroys streams by the thousand keeps ~100 bytes
// per stream it ever used.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "stream_state.hpp"

namespace gvm::detail {

class StreamRegistry {
 public:
  explicit StreamRegistry(int device) noexcept : device_(device) {}
  StreamRegistry(const StreamRegistry&) = delete;
  StreamRegistry& operator=(const StreamRegistry&) = delete;

  // The live state of `handle`; made on first use (a retired handle's next
  // use makes a new one).
  StreamState& get(vmm::StreamHandle handle);
  // The live states now (a copy: the caller may call the driver on them).
  std::vector<StreamState*> live() const;
  // Retires the live state of `handle`; false if there is none.
  bool retire(vmm::StreamHandle handle);
  // A synchronisation of the whole device has completed: every state
  // retired before it started is complete. `retired_before`: the value of
  // retire_count() read before the sync began.
  void device_synced(std::uint64_t retired_before);
  std::uint64_t retire_count() const noexcept { return retires_.load(std::memory_order_acquire); }
  // Retired states whose work is not yet known complete.
  std::size_t retired_pending() const;

 private:
  static std::atomic<std::uint64_t> next_id_;
  const int device_;
  mutable std::mutex mu_;
  std::unordered_map<vmm::StreamHandle, StreamState*> live_;
  std::vector<std::unique_ptr<StreamState>> all_;
  // Retired, not yet complete, with the retire_count() at their retirement.
  std::vector<std::pair<StreamState*, std::uint64_t>> pending_;
  std::atomic<std::uint64_t> retires_{0};
};

}  // namespace gvm::detail
