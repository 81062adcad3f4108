// PeerAccess: who may reach whose memory - the policy matrix, the grants on
// each device's scratch buffer, and context peer access - and the one way it
// changes: plan (the matrix the switch leads to) -> fence (every stream and
// device that may touch what changes) -> apply (grants, then toggles, undone
// if a step fails).
//
// Locking: lock() is shared by whoever acts under the current policy (a peer
// copy decides, notes its stream and queues under it; scratch growth grants
// new chunks under it; a scratch release fences under it) and exclusive for
// a switch, so nothing is decided under one policy and done under the next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <shared_mutex>
#include <vector>

#include "access_tracker.hpp"
#include "gvm/config.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/driver.hpp"

namespace gvm::detail {

class DeviceHeap;
class Heap;

class PeerAccess {
 public:
  // `policy_caps`: the devices as the policy sees them (vmm as gvmalloc
  // really uses it). `device(d)` makes or finds device d's heap.
  PeerAccess(vmm::Driver& driver, std::vector<vmm::DeviceCaps> policy_caps, const Config& config,
             AccessTracker& tracker, std::function<DeviceHeap&(int)> device);

  std::shared_mutex& lock() const noexcept { return lock_; }
  // The pair's policy; lock() held (shared or exclusive).
  PeerPolicy policy(int owner, int peer) const noexcept {
    return policy_[static_cast<std::size_t>(owner) * n_ + static_cast<std::size_t>(peer)];
  }
  // Device d's scratch heap, made on first use under the current policy
  // (takes lock() exclusively: call without it).
  Heap& scratch(int device);
  // Plan, fence, apply. Throws driver_error; then what was done is undone.
  void set_policy(PeerPolicy requested);
  // Context peer access this allocator enabled goes off (teardown, after
  // the devices were synchronised). Never throws.
  void disable_all() noexcept;

 private:
  std::vector<vmm::AccessDesc> scratch_access(int owner, const std::vector<PeerPolicy>& m) const;
  void enable_global(int peer, int owner);  // exclusive lock() held
  bool grants_emulated(const std::vector<vmm::AccessDesc>& access) const;
  // Sets `access` on every chunk of h; on a failure part-way the chunks
  // changed go back, then DriverError.
  void apply_access(Heap& h, const std::vector<vmm::AccessDesc>& access);

  vmm::Driver& driver_;
  const std::vector<vmm::DeviceCaps> caps_;
  const std::size_t n_;
  const Config& config_;
  AccessTracker& tracker_;
  std::function<DeviceHeap&(int)> device_;
  mutable std::shared_mutex lock_;
  PeerPolicy requested_ = PeerPolicy::automatic;
  std::vector<PeerPolicy> policy_;  // [owner * n + peer]
  // Context peer access this allocator enabled: [peer * n + owner]; 1 ours,
  // 2 the runtime's (or the application's): never ours to undo.
  std::vector<char> global_enabled_;
  // A switch failed and could not be undone everywhere: the next one applies
  // every grant again instead of returning early.
  bool dirty_ = false;
};

}  // namespace gvm::detail
