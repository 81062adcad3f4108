// What the backend asked gvmalloc for, per live block: the request in bytes
// and the device.
//
// PyTorch's statistics count a block by its request (requested_bytes) and by
// the request rounded up to 512 bytes (allocated_bytes), so its free must take
// off exactly what its allocation added. gvmalloc's deallocate(ptr) returns
// the bytes the block was allocated with, which for a small block is its size
// class (a request of 5121 bytes lives in a 6144-byte slot), so the backend
// keeps the request itself; and the device with it, so that a free needs no
// device lookup of its own besides the one inside deallocate(ptr).
//
// On every allocation and free: an open-addressing table (linear probing,
// deletion by backward shift: no tombstones, no allocation per block) in 64
// shards chosen by address, each behind its own mutex, so that threads freeing
// different blocks rarely meet.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace gvm::torch_backend {

struct LiveRequest {
  std::size_t requested = 0;
  int device = 0;
};

class LiveRequests {
 public:
  // Records `ptr`; a record already there for it is replaced, a null ptr
  // is not recorded.
  // Throws std::bad_alloc when the table cannot grow (then nothing changed).
  void insert(const void* ptr, LiveRequest r);
  // Removes and returns the record of `ptr`; nothing if there is none.
  std::optional<LiveRequest> take(const void* ptr);
  std::size_t size() const;

 private:
  struct Slot {
    std::uintptr_t key = 0;  // 0: empty (no block lives at address 0)
    LiveRequest value;
  };
  struct alignas(64) Shard {
    mutable std::mutex mutex;
    std::vector<Slot> slots;  // a power of two in size, or empty
    std::size_t used = 0;

    std::size_t home(std::uintptr_t key) const noexcept;
    std::size_t find(std::uintptr_t key) const noexcept;  // slots.size() if absent
    void grow();
    void put(std::uintptr_t key, LiveRequest value) noexcept;  // room is there
    void erase_at(std::size_t i) noexcept;
  };
  static constexpr std::size_t kShards = 64;
  Shard& shard(std::uintptr_t key) noexcept;

  std::array<Shard, kShards> shards_;
};

}  // namespace gvm::torch_backend
