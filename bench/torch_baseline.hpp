// PyTorch's CUDACachingAllocator as a baseline, behind a tiny C-style
// interface so that no benchmark includes a torch header (only
// torch_baseline.cpp does, and only when CMake found torch:
// GVM_BENCH_HAVE_TORCH).
//
// Everything runs on CUDA device 0 of the calling thread (set with
// cudaSetDevice by the caller). The allocator's mode is PyTorch's own:
// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first call
// selects expandable segments; torch_impl_name() says which one a run got.
#pragma once

#include <cstddef>
#include <string>

namespace gvm::bench {

// Whether this build has PyTorch's allocator at all (CMake found torch).
bool torch_baseline_built() noexcept;

// Whether the baseline can run here; false with the reason in *why (built
// without torch, no CUDA device, the allocator failed to initialise). The
// first call initialises PyTorch's allocator; safe from several threads.
bool torch_baseline_available(std::string* why);

// "torch" or "torch_expandable", from PYTORCH_CUDA_ALLOC_CONF (or
// PYTORCH_ALLOC_CONF) as PyTorch reads it. Needs no torch.
const char* torch_impl_name();

// raw_alloc_with_stream on device 0; `stream` is a cudaStream_t (nullptr: the
// legacy default stream). Throws std::runtime_error with PyTorch's message
// (out of memory included). Precondition: torch_baseline_available().
void* torch_alloc(std::size_t bytes, void* stream);
// raw_delete: the block goes back to the pool of the stream it was allocated
// on. Never throws (an error is printed to stderr).
void torch_free(void* ptr) noexcept;

// Device 0's reserved bytes (segments held from cudaMalloc / mapped), now and
// at their peak since the last torch_reset_peak(); 0 without torch.
std::size_t torch_reserved_bytes();
std::size_t torch_peak_reserved();
void torch_reset_peak();
// Returns every unused cached segment to the driver (emptyCache).
void torch_empty_cache();

}  // namespace gvm::bench
