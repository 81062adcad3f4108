// PageMap: address -> granule entry, by address arithmetic, one per device.
//
// Two levels over a 49-bit virtual address space at 2 MiB granules: the top
// level has 2^14 slots of 16 GiB each, each leaf 8192 entries, created the
// first time a granule in it is used. A lookup is two loads, no hash and no
// lock; leaves are never freed before the map itself, so a reader holding a
// leaf pointer can never see it disappear.
//
//   address bits:  48 ........ 34 | 33 ........ 21 | 20 ...... 0
//                  top index       leaf index        offset in granule
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

namespace gvm::detail {

struct Block;
struct Span;
class Heap;

inline constexpr int kGranuleShift = 21;
inline constexpr std::size_t kGranule = std::size_t{1} << kGranuleShift;

struct PageEntry {
  // The heap whose mapped chunk covers this granule, or null: set when the
  // chunk is mapped, cleared when it is unmapped. Read without a lock by
  // deallocate to find the heap to lock (a live block's granules are always
  // mapped, so its entry always names its heap).
  std::atomic<Heap*> owner{nullptr};
  // The small-block span occupying this granule, or null. Read without a
  // lock by deallocate; written under the owner's lock.
  std::atomic<Span*> span{nullptr};
  // Allocated large blocks that start in this granule (chained by
  // Block::page_next); under the owner's lock.
  Block* starts = nullptr;
  // 1 + index of the owner's chunk mapped here; 0 when unmapped. Owner's lock.
  std::uint32_t chunk = 0;
};

class PageMap {
 public:
  static constexpr int kAddressBits = 49;
  static constexpr int kLeafBits = 13;
  static constexpr int kTopBits = kAddressBits - kGranuleShift - kLeafBits;

  PageMap() = default;
  PageMap(const PageMap&) = delete;
  PageMap& operator=(const PageMap&) = delete;
  ~PageMap() {
    for (auto& slot : top_) delete slot.load(std::memory_order_relaxed);
  }

  static bool in_range(std::uintptr_t addr) noexcept { return (addr >> kAddressBits) == 0; }

  // The entry of the granule holding addr, or null if none was ever created.
  PageEntry* find(std::uintptr_t addr) const noexcept {
    if (!in_range(addr)) return nullptr;
    Leaf* leaf = top_[top_index(addr)].load(std::memory_order_acquire);
    return leaf == nullptr ? nullptr : &leaf->entries[leaf_index(addr)];
  }

  // The entry of the granule holding addr, creating its leaf. addr must be
  // in_range. Any thread: a leaf made by two threads at once is made once.
  PageEntry& at(std::uintptr_t addr) {
    auto& slot = top_[top_index(addr)];
    Leaf* leaf = slot.load(std::memory_order_acquire);
    if (leaf == nullptr) {
      auto fresh = std::make_unique<Leaf>();
      if (slot.compare_exchange_strong(leaf, fresh.get(), std::memory_order_acq_rel))
        leaf = fresh.release();
    }
    return leaf->entries[leaf_index(addr)];
  }

 private:
  struct Leaf {
    std::array<PageEntry, std::size_t{1} << kLeafBits> entries;
  };
  static std::size_t top_index(std::uintptr_t a) noexcept { return a >> (kGranuleShift + kLeafBits); }
  static std::size_t leaf_index(std::uintptr_t a) noexcept {
    return (a >> kGranuleShift) & ((std::size_t{1} << kLeafBits) - 1);
  }

  std::array<std::atomic<Leaf*>, std::size_t{1} << kTopBits> top_{};
};

}  // namespace gvm::detail
