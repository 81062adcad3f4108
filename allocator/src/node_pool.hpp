// NodePool: a std::allocator replacement for node containers (the best-fit
// set) that recycles nodes on a free list instead of going to malloc for
// every insert and erase - four to five of each per large alloc+free pair.
// Single-threaded: the container it serves is guarded by the device lock.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace gvm::detail {

class NodeArena {
 public:
  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  ~NodeArena() {
    for (void* p : blocks_) ::operator delete(p);
  }

  void* take(std::size_t size) {
    if (size > kNodeBytes) return ::operator new(size);
    if (free_ == nullptr) refill();
    Free* f = free_;
    free_ = f->next;
    return f;
  }
  void give(void* p, std::size_t size) noexcept {
    if (size > kNodeBytes) {
      ::operator delete(p);
      return;
    }
    auto* f = static_cast<Free*>(p);
    f->next = free_;
    free_ = f;
  }

 private:
  // A std::set<Block*> node is 40 bytes with libstdc++.
  static constexpr std::size_t kNodeBytes = 64;
  static constexpr std::size_t kPerBlock = 256;
  struct Free {
    Free* next;
  };
  void refill() {
    char* mem = static_cast<char*>(::operator new(kNodeBytes * kPerBlock));
    blocks_.push_back(mem);
    for (std::size_t i = 0; i < kPerBlock; ++i) {
      auto* f = reinterpret_cast<Free*>(mem + i * kNodeBytes);
      f->next = free_;
      free_ = f;
    }
  }
  Free* free_ = nullptr;
  std::vector<void*> blocks_;
};

template <typename T>
class NodePool {
 public:
  using value_type = T;
  explicit NodePool(NodeArena& arena) noexcept : arena_(&arena) {}
  template <typename U>
  NodePool(const NodePool<U>& o) noexcept : arena_(o.arena()) {}
  T* allocate(std::size_t n) { return static_cast<T*>(arena_->take(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { arena_->give(p, n * sizeof(T)); }
  NodeArena* arena() const noexcept { return arena_; }
  template <typename U>
  bool operator==(const NodePool<U>& o) const noexcept {
    return arena_ == o.arena();
  }

 private:
  NodeArena* arena_;
};

}  // namespace gvm::detail
