// Heap, the release of cached chunks: the fence, handovers to a growth and
// their old mappings (heap.hpp, docs/design-notes.md "Handles a release hands to its growth").
#include "heap.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "device_heap.hpp"
#include "gvm/errors.hpp"

namespace gvm::detail {

// --------------------------------------------------------------- release --

std::size_t Heap::release_cached(std::size_t want, bool all, HandleStash* keep) {
  std::lock_guard<std::mutex> chunks(chunks_mu_);
  // Old mappings left by handovers before: gone if their work is done; a
  // release of everything (a trim, the out-of-memory path) waits for them.
  settle_handovers_locked(all, true);
  std::vector<LargeArena::Release> picked;
  WaitSet waits;
  {
    std::lock_guard<SpinLock> guard(lock_);
    arena_.settle();  // the walks below carve merged free blocks only
    // Which chunks go: the largest first until `want` is met, those a
    // growth waiting for them can take first (handover_first). Then they
    // are begun in address order (one walk of the region), and dropped and
    // ended in the order chosen.
    const std::vector<std::uint32_t> cached =
        keep == nullptr || all
            ? arena_.cached_chunks()
            : handover_first(arena_.cached_chunks(), keep->wanted(), want,
                             [&](std::uint32_t c) { return arena_.chunk_size(c); });
    const std::vector<bool> ok = arena_.releasable(cached);
    std::vector<std::uint32_t> chosen;
    std::size_t sum = 0;
    for (std::size_t i = 0; i < cached.size(); ++i) {
      if (!all && sum >= want) break;
      if (!ok[i]) continue;
      chosen.push_back(cached[i]);
      sum += arena_.chunk_size(cached[i]);
    }
    std::vector<std::size_t> by_address(chosen.size());
    for (std::size_t i = 0; i < by_address.size(); ++i) by_address[i] = i;
    std::sort(by_address.begin(), by_address.end(), [&](std::size_t a, std::size_t b) {
      return arena_.chunk_addr(chosen[a]) < arena_.chunk_addr(chosen[b]);
    });
    std::vector<LargeArena::Release> begun(chosen.size());
    std::vector<bool> taken(chosen.size(), false);
    Block* cursor = nullptr;
    for (std::size_t i : by_address) taken[i] = arena_.begin_release(chosen[i], &begun[i], &waits, &cursor);
    for (std::size_t i = 0; i < chosen.size(); ++i)
      if (taken[i]) picked.push_back(std::move(begun[i]));
  }
  if (picked.empty()) return 0;
  if (kind_ == Kind::scratch && !device_.config().scratch_fence_tracked) {
    // Peers' work on the scratch is not seen by the allocator unless the
    // caller names it: every device that has access is drained, and the
    // devices of the streams known to have touched it.
    for (const auto& a : access_) waits.add_overflow(WaitSet::device_bit(a.device));
    for (int i = 0; i < waits.size(); ++i)
      waits.add_overflow(WaitSet::device_bit(waits[i].stream->device()));
  }
  if (const std::size_t handed = hand_over_unfenced(picked, waits, keep); handed != 0)
    return handed;
  // The fence: every stream whose work may still touch the chunks. They are
  // carved out of the free set, so nothing is handed out from them meanwhile,
  // and no lock is held while the host waits. It covers the old mappings
  // left by earlier handovers too: a handle released below may be one of
  // theirs, and its memory goes back only with its last mapping.
  for (const Handover& h : handovers_) waits.merge(h.waits);
  bool fenced = true;
  if (!waits.empty()) device_.count_fence();
  try {
    device_.tracker().fence(waits);
  } catch (const vmm::DriverError&) {
    fenced = false;
  }
  if (fenced) {
    for (Handover& h : handovers_) h.waits.clear();
    try {
      settle_handovers_locked(false, false);
    } catch (const vmm::DriverError&) {  // no wait left to fail
    }
  }
  std::size_t dropped = 0;
  vmm::Result failure = vmm::Result::success;
  for (LargeArena::Release& r : picked) {
    vmm::PhysicalChunk kept;
    // A handle whose old mapping still stands (its unmap failed) is neither
    // released - its memory would stay while the budget said it went - nor
    // kept for the growth, which may leave it to be released. Its chunk
    // stays mapped until that mapping goes.
    const bool held = arena_.on_demand() && has_old_mapping(r.mem.handle());
    const vmm::Result res = fenced && !held
                                ? arena_.drop(r, keep != nullptr ? &kept : nullptr)
                                : vmm::Result::unknown;
    const std::size_t size = r.size;
    const bool ok = res == vmm::Result::success;
    if (ok) device_.transit(static_cast<std::int64_t>(size));  // gone here, not yet credited
    {
      std::lock_guard<SpinLock> guard(lock_);
      arena_.end_release(r, ok);
      mapped_.store(arena_.mapped_bytes(), std::memory_order_relaxed);
    }
    if (ok) {
      dropped += size;
      // A handle kept for the growth stays charged and in transit until the
      // growth maps or releases it (DeviceHeap::map_for); any other is
      // released now (drop did, or here when it could not be kept).
      const bool for_growth = !kept.empty() && keep->add(std::move(kept));
      if (!for_growth) {
        (void)kept.reset();  // cuMemRelease (an empty one does nothing)
        device_.credit(size);
        device_.transit(-static_cast<std::int64_t>(size));
      }
    } else if (failure == vmm::Result::success && !held) {
      failure = res;
    }
  }
  if (!fenced) device_.tracker().fence(waits);  // throws again: the driver cannot tell
  if (failure != vmm::Result::success)
    throw vmm::DriverError(failure, std::string(arena_.on_demand() ? "cuMemUnmap/cuMemRelease"
                                                                   : "cuMemFree") +
                                        "(device " + std::to_string(device()) + ", a cached chunk)");
  return dropped;
}

// Handed over before the work is done (docs/design-notes.md). A release
// before a growth unmaps its chunks only after a host wait for the work that
// may still read them: the fence. When every chunk it picked goes to the
// growth (their sizes are the growth's: handle_stash.hpp), and that work is
// all queued on the stream the growth's block is for, the wait buys nothing
// for the new block - its user's next work runs after the old work in stream
// order, as a caching allocator's reuse of a block does - and is needed only
// before the old addresses are unmapped. So the handles go to the growth at
// once, mapped a second time at their new addresses while the old mappings
// stand (the driver allows a handle at two addresses: docs/measurements.md,
// "Mapping part of a handle"), and the old mappings are unmapped later, when
// a query sees a record made now done, or after a wait in a release of
// everything or a fence of a later release. The arena counts their ranges
// free and unmapped at once, as an unmap would leave them (the same layout,
// the same ratios); a growth over one waits for its work and unmaps it first
// (map_under). Their bytes are the growth's: one handle, one charge.
std::size_t Heap::hand_over_unfenced(std::vector<LargeArena::Release>& picked,
                                     const WaitSet& waits, HandleStash* keep) {
  // This heap's own growth only: another heap's release of the handle
  // later would not see the old mapping standing here.
  if (keep == nullptr || keep->heap() != this || kind_ != Kind::stream || !arena_.on_demand() ||
      keep->user() == nullptr || !waits.only(keep->user()) ||
      !device_.tracker().fence_enabled() || device_.capturing())
    return 0;
  WaitSet pending = waits;
  pending.drop_finished();
  if (pending.empty()) return 0;  // the fence would not wait: unmap now
  std::vector<std::size_t> sizes;
  sizes.reserve(picked.size());
  for (const LargeArena::Release& r : picked) sizes.push_back(r.size);
  if (!keep->takes_all(sizes)) return 0;
  try {
    // Room first: past this point nothing may fail, or a handle would be
    // released while its old mapping stands.
    handovers_.reserve(handovers_.size() + picked.size());
    keep->reserve_unfenced(picked.size());
    // A record now, which a later query can see done (the frees' token may
    // have none after it yet).
    device_.tracker().cover_now(pending);
  } catch (...) {
    return 0;  // the fenced way
  }
  std::size_t handed = 0;
  for (LargeArena::Release& r : picked) {
    Handover h;
    vmm::PhysicalChunk handle;
    {
      std::lock_guard<SpinLock> guard(lock_);
      arena_.hand_over(r, &handle, &h.old);
      mapped_.store(arena_.mapped_bytes(), std::memory_order_relaxed);
    }
    const std::size_t size = r.size;
    device_.transit(static_cast<std::int64_t>(size));  // gone here, not yet credited
    h.waits = pending;
    h.handle = handle.get();
    keep->note_unfenced(handle.get());   // room reserved above
    handovers_.push_back(std::move(h));  // room reserved above
    (void)keep->add(std::move(handle));  // room reserved above
    handed += size;
  }
  return handed;
}

void Heap::settle_handovers_locked(bool wait, bool poll, const std::vector<Run>* over) {
  if (handovers_.empty()) return;
  auto must_wait = [&](const Handover& h) {
    if (!wait || h.waits.empty()) return false;
    if (over == nullptr) return true;
    const std::uintptr_t lo = h.old.addr(), hi = lo + h.old.size();
    for (const Run& r : *over)
      if (r.first < hi && lo < r.first + r.second) return true;
    return false;
  };
  bool waiting = false;
  for (Handover& h : handovers_) {
    h.waits.drop_finished();
    waiting |= !h.waits.empty();
  }
  if (waiting && !device_.capturing()) {  // a capture forbids queries and waits
    AccessTracker& tracker = device_.tracker();
    if (poll && tracker.poll(device()) != 0)
      for (Handover& h : handovers_) h.waits.drop_finished();
    WaitSet w;
    for (const Handover& h : handovers_)
      if (must_wait(h)) w.merge(h.waits);
    if (!w.empty()) {
      tracker.fence(w);  // throws: nothing changed
      for (Handover& h : handovers_)
        if (must_wait(h)) h.waits.clear();
    }
  }
  std::vector<Handover> left;
  left.reserve(handovers_.size());
  std::vector<std::pair<vmm::PhysHandle, std::size_t>> gone_owed;  // room first: no throw below
  gone_owed.reserve(static_cast<std::size_t>(
      std::count_if(handovers_.begin(), handovers_.end(), [](const Handover& h) { return h.owed; })));
  for (Handover& h : handovers_) {
    const std::size_t size = h.old.size();
    // An unmap the driver refuses leaves the mapping here, for a later try.
    if (!h.waits.empty() || h.old.reset() != vmm::Result::success)
      left.push_back(std::move(h));
    else if (h.owed)  // its handle went before it
      gone_owed.emplace_back(h.handle, size);
  }
  handovers_ = std::move(left);
  for (const auto& [handle, size] : gone_owed) {
    // A handle handed over twice before its first old mapping went has two;
    // the device keeps its memory until the last of them goes, and the debt
    // (one per handle: give_up_handovers) moves to that one.
    Handover* standing = nullptr;
    for (Handover& h : handovers_)
      if (h.handle == handle) standing = &h;
    if (standing != nullptr) {
      standing->owed = true;
      continue;
    }
    device_.credit(size);
    device_.transit(-static_cast<std::int64_t>(size));
  }
}

bool Heap::has_old_mapping(vmm::PhysHandle handle) const noexcept {
  for (const Handover& h : handovers_)
    if (h.handle == handle) return true;
  return false;
}

std::size_t Heap::give_up_handovers(const std::vector<vmm::PhysHandle>& handles) noexcept {
  std::lock_guard<std::mutex> chunks(chunks_mu_);
  try {
    settle_handovers_locked(true, true);
  } catch (...) {  // a wait that failed: those still standing are owed below
  }
  std::size_t owed = 0;
  for (vmm::PhysHandle handle : handles)
    for (Handover& h : handovers_)
      if (h.handle == handle && !h.owed) {
        h.owed = true;
        owed += h.old.size();
        break;
      }
  return owed;
}

bool Heap::overlaps_handover(const std::vector<Run>& runs) const {
  for (const Handover& h : handovers_) {
    const std::uintptr_t lo = h.old.addr(), hi = lo + h.old.size();
    for (const Run& r : runs)
      if (r.first < hi && lo < r.first + r.second) return true;
  }
  return false;
}

void Heap::drop_unused_regions() {
  {
    // A region goes back with cuMemAddressFree, which a mapping inside refuses.
    std::lock_guard<std::mutex> chunks(chunks_mu_);
    settle_handovers_locked(true, true);
    if (!handovers_.empty()) return;  // a capture, or a wait that failed: later
  }
  std::lock_guard<SpinLock> guard(lock_);
  (void)arena_.drop_unused_regions();
}

std::size_t Heap::cached_bytes() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.cached_bytes();
}

std::size_t Heap::largest_cached_block() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.largest_mapped_free();
}

std::size_t Heap::mapped_bytes() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.mapped_bytes();
}

std::vector<Run> Heap::chunk_ranges() const {
  std::lock_guard<SpinLock> guard(lock_);
  return arena_.chunk_ranges();
}

WaitSet Heap::touching() const {
  std::lock_guard<SpinLock> guard(lock_);
  WaitSet w;
  arena_.for_each_block([&](const Block& b) {
    if (b.free) {
      w.merge(b.waits);
    } else if (!b.releasing) {
      w.merge(tokens_now(&b, nullptr));
    }
  });
  return w;
}

}  // namespace gvm::detail
