// PyTorch's private memory pools on one device, mapped to gvmalloc's pools.
//
// PyTorch names a pool by a MempoolId_t, a pair of integers: CUDA graphs make
// one per capture (or share one given as pool=, from another graph or from
// torch.cuda.graph_pool_handle()), torch.cuda.MemPool makes one per object.
// Each PyTorch pool here is one gvmalloc pool (Allocator::create_pool) with a
// use count: MemPool() and every begin of allocation into the pool take a
// reference, releasePool drops one, and at zero the gvmalloc pool is released
// (its cached memory goes back; blocks still live in it stay live).
//
// Routing, as PyTorch's allocator does it: beginAllocateToPool(pool, filter)
// sends the allocations of every stream the filter accepts into the pool
// (a CUDA graph's filter accepts the streams of its capture; use_mem_pool's
// the calling thread's), until endAllocateToPool. The routes are tried in the
// order they began. While no route is open, route() is one atomic load.
//
// A pool made with an allocator of its own (MemPool(allocator=...)) has no
// gvmalloc pool: its allocations go to that allocator (`custom`, kept opaque
// here; the backend knows its type).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace gvm::torch_backend {

using PoolId = std::uint64_t;  // gvmalloc's pool id; 0 is a device's default pool

struct MempoolKey {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool is_default() const noexcept { return first == 0 && second == 0; }
  friend bool operator==(const MempoolKey&, const MempoolKey&) = default;
};

struct MempoolKeyHash {
  std::size_t operator()(const MempoolKey& k) const noexcept {
    return std::hash<std::uint64_t>{}(k.first * 0x9e3779b97f4a7c15ULL ^ k.second);
  }
};

// Where one allocation goes.
struct Target {
  PoolId pool = 0;               // gvmalloc pool (0: the default pool)
  MempoolKey key{};              // the PyTorch pool ({0,0}: none)
  std::shared_ptr<void> custom;  // set: allocate through this allocator instead
  bool capture = false;          // the route is a CUDA graph capture
};

class PoolTable {
 public:
  using Filter = std::function<bool(void* stream)>;
  using MakePool = std::function<PoolId()>;

  // A reference to `key`, creating it (make() gives its gvmalloc pool; not
  // called for a pool with a `custom` allocator). Taking a reference to an
  // existing pool with a different `custom` allocator is an error (throws
  // std::invalid_argument), as it is for PyTorch.
  void create_or_incref(MempoolKey key, std::shared_ptr<void> custom, const MakePool& make);

  // beginAllocateToPool: a reference (as create_or_incref without an
  // allocator) and a route for the streams `filter` accepts. `capture`: the
  // route serves a CUDA graph capture. Returns the pool's target.
  Target begin(MempoolKey key, Filter filter, bool capture, const MakePool& make);

  // endAllocateToPool: closes the latest open route of `key`; returns its
  // target, or nothing if no route of `key` is open.
  std::optional<Target> end(MempoolKey key);

  // releasePool: drops a reference. Returns the gvmalloc pool to release when
  // it was the last one (nothing for a custom-allocator pool or while
  // references remain). Unknown key: nothing (PyTorch releases pools that
  // were never used on this device).
  std::optional<PoolId> release(MempoolKey key);

  int use_count(MempoolKey key) const;
  void set_use_on_oom(MempoolKey key, bool use);
  void set_no_split(MempoolKey key);
  bool no_split(MempoolKey key) const;

  // Where an allocation on `stream` goes: the first open route whose filter
  // accepts it, else the default pool.
  Target route(void* stream) const;
  bool any_routes() const noexcept { return open_routes_.load(std::memory_order_acquire) > 0; }
  // A CUDA graph capture is open on this device (a route begun with capture).
  bool capturing() const noexcept { return open_captures_.load(std::memory_order_acquire) > 0; }

  // Pools marked use_on_oom (MemPool(use_on_oom=True)): tried when an
  // allocation outside every pool runs out of memory.
  std::vector<Target> use_on_oom_targets() const;

  std::optional<Target> find(MempoolKey key) const;
  // The PyTorch pool of a gvmalloc pool (for snapshots).
  std::optional<MempoolKey> key_of(PoolId pool) const;
  std::vector<MempoolKey> keys() const;

 private:
  struct Entry {
    PoolId pool = 0;
    std::shared_ptr<void> custom;
    int use_count = 0;
    bool use_on_oom = false;
    bool no_split = false;
  };
  struct Route {
    MempoolKey key;
    Filter filter;
    bool capture = false;
  };

  Entry& incref_locked(MempoolKey key, const std::shared_ptr<void>& custom, const MakePool& make);
  static Target target_of(MempoolKey key, const Entry& e, bool capture);

  mutable std::mutex mutex_;
  std::unordered_map<MempoolKey, Entry, MempoolKeyHash> pools_;
  std::vector<Route> routes_;
  std::atomic<int> open_routes_{0};
  std::atomic<int> open_captures_{0};
};

}  // namespace gvm::torch_backend
