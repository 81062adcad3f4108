// The only file of the project that includes a torch header (see
// torch_baseline.hpp). Without torch it compiles to stubs that say why.
#include "torch_baseline.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#if GVM_BENCH_HAVE_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace gvm::bench {

namespace {

// PyTorch's parser takes "expandable_segments:True"; keys are separated by
// commas and spaces do not count. Lower-cased here so "true" matches too.
bool conf_says_expandable(const char* conf) {
  if (conf == nullptr) return false;
  std::string s;
  for (const char* p = conf; *p; ++p) {
    if (!std::isspace(static_cast<unsigned char>(*p))) {
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
    }
  }
  return s.find("expandable_segments:true") != std::string::npos;
}

}  // namespace

bool torch_baseline_built() noexcept {
  return GVM_BENCH_HAVE_TORCH != 0;
}

const char* torch_impl_name() {
  // PyTorch >= 2.8 reads PYTORCH_ALLOC_CONF first, PYTORCH_CUDA_ALLOC_CONF
  // when that is unset.
  const char* conf = std::getenv("PYTORCH_ALLOC_CONF");
  if (conf == nullptr) conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  return conf_says_expandable(conf) ? "torch_expandable" : "torch";
}

#if GVM_BENCH_HAVE_TORCH

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

constexpr c10::DeviceIndex kDevice = 0;
// Index of StatType::AGGREGATE (small and large pools together) in a
// StatArray; 0 in every release, and the enum moved namespace between them.
constexpr std::size_t kAggregate = 0;

struct InitState {
  std::once_flag once;
  bool ok = false;
  std::string why;
};

InitState& init_state() {
  static InitState s;
  return s;
}

}  // namespace

bool torch_baseline_available(std::string* why) {
  InitState& s = init_state();
  std::call_once(s.once, [&s] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      s.why = std::string("no CUDA device for PyTorch's allocator (cudaGetDeviceCount: ") +
              (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")";
      return;
    }
    try {
      // Nothing else in the process initialises c10's allocator (no Python,
      // no ATen), and raw_alloc refuses a device it was not initialised for.
      cca::init(count);
      s.ok = true;
    } catch (const std::exception& e) {
      s.why = std::string("PyTorch's allocator did not initialise: ") + e.what();
    }
  });
  if (!s.ok && why) *why = s.why;
  return s.ok;
}

void* torch_alloc(std::size_t bytes, void* stream) {
  try {
    return cca::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
  } catch (const std::exception& e) {
    // c10::Error (OutOfMemoryError among them) must not leave this file.
    throw std::runtime_error("torch raw_alloc_with_stream(" + std::to_string(bytes) +
                             "): " + std::string(e.what()).substr(0, 400));
  }
}

void torch_free(void* ptr) noexcept {
  try {
    cca::raw_delete(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch raw_delete: %s\n", e.what());
  }
}

std::size_t torch_reserved_bytes() {
  return static_cast<std::size_t>(cca::getDeviceStats(kDevice).reserved_bytes[kAggregate].current);
}

std::size_t torch_peak_reserved() {
  return static_cast<std::size_t>(cca::getDeviceStats(kDevice).reserved_bytes[kAggregate].peak);
}

void torch_reset_peak() {
  cca::resetPeakStats(kDevice);
}

void torch_empty_cache() {
  cca::emptyCache();
}

#else  // !GVM_BENCH_HAVE_TORCH

bool torch_baseline_available(std::string* why) {
  if (why) {
    // GVM_BENCH_TORCH_WHY: what bench/CMakeLists.txt found.
    *why = std::string("built without PyTorch (") + GVM_BENCH_TORCH_WHY +
           "; docs/benchmarks.md says how to build it)";
  }
  return false;
}

void* torch_alloc(std::size_t, void*) {
  throw std::runtime_error("torch_alloc: built without PyTorch");
}
void torch_free(void*) noexcept {}
std::size_t torch_reserved_bytes() {
  return 0;
}
std::size_t torch_peak_reserved() {
  return 0;
}
void torch_reset_peak() {}
void torch_empty_cache() {}

#endif  // GVM_BENCH_HAVE_TORCH

}  // namespace gvm::bench
