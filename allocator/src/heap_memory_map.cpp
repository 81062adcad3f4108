// DeviceHeap::memory_map: the heap's segments and blocks (gvm/memory_map.hpp).
#include <algorithm>
#include <mutex>
#include <vector>

#include "device_heap.hpp"

namespace gvm::detail {

void DeviceHeap::memory_map(std::vector<SegmentInfo>& out) const {
  // Slot bitmaps are guarded by their cache's lock, which comes before the
  // device lock (device_heap.hpp): every cache first, then the device.
  std::lock_guard<std::mutex> caches_guard(caches_lock_);
  std::vector<std::unique_lock<SpinLock>> held;
  held.reserve(caches_.size());
  for (const auto& entry : caches_) held.emplace_back(entry.second->lock);
  std::lock_guard<std::mutex> guard(lock_);

  // Segments: runs of adjacent mapped chunks (a cuMemAlloc segment is one).
  std::vector<std::pair<std::uintptr_t, std::size_t>> segs;
  for (const ChunkRec& c : chunks_)
    if (c.in_use) segs.emplace_back(c.addr, c.size);
  std::sort(segs.begin(), segs.end());
  std::vector<std::pair<std::uintptr_t, std::size_t>> runs;
  for (const auto& s : segs) {
    if (vmm_ && !runs.empty() && runs.back().first + runs.back().second == s.first)
      runs.back().second += s.second;
    else
      runs.push_back(s);
  }
  // Every block in address order (regions do not overlap).
  std::vector<const Block*> blocks;
  for (const auto& r : regions_)
    for (const Block* b = r->region.first; b != nullptr; b = b->next) blocks.push_back(b);
  std::sort(blocks.begin(), blocks.end(),
            [](const Block* a, const Block* b) { return a->addr < b->addr; });

  auto stream_of_free = [](const Block* b) -> vmm::StreamHandle {
    return !b->tags.all() && b->tags.size() == 1 ? b->tags[0] : nullptr;
  };
  auto emit_span = [&](SegmentInfo& seg, const Span& s) {
    BlockInfo run;  // free slots merge into one entry
    auto flush = [&] {
      if (run.size != 0) seg.blocks.push_back(run);
      run = BlockInfo{};
    };
    for (std::uint32_t i = 0; i < s.slots; ++i) {
      const std::uintptr_t a = s.base + static_cast<std::uintptr_t>(i) * s.slot_size;
      if (s.is_allocated(i)) {
        flush();
        seg.blocks.push_back(
            BlockInfo{a, s.slot_size, s.slot_size, true, true, s.owner->stream});
      } else {
        if (run.size == 0) run = BlockInfo{a, 0, 0, false, true, s.owner->stream};
        run.size += s.slot_size;
      }
    }
    // The tail a slot size leaves over in the granule.
    const std::size_t used = static_cast<std::size_t>(s.slots) * s.slot_size;
    if (used < kGranule) {
      if (run.size == 0) run = BlockInfo{s.base + used, 0, 0, false, true, s.owner->stream};
      run.size += kGranule - used;
    }
    flush();
  };

  std::size_t bi = 0;
  for (const auto& [addr, size] : runs) {
    SegmentInfo seg;
    seg.device = device();
    seg.addr = addr;
    seg.size = size;
    seg.scratch = kind_ == Kind::scratch;
    const std::uintptr_t end = addr + size;
    while (bi < blocks.size() && blocks[bi]->end() <= addr) ++bi;
    for (std::size_t k = bi; k < blocks.size() && blocks[k]->addr < end; ++k) {
      const Block* b = blocks[k];
      if (!b->free && b->span != nullptr) {
        emit_span(seg, *b->span);
        continue;
      }
      // A free block may run past the mapped range: clip it to the segment.
      const std::uintptr_t lo = std::max(b->addr, addr);
      const std::uintptr_t hi = std::min(b->end(), end);
      seg.blocks.push_back(BlockInfo{lo, static_cast<std::size_t>(hi - lo),
                                     b->free ? 0 : b->requested, !b->free, false,
                                     b->free ? stream_of_free(b) : b->stream});
    }
    out.push_back(std::move(seg));
  }
}

}  // namespace gvm::detail
