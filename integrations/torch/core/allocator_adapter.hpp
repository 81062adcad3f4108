// The one place where the PyTorch backend calls gvmalloc.
//
// The backend serves PyTorch from the process's allocator - the one the C ABI
// (gvm.h) and gvmalloc's Python statistics see - through this interface.
// Parts of gvmalloc's C++ API that the backend needs are still being added
// (private pools, capture, deallocate(ptr), the memory fraction, peak reset;
// see docs/pytorch.md, "What the backend needs from the allocator").
// allocator_adapter.cpp finds at compile time which of them this gvmalloc has
// and uses them; for each one missing it either does the same through what
// exists (a table of its own blocks) or throws api_unavailable naming the
// function. capabilities() says which is which, and
// gvmalloc.torch.backend_info() shows it, so a run says what it tested.
//
// Errors: gvm::out_of_memory when the device cannot supply the memory,
// gvm::usage_error for bad input, api_unavailable as above, and the
// allocator's other errors as they come.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gvm/stats.hpp"
#include "pool_table.hpp"

namespace gvm::torch_backend {

// A gvmalloc function the backend needs and this gvmalloc build does not have.
class api_unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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

// Which parts of gvmalloc's API this build uses (true) or works around /
// lacks (false).
struct Capabilities {
  bool process_allocator = false;  // gvm::process_allocator()
  bool pool_allocate = false;      // allocate(bytes, device, stream, pool), create/release_pool
  bool capture = false;            // begin_capture / end_capture
  bool deallocate_by_ptr = false;  // deallocate(ptr) and device_of(ptr) (else a block table)
  bool memory_fraction = false;    // set_memory_fraction / memory_fraction
  bool reset_peak = false;         // reset_peak_stats
  bool largest_cached = false;     // largest_cached_block (cacheInfo)
  bool memory_map = false;         // memory_map (snapshots, checkpoints)
  bool allocate_at = false;        // allocate_at (restoring a pool checkpoint)
  bool trim_pool = false;          // trim_pool (emptyCache of one pool)
  std::string to_string() const;   // "process_allocator=1,pool_allocate=0,..."
};

struct FreedBlock {
  std::size_t requested = 0;
  int device = 0;
};

class AllocatorAdapter {
 public:
  // The process's allocator (started from GVM_CONF if nothing started it).
  static AllocatorAdapter& instance();

  // Compile-time facts: asking starts nothing.
  static Capabilities capabilities() noexcept;

  void* allocate(std::size_t bytes, int device, void* stream, PoolId pool);
  // The block's requested size and device. usage_error for an address the
  // allocator did not hand out (or already took back).
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
  void trim_pool(PoolId pool, int device);
  DeviceStats device_stats(int device) const;
  std::size_t largest_cached_block(int device) const;
  void set_memory_fraction(int device, double fraction);
  double memory_fraction(int device) const;  // 0: no cap
  void reset_peak_stats(int device);
  std::vector<SegmentView> memory_map(int device) const;
  std::string config_text() const;  // "" when not known

  // The block table (when the allocator cannot look blocks up itself): live
  // blocks the backend holds. For tests.
  std::size_t tracked_blocks() const;

  class Impl;

 private:
  AllocatorAdapter();
  Impl* impl_;
};

}  // namespace gvm::torch_backend
