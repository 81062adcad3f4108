// The one place where the PyTorch backend calls gvmalloc.
//
// The backend serves PyTorch from the process's allocator - the one the C ABI
// (gvm.h) and gvmalloc's Python statistics see - through this interface, which
// calls gvm::Allocator (allocator/include/gvm/allocator.hpp) directly and
// keeps, per live block, what the backend asked for (LiveRequests): PyTorch's
// statistics count requests, gvmalloc's deallocate(ptr) answers with the
// block's size class.
//
// Errors: gvm::out_of_memory when the device cannot supply the memory,
// gvm::usage_error for bad input, and the allocator's other errors as they
// come.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gvm/stats.hpp"
#include "live_requests.hpp"
#include "pool_table.hpp"

namespace gvm::torch_backend {

// What the allocator holds on a device (gvm::SegmentInfo / BlockInfo).
struct BlockView {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  bool allocated = false;
  bool small = false;
  void* stream = nullptr;
};
struct SegmentView {
  int device = 0;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  bool scratch = false;
  PoolId pool = 0;
  std::vector<BlockView> blocks;
};

struct FreedBlock {
  std::size_t requested = 0;
  int device = 0;
};

class AllocatorAdapter {
 public:
  // The process's allocator (started from GVM_CONF if nothing started it).
  static AllocatorAdapter& instance();

  void* allocate(std::size_t bytes, int device, void* stream, PoolId pool);
  // Frees the block on its allocation stream; returns what allocate (or
  // allocate_at) was asked for and the device. usage_error for an address
  // this adapter did not hand out (or already took back): then nothing
  // changed.
  FreedBlock deallocate(void* ptr);
  void record_stream(void* ptr, void* stream, int stream_device);

  PoolId create_pool(int device);
  void release_pool(PoolId pool);
  void begin_capture(PoolId pool);
  void end_capture(PoolId pool);
  // Restores one block of a pool checkpoint: exactly [addr, addr + bytes),
  // which must be free in `pool`, becomes a live block again.
  void* allocate_at(void* addr, std::size_t bytes, void* stream, PoolId pool);

  void trim(int device);  // -1: every device
  void trim_pool(PoolId pool);
  DeviceStats device_stats(int device) const;
  std::size_t reserved_bytes(int device) const;  // one atomic load
  std::size_t largest_cached_block(int device) const;
  void set_memory_fraction(int device, double fraction);
  double memory_fraction(int device) const;  // 0: no cap
  void reset_peak_stats(int device);
  std::vector<SegmentView> memory_map(int device) const;
  std::string config_text() const;

  // Live blocks handed out through this adapter. For tests.
  std::size_t live_blocks() const;


 private:
  AllocatorAdapter() = default;
  void* recorded(void* ptr, std::size_t bytes, int device);

  LiveRequests live_;
};

}  // namespace gvm::torch_backend
