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
#include "gvm/stats.hpp"
#include "gvm/vmm/device_caps.hpp"
#include "gvm/vmm/driver.hpp"

namespace gvm {

// Alignment of every block gvmalloc hands out.
inline constexpr std::size_t kBlockAlignment = 512;

// Passed as `bytes` to deallocate when the caller does not know the size
// (CuPy's free carries none); the size check is then skipped.
inline constexpr std::size_t kUnknownSize = static_cast<std::size_t>(-1);

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

  // Returns a block. `bytes` must be what was asked for (or kUnknownSize);
  // `stream` is the stream its last use was ordered on (normally the stream it
  // was allocated on). Throws usage_error for a pointer we never gave out, an
  // interior pointer, a double free, a size or device that does not match;
  // then nothing changed.
  void deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream);

  // The block `ptr` is also used on `stream`: its free waits for that work.
  // Throws usage_error for a pointer that is not a live block.
  void record_stream(void* ptr, vmm::StreamHandle stream);

  // Returns every cached chunk of `device` (-1: every device) to the driver,
  // behind the fence. Live blocks are untouched.
  void trim(int device = -1);

  int device_count() const noexcept;
  const vmm::DeviceCaps& caps(int device) const;
  const Config& config() const noexcept;

  Stats stats() const;
  DeviceStats device_stats(int device) const;
  // The stats as one JSON object (see stats.hpp), plus the config.
  std::string snapshot_json() const;

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
