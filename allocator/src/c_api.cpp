// The C ABI (gvm.h): one process-wide Allocator behind C functions that never
// let an exception out.
//
// The running allocator is one heap object published through an atomic
// pointer. init / shutdown serialize on a mutex; malloc / free only load the
// pointer (acquire), so they contend on nothing global. shutdown must not race
// with other calls (documented in gvm.h), which is what lets the hot path go
// without a reader count.
//
// An allocator still running at process exit is deliberately never destroyed:
// frameworks free tensors from their own static destructors, after ours would
// have run, and the CUDA driver may already be unloading by then.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include "c_api_errors.hpp"
#include "gvm/allocator.hpp"
#include "gvm/config.hpp"
#include "gvm/errors.hpp"
#include "gvm/gvm.h"
#include "gvm/process_allocator.hpp"
#include "gvm/vmm/cuda_driver.hpp"
#include "gvm/vmm/sim_driver.hpp"

namespace gvm {
namespace {

struct Instance {
  // Declared first so it is destroyed last: the allocator uses it to the end.
  std::unique_ptr<vmm::Driver> driver;
  std::unique_ptr<Allocator> allocator;
  int device_count = 0;
};

std::mutex g_lifecycle;
std::atomic<Instance*> g_instance{nullptr};

thread_local gvm_status t_status = GVM_OK;
thread_local std::string t_message;

}  // namespace

namespace detail {

gvm_status record_failure(gvm_status status, const char* fn, const char* what) noexcept {
  t_status = status;
  // "gvm_free: gvmalloc: ..." would say the library's name twice.
  constexpr std::string_view kPrefix = "gvmalloc: ";
  std::string_view text = what;
  if (text.substr(0, kPrefix.size()) == kPrefix) text.remove_prefix(kPrefix.size());
  try {
    t_message.assign(fn).append(": ").append(text);
  } catch (...) {
    t_message.clear();  // no allocation: a cleared string keeps its buffer
  }
  return status;
}

gvm_status record_current_exception(const char* fn) noexcept {
  try {
    throw;
  } catch (const vmm::DriverUnavailable& e) {
    return record_failure(GVM_ERROR_NO_DRIVER, fn, e.what());
  } catch (const driver_error& e) {
    return record_failure(GVM_ERROR_DRIVER, fn, e.what());
  } catch (const out_of_memory& e) {
    return record_failure(GVM_ERROR_OUT_OF_MEMORY, fn, e.what());
  } catch (const std::bad_alloc&) {
    return record_failure(GVM_ERROR_OUT_OF_MEMORY, fn, "out of host memory (std::bad_alloc)");
  } catch (const config_error& e) {
    return record_failure(GVM_ERROR_CONFIG, fn, e.what());
  } catch (const usage_error& e) {
    return record_failure(GVM_ERROR_INVALID_ARGUMENT, fn, e.what());
  } catch (const std::exception& e) {
    return record_failure(GVM_ERROR_INTERNAL, fn, e.what());
  } catch (...) {
    return record_failure(GVM_ERROR_INTERNAL, fn, "unknown exception");
  }
}

}  // namespace detail

namespace {

using detail::record_failure;
constexpr auto fail = record_failure;
constexpr auto fail_current = detail::record_current_exception;

// fail() with a message built by `make` (which may throw; this does not).
template <class F>
gvm_status fail_with(gvm_status status, const char* fn, F&& make) noexcept {
  try {
    const std::string message = make();
    return fail(status, fn, message.c_str());
  } catch (...) {
    return fail(status, fn, "(no message: out of host memory)");
  }
}

// Frameworks cannot be told why a call failed, so say it where a person sees it.
void tell_stderr() noexcept {
  std::fprintf(stderr, "gvmalloc: %s\n", t_message.c_str());
}

Instance* running(const char* fn) noexcept {
  Instance* inst = g_instance.load(std::memory_order_acquire);
  if (inst == nullptr) {
    fail(GVM_ERROR_NOT_INITIALIZED, fn, "gvmalloc is not initialized (call gvm_init first)");
  }
  return inst;
}

bool device_ok(const Instance& inst, int device, const char* fn) noexcept {
  if (device >= 0 && device < inst.device_count) return true;
  fail_with(GVM_ERROR_INVALID_ARGUMENT, fn, [&] {
    return "no device " + std::to_string(device) + " (there are " +
           std::to_string(inst.device_count) + ")";
  });
  return false;
}

// GVM_CONF, then `conf` over it. Throws config_error naming which of the two
// is wrong ("GVM_CONF: ..." or "conf: ...").
Config make_config(const char* conf) {
  Config c = config_from_env();
  if (conf == nullptr) return c;
  try {
    return parse_config(conf, c);
  } catch (const config_error& e) {
    throw config_error(std::string("conf: ") + e.what());
  }
}

// Builds the allocator over `driver` and publishes it. Caller holds g_lifecycle.
void publish(std::unique_ptr<vmm::Driver> driver, const Config& config) {
  auto inst = std::make_unique<Instance>();
  inst->driver = std::move(driver);
  inst->allocator = std::make_unique<Allocator>(*inst->driver, config);
  inst->device_count = inst->allocator->device_count();
  g_instance.store(inst.release(), std::memory_order_release);
}

// Starts the allocator on the real driver. Caller holds g_lifecycle. Throws.
void start_real(const char* conf) {
  const Config config = make_config(conf);  // bad config: reported even without a GPU
  std::string why;
  std::unique_ptr<vmm::Driver> driver = vmm::try_load_cuda_driver(&why);
  if (driver == nullptr) {
    throw vmm::DriverUnavailable(why.empty() ? "no CUDA driver found" : why);
  }
  publish(std::move(driver), config);
}

// The running allocator, started from GVM_CONF on the real driver when there
// is none yet (the framework entry points).
Instance* running_or_start(const char* fn) noexcept {
  Instance* inst = g_instance.load(std::memory_order_acquire);
  if (inst != nullptr) return inst;
  try {
    std::lock_guard<std::mutex> lock(g_lifecycle);
    inst = g_instance.load(std::memory_order_acquire);
    if (inst == nullptr) {
      start_real(nullptr);
      inst = g_instance.load(std::memory_order_acquire);
    }
    return inst;
  } catch (...) {
    fail_current(fn);
    return nullptr;
  }
}

gvm_status free_block(Instance& inst, void* ptr, std::size_t size, int device, void* stream,
                      const char* fn) noexcept {
  if (ptr == nullptr) return fail(GVM_ERROR_INVALID_ARGUMENT, fn, "ptr is NULL");
  if (!device_ok(inst, device, fn)) return GVM_ERROR_INVALID_ARGUMENT;
  try {
    inst.allocator->deallocate(ptr, size, device, stream);
    return GVM_OK;
  } catch (...) {
    return fail_current(fn);
  }
}

void* malloc_block(Instance& inst, std::size_t size, int device, void* stream,
                   const char* fn) noexcept {
  if (size == 0) {
    fail(GVM_ERROR_INVALID_ARGUMENT, fn, "size is 0");
    return nullptr;
  }
  if (!device_ok(inst, device, fn)) return nullptr;
  try {
    return inst.allocator->allocate(size, device, stream);
  } catch (...) {
    fail_current(fn);
    return nullptr;
  }
}

}  // namespace

Allocator& process_allocator() {
  Instance* inst = g_instance.load(std::memory_order_acquire);
  if (inst != nullptr) return *inst->allocator;
  std::lock_guard<std::mutex> lock(g_lifecycle);
  inst = g_instance.load(std::memory_order_acquire);
  if (inst == nullptr) {
    start_real(nullptr);
    inst = g_instance.load(std::memory_order_acquire);
  }
  return *inst->allocator;
}

}  // namespace gvm

using gvm::Instance;

extern "C" {

gvm_status gvm_init(const char* conf) {
  constexpr const char* fn = "gvm_init";
  try {
    std::lock_guard<std::mutex> lock(gvm::g_lifecycle);
    if (gvm::g_instance.load(std::memory_order_acquire) != nullptr) {
      return gvm::fail(GVM_ERROR_ALREADY_INITIALIZED, fn,
                       "gvmalloc is already initialized (call gvm_shutdown first)");
    }
    gvm::start_real(conf);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

gvm_status gvm_init_simulated(const char* profile, int device_count, const char* conf) {
  constexpr const char* fn = "gvm_init_simulated";
  if (profile == nullptr) return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "profile is NULL");
  if (device_count < 1) {
    return gvm::fail_with(GVM_ERROR_INVALID_ARGUMENT, fn, [&] {
      return "device_count " + std::to_string(device_count) + " is not positive";
    });
  }
  try {
    std::lock_guard<std::mutex> lock(gvm::g_lifecycle);
    if (gvm::g_instance.load(std::memory_order_acquire) != nullptr) {
      return gvm::fail(GVM_ERROR_ALREADY_INITIALIZED, fn,
                       "gvmalloc is already initialized (call gvm_shutdown first)");
    }
    const gvm::Config config = gvm::make_config(conf);
    std::unique_ptr<gvm::vmm::SimDriver> driver;
    try {
      driver = gvm::vmm::SimDriver::uniform(gvm::vmm::parse_profile(profile), device_count);
    } catch (const std::invalid_argument& e) {
      // An unknown profile name or a device count the simulator refuses.
      return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, e.what());
    }
    gvm::publish(std::move(driver), config);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

gvm_status gvm_shutdown(void) {
  constexpr const char* fn = "gvm_shutdown";
  Instance* inst = nullptr;
  try {
    std::lock_guard<std::mutex> lock(gvm::g_lifecycle);
    inst = gvm::g_instance.exchange(nullptr, std::memory_order_acq_rel);
  } catch (...) {
    return gvm::fail_current(fn);
  }
  if (inst == nullptr) {
    return gvm::fail(GVM_ERROR_NOT_INITIALIZED, fn, "gvmalloc is not initialized");
  }
  delete inst;  // ~Allocator never throws; then the driver goes
  return GVM_OK;
}

int gvm_is_initialized(void) {
  return gvm::g_instance.load(std::memory_order_acquire) != nullptr ? 1 : 0;
}

void* gvm_malloc(size_t size, int device, void* stream) {
  constexpr const char* fn = "gvm_malloc";
  Instance* inst = gvm::running(fn);
  return inst == nullptr ? nullptr : gvm::malloc_block(*inst, size, device, stream, fn);
}

gvm_status gvm_free(void* ptr, size_t size, int device, void* stream) {
  constexpr const char* fn = "gvm_free";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  return gvm::free_block(*inst, ptr, size == 0 ? gvm::kUnknownSize : size, device, stream, fn);
}

gvm_status gvm_record_stream(void* ptr, void* stream) {
  constexpr const char* fn = "gvm_record_stream";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (ptr == nullptr) return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "ptr is NULL");
  try {
    inst->allocator->record_stream(ptr, stream);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

void* gvm_scratch_malloc(size_t size, int device, void* stream) {
  constexpr const char* fn = "gvm_scratch_malloc";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return nullptr;
  if (size == 0) {
    gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "size is 0");
    return nullptr;
  }
  if (!gvm::device_ok(*inst, device, fn)) return nullptr;
  try {
    return inst->allocator->scratch_allocate(size, device, stream);
  } catch (...) {
    gvm::fail_current(fn);
    return nullptr;
  }
}

gvm_status gvm_forget_stream(void* stream) {
  constexpr const char* fn = "gvm_forget_stream";
  Instance* inst = gvm::g_instance.load(std::memory_order_acquire);
  if (inst == nullptr) return GVM_OK;  // nothing was seen
  try {
    inst->allocator->forget_stream(stream);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

gvm_status gvm_record_stream_on(void* ptr, void* stream, int stream_device) {
  constexpr const char* fn = "gvm_record_stream_on";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (ptr == nullptr) return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "ptr is NULL");
  if (!gvm::device_ok(*inst, stream_device, fn)) return GVM_ERROR_INVALID_ARGUMENT;
  try {
    inst->allocator->record_stream(ptr, stream, stream_device);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

gvm_status gvm_set_peer_policy(const char* policy) {
  constexpr const char* fn = "gvm_set_peer_policy";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (policy == nullptr) return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "policy is NULL");
  try {
    // The same words as GVM_CONF's peer_policy key.
    const gvm::Config c = gvm::parse_config(std::string("peer_policy:") + policy);
    inst->allocator->set_peer_policy(c.peer_policy);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

const char* gvm_peer_policy(int owner, int peer) {
  constexpr const char* fn = "gvm_peer_policy";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return nullptr;
  if (!gvm::device_ok(*inst, owner, fn) || !gvm::device_ok(*inst, peer, fn)) return nullptr;
  try {
    return gvm::to_string(inst->allocator->peer_policy(owner, peer));
  } catch (...) {
    gvm::fail_current(fn);
    return nullptr;
  }
}

gvm_status gvm_peer_copy(void* dst, int dst_device, const void* src, int src_device, size_t size,
                         void* stream) {
  constexpr const char* fn = "gvm_peer_copy";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (dst == nullptr || src == nullptr)
    return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "dst or src is NULL");
  if (!gvm::device_ok(*inst, dst_device, fn) || !gvm::device_ok(*inst, src_device, fn))
    return GVM_ERROR_INVALID_ARGUMENT;
  try {
    inst->allocator->peer_copy(dst, dst_device, src, src_device, size, stream);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

gvm_status gvm_trim(int device) {
  constexpr const char* fn = "gvm_trim";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (device != -1 && !gvm::device_ok(*inst, device, fn)) return GVM_ERROR_INVALID_ARGUMENT;
  try {
    inst->allocator->trim(device);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

void* gvm_torch_malloc(ssize_t size, int device, void* stream) {
  constexpr const char* fn = "gvm_torch_malloc";
  if (size < 0) {
    gvm::fail_with(GVM_ERROR_INVALID_ARGUMENT, fn,
                   [&] { return "size " + std::to_string(size) + " is negative"; });
    gvm::tell_stderr();
    return nullptr;
  }
  if (size == 0) return nullptr;  // PyTorch's empty tensors; freed with NULL
  Instance* inst = gvm::running_or_start(fn);
  void* p = inst == nullptr
                ? nullptr
                : gvm::malloc_block(*inst, static_cast<std::size_t>(size), device, stream, fn);
  if (p == nullptr) gvm::tell_stderr();
  return p;
}

void gvm_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  constexpr const char* fn = "gvm_torch_free";
  if (ptr == nullptr) return;  // what gvm_torch_malloc gave for size 0
  if (size < 0) {
    gvm::fail_with(GVM_ERROR_INVALID_ARGUMENT, fn,
                   [&] { return "size " + std::to_string(size) + " is negative"; });
    gvm::tell_stderr();
    return;
  }
  // A free never starts the allocator: with none running the pointer is not ours.
  Instance* inst = gvm::running(fn);
  const std::size_t bytes = size == 0 ? gvm::kUnknownSize : static_cast<std::size_t>(size);
  if (inst == nullptr || gvm::free_block(*inst, ptr, bytes, device, stream, fn) != GVM_OK) {
    gvm::tell_stderr();
  }
}

void gvm_torch_pool_free(void* ptr, ssize_t size, int device, void* stream) {
  constexpr const char* fn = "gvm_torch_pool_free";
  if (ptr == nullptr) return;
  if (size < 0) {
    gvm::fail_with(GVM_ERROR_INVALID_ARGUMENT, fn,
                   [&] { return "size " + std::to_string(size) + " is negative"; });
    gvm::tell_stderr();
    return;
  }
  Instance* inst = gvm::running(fn);
  const std::size_t bytes = size == 0 ? gvm::kUnknownSize : static_cast<std::size_t>(size);
  if (inst == nullptr || gvm::free_block(*inst, ptr, bytes, device, stream, fn) != GVM_OK) {
    gvm::tell_stderr();  // a free that failed trims nothing
    return;
  }
  try {
    inst->allocator->trim(device);
  } catch (...) {
    gvm::fail_current(fn);
    gvm::tell_stderr();
  }
}

intptr_t gvm_cupy_malloc(intptr_t param, size_t size, int device) {
  constexpr const char* fn = "gvm_cupy_malloc";
  if (size == 0) return 0;
  Instance* inst = gvm::running_or_start(fn);
  void* stream = reinterpret_cast<void*>(param);
  void* p = inst == nullptr ? nullptr : gvm::malloc_block(*inst, size, device, stream, fn);
  if (p == nullptr) gvm::tell_stderr();
  return reinterpret_cast<intptr_t>(p);
}

void gvm_cupy_free(intptr_t param, intptr_t ptr, int device) {
  constexpr const char* fn = "gvm_cupy_free";
  if (ptr == 0) return;
  Instance* inst = gvm::running(fn);
  void* stream = reinterpret_cast<void*>(param);
  if (inst == nullptr || gvm::free_block(*inst, reinterpret_cast<void*>(ptr), gvm::kUnknownSize,
                                         device, stream, fn) != GVM_OK) {
    gvm::tell_stderr();
  }
}

const char* gvm_last_error(void) {
  return gvm::t_message.c_str();
}

gvm_status gvm_last_status(void) {
  return gvm::t_status;
}

void gvm_clear_last_error(void) {
  gvm::t_status = GVM_OK;
  gvm::t_message.clear();
}

const char* gvm_status_name(gvm_status status) {
  switch (status) {
    case GVM_OK: return "GVM_OK";
    case GVM_ERROR_INVALID_ARGUMENT: return "GVM_ERROR_INVALID_ARGUMENT";
    case GVM_ERROR_OUT_OF_MEMORY: return "GVM_ERROR_OUT_OF_MEMORY";
    case GVM_ERROR_DRIVER: return "GVM_ERROR_DRIVER";
    case GVM_ERROR_NO_DRIVER: return "GVM_ERROR_NO_DRIVER";
    case GVM_ERROR_CONFIG: return "GVM_ERROR_CONFIG";
    case GVM_ERROR_NOT_INITIALIZED: return "GVM_ERROR_NOT_INITIALIZED";
    case GVM_ERROR_ALREADY_INITIALIZED: return "GVM_ERROR_ALREADY_INITIALIZED";
    case GVM_ERROR_INTERNAL: return "GVM_ERROR_INTERNAL";
  }
  return "GVM_ERROR_UNKNOWN_STATUS";
}

gvm_status gvm_stats_json(char* buf, size_t buf_size, size_t* needed) {
  constexpr const char* fn = "gvm_stats_json";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (buf == nullptr && buf_size != 0) {
    return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "buf is NULL but buf_size is not 0");
  }
  try {
    const std::string json = inst->allocator->snapshot_json();
    const std::size_t size = json.size() + 1;
    if (needed != nullptr) *needed = size;
    if (buf_size < size) {
      const std::string why = "buffer of " + std::to_string(buf_size) +
                              " bytes is too small: " + "the stats need " + std::to_string(size);
      return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, why.c_str());
    }
    std::memcpy(buf, json.c_str(), size);
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

gvm_status gvm_device_stats(int device, gvm_device_stats_t* out) {
  constexpr const char* fn = "gvm_device_stats";
  Instance* inst = gvm::running(fn);
  if (inst == nullptr) return GVM_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return gvm::fail(GVM_ERROR_INVALID_ARGUMENT, fn, "out is NULL");
  if (!gvm::device_ok(*inst, device, fn)) return GVM_ERROR_INVALID_ARGUMENT;
  try {
    const gvm::DeviceStats d = inst->allocator->device_stats(device);
    gvm_device_stats_t s{};
#define GVM_STATS_COPY(type, name, doc) s.name = d.name;
    GVM_DEVICE_STATS_FIELDS(GVM_STATS_COPY)
#undef GVM_STATS_COPY
    *out = s;
    return GVM_OK;
  } catch (...) {
    return gvm::fail_current(fn);
  }
}

const char* gvm_device_stats_schema(void) {
  static const char* const kSchema =
#define GVM_STATS_LINE(type, name, doc) #type " " #name " " doc "\n"
      GVM_DEVICE_STATS_FIELDS(GVM_STATS_LINE)
#undef GVM_STATS_LINE
      ;
  return kSchema;
}

}  // extern "C"
