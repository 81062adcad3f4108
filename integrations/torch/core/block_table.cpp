#include "block_table.hpp"

namespace gvm::torch_backend {

BlockTable::Shard& BlockTable::shard(const void* ptr) const noexcept {
  // Blocks are 512-byte aligned: the low bits say nothing.
  const auto a = reinterpret_cast<std::uintptr_t>(ptr) >> 9;
  return shards_[(a ^ (a >> 7) ^ (a >> 17)) % kShards];
}

void BlockTable::insert(const void* ptr, BlockRecord record) {
  Shard& s = shard(ptr);
  std::lock_guard lock(s.mutex);
  s.blocks.insert_or_assign(reinterpret_cast<std::uintptr_t>(ptr), std::move(record));
}

std::optional<BlockRecord> BlockTable::take(const void* ptr) {
  Shard& s = shard(ptr);
  std::lock_guard lock(s.mutex);
  auto it = s.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.blocks.end()) return std::nullopt;
  BlockRecord r = std::move(it->second);
  s.blocks.erase(it);
  return r;
}

std::optional<BlockRecord> BlockTable::find(const void* ptr) const {
  Shard& s = shard(ptr);
  std::lock_guard lock(s.mutex);
  auto it = s.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.blocks.end()) return std::nullopt;
  return it->second;
}

bool BlockTable::add_use(const void* ptr, void* stream, int device) {
  Shard& s = shard(ptr);
  std::lock_guard lock(s.mutex);
  auto it = s.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.blocks.end()) return false;
  it->second.uses.emplace_back(stream, device);
  return true;
}

std::size_t BlockTable::size() const {
  std::size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mutex);
    n += s.blocks.size();
  }
  return n;
}

}  // namespace gvm::torch_backend
