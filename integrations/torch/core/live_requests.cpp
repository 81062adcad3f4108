#include "live_requests.hpp"

#include <bit>
#include <utility>

namespace gvm::torch_backend {

namespace {

// Fibonacci hashing of the address: blocks are 512-byte aligned, so the low
// bits say nothing; the product's high bits mix all the others. The top 6
// bits pick the shard, the bits below them the slot.
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr int kShardBits = 6;
// A shard's table starts at this many slots and doubles when half full (linear
// probing stays short below that load).
constexpr std::size_t kFirstSlots = 256;

std::uint64_t mix(std::uintptr_t key) noexcept {
  return (static_cast<std::uint64_t>(key) >> 9) * kGolden;
}

}  // namespace

LiveRequests::Shard& LiveRequests::shard(std::uintptr_t key) noexcept {
  return shards_[static_cast<std::size_t>(mix(key) >> (64 - kShardBits))];
}

std::size_t LiveRequests::Shard::home(std::uintptr_t key) const noexcept {
  const int bits = std::countr_zero(slots.size());
  return static_cast<std::size_t>(mix(key) >> (64 - kShardBits - bits)) & (slots.size() - 1);
}

std::size_t LiveRequests::Shard::find(std::uintptr_t key) const noexcept {
  if (slots.empty()) return 0;
  const std::size_t mask = slots.size() - 1;
  for (std::size_t i = home(key);; i = (i + 1) & mask) {
    if (slots[i].key == key) return i;
    if (slots[i].key == 0) return slots.size();
  }
}

void LiveRequests::Shard::put(std::uintptr_t key, LiveRequest value) noexcept {
  const std::size_t mask = slots.size() - 1;
  std::size_t i = home(key);
  while (slots[i].key != 0 && slots[i].key != key) i = (i + 1) & mask;
  if (slots[i].key == 0) ++used;
  slots[i] = Slot{key, value};
}

void LiveRequests::Shard::grow() {
  // The new vector is made first: if that throws, nothing changed.
  const std::vector<Slot> previous =
      std::exchange(slots, std::vector<Slot>(slots.empty() ? kFirstSlots : slots.size() * 2));
  used = 0;
  for (const Slot& s : previous)
    if (s.key != 0) put(s.key, s.value);
}

void LiveRequests::Shard::erase_at(std::size_t i) noexcept {
  // Backward shift: each later entry of the run moves into the hole unless
  // its home lies cyclically after the hole (then the hole does not cut it
  // off from its home).
  const std::size_t mask = slots.size() - 1;
  for (std::size_t j = (i + 1) & mask; slots[j].key != 0; j = (j + 1) & mask) {
    const std::size_t k = home(slots[j].key);
    const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    slots[i] = slots[j];
    i = j;
  }
  slots[i] = Slot{};
  --used;
}

void LiveRequests::insert(const void* ptr, LiveRequest r) {
  const auto key = reinterpret_cast<std::uintptr_t>(ptr);
  if (key == 0) return;  // no block lives at address 0 (and 0 marks an empty slot)
  Shard& s = shard(key);
  std::lock_guard lock(s.mutex);
  if ((s.used + 1) * 2 > s.slots.size()) s.grow();
  s.put(key, r);
}

std::optional<LiveRequest> LiveRequests::take(const void* ptr) {
  const auto key = reinterpret_cast<std::uintptr_t>(ptr);
  if (key == 0) return std::nullopt;
  Shard& s = shard(key);
  std::lock_guard lock(s.mutex);
  const std::size_t i = s.find(key);
  if (i >= s.slots.size()) return std::nullopt;
  const LiveRequest r = s.slots[i].value;
  s.erase_at(i);
  return r;
}

std::size_t LiveRequests::size() const {
  std::size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mutex);
    n += s.used;
  }
  return n;
}

}  // namespace gvm::torch_backend
