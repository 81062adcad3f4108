// The backend finds gvmalloc's API by concepts (allocator_api.hpp). A
// stand-in declaring the API exactly as specified must satisfy every one of
// them, so that the backend uses each piece the day it lands; the adapter
// must report what it detects on gvm::Allocator.
#include "allocator_api.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "allocator_adapter.hpp"
#include "gvm/allocator.hpp"

namespace gvm::torch_backend {
namespace {

struct SpecBlockInfo {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  bool allocated = false;
  bool small = false;
  vmm::StreamHandle stream = nullptr;
};
struct SpecSegmentInfo {
  int device = 0;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  bool scratch = false;
  std::uint64_t pool = 0;
  std::vector<SpecBlockInfo> blocks;
};

// The declarations the lead specified for gvm::Allocator (memory_map, pools,
// capture, deallocate(ptr), fraction, peaks, largest cached block). Never
// defined: only the concepts look at it.
struct SpecifiedAllocator {
  void* allocate(std::size_t bytes, int device, vmm::StreamHandle stream);
  void* allocate(std::size_t bytes, int device, vmm::StreamHandle stream, std::uint64_t pool);
  void deallocate(void* ptr, std::size_t bytes, int device, vmm::StreamHandle stream);
  std::size_t deallocate(void* ptr);
  int device_of(const void* ptr) const;
  std::uint64_t create_pool(int device);
  void release_pool(std::uint64_t pool);
  void begin_capture(std::uint64_t pool);
  void end_capture(std::uint64_t pool);
  std::size_t largest_cached_block(int device) const;
  void set_memory_fraction(int device, double fraction);
  double memory_fraction(int device) const;
  void reset_peak_stats(int device);
  std::vector<SpecSegmentInfo> memory_map(int device) const;
};

// The two the backend proposes on top (docs/pytorch.md).
struct ProposedAllocator : SpecifiedAllocator {
  void* allocate_at(void* addr, std::size_t bytes, vmm::StreamHandle stream, std::uint64_t pool);
  void trim_pool(std::uint64_t pool);
};

TEST(AllocatorApi, TheSpecifiedApiIsDetectedWhole) {
  EXPECT_TRUE(has_pool_allocate<SpecifiedAllocator>);
  EXPECT_TRUE(has_capture<SpecifiedAllocator>);
  EXPECT_TRUE(has_ptr_deallocate<SpecifiedAllocator>);
  EXPECT_TRUE(has_memory_fraction<SpecifiedAllocator>);
  EXPECT_TRUE(has_reset_peak<SpecifiedAllocator>);
  EXPECT_TRUE(has_largest_cached<SpecifiedAllocator>);
  EXPECT_TRUE(has_memory_map<SpecifiedAllocator>);
  EXPECT_FALSE(has_allocate_at<SpecifiedAllocator>);
  EXPECT_FALSE(has_trim_pool<SpecifiedAllocator>);
  EXPECT_TRUE(has_allocate_at<ProposedAllocator>);
  EXPECT_TRUE(has_trim_pool<ProposedAllocator>);
}

TEST(AllocatorApi, AnAllocatorWithoutThemIsNotMistakenForOne) {
  struct Bare {
    void* allocate(std::size_t, int, vmm::StreamHandle);
    void deallocate(void*, std::size_t, int, vmm::StreamHandle);
  };
  EXPECT_FALSE(has_pool_allocate<Bare>);
  EXPECT_FALSE(has_ptr_deallocate<Bare>);
  EXPECT_FALSE(has_memory_map<Bare>);
  EXPECT_FALSE(has_capture<Bare>);
}

TEST(AllocatorApi, TheAdapterReportsWhatGvmAllocatorHas) {
  const Capabilities c = AllocatorAdapter::capabilities();
  EXPECT_EQ(c.pool_allocate, has_pool_allocate<Allocator>);
  EXPECT_EQ(c.capture, has_capture<Allocator>);
  EXPECT_EQ(c.deallocate_by_ptr, has_ptr_deallocate<Allocator>);
  EXPECT_EQ(c.memory_fraction, has_memory_fraction<Allocator>);
  EXPECT_EQ(c.reset_peak, has_reset_peak<Allocator>);
  EXPECT_EQ(c.largest_cached, has_largest_cached<Allocator>);
  EXPECT_EQ(c.memory_map, has_memory_map<Allocator>);
  std::printf("gvmalloc API seen by the PyTorch backend: %s\n", c.to_string().c_str());
}

}  // namespace
}  // namespace gvm::torch_backend
