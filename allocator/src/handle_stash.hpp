// HandleStash: the physical handles a release before a growth unmapped, kept
// for that growth to map again instead of cuMemRelease now and cuMemCreate a
// moment later. On the H200 the pair costs 50-130 us a chunk (cuMemCreate
// 11-34 us, cuMemRelease 27-97 us a call on the shipped traces,
// docs/measurements.md), the unmap, map and grant are paid either way.
//
// A handle is mapped whole or not at all (a part of it is refused,
// docs/measurements.md "Mapping part of a handle"), so a kept handle serves a
// growth only as one of the chunks the growth would make anyway, of its size
// exactly; the other chunks are made new as before. plan_chunks decides
// which (no driver call); the stash then releases what no chunk took, before
// any new handle is made, so the device never holds more than the release
// and the growth would have without it.
//
// One stash belongs to one growth on one thread (DeviceHeap::map_for); its
// handles are charged to the device's budget and counted in transit until
// they are mapped again or released (the caller's accounting).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "gvm/vmm/owners.hpp"
#include "page_map.hpp"

namespace gvm::detail {

class StreamState;

class HandleStash {
 public:
  HandleStash() = default;
  HandleStash(const HandleStash&) = delete;
  HandleStash& operator=(const HandleStash&) = delete;
  ~HandleStash() { (void)release_all(); }

  // Keeps h; false (h left as it was, the caller releases it) when there is
  // no memory to keep it in.
  bool add(vmm::PhysicalChunk&& h) noexcept {
    try {
      handles_.push_back(std::move(h));  // h moves only once there is room
    } catch (...) {
      return false;
    }
    bytes_ += handles_.back().size();
    return true;
  }
  std::size_t bytes() const noexcept { return bytes_; }
  // The sizes of the chunks the growth will map (plan_chunks without a
  // stash), set before the release: handover_first puts idle chunks of
  // these sizes first.
  std::vector<std::size_t>& wanted() noexcept { return wanted_; }
  // Whether the growth's chunks take a handle of each of `sizes` (each size
  // as often as it is there): every one of them is in wanted().
  // Handles already kept (an earlier heap's release for the same growth)
  // take their sizes first.
  bool takes_all(const std::vector<std::size_t>& sizes) const {
    std::vector<std::size_t> left = wanted_;
    for (const vmm::PhysicalChunk& h : handles_) {
      auto it = std::find(left.begin(), left.end(), h.size());
      if (it != left.end()) left.erase(it);
    }
    for (std::size_t s : sizes) {
      auto it = std::find(left.begin(), left.end(), s);
      if (it == left.end()) return false;
      left.erase(it);
    }
    return true;
  }
  // The stream the growth's block is for (DeviceHeap::map_for): a handle
  // whose last users are all that stream's work may be mapped for it before
  // that work is done - stream order keeps the new use behind the old one
  // (Heap::release_cached).
  const StreamState* user() const noexcept { return user_; }
  // ... and the heap that grows (the handles are mapped there).
  const void* heap() const noexcept { return heap_; }
  void set_user(const StreamState* s, const void* heap) noexcept {
    user_ = s;
    heap_ = heap;
  }
  // A release handed handles over with their old mappings standing: a
  // growth that fails releases them, and their memory goes back only with
  // those mappings (Heap::give_up_handovers).
  bool unfenced() const noexcept { return !unfenced_.empty(); }
  // The ids of the handles handed over that way.
  const std::vector<vmm::PhysHandle>& unfenced_handles() const noexcept { return unfenced_; }
  // Room for n more of each (so that the next n add() and note_unfenced()
  // cannot fail). Throws std::bad_alloc.
  void reserve_unfenced(std::size_t n) {
    handles_.reserve(handles_.size() + n);
    unfenced_.reserve(unfenced_.size() + n);
  }
  void note_unfenced(vmm::PhysHandle h) noexcept { unfenced_.push_back(h); }
  std::size_t count() const noexcept { return handles_.size(); }
  bool empty() const noexcept { return handles_.empty(); }

  // A handle of exactly `size` bytes, taken out of the stash; an empty one
  // when there is none.
  vmm::PhysicalChunk take_exact(std::size_t size) {
    for (std::size_t i = 0; i < handles_.size(); ++i) {
      if (handles_[i].size() != size) continue;
      vmm::PhysicalChunk h = std::move(handles_[i]);
      handles_[i] = std::move(handles_.back());
      handles_.pop_back();
      bytes_ -= h.size();
      return h;
    }
    return {};
  }

  // cuMemRelease of every handle left; the bytes they held. A release the
  // driver refuses still counts: the handle is unmapped and out of every
  // heap, its owner's destructor tries once more (as LargeArena::drop
  // counts a chunk whose unmap went through).
  std::size_t release_all() noexcept {
    const std::size_t n = bytes_;
    for (auto& h : handles_) (void)h.reset();
    handles_.clear();
    bytes_ = 0;
    return n;
  }

 private:
  std::vector<vmm::PhysicalChunk> handles_;
  std::size_t bytes_ = 0;
  std::vector<std::size_t> wanted_;
  const StreamState* user_ = nullptr;
  const void* heap_ = nullptr;
  std::vector<vmm::PhysHandle> unfenced_;
};

// The order in which a release before a growth takes idle chunks to give
// back `want` bytes. `largest_first`: the idle chunks, largest first (the
// fewest driver calls for the bytes); size_of(chunk) their sizes. Chunks of
// the sizes in `wanted` (each size as often as it is there) go first, since
// their handles are handed to the growth - a cuMemRelease and a cuMemCreate
// fewer each (50-130 us on the H200) - then the rest, largest first. Unless
// that meets `want` with more chunks than the largest first would (a chunk
// more is an unmap now and a map later: GPT-2's replay went from 1,612 to
// 1,643 driver calls), or gives back less than half the bytes it would:
// what the largest first gives beyond the want is headroom that the next
// growths take without a release of their own, and giving most of it up
// made EfficientNet's replay release and grow again (1,403 driver calls
// became 1,422, 2 fences 5). On BERT inference's replay: 2,129 driver calls
// before, 1,948 with this order, every shipped trace's peak unchanged
// (docs/design-notes.md, "Handles a release hands to its growth").
template <typename SizeOf>
std::vector<std::uint32_t> handover_first(const std::vector<std::uint32_t>& largest_first,
                                          std::vector<std::size_t> wanted, std::size_t want,
                                          SizeOf size_of) {
  if (wanted.empty()) return largest_first;
  std::vector<std::uint32_t> order, rest;
  for (std::uint32_t c : largest_first) {
    auto it = std::find(wanted.begin(), wanted.end(), size_of(c));
    if (it != wanted.end()) {
      wanted.erase(it);
      order.push_back(c);
    } else {
      rest.push_back(c);
    }
  }
  if (order.empty()) return largest_first;
  order.insert(order.end(), rest.begin(), rest.end());
  // How many chunks, and how many bytes, an order gives back for `want`.
  auto taken = [&](const std::vector<std::uint32_t>& o) {
    std::pair<std::size_t, std::size_t> n_bytes{0, 0};
    for (std::uint32_t c : o) {
      if (n_bytes.second >= want) break;
      n_bytes.second += size_of(c);
      ++n_bytes.first;
    }
    return n_bytes;
  };
  const auto mine = taken(order), largest = taken(largest_first);
  const bool keep_order = mine.first <= largest.first && 2 * mine.second >= largest.second;
  return keep_order ? order : largest_first;
}

// One chunk of a growth: where it goes, its size, and the kept handle that
// backs it (empty: a new one is made).
struct ChunkPlan {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  vmm::PhysicalChunk reused;
};

// The chunks that map `runs` (address, bytes; multiples of the granule):
// each run cut from its start into chunks of at most `max_chunk` bytes, as
// always; a chunk whose size a kept handle has takes that handle. Only
// exact sizes: a kept handle placed in part of a run would cut the rest into
// more, smaller chunks, and every later release and growth would pay for
// them (on the BERT trace, simulated: 2,145 driver calls became 17,936).
//
// `block_end` is the end of the block the runs are mapped for.
// Where that block ends inside a run's last granule and the run is cut into
// several chunks anyway, that granule is a chunk of its own: the rest of it
// is free memory that the next block placed there will share, and a granule
// is unmapped only with its whole chunk, so that neighbour would otherwise
// keep the run's whole last chunk mapped after this block is freed. A run of
// one chunk is left whole (the granule of its own would double its chunks).
template <typename Runs>
std::vector<ChunkPlan> plan_chunks(const Runs& runs, std::size_t max_chunk, HandleStash* stash,
                                   std::uintptr_t block_end) {
  std::vector<ChunkPlan> plan;
  for (const auto& run : runs) {
    std::uintptr_t addr = run.first;
    std::size_t left = run.second;
    const std::uintptr_t run_end = run.first + run.second;
    const bool shared_edge = run_end > block_end && run.second > max_chunk;
    while (left != 0) {
      ChunkPlan c;
      c.addr = addr;
      c.size = std::min(left, max_chunk);
      if (shared_edge && left > kGranule && addr + c.size > run_end - kGranule)
        c.size = run_end - kGranule - addr;  // stops short of the shared granule
      if (stash != nullptr && !stash->empty()) c.reused = stash->take_exact(c.size);
      addr += c.size;
      left -= c.size;
      plan.push_back(std::move(c));
    }
  }
  return plan;
}

}  // namespace gvm::detail
