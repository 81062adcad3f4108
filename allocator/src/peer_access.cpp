// gvm::Allocator: the peer scratch buffers, the peer policy and peer copies.
//
// Peer access is granted to one scratch reservation per device and to
// nothing else; every change of who may touch it (a grant, a revoke, a
// context peer-access toggle) happens behind the fence (fence.hpp).
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "allocator_impl.hpp"

namespace gvm {

void Allocator::Impl::init_peer_policy() {
  requested_policy_ = config_.peer_policy;
  const std::size_t n = caps_.size();
  for (std::size_t o = 0; o < n; ++o)
    for (std::size_t p = 0; p < n; ++p)
      policy_[o * n + p] =
          o == p ? PeerPolicy::none : detail::effective_peer_policy(requested_policy_, policy_caps_[o], policy_caps_[p]);
}

std::vector<vmm::AccessDesc> Allocator::Impl::scratch_access(
    int owner, const std::vector<PeerPolicy>& matrix) const {
  std::vector<vmm::AccessDesc> access{{owner, vmm::Access::read_write}};
  const std::size_t n = caps_.size();
  for (int p = 0; p < static_cast<int>(n); ++p) {
    const PeerPolicy pol = matrix[static_cast<std::size_t>(owner) * n + static_cast<std::size_t>(p)];
    // VMM memory needs a grant whatever the policy; `global` adds the
    // context toggle for classic memory and for the pre-Ampere driver.
    if (pol == PeerPolicy::per_allocation || pol == PeerPolicy::global)
      access.push_back({p, vmm::Access::read_write});
  }
  return access;
}

void Allocator::Impl::enable_global(int peer, int owner) {
  char& state = global_enabled_[static_cast<std::size_t>(peer) * caps_.size() +
                                static_cast<std::size_t>(owner)];
  if (state != 0) return;
  // Enabled once, and only with both devices drained: a toggle is not
  // ordered with transfers in flight (MEASUREMENTS.md, 20 of 20 failures).
  fence_.wait_devices({peer, owner});
  const vmm::Result r = driver_.enable_peer_access(peer, owner);
  if (r == vmm::Result::peer_access_already_enabled) {
    state = 2;  // the runtime (or the application) did it; never ours to undo
    return;
  }
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, "cuCtxEnablePeerAccess(device " + std::to_string(peer) +
                                  " -> device " + std::to_string(owner) + ")");
  state = 1;
}

detail::DeviceHeap& Allocator::Impl::scratch(int device) {
  if (auto* h = existing_scratch(device); h != nullptr) return *h;
  std::unique_lock<std::shared_mutex> guard(policy_lock_);
  auto& slot = owned_scratch_[static_cast<std::size_t>(device)];
  if (!slot) {
    for (int p = 0; p < static_cast<int>(caps_.size()); ++p)
      if (policy(device, p) == PeerPolicy::global) enable_global(p, device);
    slot = std::make_unique<detail::DeviceHeap>(driver_, caps_[static_cast<std::size_t>(device)],
                                                config_, fence_, detail::DeviceHeap::Kind::scratch,
                                                scratch_access(device, policy_),
                                                device_reserved_[static_cast<std::size_t>(device)]);
    scratch_[static_cast<std::size_t>(device)].store(slot.get(), std::memory_order_release);
  }
  return *slot;
}

detail::DeviceHeap* Allocator::Impl::heap_holding(int device, std::uintptr_t addr) const {
  if (auto* h = existing_heap(device); h != nullptr && h->owns(addr)) return h;
  if (auto* h = existing_scratch(device); h != nullptr && h->owns(addr)) return h;
  return nullptr;
}

void Allocator::Impl::check_copy_side(std::uintptr_t addr, std::size_t bytes, int device,
                                      const char* side) const {
  // Memory gvmalloc did not hand out is the caller's business; a range in
  // gvmalloc's memory must lie inside one live block of the named device. A
  // copy that runs past its block reaches unmapped memory (or another
  // block): on the device that is an illegal address, which kills the
  // context for every stream, so it is refused here.
  const int owner = owner_of(addr);
  if (owner < 0) return;
  const auto say = [&](const std::string& why) {
    throw usage_error("gvmalloc: peer_copy(" + std::to_string(bytes) + " bytes): the " + side +
                      " " + std::to_string(addr) + " " + why);
  };
  if (owner != device)
    say("belongs to device " + std::to_string(owner) + ", not device " + std::to_string(device));
  // kAbsurdBytes first: addr + bytes must not wrap in the block test.
  if (bytes > detail::kAbsurdBytes || !heap_holding(owner, addr)->is_live_block(addr, bytes))
    say("is not inside one live block for the whole range");
}

void* Allocator::scratch_allocate(std::size_t bytes, int device, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(device, "scratch_allocate");
  if (bytes == 0)
    throw usage_error("gvmalloc: scratch_allocate(0 bytes) on device " + std::to_string(device) +
                      ": a block must have at least 1 byte");
  if (bytes > detail::kAbsurdBytes)
    throw usage_error("gvmalloc: scratch_allocate(" + std::to_string(bytes) + " bytes) on device " +
                      std::to_string(device) +
                      ": not a size any GPU can hold (a negative size converted to unsigned?)");
  if (bytes > im.caps_[static_cast<std::size_t>(device)].total_memory)
    throw out_of_memory("gvmalloc: out of memory on device " + std::to_string(device) +
                        ": scratch_allocate(" + detail::format_bytes(bytes) +
                        ") is more than the device's memory");
  detail::DeviceHeap& h = im.scratch(device);
  try {
    return h.allocate_large(bytes, stream);
  } catch (const out_of_memory&) {
    if (!im.release_other_heap(device, &h)) throw;
    return h.allocate_large(bytes, stream);
  }
}

void Allocator::scratch_deallocate(void* ptr, std::size_t bytes, int device,
                                   vmm::StreamHandle stream) {
  deallocate(ptr, bytes, device, stream);
}

void Allocator::record_stream(void* ptr, vmm::StreamHandle stream, int stream_device) {
  Impl& im = *impl_;
  im.check_device(stream_device, "record_stream");
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  for (int d = 0; d < device_count(); ++d) {
    detail::DeviceHeap* h = im.heap_holding(d, addr);
    if (h == nullptr) continue;
    if (d == stream_device) {
      h->record_stream(addr, stream);
    } else {
      h->note_use(addr, detail::StreamRef{stream_device, stream});
    }
    return;
  }
  throw usage_error("gvmalloc: record_stream(" + std::to_string(addr) +
                    "): not a pointer gvmalloc gave out");
}

PeerPolicy Allocator::peer_policy(int owner, int peer) const {
  impl_->check_device(owner, "peer_policy");
  impl_->check_device(peer, "peer_policy");
  std::shared_lock<std::shared_mutex> guard(impl_->policy_lock_);
  return impl_->policy(owner, peer);
}

void Allocator::set_peer_policy(PeerPolicy requested) {
  Impl& im = *impl_;
  // Exclusive: no peer copy is between its decision and its queueing now.
  std::unique_lock<std::shared_mutex> guard(im.policy_lock_);
  const std::size_t n = im.caps_.size();
  // Plan: the matrix the switch leads to.
  std::vector<PeerPolicy> next(n * n, PeerPolicy::none);
  for (std::size_t o = 0; o < n; ++o)
    for (std::size_t p = 0; p < n; ++p)
      if (o != p)
        next[o * n + p] =
            detail::effective_peer_policy(requested, im.policy_caps_[o], im.policy_caps_[p]);
  if (next == im.policy_ && !im.policy_dirty_) {
    im.requested_policy_ = requested;
    return;
  }

  // Fence, before anything changes: every device that may touch a scratch
  // buffer now (the owners and their current peers), or - with
  // scratch_fence:tracked - the streams known to have used them.
  std::vector<int> devices;
  std::vector<detail::StreamRef> streams;
  bool whole_devices = false;
  auto add_device = [&](int d) {
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  };
  for (std::size_t o = 0; o < n; ++o) {
    for (std::size_t p = 0; p < n; ++p) {
      if (next[o * n + p] == im.policy_[o * n + p]) continue;
      if (im.policy_[o * n + p] == PeerPolicy::global) {
        // A global toggle acts on the whole context: drain both devices.
        whole_devices = true;
        add_device(static_cast<int>(o));
        add_device(static_cast<int>(p));
      }
    }
    detail::DeviceHeap* h = im.existing_scratch(static_cast<int>(o));
    if (h == nullptr) continue;
    for (const auto& a : h->access()) add_device(a.device);
    bool heap_whole = false;
    for (const auto& r : h->streams_touching(&heap_whole)) {
      streams.push_back(r);
      add_device(r.device);
    }
    whole_devices = whole_devices || heap_whole;
  }
  if (whole_devices) {
    im.fence_.wait_devices(devices);
  } else {
    im.fence_.wait(streams);
  }

  // Apply, keeping what to undo: grants of each scratch buffer, then the
  // context toggles. Should a step fail, what was done is undone and the
  // policy stays as it was; what cannot be undone makes the pairs of that
  // owner `none` (no direct copy trusts a grant in doubt) and the next
  // switch applies everything again.
  std::vector<std::pair<detail::DeviceHeap*, std::vector<vmm::AccessDesc>>> regranted;
  std::vector<std::pair<std::size_t, char>> toggled;  // global_enabled_ index, old state
  try {
    for (std::size_t o = 0; o < n; ++o) {
      detail::DeviceHeap* h = im.existing_scratch(static_cast<int>(o));
      if (h == nullptr) continue;
      std::vector<vmm::AccessDesc> old = h->access();
      std::vector<vmm::AccessDesc> want = im.scratch_access(static_cast<int>(o), next);
      if (old == want && !im.policy_dirty_) continue;
      h->set_access(want);  // undoes itself when it fails part-way
      regranted.emplace_back(h, std::move(old));
    }
    for (std::size_t o = 0; o < n; ++o) {
      for (std::size_t p = 0; p < n; ++p) {
        const std::size_t k = p * n + o;
        char& state = im.global_enabled_[k];
        if (im.policy_[o * n + p] == PeerPolicy::global && next[o * n + p] != PeerPolicy::global &&
            state == 1) {
          // Context peer access this allocator enabled, behind the fence above.
          const vmm::Result r =
              im.driver_.disable_peer_access(static_cast<int>(p), static_cast<int>(o));
          if (r != vmm::Result::success && r != vmm::Result::peer_access_not_enabled)
            throw vmm::DriverError(r, "cuCtxDisablePeerAccess(device " + std::to_string(p) +
                                          " -> device " + std::to_string(o) + ")");
          toggled.emplace_back(k, state);
          state = 0;
        }
      }
    }
    for (std::size_t o = 0; o < n; ++o) {
      if (im.existing_scratch(static_cast<int>(o)) == nullptr) continue;
      for (std::size_t p = 0; p < n; ++p) {
        if (next[o * n + p] != PeerPolicy::global) continue;
        const std::size_t k = p * n + o;
        const char before = im.global_enabled_[k];
        im.enable_global(static_cast<int>(p), static_cast<int>(o));
        if (im.global_enabled_[k] != before) toggled.emplace_back(k, before);
      }
    }
  } catch (...) {
    bool undone = true;
    for (auto it = toggled.rbegin(); it != toggled.rend(); ++it) {
      const int p = static_cast<int>(it->first / n), o = static_cast<int>(it->first % n);
      const vmm::Result r = it->second == 1 ? im.driver_.enable_peer_access(p, o)
                                            : im.driver_.disable_peer_access(p, o);
      if (r == vmm::Result::success || r == vmm::Result::peer_access_already_enabled ||
          r == vmm::Result::peer_access_not_enabled)
        im.global_enabled_[it->first] = it->second;
      else
        undone = false;
    }
    for (auto it = regranted.rbegin(); it != regranted.rend(); ++it) {
      try {
        it->first->set_access(it->second);
      } catch (...) {
        undone = false;
        const auto o = static_cast<std::size_t>(it->first->device());
        for (std::size_t p = 0; p < n; ++p) im.policy_[o * n + p] = PeerPolicy::none;
      }
    }
    if (!undone) im.policy_dirty_ = true;
    throw;
  }
  im.policy_ = next;
  im.policy_dirty_ = false;
  im.requested_policy_ = requested;
}

void Allocator::peer_copy(void* dst, int dst_device, const void* src, int src_device,
                          std::size_t bytes, vmm::StreamHandle stream) {
  Impl& im = *impl_;
  im.check_device(dst_device, "peer_copy");
  im.check_device(src_device, "peer_copy");
  if (bytes == 0) return;
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  im.check_copy_side(s, bytes, src_device, "source");
  im.check_copy_side(d, bytes, dst_device, "destination");
  vmm::Result r;
  const char* call = "cuMemcpyAsync";  // named in the message
  if (src_device == dst_device) {
    r = im.driver_.memcpy_async(dst_device, d, s, bytes, stream);
  } else {
    // Decided, noted and queued under one policy: a switch waits for all
    // three (set_peer_policy takes the lock exclusively), and then its
    // fence sees the copy.
    std::shared_lock<std::shared_mutex> guard(im.policy_lock_);
    // Direct when dst_device (whose stream runs the copy) was let into the
    // source: it lies in src_device's scratch and the pair's policy grants it.
    detail::DeviceHeap* sh = im.existing_scratch(src_device);
    const bool direct = im.policy(src_device, dst_device) != PeerPolicy::none && sh != nullptr &&
                        sh->is_live_block(s, bytes);
    // dst_device's stream touches src_device's memory either way (a staged
    // copy too): a fence before that memory is unmapped or its access
    // changes must wait for it.
    if (detail::DeviceHeap* h = im.heap_holding(src_device, s); h != nullptr)
      h->note_use(s, detail::StreamRef{dst_device, stream});
    if (direct) {
      r = im.driver_.memcpy_async(dst_device, d, s, bytes, stream);
    } else {
      call = "cuMemcpyPeerAsync";
      r = im.driver_.memcpy_peer_async(d, dst_device, s, src_device, bytes, stream);
    }
  }
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, std::string(call) + " in peer_copy(" + std::to_string(bytes) +
                                  " bytes, device " +
                                  std::to_string(src_device) + " -> " +
                                  std::to_string(dst_device) + ")");
}

bool Allocator::is_peer_copy_direct(const void* src, int src_device, int dst_device) const {
  Impl& im = *impl_;
  im.check_device(dst_device, "is_peer_copy_direct");
  im.check_device(src_device, "is_peer_copy_direct");
  std::shared_lock<std::shared_mutex> guard(im.policy_lock_);
  detail::DeviceHeap* sh = im.existing_scratch(src_device);
  return src_device != dst_device && im.policy(src_device, dst_device) != PeerPolicy::none &&
         sh != nullptr && sh->is_live_block(reinterpret_cast<std::uintptr_t>(src), 1);
}

}  // namespace gvm
