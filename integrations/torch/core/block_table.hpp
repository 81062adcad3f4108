// What the backend must remember about a block it handed out when the
// allocator cannot tell it from the address alone: its device, allocation
// stream and requested size (for an allocator without deallocate(ptr) and
// device_of(ptr)), and the blocks that came from a pool's own allocator
// (MemPool(allocator=...)), which are freed through that allocator.
//
// Sharded by address so that threads freeing different blocks rarely meet on
// one lock; the table is not used at all on the hot path when the allocator
// answers those questions itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace gvm::torch_backend {

struct BlockRecord {
  std::size_t requested = 0;
  int device = 0;
  void* stream = nullptr;                   // the allocation stream
  std::shared_ptr<void> custom;             // set: the pool allocator it came from
  std::vector<std::pair<void*, int>> uses;  // record_stream(stream, device) of a custom block
};

class BlockTable {
 public:
  void insert(const void* ptr, BlockRecord record);
  // Removes and returns the record; nothing for an address not in the table.
  std::optional<BlockRecord> take(const void* ptr);
  std::optional<BlockRecord> find(const void* ptr) const;
  // Adds a use by (stream, device) to a block's record; false if not in the table.
  bool add_use(const void* ptr, void* stream, int device);
  std::size_t size() const;

 private:
  static constexpr std::size_t kShards = 64;
  struct Shard {
    mutable std::mutex mutex;
    std::unordered_map<std::uintptr_t, BlockRecord> blocks;
  };
  Shard& shard(const void* ptr) const noexcept;

  mutable std::array<Shard, kShards> shards_;
};

}  // namespace gvm::torch_backend
