// The allocators the benchmarks compare, behind one interface: gvmalloc on the
// real driver and on a simulated H200, cudaMalloc, cudaMallocAsync and
// PyTorch's CUDACachingAllocator. gvm-bench-alloc, gvm-bench-mt and
// gvm-replay-baseline use only this layer, so that every tool measures the
// same thing under the same name.
//
//   BackendHost  what one kind needs once per process: the driver or the CUDA
//                runtime, device 0, and the streams. It lives to the end of the
//                process, so its streams outlive every allocator made on them.
//   Backend      one allocator instance (a fresh one per benchmark run or
//                replay pass), shared by every thread that uses it.
//
// Everything runs on device 0. Only the .cpp files of this layer include the
// CUDA runtime's header (and torch_baseline.cpp PyTorch's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gvm::bench {

enum class BackendKind { gvm_cuda, gvm_sim_h200, cuda_malloc, cuda_malloc_async, torch };

// "gvm_cuda", "gvm_sim_h200", "cudaMalloc", "cudaMallocAsync", and "torch" or
// "torch_expandable" (PyTorch's mode, from PYTORCH_CUDA_ALLOC_CONF).
const char* backend_name(BackendKind kind);

// A stream of device 0: a CUstream for gvmalloc, a cudaStream_t for the
// others. nullptr is the legacy default stream, for every kind.
using StreamHandle = void*;

struct BackendOptions {
  // Start with nothing cached and the peaks at zero, and give everything back
  // at the end: cudaMallocAsync gets a pool of its own (release threshold
  // UINT64_MAX) instead of the device's default pool, PyTorch's allocator is
  // emptied (emptyCache, resetPeakStats). gvmalloc always starts fresh.
  bool fresh = false;
};

// One allocator under test. Thread-safe as the allocator itself is (all of
// them are). Failures throw std::runtime_error (gvm::out_of_memory and the
// allocator's own errors for gvmalloc), naming the call.
class Backend {
 public:
  virtual ~Backend() = default;
  // On `stream`, a stream of the host that made this backend (or nullptr).
  virtual void* allocate(std::size_t bytes, StreamHandle stream) = 0;
  virtual void deallocate(void* p, std::size_t bytes, StreamHandle stream) = 0;
  // Bytes the allocator holds from the device, now and at their peak since it
  // was made; nullopt where the allocator does not say (cudaMalloc).
  virtual std::optional<std::size_t> reserved_bytes() = 0;
  virtual std::optional<std::size_t> peak_reserved_bytes() = 0;
  // Driver calls the allocator has made since it was made (gvmalloc counts
  // its own); nullopt for the others, whose calls are inside the runtime.
  virtual std::optional<std::uint64_t> driver_calls() { return std::nullopt; }
};

class BackendHost {
 public:
  virtual ~BackendHost() = default;
  virtual BackendKind kind() const = 0;
  // Readies the calling thread for device 0 (cudaSetDevice for the CUDA
  // runtime, whose current device is per thread). Call once in each thread.
  virtual void bind_thread() = 0;
  // The index-th stream of device 0 (non-blocking), made on first use and
  // kept to the end of the process. Thread-safe.
  virtual StreamHandle stream(std::size_t index) = 0;
  // Waits for the work queued on `stream`.
  virtual void synchronize(StreamHandle stream) = 0;
  // A fresh allocator.
  virtual std::unique_ptr<Backend> make_backend(const BackendOptions& options = {}) = 0;
};

// The host of `kind`, made on the first call; nullptr when the kind cannot run
// here, with the reason in *why_not ("no CUDA driver found: ...", "built
// without PyTorch ..."). The answer does not change within a process.
BackendHost* backend_host(BackendKind kind, std::string* why_not);

// The kinds of `wanted` that cannot run here, grouped by reason: one line per
// reason, "left out cudaMalloc, cudaMallocAsync: no CUDA driver found: ...".
std::vector<std::string> left_out_lines(const std::vector<BackendKind>& wanted);

namespace detail {
// The hosts, by family (gvm_backend.cpp, runtime_backends.cpp).
BackendHost* gvm_host(BackendKind kind, std::string* why_not);
BackendHost* runtime_host(BackendKind kind, std::string* why_not);
// Why the CUDA driver cannot serve device 0 ("no CUDA driver found: ...",
// "the CUDA driver shows no device"); empty when it can. Asked before the CUDA
// runtime, whose own message without a driver ("CUDA driver version is
// insufficient for CUDA runtime version") misleads.
const std::string& cuda_driver_problem();
}  // namespace detail

}  // namespace gvm::bench
