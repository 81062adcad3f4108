// Allocator::Impl: the devices, the peer-access part, and the thread-local
// shortcut from (device, stream) to that stream's heap.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "access_tracker.hpp"
#include "device_heap.hpp"
#include "gvm/allocator.hpp"
#include "gvm/vmm/counting_driver.hpp"
#include "peer_access.hpp"
#include "stream_registry.hpp"

namespace gvm {
namespace detail {

// Requests above this are not sizes but bugs (a negative ssize_t seen as
// unsigned, say): no GPU has 128 TiB.
inline constexpr std::size_t kAbsurdBytes = std::size_t{1} << 47;

// The last (allocator, device, stream) -> heap lookup of this thread. The
// allocator id is never reused, so a stale slot can never match; the
// generation moves when a stream is forgotten (its handle may come back as a
// new stream, with a heap of its own).
struct HeapSlot {
  std::uint64_t owner = 0;
  std::uint64_t generation = 0;
  int device = -1;
  vmm::StreamHandle stream = nullptr;
  Heap* heap = nullptr;
};
// initial-exec: read with one %fs-relative load instead of a __tls_get_addr
// call per lookup (the library is a shared object, often dlopen'ed by
// PyTorch; 40 bytes of static TLS is well within glibc's surplus for that).
inline thread_local HeapSlot tls_heap_slot [[gnu::tls_model("initial-exec")]];
inline std::atomic<std::uint64_t> next_allocator_id{1};

}  // namespace detail

class Allocator::Impl {
 public:
  Impl(vmm::Driver& driver, Config config);
  // Every device is fenced before any heap unmaps: a stream of one device may
  // still read another's memory (a staged peer copy runs on the destination's
  // stream), so draining each heap's own device is not enough.
  ~Impl();

  // Inline: one compare on the hot path; the message is built out of line.
  void check_device(int device, const char* what) const {
    if (static_cast<std::size_t>(static_cast<unsigned>(device)) >= device_count_) [[unlikely]]
      throw_no_such_device(device, what);
  }
  [[noreturn, gnu::cold, gnu::noinline]] void throw_no_such_device(int device, const char* what) const;
  // Inline: one compare against the smallest device's memory (no load of
  // the device's caps on the hot path); the device's own figure and the
  // message out of line.
  void check_fits_device(std::size_t bytes, int device) const {
    if (bytes > smallest_memory_) [[unlikely]]
      check_fits_device_slow(bytes, device);
  }
  [[gnu::cold, gnu::noinline]] void check_fits_device_slow(std::size_t bytes, int device) const;

  detail::DeviceHeap& device(int d);
  detail::DeviceHeap* existing(int d) const {
    return devices_[static_cast<std::size_t>(d)].load(std::memory_order_acquire);
  }
  // The heap of `stream` on `device` (the thread's slot, else the slow path).
  detail::Heap& heap(int device, vmm::StreamHandle stream) {
    detail::HeapSlot& slot = detail::tls_heap_slot;
    const std::uint64_t gen = generation_.load(std::memory_order_relaxed);
    if (slot.owner == id_ && slot.device == device && slot.stream == stream &&
        slot.generation == gen) [[likely]]
      return *slot.heap;
    return heap_slow(device, stream, gen);
  }
  detail::Heap& heap_slow(int device, vmm::StreamHandle stream, std::uint64_t gen);
  detail::StreamState& stream_state(int device, vmm::StreamHandle stream) {
    return this->device(device).streams().get(stream);
  }

  // The device whose memory holds addr (a mapped granule, or any region), or -1.
  int owner_of(std::uintptr_t addr) const;
  // The heap of `device` holding addr (mapped or not), or null.
  detail::Heap* heap_holding(int device, std::uintptr_t addr) const;
  // Throws usage_error when [addr, addr + bytes) lies in gvmalloc's memory
  // but not inside one live block of `device` (peer_copy's arguments).
  void check_copy_side(std::uintptr_t addr, std::size_t bytes, int device, const char* side) const;

  void forget_stream(vmm::StreamHandle stream);
  // The heap of private pool `pool` and its device; usage_error (naming
  // `what`) for an unknown pool.
  detail::Heap& pool_heap(PoolId pool, const char* what, int* device = nullptr);
  bool any_capture() const;

  vmm::CountingDriver driver_;
  Config config_;
  std::vector<vmm::DeviceCaps> caps_;
  const std::size_t device_count_;  // caps_.size(), without its division by 120
  const std::size_t smallest_memory_;  // the least total_memory of caps_
  std::vector<std::unique_ptr<detail::StreamRegistry>> registries_;
  detail::AccessTracker tracker_;
  std::mutex devices_lock_;
  std::vector<std::atomic<detail::DeviceHeap*>> devices_;
  std::vector<std::unique_ptr<detail::DeviceHeap>> owned_;
  detail::PeerAccess peers_;
  mutable std::mutex pools_mu_;
  std::unordered_map<PoolId, int> pool_device_;  // every pool ever made
  std::atomic<PoolId> next_pool_{1};
  std::atomic<std::uint64_t> generation_{0};
  const std::uint64_t id_;
};

}  // namespace gvm
