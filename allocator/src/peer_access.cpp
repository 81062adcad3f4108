// PeerAccess: the policy matrix, scratch grants and context toggles
// (peer_access.hpp).
#include "peer_access.hpp"

#include <algorithm>
#include <mutex>
#include <string>

#include "device_heap.hpp"
#include "peer_policy.hpp"

namespace gvm::detail {

PeerAccess::PeerAccess(vmm::Driver& driver, std::vector<vmm::DeviceCaps> policy_caps,
                       const Config& config, AccessTracker& tracker,
                       std::function<DeviceHeap&(int)> device)
    : driver_(driver),
      caps_(std::move(policy_caps)),
      n_(caps_.size()),
      config_(config),
      tracker_(tracker),
      device_(std::move(device)),
      requested_(config.peer_policy),
      policy_(n_ * n_, PeerPolicy::none),
      global_enabled_(n_ * n_, 0) {
  for (std::size_t o = 0; o < n_; ++o)
    for (std::size_t p = 0; p < n_; ++p)
      if (o != p) policy_[o * n_ + p] = effective_peer_policy(requested_, caps_[o], caps_[p]);
}

std::vector<vmm::AccessDesc> PeerAccess::scratch_access(int owner,
                                                        const std::vector<PeerPolicy>& m) const {
  std::vector<vmm::AccessDesc> access{{owner, vmm::Access::read_write}};
  for (int p = 0; p < static_cast<int>(n_); ++p) {
    const PeerPolicy pol = m[static_cast<std::size_t>(owner) * n_ + static_cast<std::size_t>(p)];
    // VMM memory needs a grant whatever the policy; `global` adds the
    // context toggle for classic memory and for the pre-Ampere driver.
    if (pol == PeerPolicy::per_allocation || pol == PeerPolicy::global)
      access.push_back({p, vmm::Access::read_write});
  }
  return access;
}

void PeerAccess::enable_global(int peer, int owner) {
  char& state = global_enabled_[static_cast<std::size_t>(peer) * n_ + static_cast<std::size_t>(owner)];
  if (state != 0) return;
  // Enabled once, and only with both devices drained: a toggle is not
  // ordered with transfers in flight (docs/measurements.md: 20 of 20 runs
  // failed with a copy queued).
  tracker_.fence_devices(WaitSet::device_bit(peer) | WaitSet::device_bit(owner));
  const vmm::Result r = driver_.enable_peer_access(peer, owner);
  if (r == vmm::Result::peer_access_already_enabled) {
    state = 2;
    return;
  }
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, "cuCtxEnablePeerAccess(device " + std::to_string(peer) +
                                  " -> device " + std::to_string(owner) + ")");
  state = 1;
}

Heap& PeerAccess::scratch(int device) {
  DeviceHeap& d = device_(device);
  if (Heap* h = d.existing_scratch(); h != nullptr) return *h;
  std::unique_lock<std::shared_mutex> guard(lock_);
  if (Heap* h = d.existing_scratch(); h != nullptr) return *h;
  for (int p = 0; p < static_cast<int>(n_); ++p) {
    if (policy(device, p) != PeerPolicy::global) continue;
    // The first toggle is fenced (both devices drained), which a capture
    // forbids: refused before any driver call.
    if (tracker_.capturing() &&
        global_enabled_[static_cast<std::size_t>(p) * n_ + static_cast<std::size_t>(device)] == 0)
      throw out_of_memory("gvmalloc: the peer scratch of device " + std::to_string(device) +
                          " during a CUDA graph capture: its first use enables peer access from "
                          "device " + std::to_string(p) +
                          " behind a fence the capture forbids; allocate from the scratch once "
                          "before the capture");
    enable_global(p, device);
  }
  Heap& h = d.scratch(scratch_access(device, policy_));
  h.set_grants_fenced(grants_emulated(h.access()));
  return h;
}

bool PeerAccess::grants_emulated(const std::vector<vmm::AccessDesc>& access) const {
  // Per-range peer access is emulated in software below compute capability
  // 8.0 (the reason for the `global` policy, peer_policy.hpp).
  for (const auto& a : access)
    if (caps_[static_cast<std::size_t>(a.device)].cc_major < 8) return true;
  return false;
}

void PeerAccess::apply_access(Heap& h, const std::vector<vmm::AccessDesc>& access) {
  const std::vector<vmm::AccessDesc>& old = h.access();
  // Devices that had access and lose it are named with PROT_NONE: setting
  // the others alone does not revoke (docs/measurements.md, hazards).
  std::vector<vmm::AccessDesc> descs = access;
  for (const auto& o : old)
    if (std::none_of(access.begin(), access.end(), [&](const auto& a) { return a.device == o.device; }))
      descs.push_back({o.device, vmm::Access::none});
  // What puts a chunk back as it was: the old rights, and PROT_NONE for
  // devices the change would have added.
  std::vector<vmm::AccessDesc> undo = old;
  for (const auto& a : access)
    if (std::none_of(old.begin(), old.end(), [&](const auto& o) { return o.device == a.device; }))
      undo.push_back({a.device, vmm::Access::none});
  if (h.backing_on_demand()) {
    std::lock_guard<std::mutex> no_release(h.chunks_lock());
    const std::vector<Run> chunks = h.chunk_ranges();
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const vmm::Result r =
          driver_.mem_set_access(chunks[i].first, chunks[i].second, descs.data(), descs.size());
      if (r != vmm::Result::success) {
        for (std::size_t j = 0; j < i; ++j)
          (void)driver_.mem_set_access(chunks[j].first, chunks[j].second, undo.data(), undo.size());
        throw vmm::DriverError(r, "cuMemSetAccess(device " + std::to_string(h.device()) +
                                      " scratch chunk of " + std::to_string(chunks[i].second) +
                                      " bytes)");
      }
    }
  }
  h.set_access_list(access);
  h.set_grants_fenced(grants_emulated(access));
}

void PeerAccess::set_policy(PeerPolicy requested) {
  std::unique_lock<std::shared_mutex> guard(lock_);
  // Plan: the matrix the switch leads to.
  std::vector<PeerPolicy> next(n_ * n_, PeerPolicy::none);
  for (std::size_t o = 0; o < n_; ++o)
    for (std::size_t p = 0; p < n_; ++p)
      if (o != p) next[o * n_ + p] = effective_peer_policy(requested, caps_[o], caps_[p]);
  if (next == policy_ && !dirty_) {
    requested_ = requested;
    return;
  }

  // Fence, before anything changes. A global toggle acts on the whole
  // context: both devices are drained. A scratch buffer: with
  // scratch_fence:tracked the streams known to touch it (its blocks' streams
  // and users), else every device that has access, and those streams' devices.
  std::uint64_t devices = 0;
  WaitSet waits;
  for (std::size_t o = 0; o < n_; ++o) {
    for (std::size_t p = 0; p < n_; ++p)
      if (next[o * n_ + p] != policy_[o * n_ + p] && policy_[o * n_ + p] == PeerPolicy::global)
        devices |= WaitSet::device_bit(static_cast<int>(o)) | WaitSet::device_bit(static_cast<int>(p));
    Heap* h = device_(static_cast<int>(o)).existing_scratch();
    if (h == nullptr) continue;
    const WaitSet touching = h->touching();
    waits.merge(touching);
    if (!config_.scratch_fence_tracked) {
      for (const auto& a : h->access()) devices |= WaitSet::device_bit(a.device);
      for (int i = 0; i < touching.size(); ++i)
        devices |= WaitSet::device_bit(touching[i].stream->device());
      devices |= touching.overflow_devices();
    }
  }
  tracker_.fence(waits);
  tracker_.fence_devices(devices);

  // Apply, keeping what to undo: grants of each scratch buffer, then the
  // context toggles. Should a step fail, what was done is undone and the
  // policy stays as it was; what cannot be undone makes the pairs of that
  // owner `none` (no direct copy trusts a grant in doubt) and the next switch
  // applies everything again.
  std::vector<std::pair<Heap*, std::vector<vmm::AccessDesc>>> regranted;
  std::vector<std::pair<std::size_t, char>> toggled;  // global_enabled_ index, old state
  try {
    for (std::size_t o = 0; o < n_; ++o) {
      Heap* h = device_(static_cast<int>(o)).existing_scratch();
      if (h == nullptr) continue;
      std::vector<vmm::AccessDesc> old = h->access();
      std::vector<vmm::AccessDesc> want = scratch_access(static_cast<int>(o), next);
      if (old == want && !dirty_) continue;
      apply_access(*h, want);
      regranted.emplace_back(h, std::move(old));
    }
    for (std::size_t o = 0; o < n_; ++o) {
      for (std::size_t p = 0; p < n_; ++p) {
        const std::size_t k = p * n_ + o;
        char& state = global_enabled_[k];
        if (policy_[o * n_ + p] == PeerPolicy::global && next[o * n_ + p] != PeerPolicy::global &&
            state == 1) {
          // Context peer access this allocator enabled, behind the fence above.
          const vmm::Result r = driver_.disable_peer_access(static_cast<int>(p), static_cast<int>(o));
          if (r != vmm::Result::success && r != vmm::Result::peer_access_not_enabled)
            throw vmm::DriverError(r, "cuCtxDisablePeerAccess(device " + std::to_string(p) +
                                          " -> device " + std::to_string(o) + ")");
          toggled.emplace_back(k, state);
          state = 0;
        }
      }
    }
    for (std::size_t o = 0; o < n_; ++o) {
      if (device_(static_cast<int>(o)).existing_scratch() == nullptr) continue;
      for (std::size_t p = 0; p < n_; ++p) {
        if (next[o * n_ + p] != PeerPolicy::global) continue;
        const std::size_t k = p * n_ + o;
        const char before = global_enabled_[k];
        enable_global(static_cast<int>(p), static_cast<int>(o));
        if (global_enabled_[k] != before) toggled.emplace_back(k, before);
      }
    }
  } catch (...) {
    bool undone = true;
    for (auto it = toggled.rbegin(); it != toggled.rend(); ++it) {
      const int p = static_cast<int>(it->first / n_), o = static_cast<int>(it->first % n_);
      const vmm::Result r =
          it->second == 1 ? driver_.enable_peer_access(p, o) : driver_.disable_peer_access(p, o);
      if (r == vmm::Result::success || r == vmm::Result::peer_access_already_enabled ||
          r == vmm::Result::peer_access_not_enabled)
        global_enabled_[it->first] = it->second;
      else
        undone = false;
    }
    for (auto it = regranted.rbegin(); it != regranted.rend(); ++it) {
      try {
        apply_access(*it->first, it->second);
      } catch (...) {
        undone = false;
        const auto o = static_cast<std::size_t>(it->first->device());
        for (std::size_t p = 0; p < n_; ++p) policy_[o * n_ + p] = PeerPolicy::none;
      }
    }
    if (!undone) dirty_ = true;
    throw;
  }
  policy_ = next;
  dirty_ = false;
  requested_ = requested;
}

void PeerAccess::disable_all() noexcept {
  for (std::size_t k = 0; k < global_enabled_.size(); ++k) {
    if (global_enabled_[k] != 1) continue;
    (void)driver_.disable_peer_access(static_cast<int>(k / n_), static_cast<int>(k % n_));
    global_enabled_[k] = 0;
  }
}

}  // namespace gvm::detail
