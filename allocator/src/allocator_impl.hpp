// Allocator::Impl, shared by allocator.cpp (blocks) and peer_access.cpp
// (scratch, peer policy, peer copies).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "counting_driver.hpp"
#include "device_heap.hpp"
#include "fence.hpp"
#include "gvm/allocator.hpp"
#include "peer_policy.hpp"

namespace gvm {
namespace detail {

// Requests above this are not sizes but bugs (a negative ssize_t seen as
// unsigned, say): no GPU has 128 TiB.
inline constexpr std::size_t kAbsurdBytes = std::size_t{1} << 47;

// The last (allocator, device, stream) -> cache lookup of this thread. The
// allocator id is never reused, so a stale slot can never match.
struct CacheSlot {
  std::uint64_t owner = 0;
  int device = -1;
  vmm::StreamHandle stream = nullptr;
  StreamCache* cache = nullptr;
};
// initial-exec: read with one %fs-relative load instead of a __tls_get_addr
// call per lookup (the library is a shared object, often dlopen'ed by
// PyTorch; 32 bytes of static TLS is well within glibc's surplus for that).
inline thread_local CacheSlot tls_cache_slot [[gnu::tls_model("initial-exec")]];
inline std::atomic<std::uint64_t> next_allocator_id{1};

}  // namespace detail

class Allocator::Impl {
 public:
  Impl(vmm::Driver& driver, Config config)
      : driver_(driver),
        config_(std::move(config)),
        caps_(vmm::read_all_device_caps(driver_)),
        policy_caps_(caps_),
        fence_(driver_, static_cast<int>(caps_.size()), config_.fence_enabled),
        device_reserved_(caps_.size()),
        heaps_(caps_.size()),
        policy_(caps_.size() * caps_.size(), PeerPolicy::none),
        global_enabled_(caps_.size() * caps_.size(), 0),
        scratch_(caps_.size()),
        owned_(caps_.size()),
        owned_scratch_(caps_.size()),
        id_(detail::next_allocator_id.fetch_add(1)) {
    // The policy follows the memory gvmalloc hands out: with no_vmm the
    // scratch is cuMemAlloc memory, which only context peer access reaches.
    if (config_.force_no_vmm)
      for (auto& c : policy_caps_) c.vmm = false;
    init_peer_policy();
  }
  // Every device is fenced before any heap unmaps: a stream of one device may
  // still read another's memory (a staged peer copy runs on the destination's
  // stream), so draining each heap's own device is not enough.
  ~Impl() {
    std::vector<int> all(caps_.size());
    for (std::size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
    try {
      fence_.wait_devices(all);
    } catch (...) {
      // A dead context: nothing queued runs again; unmapping is all that is left.
    }
    owned_scratch_.clear();
    owned_.clear();
  }

  // Inline: one compare on the hot path; the message is built out of line.
  void check_device(int device, const char* what) const {
    if (static_cast<std::size_t>(static_cast<unsigned>(device)) >= caps_.size()) [[unlikely]]
      throw_no_such_device(device, what);
  }
  [[noreturn, gnu::cold, gnu::noinline]] void throw_no_such_device(int device,
                                                                   const char* what) const {
    throw usage_error(std::string("gvmalloc: ") + what + ": device " + std::to_string(device) +
                      " does not exist (" + std::to_string(caps_.size()) + " device" +
                      (caps_.size() == 1 ? "" : "s") + ")");
  }

  detail::DeviceHeap& heap(int device) {
    detail::DeviceHeap* h = heaps_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
    if (h != nullptr) return *h;
    std::lock_guard<std::mutex> guard(heaps_lock_);
    auto& slot = owned_[static_cast<std::size_t>(device)];
    if (!slot) {
      slot = std::make_unique<detail::DeviceHeap>(
          driver_, caps_[static_cast<std::size_t>(device)], config_, fence_,
          detail::DeviceHeap::Kind::arena,
          std::vector<vmm::AccessDesc>{{device, vmm::Access::read_write}},
          device_reserved_[static_cast<std::size_t>(device)]);
      heaps_[static_cast<std::size_t>(device)].store(slot.get(), std::memory_order_release);
    }
    return *slot;
  }

  detail::DeviceHeap* existing_heap(int device) const {
    return heaps_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  }

  detail::StreamCache& cache(detail::DeviceHeap& h, int device, vmm::StreamHandle stream) {
    detail::CacheSlot& slot = detail::tls_cache_slot;
    if (slot.owner == id_ && slot.device == device && slot.stream == stream) [[likely]]
      return *slot.cache;
    detail::StreamCache& c = h.cache_for(stream);
    slot = detail::CacheSlot{id_, device, stream, &c};
    return c;
  }

  // The device's heap other than `h` (arena or scratch) gives back its cached
  // chunks; true if it held any (then an allocation that met the reserve cap
  // or the device's limit is worth one more try).
  bool release_other_heap(int device, detail::DeviceHeap* h) {
    detail::DeviceHeap* other = h == existing_heap(device) ? existing_scratch(device) : existing_heap(device);
    if (other == nullptr) return false;
    const DeviceStats before = other->stats();
    if (before.cached_bytes == 0) return false;
    other->trim();
    return other->stats().reserved_bytes < before.reserved_bytes;
  }

  // The device whose heap holds addr, or -1.
  int owner_of(std::uintptr_t addr) const {
    for (std::size_t d = 0; d < heaps_.size(); ++d)
      if (heap_holding(static_cast<int>(d), addr) != nullptr) return static_cast<int>(d);
    return -1;
  }

  // --- peer access (peer_access.cpp) ---
  void init_peer_policy();
  detail::DeviceHeap& scratch(int device);
  detail::DeviceHeap* existing_scratch(int device) const {
    return scratch_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  }
  // Who may touch `owner`'s scratch under the policy `matrix`.
  std::vector<vmm::AccessDesc> scratch_access(int owner, const std::vector<PeerPolicy>& matrix) const;
  void enable_global(int peer, int owner);                        // policy_lock_ held
  PeerPolicy policy(int owner, int peer) const {
    return policy_[static_cast<std::size_t>(owner) * caps_.size() + static_cast<std::size_t>(peer)];
  }
  // Throws usage_error when [addr, addr + bytes) lies in gvmalloc's memory
  // but not inside one live block of `device` (peer_copy's arguments).
  void check_copy_side(std::uintptr_t addr, std::size_t bytes, int device,
                       const char* side) const;
  // The heap (arena or scratch) of `device` that holds addr, or null.
  detail::DeviceHeap* heap_holding(int device, std::uintptr_t addr) const;

  detail::CountingDriver driver_;
  Config config_;
  std::vector<vmm::DeviceCaps> caps_;
  // caps_ as the peer policy sees them: vmm is what gvmalloc really uses.
  std::vector<vmm::DeviceCaps> policy_caps_;
  detail::Fence fence_;
  // Bytes mapped per device by its arena and scratch together (the cap).
  std::vector<std::atomic<std::size_t>> device_reserved_;
  std::mutex heaps_lock_;
  std::vector<std::atomic<detail::DeviceHeap*>> heaps_;
  // Shared by whoever acts under the current policy (a peer copy decides,
  // notes its stream and queues under it); exclusive for a switch, so no
  // copy can be decided under one policy and queued under the next.
  mutable std::shared_mutex policy_lock_;
  PeerPolicy requested_policy_ = PeerPolicy::automatic;
  // A switch failed and could not be undone everywhere: the next one applies
  // every grant again instead of returning early.
  bool policy_dirty_ = false;
  std::vector<PeerPolicy> policy_;  // [owner * n + peer]
  // Context peer access this allocator enabled: [peer * n + owner].
  std::vector<char> global_enabled_;
  std::vector<std::atomic<detail::DeviceHeap*>> scratch_;
  // Declared last: heaps are destroyed (fenced, unmapped) before the rest.
  std::vector<std::unique_ptr<detail::DeviceHeap>> owned_;
  std::vector<std::unique_ptr<detail::DeviceHeap>> owned_scratch_;
  const std::uint64_t id_;
};

}  // namespace gvm
