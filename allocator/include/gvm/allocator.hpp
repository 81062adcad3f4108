// gvm::Allocator: the C++ API of gvmalloc.
//
// One Allocator serves every device the driver shows. Blocks come from one
// large virtual reservation per device (the arena); physical chunks are mapped
// into it as the work grows and returned on trim. Allocation and free are
// stream-ordered, like PyTorch's caching allocator: a block freed on stream S
// is reused at once by S, and by another stream only behind an event recorded
// on S (a stream wait, not a host sync).
//
// Thread-safe. The cache-hit path makes no driver call.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gvm/config.hpp"
#include "gvm/errors.hpp"
#include "gvm/memory_map.hpp"
#include "gvm/stats.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/driver.hpp"

namespace gvm {

// Alignment of every block gvmalloc hands out.
inline constexpr std::size_t kBlockAlignment = 512;

// Passed as `bytes` to deallocate when the caller does not know the size
// (CuPy's free carries none); the size check is then skipped.
inline constexpr std::size_t kUnknownSize = static_cast<std::size_t>(-1);

// A private pool (CUDA graphs, torch.cuda.MemPool): 0 is a device's default
// pool; ids of pools made by create_pool are never reused.
using PoolId = std::uint64_t;

class Allocator {
 public:
  // Reads DeviceCaps of every device once; arenas are created on first use.
  // `driver` must outlive the Allocator. Throws driver_error, config_error.
  explicit Allocator(vmm::Driver& driver, Config config = {});
  // Fences every device, then unmaps and releases everything, including blocks
  // still live (their memory dies with the allocator). Never throws.
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // A block of at least `bytes` on `device`, ordered on `stream`.
  // Throws usage_error (bytes 0 or absurd, no such device), out_of_memory,
  // driver_error.
  void* allocate(std::size_t bytes, int device, vmm::StreamHandle stream);

  // Streams: gvmalloc may record events on a stream it has seen (when
  // another stream takes memory it used, or before memory it used is
  // unmapped or its access changes) until forget_stream(stream) is called.
  // Call it when destroying a stream (before or right after
  // cuStreamDestroy): from then on gvmalloc never touches that handle again,
  // waits for what the stream left through the events it already has (or a
  // device synchronisation), and treats a new stream that gets the same
  // handle as a new stream. The CuPy and Numba integrations call it for the
  // stream objects they see die (Numba: streams named with
  // gvmalloc.numba.stream). Unknown streams are ignored.
  void forget_stream(vmm::StreamHandle stream);

  // Returns a block. `bytes` must be what was asked for (or kUnknownSize);
  // `stream` is the stream its last use was ordered on (normally the stream it
  // was allocated on). Throws usage_error for a pointer we never gave out, an
  // interior pointer, a double free, a size or device that does not match;
  // then nothing changed.
  void deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream);

  // The same, from private pool `pool` (0: the default pool, as above). A
  // pool's blocks come from address space of its own and are reused only
  // inside it. Throws usage_error for an unknown or released pool, or a
  // pool of another device.
  void* allocate(std::size_t bytes, int device, vmm::StreamHandle stream, PoolId pool);
  // Frees `ptr` on the stream it was allocated on (other streams recorded
  // on it are waited for as usual); the device from the address, the size
  // not checked (PyTorch's raw_delete carries neither). Returns the bytes it
  // was allocated with. Throws usage_error like the other deallocate.
  std::size_t deallocate(void* ptr);
  // The device whose memory holds ptr, or -1.
  int device_of(const void* ptr) const;
  // Exactly [addr, addr + bytes) of pool `pool` as a live block again,
  // ordered on `stream`: it must lie in the pool's free memory (a CUDA graph
  // pool restored to a checkpoint, PyTorch's setCheckpointPoolState).
  // Throws usage_error otherwise, changing nothing.
  void* allocate_at(void* addr, std::size_t bytes, vmm::StreamHandle stream, PoolId pool);

  // --- private pools and CUDA graph capture -------------------------------
  PoolId create_pool(int device);
  // The pool's cached memory goes back now, and the rest as its last live
  // blocks are freed; no allocation may name it again. usage_error for an
  // unknown pool.
  void release_pool(PoolId pool);
  // The pool's cached memory goes back (empty_cache of one pool).
  void trim_pool(PoolId pool);
  // A CUDA graph capture into `pool` is under way on its device, from
  // begin to end. Meanwhile gvmalloc does nothing capture forbids on that
  // device: no event query, no synchronisation, no fence, no release (a
  // growth that would need one fails with out_of_memory saying which setting
  // to raise), and without VMM no growth at all (cuMemAlloc is forbidden:
  // out_of_memory); a block freed outside the pool is kept from reuse until the
  // last capture on the device ends (the graph may still use it); a block of
  // the pool is reused inside it only by the stream that freed it (no wait
  // on work outside the capture). trim and set_peer_policy refuse while a
  // capture is under way.
  void begin_capture(PoolId pool);
  void end_capture(PoolId pool);

  // --- the reserve cap and statistics, per device -------------------------
  // memory_fraction of one device at run time (0 < f <= 1), over the
  // config's; the smaller of it and max_reserved holds. Cached memory above
  // a lowered cap goes back at the next growth.
  void set_memory_fraction(int device, double fraction);
  double memory_fraction(int device) const;  // 0: none set
  // Peaks start again from what is live and reserved now.
  void reset_peak_stats(int device);
  // The largest block a request could get from cached (mapped, free)
  // memory of `device`'s default pool without growing.
  std::size_t largest_cached_block(int device) const;

  // The block `ptr` is also used on `stream`: its free waits for that work.
  // Throws usage_error for a pointer that is not a live block.
  void record_stream(void* ptr, vmm::StreamHandle stream);

  // --- peer scratch (docs/peer-access.md) ---------------------------------
  // A block in `device`'s scratch buffer: a separate reservation whose chunks
  // the peers admitted by the peer policy may read and write (granted with
  // one cuMemSetAccess per chunk when it is mapped, never revoked on a free).
  // Ordinary blocks stay private to their device. Free it with deallocate
  // (or scratch_deallocate). Throws as allocate does.
  void* scratch_allocate(std::size_t bytes, int device, vmm::StreamHandle stream);
  void scratch_deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream);

  // record_stream for a stream of any device: for a stream of the block's own
  // device, as record_stream(ptr, stream); for a peer's stream, the fence
  // before an access change or unmap of the block's memory waits for it (with
  // scratch_fence:tracked). Work of a peer must be finished or ordered by the
  // caller before the block is freed, as with any allocator.
  void record_stream(void* ptr, vmm::StreamHandle stream, int stream_device);

  // The policy under which `peer` reaches `owner`'s scratch.
  PeerPolicy peer_policy(int owner, int peer) const;
  // Changes the policy of every pair at a phase boundary (what an inference
  // engine does when its batch size crosses a threshold): fences first, then
  // grants, revokes, or toggles context peer access. automatic returns to
  // the choice from DeviceCaps. Throws driver_error.
  void set_peer_policy(PeerPolicy policy);

  // Copies `bytes` from src (on src_device) to dst (on dst_device), ordered
  // on `stream`, a stream of dst_device. Direct (P2P) when src lies in
  // src_device's scratch and the policy admits dst_device; staged by the
  // driver (cuMemcpyPeerAsync) otherwise. Throws driver_error.
  void peer_copy(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                 vmm::StreamHandle stream);
  // Whether peer_copy from src would take the direct path.
  bool is_peer_copy_direct(const void* src, int src_device, int dst_device) const;

  // Returns every cached chunk of `device` (-1: every device) to the driver,
  // behind the fence. Live blocks are untouched.
  void trim(int device = -1);

  int device_count() const noexcept;
  const vmm::DeviceCaps& caps(int device) const;
  const Config& config() const noexcept;

  Stats stats() const;
  DeviceStats device_stats(int device) const;
  // device_stats(device).reserved_bytes alone: one atomic load, no heap's
  // lock, for callers on an allocation path (the PyTorch backend reports it
  // to the profiler at every allocate and free while memory is profiled).
  std::size_t reserved_bytes(int device) const;
  // The stats as one JSON object (see stats.hpp), plus the config.
  std::string snapshot_json() const;

  // Every segment of `device` (arena and scratch) with its blocks, in address
  // order within each heap. Takes every lock of the device: for snapshots and
  // analysis, not the hot path.
  std::vector<SegmentInfo> memory_map(int device) const;

  // Invariant checker: blocks do not overlap, every byte of each arena is in
  // exactly one block, every live block lies in mapped chunks, and the stats
  // equal what the blocks say. Returns false and says why on the first
  // violation. Takes every lock: for tests and the fuzzer, not the hot path.
  bool check_invariants(std::string* why = nullptr) const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gvm
