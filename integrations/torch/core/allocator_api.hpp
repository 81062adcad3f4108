// What an allocator type offers of the API the PyTorch backend uses, as
// concepts: a member that is missing (or has another signature) makes the
// concept false rather than the build fail. allocator_adapter.cpp uses them
// on gvm::Allocator; tests/torch_core checks them against a stand-in that
// declares exactly the API the lead specified, so that the day it lands the
// backend uses it.
#pragma once

#include <concepts>
#include <cstddef>

#include "gvm/vmm/types.hpp"
#include "pool_table.hpp"

namespace gvm::torch_backend {

template <class A>
concept has_pool_allocate = requires(A& a, std::size_t n, int d, vmm::StreamHandle s, PoolId p) {
  { a.allocate(n, d, s, p) } -> std::convertible_to<void*>;
  { a.create_pool(d) } -> std::convertible_to<PoolId>;
  a.release_pool(p);
};
template <class A>
concept has_capture = requires(A& a, PoolId p) {
  a.begin_capture(p);
  a.end_capture(p);
};
template <class A>
concept has_ptr_deallocate = requires(A& a, const A& ca, void* p) {
  { a.deallocate(p) } -> std::convertible_to<std::size_t>;
  { ca.device_of(p) } -> std::convertible_to<int>;
};
template <class A>
concept has_memory_fraction = requires(A& a, const A& ca, int d, double f) {
  a.set_memory_fraction(d, f);
  { ca.memory_fraction(d) } -> std::convertible_to<double>;
};
template <class A>
concept has_reset_peak = requires(A& a, int d) {
  a.reset_peak_stats(d);
};
template <class A>
concept has_largest_cached = requires(const A& a, int d) {
  { a.largest_cached_block(d) } -> std::convertible_to<std::size_t>;
};
template <class A>
concept has_memory_map = requires(const A& a, int d) {
  { a.memory_map(d).size() } -> std::convertible_to<std::size_t>;
};
// Not in the specified API: the backend's proposals (docs/pytorch.md).
template <class A>
concept has_allocate_at = requires(A& a, void* p, std::size_t n, vmm::StreamHandle s, PoolId pool) {
  { a.allocate_at(p, n, s, pool) } -> std::convertible_to<void*>;
};
template <class A>
concept has_trim_pool = requires(A& a, PoolId p) {
  a.trim_pool(p);
};
template <class A>
concept has_config = requires(const A& a) {
  a.config();
};

}  // namespace gvm::torch_backend
