// DeviceHeap: physical chunks under the arena - growth, release, trim.
#include <algorithm>
#include <string>

#include "device_heap.hpp"

namespace gvm::detail {

void DeviceHeap::map_run(std::uintptr_t addr, std::size_t size, std::vector<std::uint32_t>& made) {
  const std::size_t chunk_limit = std::max(
      kind_ == Kind::scratch ? config_.scratch_chunk_bytes : config_.max_chunk_bytes, kGranule);
  while (size != 0) {
    const std::size_t piece = std::min(size, chunk_limit);
    // Create, map and grant in one step; a failure undoes itself.
    vmm::MappedChunk mem(driver_, device(), addr, piece, access_);
    std::uint32_t idx;
    if (!free_chunk_slots_.empty()) {
      idx = free_chunk_slots_.back();
      free_chunk_slots_.pop_back();
    } else {
      idx = static_cast<std::uint32_t>(chunks_.size());
      chunks_.emplace_back();
    }
    ChunkRec& c = chunks_[idx];
    c.mem = std::move(mem);
    c.addr = addr;
    c.size = piece;
    c.in_use = true;
    c.streams.clear();
    c.live = 1;  // made for the block being committed (ensure_mapped)
    for (std::uintptr_t g = addr; g < addr + piece; g += kGranule) pages_.at(g).chunk = idx + 1;
    add_reserved(piece);
    ++chunks_mapped_;
    made.push_back(idx);
    addr += piece;
    size -= piece;
  }
}

void DeviceHeap::ensure_mapped(Block* b) {
  // The runs of unmapped granules under the block.
  auto unmapped_runs = [&] {
    std::vector<std::pair<std::uintptr_t, std::size_t>> runs;
    for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end();) {
      if (const std::uint32_t c = pages_.at(g).chunk; c != 0) {
        g = chunks_[c - 1].addr + chunks_[c - 1].size;  // hop over the chunk
        continue;
      }
      if (!runs.empty() && runs.back().first + runs.back().second == g)
        runs.back().second += kGranule;
      else
        runs.emplace_back(g, kGranule);
      g += kGranule;
    }
    return runs;
  };
  // The cache hit: every granule already mapped. Checked first, hopping
  // chunk to chunk, so that a hit allocates nothing.
  bool all_mapped = true;
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end();) {
    const std::uint32_t c = pages_.at(g).chunk;
    if (c == 0) {
      all_mapped = false;
      break;
    }
    g = chunks_[c - 1].addr + chunks_[c - 1].size;
  }
  if (all_mapped) {
    ++large_hits_;
    return;
  }
  auto runs = unmapped_runs();
  std::size_t need = 0;
  for (const auto& r : runs) need += r.second;
  if (need == 0) {
    ++large_hits_;
    return;
  }

  // Before growing: give back whole cached chunks if the cap or the slack
  // bound would be passed (see Config::reserve_slack).
  const std::size_t cap = reserve_cap();
  if (cap != 0 && device_reserved() + need > cap)
    release_cached(device_reserved() + need - cap, false);
  // The scratch never shrinks to make room: its chunks carry peer grants
  // that cost ~1 ms per 64 MiB to make again (MEASUREMENTS.md).
  if (kind_ == Kind::arena && config_.reserve_slack >= 0.0) {
    // The bound follows the peak of live bytes, not the current live bytes:
    // a workload whose live bytes swing below their peak would otherwise
    // release and re-map chunks on every swing (measured on the mixed
    // workload: 42k chunk maps in 2M operations).
    const double live_after = static_cast<double>(live_total()) +
                              static_cast<double>(b->size);
    const double peak = std::max(live_after, static_cast<double>(peak_live_.load()));
    const auto bound = static_cast<std::size_t>(peak * (1.0 + config_.reserve_slack));
    // Only for a growth that would set a new peak of reserved bytes (below
    // the peak, a growth changes nothing the workload has not already paid
    // for, and releasing there is what turned a fragmented steady state into
    // driver churn) and is at least 1/128 of what is reserved
    // (kReleaseGrowthFraction). docs/design-notes.md, "Fragmentation", has
    // the trace study behind both.
    if (reserved_ + need > bound && reserved_ + need > peak_reserved_ &&
        need * kReleaseGrowthFraction >= reserved_) {
      // Empty small-block spans are cached memory too, but only
      // allocate_large, which holds no cache lock, can take them back.
      if (reclaim_spans_first_) throw ReclaimSpans{};
      release_cached(reserved_ + need - bound, false);
    }
  }
  if (cap != 0 && device_reserved() + need > cap) throw_oom(b->requested, "the reserved-bytes cap");

  std::vector<std::uint32_t> made;
  auto undo = [&] {
    // Chunks made for this block were never touched by any stream: no fence.
    for (auto idx : made) (void)release_chunk_noexcept(idx);
  };
  try {
    for (const auto& r : runs) map_run(r.first, r.second, made);
  } catch (const vmm::DriverError& e) {
    if (e.result() != vmm::Result::out_of_memory) {
      undo();
      throw;
    }
    // Out of memory: fence, return every cached chunk, try once more.
    ++oom_retries_;
    try {
      release_cached(0, true);
      for (const auto& r : unmapped_runs()) map_run(r.first, r.second, made);
    } catch (const vmm::DriverError& e2) {
      undo();
      if (e2.result() == vmm::Result::out_of_memory) throw_oom(b->requested, "the device");
      throw;
    }
  }
}

std::size_t DeviceHeap::cached_chunk_bytes() const {
  std::size_t n = 0;
  for (std::uint32_t i = 0; i < chunks_.size(); ++i)
    if (chunks_[i].in_use && chunk_is_free(i)) n += chunks_[i].size;
  return n;
}

bool DeviceHeap::chunk_is_free(std::uint32_t idx) const { return chunks_[idx].live == 0; }

void DeviceHeap::fence_chunks(const std::vector<std::uint32_t>& chunks) {
  // The fence: every stream that may have touched these chunks.
  bool whole_device = false;
  std::vector<StreamRef> streams;
  auto add = [&](StreamRef ref) {
    if (std::find(streams.begin(), streams.end(), ref) == streams.end()) streams.push_back(ref);
  };
  for (auto idx : chunks) {
    const ChunkRec& c = chunks_[idx];
    if (c.streams.all()) whole_device = true;
    for (int i = 0; i < c.streams.size(); ++i) add(StreamRef{device(), c.streams[i]});
    for (const StreamRef& r : c.peer_streams) add(r);
  }
  if (kind_ == Kind::scratch && !config_.scratch_fence_tracked) {
    // Peers' work on the scratch is not seen by the allocator unless the
    // caller names it: drain every device that has access, and the devices
    // of streams known to have touched it (a staged copy runs on the other
    // device's stream).
    std::vector<int> devices;
    auto add_device = [&](int d) {
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    };
    for (const auto& a : access_) add_device(a.device);
    for (const StreamRef& r : streams) add_device(r.device);
    fence_.wait_devices(devices);
  } else if (whole_device) {
    fence_.wait_devices({device()});
    std::vector<StreamRef> others;
    for (const StreamRef& r : streams)
      if (r.device != device()) others.push_back(r);
    fence_.wait(others);
  } else {
    fence_.wait(streams);
  }
}

std::size_t DeviceHeap::release_cached(std::size_t want, bool all) {
  std::vector<std::uint32_t> picked;
  for (std::uint32_t i = 0; i < chunks_.size(); ++i)
    if (chunks_[i].in_use && chunk_is_free(i)) picked.push_back(i);
  if (picked.empty()) return 0;
  if (!all) {
    // Largest first: fewest driver calls for the bytes wanted.
    std::sort(picked.begin(), picked.end(),
              [&](std::uint32_t a, std::uint32_t b) { return chunks_[a].size > chunks_[b].size; });
    std::size_t sum = 0;
    std::size_t n = 0;
    while (n < picked.size() && sum < want) sum += chunks_[picked[n++]].size;
    picked.resize(n);
  }
  fence_chunks(picked);
  ++fences_;
  std::size_t freed = 0;
  for (auto idx : picked) {
    const std::size_t size = chunks_[idx].size;
    release_chunk(idx);
    freed += size;
  }
  return freed;
}

vmm::Result DeviceHeap::release_chunk_noexcept(std::uint32_t idx) noexcept {
  ChunkRec& c = chunks_[idx];
  const vmm::Result r = vmm_ ? c.mem.reset() : driver_.mem_free(device(), c.classic);
  // A cuMemRelease that fails after the cuMemUnmap went through leaves the
  // range unmapped all the same: the books must say so, or the next block
  // served from it faults (the fault sweep's trim / cuMemRelease case). The
  // release is tried once more as the record is cleared below.
  if (r != vmm::Result::success && !(vmm_ && c.mem.empty())) return r;
  if (vmm_) {
    for (std::uintptr_t g = c.addr; g < c.addr + c.size; g += kGranule) {
      if (PageEntry* e = pages_.find(g); e != nullptr) e->chunk = 0;
    }
  }
  sub_reserved(c.size);
  ++chunks_unmapped_;
  c = ChunkRec{};
  free_chunk_slots_.push_back(idx);
  return r;
}

void DeviceHeap::release_chunk(std::uint32_t idx) {
  const std::size_t size = chunks_[idx].size;
  if (!vmm_) {
    // The region this segment backs goes with it, and its one free block.
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const auto& r) { return r->classic_chunk == idx + 1; });
    if (it == regions_.end()) return;
    Block* first = (*it)->region.first;
    const vmm::Result r = release_chunk_noexcept(idx);
    if (r != vmm::Result::success)
      throw vmm::DriverError(r, "cuMemFree(device " + std::to_string(device()) + ", " +
                                    std::to_string(size) + " bytes)");
    // Nothing live is left in it, but its free blocks need not be one: free
    // neighbours of different streams stay apart (mergeable in block.hpp).
    for (Block* b = first; b != nullptr;) {
      Block* next = b->next;
      erase_free(b);
      blocks_.recycle(b);
      b = next;
    }
    regions_.erase(it);
    for (std::size_t i = 0; i < regions_.size(); ++i) regions_[i]->region.index = i;
    return;
  }
  const vmm::Result r = release_chunk_noexcept(idx);
  if (r != vmm::Result::success)
    throw vmm::DriverError(r, "cuMemUnmap/cuMemRelease(device " + std::to_string(device()) +
                                  ", chunk of " + std::to_string(size) + " bytes)");
}

void DeviceHeap::release_unused_regions() {
  if (!vmm_) return;
  // Extra reservations (made when the first filled up) go once wholly free
  // and unmapped. The first stays: it is where the next allocation goes.
  for (std::size_t i = regions_.size(); i-- > 1;) {
    Region& r = regions_[i]->region;
    if (!(r.first->free && r.first->next == nullptr)) continue;
    bool mapped = false;
    for (const auto& c : chunks_)
      if (c.in_use && c.addr - r.base < r.size) mapped = true;
    if (mapped) continue;
    erase_free(r.first);
    blocks_.recycle(r.first);
    regions_.erase(regions_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  for (std::size_t i = 0; i < regions_.size(); ++i) regions_[i]->region.index = i;
}

void DeviceHeap::maybe_release_above_threshold() {
  if (kind_ == Kind::scratch || config_.release_threshold_bytes == SIZE_MAX) return;
  const auto live = static_cast<std::size_t>(std::max<std::int64_t>(0, live_total()));
  const std::size_t cached = reserved_ > live ? reserved_ - live : 0;
  if (cached <= config_.release_threshold_bytes) return;
  try {
    release_cached(cached - config_.release_threshold_bytes, false);
  } catch (const vmm::DriverError&) {
    // Called from deallocate, which reports bad input only: the block is
    // already free. A chunk that could not go back stays mapped and counted;
    // the next release or trim tries again.
  }
}

void DeviceHeap::trim() {
  reclaim_spans();
  std::lock_guard<std::mutex> guard(lock_);
  release_cached(0, true);
  release_unused_regions();
}

}  // namespace gvm::detail

namespace gvm::detail {

std::vector<vmm::AccessDesc> DeviceHeap::access() const {
  std::lock_guard<std::mutex> guard(lock_);
  return access_;
}

void DeviceHeap::set_access(std::vector<vmm::AccessDesc> access) {
  std::lock_guard<std::mutex> guard(lock_);
  // Devices that had access and lose it are named with PROT_NONE: setting
  // the others alone does not revoke (MEASUREMENTS.md, Hazards).
  std::vector<vmm::AccessDesc> descs = access;
  for (const auto& old : access_) {
    const bool kept = std::any_of(access.begin(), access.end(),
                                  [&](const vmm::AccessDesc& a) { return a.device == old.device; });
    if (!kept) descs.push_back({old.device, vmm::Access::none});
  }
  if (vmm_) {
    // What puts a chunk back as it was: the old rights, and PROT_NONE for
    // devices the change would have added.
    std::vector<vmm::AccessDesc> undo = access_;
    for (const auto& a : access)
      if (std::none_of(access_.begin(), access_.end(),
                       [&](const vmm::AccessDesc& o) { return o.device == a.device; }))
        undo.push_back({a.device, vmm::Access::none});
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      ChunkRec& c = chunks_[i];
      if (!c.in_use) continue;
      const vmm::Result r = driver_.mem_set_access(c.addr, c.size, descs.data(), descs.size());
      if (r != vmm::Result::success) {
        // Part-way: the chunks already changed go back, so that the heap's
        // rights are all old or all new (the caller's policy says which).
        for (std::size_t j = 0; j < i; ++j)
          if (chunks_[j].in_use)
            (void)driver_.mem_set_access(chunks_[j].addr, chunks_[j].size, undo.data(),
                                         undo.size());
        throw vmm::DriverError(r, "cuMemSetAccess(device " + std::to_string(device()) +
                                      " scratch chunk of " + std::to_string(c.size) + " bytes)");
      }
    }
    // After the change (behind the caller's fence) only the owner's and the
    // new peers' work can touch the chunks.
    for (auto& c : chunks_) c.peer_streams.clear();
  }
  access_ = std::move(access);
}

const Block* DeviceHeap::live_block_holding(std::uintptr_t addr, std::size_t bytes) const {
  // A walk of the region's blocks: for peer_copy and record_stream on a
  // peer's stream (the scratch holds few blocks), never the allocation path.
  for (const auto& r : regions_) {
    if (addr - r->region.base >= r->region.size) continue;
    for (const Block* b = r->region.first; b != nullptr; b = b->next)
      if (!b->free && addr >= b->addr && addr < b->end() && bytes <= b->end() - addr) return b;
  }
  return nullptr;
}

void DeviceHeap::note_use(std::uintptr_t addr, StreamRef ref) {
  std::lock_guard<std::mutex> guard(lock_);
  // Any pointer into a live block: a copy may start inside one.
  const Block* b = live_block_holding(addr, 1);
  if (b == nullptr) return;
  if (ref.device == device()) {
    tag_chunks(b, ref.stream);
    return;
  }
  for (std::uintptr_t g = b->addr & ~(kGranule - 1); g < b->end(); g += kGranule) {
    const std::uint32_t ci = pages_.at(g).chunk;
    if (ci == 0) continue;
    auto& v = chunks_[ci - 1].peer_streams;
    if (std::find(v.begin(), v.end(), ref) == v.end()) v.push_back(ref);
  }
}

std::vector<StreamRef> DeviceHeap::streams_touching(bool* whole_devices) const {
  std::lock_guard<std::mutex> guard(lock_);
  std::vector<StreamRef> out;
  *whole_devices = kind_ == Kind::scratch && !config_.scratch_fence_tracked;
  for (const auto& c : chunks_) {
    if (!c.in_use) continue;
    if (c.streams.all()) *whole_devices = true;
    for (int i = 0; i < c.streams.size(); ++i) {
      StreamRef r{device(), c.streams[i]};
      if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
    }
    for (const StreamRef& r : c.peer_streams)
      if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  return out;
}

bool DeviceHeap::is_live_block(std::uintptr_t addr, std::size_t bytes) const {
  std::lock_guard<std::mutex> guard(lock_);
  return live_block_holding(addr, bytes) != nullptr;
}

}  // namespace gvm::detail
