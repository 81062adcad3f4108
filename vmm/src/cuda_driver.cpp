// CudaDriver: the Driver interface over the real CUDA driver, loaded with
// dlopen + cuGetProcAddress. The only file in gvmalloc that includes <cuda.h>.
#include "gvm/vmm/cuda_driver.hpp"

#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gvm/vmm/test_driver.hpp"

namespace gvm::vmm {
namespace {

// Every entry point CudaDriver calls, by the base name cuGetProcAddress knows
// it by. The pointer types come from the <cuda.h> declarations (decltype), so
// the compiler checks each call against the ABI of CUDA_VERSION; names that
// <cuda.h> maps to a versioned symbol (cuMemAlloc -> cuMemAlloc_v2) get that
// version's signature, and cuGetProcAddress returns the matching symbol.
#define GVM_CUDA_ENTRY_POINTS(X)    \
  X(cuInit)                         \
  X(cuDriverGetVersion)             \
  X(cuGetErrorName)                 \
  X(cuDeviceGet)                    \
  X(cuDeviceGetCount)               \
  X(cuDeviceGetName)                \
  X(cuDeviceGetAttribute)           \
  X(cuDeviceTotalMem)               \
  X(cuDeviceCanAccessPeer)          \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease)      \
  X(cuCtxGetCurrent)                \
  X(cuCtxSetCurrent)                \
  X(cuCtxSynchronize)               \
  X(cuCtxEnablePeerAccess)          \
  X(cuCtxDisablePeerAccess)         \
  X(cuMemGetInfo)                   \
  X(cuMemGetAllocationGranularity)  \
  X(cuMemAddressReserve)            \
  X(cuMemAddressFree)               \
  X(cuMemCreate)                    \
  X(cuMemRelease)                   \
  X(cuMemMap)                       \
  X(cuMemUnmap)                     \
  X(cuMemSetAccess)                 \
  X(cuMemGetAccess)                 \
  X(cuMemExportToShareableHandle)   \
  X(cuMemImportFromShareableHandle) \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy)                \
  X(cuStreamSynchronize)            \
  X(cuStreamWaitEvent)              \
  X(cuStreamGetId)                  \
  X(cuStreamGetCaptureInfo)         \
  X(cuStreamBeginCapture)           \
  X(cuStreamEndCapture)             \
  X(cuGraphDestroy)                 \
  X(cuEventCreate)                  \
  X(cuEventDestroy)                 \
  X(cuEventRecord)                  \
  X(cuEventQuery)                   \
  X(cuEventSynchronize)             \
  X(cuMemcpyAsync)                  \
  X(cuMemcpyPeerAsync)              \
  X(cuMemcpyHtoD)                   \
  X(cuMemcpyDtoH)                   \
  X(cuMemsetD8Async)                \
  X(cuModuleLoadDataEx)             \
  X(cuModuleUnload)                 \
  X(cuModuleGetFunction)            \
  X(cuLaunchKernel)

// Member `cuFoo_` holds cuFoo. `##` keeps the unversioned name for the member
// and `#` for the string, while decltype(&::name) sees the versioned symbol.
struct Api {
#define GVM_CUDA_FIELD(name) decltype(&::name) name##_ = nullptr;
  GVM_CUDA_ENTRY_POINTS(GVM_CUDA_FIELD)
#undef GVM_CUDA_FIELD
};

// The CUDA version to ask cuGetProcAddress for. CUDA_VERSION, so each entry
// point comes with the ABI of the header we compile against, except where the
// header's unversioned declaration is older than that version's symbol:
// CUDA 13.0 registered cuCtxSynchronize_v2(CUcontext) as "cuCtxSynchronize"
// version 13000 while <cuda.h> still declares cuCtxSynchronize(void), so
// that one is asked for as of 12.0. (cudaTypedefs.h lists every version: in
// CUDA 13.0 no other entry point used here has one newer than 12.0.)
int requested_version(std::string_view name) noexcept {
  return name == "cuCtxSynchronize" ? 12000 : CUDA_VERSION;
}
static_assert(std::is_same_v<decltype(&::cuCtxSynchronize), CUresult (*)()>,
              "<cuda.h> changed cuCtxSynchronize: revisit requested_version()");

Result to_result(CUresult r) noexcept {
  return static_cast<Result>(static_cast<int>(r));
}

std::string error_name(const Api& api, CUresult r) {
  const char* s = nullptr;
  if (api.cuGetErrorName_ != nullptr && api.cuGetErrorName_(r, &s) == CUDA_SUCCESS && s != nullptr)
    return s;
  return result_name(to_result(r));
}

// Makes `want` current on this thread for one call and then restores what was
// current before. Checking with cuCtxGetCurrent rather than trusting a
// thread_local record of the last context we set: the host program (the CUDA
// runtime's cudaSetDevice, PyTorch's device guards) changes the current
// context behind our back, and a stale record would send a call to the wrong
// device. cuCtxGetCurrent reads the driver's own per-thread state, so the
// common case (the caller already on the right device) costs one call with
// no switch; its cost has not been measured on the lent GPUs yet.
class ScopedContext {
 public:
  ScopedContext(const Api& api, CUcontext want) noexcept : api_(api) {
    CUcontext current = nullptr;
    result_ = api_.cuCtxGetCurrent_(&current);
    if (result_ != CUDA_SUCCESS || current == want) return;
    result_ = api_.cuCtxSetCurrent_(want);
    if (result_ == CUDA_SUCCESS) {
      previous_ = current;
      switched_ = true;
    }
  }
  ~ScopedContext() {
    if (switched_) api_.cuCtxSetCurrent_(previous_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

  CUresult result() const noexcept { return result_; }

 private:
  const Api& api_;
  CUresult result_ = CUDA_SUCCESS;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

CUmemAllocationProp device_allocation_prop(int device, ShareableHandleType handle_types) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(handle_types);
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

bool known_handle_type(ShareableHandleType t) noexcept {
  return t == ShareableHandleType::none || t == ShareableHandleType::posix_fd ||
         t == ShareableHandleType::fabric;
}

bool known_access(Access a) noexcept {
  return a == Access::none || a == Access::read || a == Access::read_write;
}

// CU_DEVICE_ATTRIBUTE_MAX for a value outside the enum.
CUdevice_attribute to_cu_attribute(DeviceAttribute a) noexcept {
  using A = DeviceAttribute;
  switch (a) {
    case A::compute_capability_major: return CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
    case A::compute_capability_minor: return CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
    case A::vmm_supported: return CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    case A::posix_fd_handle_supported:
      return CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    case A::fabric_handle_supported: return CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED;
    case A::generic_compression_supported: return CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED;
    case A::unified_addressing: return CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING;
    case A::multiprocessor_count: return CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
  }
  return CU_DEVICE_ATTRIBUTE_MAX;
}

CUstream to_cu(StreamHandle s) noexcept {
  return static_cast<CUstream>(s);
}
CUevent to_cu_event(EventHandle e) noexcept {
  return static_cast<CUevent>(e);
}

class CudaDriver final : public TestDriver {
 public:
  CudaDriver(void* library, const Api& api, std::vector<CUdevice> devices, int version)
      : library_(library),
        api_(api),
        device_count_(static_cast<int>(devices.size())),
        slots_(std::make_unique<Slot[]>(devices.size())),
        version_(version) {
    for (std::size_t i = 0; i < devices.size(); ++i) slots_[i].device = devices[i];
  }

  // Releases the primary contexts this driver retained. The library stays
  // loaded: the CUDA runtime and other users in the process may hold the same
  // libcuda, and unloading a driver whose threads still run is not safe.
  ~CudaDriver() override {
    for (int d = 0; d < device_count_; ++d) {
      if (slots_[d].context.load(std::memory_order_acquire) != nullptr) {
        // CUDA_ERROR_DEINITIALIZED at process exit: the driver has already
        // torn the context down, nothing left to release.
        (void)api_.cuDevicePrimaryCtxRelease_(slots_[d].device);
      }
    }
    (void)library_;
  }

  const char* name() const noexcept override { return "cuda"; }
  int version() const noexcept { return version_; }

  int current_device() const noexcept {
    CUcontext current = nullptr;
    if (api_.cuCtxGetCurrent_(&current) != CUDA_SUCCESS || current == nullptr) return -1;
    for (int d = 0; d < device_count_; ++d)
      if (slots_[d].context.load(std::memory_order_acquire) == current) return d;
    return -1;
  }

  // --- devices -------------------------------------------------------------
  Result device_count(int* count) override {
    if (count == nullptr) return Result::invalid_value;
    *count = device_count_;
    return Result::success;
  }

  Result device_name(int device, std::string* name) override {
    if (!valid(device)) return Result::invalid_device;
    if (name == nullptr) return Result::invalid_value;
    std::array<char, 256> buf{};
    CUresult r = api_.cuDeviceGetName_(buf.data(), static_cast<int>(buf.size()), cu_device(device));
    if (r == CUDA_SUCCESS) *name = buf.data();
    return to_result(r);
  }

  Result device_attribute(int device, DeviceAttribute attr, int* value) override {
    if (!valid(device)) return Result::invalid_device;
    if (value == nullptr) return Result::invalid_value;
    CUdevice_attribute a = to_cu_attribute(attr);
    if (a == CU_DEVICE_ATTRIBUTE_MAX) return Result::invalid_value;
    return to_result(api_.cuDeviceGetAttribute_(value, a, cu_device(device)));
  }

  Result device_total_memory(int device, std::size_t* bytes) override {
    if (!valid(device)) return Result::invalid_device;
    if (bytes == nullptr) return Result::invalid_value;
    return to_result(api_.cuDeviceTotalMem_(bytes, cu_device(device)));
  }

  Result mem_get_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) override {
    if (free_bytes == nullptr || total_bytes == nullptr) return Result::invalid_value;
    return on_device(device, [&] { return api_.cuMemGetInfo_(free_bytes, total_bytes); });
  }

  Result allocation_granularity(int device, GranularityKind kind, std::size_t* bytes) override {
    if (!valid(device)) return Result::invalid_device;
    if (bytes == nullptr) return Result::invalid_value;
    if (kind != GranularityKind::minimum && kind != GranularityKind::recommended)
      return Result::invalid_value;
    CUmemAllocationProp prop = device_allocation_prop(device, ShareableHandleType::none);
    return to_result(api_.cuMemGetAllocationGranularity_(
        bytes, &prop, static_cast<CUmemAllocationGranularity_flags>(kind)));
  }

  Result can_access_peer(int device, int peer, bool* can) override {
    if (!valid(device) || !valid(peer)) return Result::invalid_device;
    if (can == nullptr) return Result::invalid_value;
    if (device == peer) {  // DeviceCaps: a device is not its own peer
      *can = false;
      return Result::success;
    }
    int v = 0;
    CUresult r = api_.cuDeviceCanAccessPeer_(&v, cu_device(device), cu_device(peer));
    if (r == CUDA_SUCCESS) *can = v != 0;
    return to_result(r);
  }

  // --- contexts ------------------------------------------------------------
  Result ctx_synchronize(int device) override {
    return on_device(device, [&] { return api_.cuCtxSynchronize_(); });
  }

  Result enable_peer_access(int device, int peer) override {
    CUcontext peer_ctx = nullptr;
    if (Result r = context(peer, &peer_ctx); r != Result::success) return r;
    return on_device(device, [&] { return api_.cuCtxEnablePeerAccess_(peer_ctx, 0); });
  }

  Result disable_peer_access(int device, int peer) override {
    CUcontext peer_ctx = nullptr;
    if (Result r = context(peer, &peer_ctx); r != Result::success) return r;
    return on_device(device, [&] { return api_.cuCtxDisablePeerAccess_(peer_ctx); });
  }

  // --- virtual memory ------------------------------------------------------
  // The VMM calls act on devices named in their arguments and need no
  // current context.
  Result address_reserve(std::size_t size, std::size_t alignment, DevicePtr* addr) override {
    if (addr == nullptr) return Result::invalid_value;
    CUdeviceptr p = 0;
    CUresult r = api_.cuMemAddressReserve_(&p, size, alignment, 0, 0);
    if (r == CUDA_SUCCESS) *addr = p;
    return to_result(r);
  }

  Result address_free(DevicePtr addr, std::size_t size) override {
    return to_result(api_.cuMemAddressFree_(addr, size));
  }

  Result mem_create(int device, std::size_t size, ShareableHandleType exportable,
                    PhysHandle* handle) override {
    if (!valid(device)) return Result::invalid_device;
    if (handle == nullptr || !known_handle_type(exportable)) return Result::invalid_value;
    CUmemAllocationProp prop = device_allocation_prop(device, exportable);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = api_.cuMemCreate_(&h, size, &prop, 0);
    if (r == CUDA_SUCCESS) *handle = h;
    return to_result(r);
  }

  Result mem_release(PhysHandle handle) override { return to_result(api_.cuMemRelease_(handle)); }

  Result mem_map(DevicePtr addr, std::size_t size, PhysHandle handle) override {
    return to_result(api_.cuMemMap_(addr, size, 0, handle, 0));
  }

  Result mem_unmap(DevicePtr addr, std::size_t size) override {
    return to_result(api_.cuMemUnmap_(addr, size));
  }

  Result mem_set_access(DevicePtr addr, std::size_t size, const AccessDesc* descs,
                        std::size_t count) override {
    if (count == 0 || descs == nullptr) return Result::invalid_value;
    // Few descriptors in practice (owner + peers); no allocation for up to 16.
    std::array<CUmemAccessDesc, 16> small{};
    std::vector<CUmemAccessDesc> large;
    CUmemAccessDesc* out = small.data();
    if (count > small.size()) {
      large.resize(count);
      out = large.data();
    }
    for (std::size_t i = 0; i < count; ++i) {
      if (!valid(descs[i].device)) return Result::invalid_device;
      if (!known_access(descs[i].access)) return Result::invalid_value;
      out[i] = CUmemAccessDesc{};
      out[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      out[i].location.id = descs[i].device;
      out[i].flags = static_cast<CUmemAccess_flags>(descs[i].access);
    }
    return to_result(api_.cuMemSetAccess_(addr, size, out, count));
  }

  Result mem_get_access(DevicePtr addr, int device, Access* access) override {
    if (!valid(device)) return Result::invalid_device;
    if (access == nullptr) return Result::invalid_value;
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device;
    unsigned long long flags = 0;
    CUresult r = api_.cuMemGetAccess_(&flags, &loc, addr);
    if (r == CUDA_SUCCESS) *access = static_cast<Access>(flags);
    return to_result(r);
  }

  Result export_shareable_handle(PhysHandle handle, ShareableHandleType type, void* out) override {
    if (out == nullptr || type == ShareableHandleType::none || !known_handle_type(type))
      return Result::invalid_value;
    return to_result(api_.cuMemExportToShareableHandle_(
        out, handle, static_cast<CUmemAllocationHandleType>(type), 0));
  }

  Result import_shareable_handle(void* shareable, ShareableHandleType type,
                                 PhysHandle* handle) override {
    if (handle == nullptr || type == ShareableHandleType::none || !known_handle_type(type))
      return Result::invalid_value;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = api_.cuMemImportFromShareableHandle_(&h, shareable,
                                                      static_cast<CUmemAllocationHandleType>(type));
    if (r == CUDA_SUCCESS) *handle = h;
    return to_result(r);
  }

  // --- classic allocation --------------------------------------------------
  Result mem_alloc(int device, std::size_t size, DevicePtr* addr) override {
    if (addr == nullptr) return Result::invalid_value;
    return on_device(device, [&] {
      CUdeviceptr p = 0;
      CUresult r = api_.cuMemAlloc_(&p, size);
      if (r == CUDA_SUCCESS) *addr = p;
      return r;
    });
  }

  Result mem_free(int device, DevicePtr addr) override {
    return on_device(device, [&] { return api_.cuMemFree_(addr); });
  }

  // --- streams and events --------------------------------------------------
  Result stream_create(int device, StreamHandle* stream) override {
    if (stream == nullptr) return Result::invalid_value;
    return on_device(device, [&] {
      CUstream s = nullptr;
      CUresult r = api_.cuStreamCreate_(&s, CU_STREAM_NON_BLOCKING);
      if (r == CUDA_SUCCESS) *stream = s;
      return r;
    });
  }

  Result stream_destroy(int device, StreamHandle stream) override {
    if (stream == nullptr) return Result::invalid_handle;  // the default stream is not ours
    return on_device(device, [&] { return api_.cuStreamDestroy_(to_cu(stream)); });
  }

  Result stream_synchronize(int device, StreamHandle stream) override {
    return on_device(device, [&] { return api_.cuStreamSynchronize_(to_cu(stream)); });
  }

  Result stream_get_id(int device, StreamHandle stream, std::uint64_t* id) override {
    if (id == nullptr) return Result::invalid_value;
    return on_device(device, [&] {
      unsigned long long v = 0;
      CUresult r = api_.cuStreamGetId_(to_cu(stream), &v);
      if (r == CUDA_SUCCESS) *id = v;
      return r;
    });
  }

  Result stream_capture_status(int device, StreamHandle stream, CaptureStatus* status,
                               std::uint64_t* capture_id) override {
    if (status == nullptr) return Result::invalid_value;
    return on_device(device, [&] {
      CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
      cuuint64_t id = 0;
      CUresult r =
          api_.cuStreamGetCaptureInfo_(to_cu(stream), &st, &id, nullptr, nullptr, nullptr, nullptr);
      if (r == CUDA_SUCCESS) {
        *status = static_cast<CaptureStatus>(st);
        if (capture_id != nullptr && st == CU_STREAM_CAPTURE_STATUS_ACTIVE) *capture_id = id;
      }
      return r;
    });
  }

  Result stream_begin_capture(int device, StreamHandle stream, CaptureMode mode) override {
    if (mode != CaptureMode::global && mode != CaptureMode::local_thread &&
        mode != CaptureMode::relaxed) {
      return Result::invalid_value;
    }
    return on_device(device, [&] {
      return api_.cuStreamBeginCapture_(to_cu(stream), static_cast<CUstreamCaptureMode>(mode));
    });
  }

  // The graph is not needed by anyone: destroyed at once.
  Result stream_end_capture(int device, StreamHandle stream) override {
    return on_device(device, [&] {
      CUgraph graph = nullptr;
      CUresult r = api_.cuStreamEndCapture_(to_cu(stream), &graph);
      if (graph != nullptr) (void)api_.cuGraphDestroy_(graph);
      return r;
    });
  }

  Result stream_wait_event(int device, StreamHandle stream, EventHandle event) override {
    if (event == nullptr) return Result::invalid_handle;
    return on_device(device, [&] {
      return api_.cuStreamWaitEvent_(to_cu(stream), to_cu_event(event), CU_EVENT_WAIT_DEFAULT);
    });
  }

  Result event_create(int device, EventHandle* event) override {
    if (event == nullptr) return Result::invalid_value;
    return on_device(device, [&] {
      CUevent e = nullptr;
      CUresult r = api_.cuEventCreate_(&e, CU_EVENT_DISABLE_TIMING);
      if (r == CUDA_SUCCESS) *event = e;
      return r;
    });
  }

  Result event_destroy(EventHandle event) override {
    if (event == nullptr) return Result::invalid_handle;
    return to_result(api_.cuEventDestroy_(to_cu_event(event)));
  }

  Result event_record(int device, EventHandle event, StreamHandle stream) override {
    if (event == nullptr) return Result::invalid_handle;
    return on_device(device,
                     [&] { return api_.cuEventRecord_(to_cu_event(event), to_cu(stream)); });
  }

  Result event_query(EventHandle event) override {
    if (event == nullptr) return Result::invalid_handle;
    return to_result(api_.cuEventQuery_(to_cu_event(event)));
  }

  Result event_synchronize(EventHandle event) override {
    if (event == nullptr) return Result::invalid_handle;
    return to_result(api_.cuEventSynchronize_(to_cu_event(event)));
  }

  // --- copies --------------------------------------------------------------
  Result memcpy_async(int device, DevicePtr dst, DevicePtr src, std::size_t bytes,
                      StreamHandle stream) override {
    return on_device(device, [&] { return api_.cuMemcpyAsync_(dst, src, bytes, to_cu(stream)); });
  }

  Result memcpy_peer_async(DevicePtr dst, int dst_device, DevicePtr src, int src_device,
                           std::size_t bytes, StreamHandle stream) override {
    CUcontext dst_ctx = nullptr;
    CUcontext src_ctx = nullptr;
    if (Result r = context(dst_device, &dst_ctx); r != Result::success) return r;
    if (Result r = context(src_device, &src_ctx); r != Result::success) return r;
    // The Driver contract: `stream` is a stream of dst_device and nullptr
    // dst_device's legacy stream, which is the legacy stream of the context
    // current for the call: dst_device's. (The real driver also takes a
    // stream of another device for a copy, as the CUDA programming guide
    // says; the simulated driver holds callers to the contract.)
    return on_device(dst_device, [&] {
      return api_.cuMemcpyPeerAsync_(dst, dst_ctx, src, src_ctx, bytes, to_cu(stream));
    });
  }

  Result memcpy_htod(int device, DevicePtr dst, const void* src, std::size_t bytes) override {
    if (src == nullptr && bytes != 0) return Result::invalid_value;
    return on_device(device, [&] { return api_.cuMemcpyHtoD_(dst, src, bytes); });
  }

  Result memcpy_dtoh(int device, void* dst, DevicePtr src, std::size_t bytes) override {
    if (dst == nullptr && bytes != 0) return Result::invalid_value;
    return on_device(device, [&] { return api_.cuMemcpyDtoH_(dst, src, bytes); });
  }

  Result memset_d8_async(int device, DevicePtr dst, unsigned char value, std::size_t bytes,
                         StreamHandle stream) override {
    return on_device(device,
                     [&] { return api_.cuMemsetD8Async_(dst, value, bytes, to_cu(stream)); });
  }

  // --- test kernels --------------------------------------------------------
  // The JIT's error log goes to stderr on failure: a PTX that does not build
  // for some GPU would otherwise fail with a bare CUDA_ERROR_INVALID_PTX.
  Result module_load_data(int device, const char* ptx, ModuleHandle* module) override {
    if (ptx == nullptr || module == nullptr) return Result::invalid_value;
    return on_device(device, [&] {
      std::array<char, 4096> log{};
      std::array<CUjit_option, 2> options = {CU_JIT_ERROR_LOG_BUFFER,
                                             CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
      std::array<void*, 2> values = {log.data(), reinterpret_cast<void*>(log.size())};
      CUmodule m = nullptr;
      CUresult r = api_.cuModuleLoadDataEx_(&m, ptx, static_cast<unsigned>(options.size()),
                                            options.data(), values.data());
      if (r == CUDA_SUCCESS) {
        *module = m;
      } else {
        log.back() = '\0';
        std::fprintf(stderr, "gvm: cuModuleLoadData on device %d failed: %s\n%s\n", device,
                     error_name(api_, r).c_str(), log.data());
      }
      return r;
    });
  }

  Result module_unload(int device, ModuleHandle module) override {
    if (module == nullptr) return Result::invalid_handle;
    return on_device(device, [&] { return api_.cuModuleUnload_(static_cast<CUmodule>(module)); });
  }

  Result module_get_function(ModuleHandle module, const char* name,
                             FunctionHandle* function) override {
    if (module == nullptr) return Result::invalid_handle;
    if (name == nullptr || function == nullptr) return Result::invalid_value;
    CUfunction f = nullptr;
    CUresult r = api_.cuModuleGetFunction_(&f, static_cast<CUmodule>(module), name);
    if (r == CUDA_SUCCESS) *function = f;
    return to_result(r);
  }

  Result launch_kernel(int device, FunctionHandle function, unsigned grid_x, unsigned block_x,
                       StreamHandle stream, void** args) override {
    if (function == nullptr) return Result::invalid_handle;
    return on_device(device, [&] {
      return api_.cuLaunchKernel_(static_cast<CUfunction>(function), grid_x, 1, 1, block_x, 1, 1, 0,
                                  to_cu(stream), args, nullptr);
    });
  }

 private:
  // One device: its handle and its primary context, retained on first use.
  struct Slot {
    CUdevice device = 0;
    std::atomic<CUcontext> context{nullptr};
    std::mutex retain_mutex;
  };

  bool valid(int device) const noexcept { return device >= 0 && device < device_count_; }
  CUdevice cu_device(int device) const noexcept { return slots_[device].device; }

  // The primary context of `device`, retained once. A failed retain is not
  // remembered: the next call tries again.
  Result context(int device, CUcontext* ctx) {
    if (!valid(device)) return Result::invalid_device;
    Slot& s = slots_[device];
    CUcontext c = s.context.load(std::memory_order_acquire);
    if (c == nullptr) {
      std::lock_guard<std::mutex> lock(s.retain_mutex);
      c = s.context.load(std::memory_order_relaxed);
      if (c == nullptr) {
        CUresult r = api_.cuDevicePrimaryCtxRetain_(&c, s.device);
        if (r != CUDA_SUCCESS) return to_result(r);
        s.context.store(c, std::memory_order_release);
      }
    }
    *ctx = c;
    return Result::success;
  }

  // Runs `call` (returning a CUresult) with `device`'s primary context current.
  template <class F>
  Result on_device(int device, F&& call) {
    CUcontext ctx = nullptr;
    if (Result r = context(device, &ctx); r != Result::success) return r;
    ScopedContext scope(api_, ctx);
    if (scope.result() != CUDA_SUCCESS) return to_result(scope.result());
    return to_result(call());
  }

  void* library_;
  Api api_;
  int device_count_;
  std::unique_ptr<Slot[]> slots_;
  int version_;
};

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string query_status_name(CUdriverProcAddressQueryResult s) {
  switch (s) {
    case CU_GET_PROC_ADDRESS_SUCCESS: return "found";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "symbol not found";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "driver version not sufficient";
  }
  return "status " + std::to_string(static_cast<int>(s));
}

}  // namespace

std::unique_ptr<TestDriver> load_cuda_test_driver_from(const char* library) {
  if (library == nullptr || *library == '\0')
    throw DriverUnavailable("no CUDA driver found: no library name given");
  dlerror();  // clear any earlier error so the message below is ours
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    throw DriverUnavailable(std::string("no CUDA driver found: ") + (e != nullptr ? e : library));
  }

  // cuGetProcAddress_v2 (CUDA 12.0+) is the one symbol taken with dlsym; the
  // driver itself then picks each entry point's version for CUDA_VERSION.
  auto get_proc =
      reinterpret_cast<decltype(&::cuGetProcAddress)>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    dlclose(lib);
    throw DriverUnavailable(std::string("CUDA driver too old or not a CUDA driver: ") + library +
                            " has no cuGetProcAddress_v2 (gvmalloc needs a driver for CUDA "
                            "12.0 or newer)");
  }

  Api api;
  auto resolve = [&](const char* name, void** slot) {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const int version = requested_version(name);
    CUresult r = get_proc(name, slot, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
    if (r != CUDA_SUCCESS || *slot == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
      dlclose(lib);
      throw DriverUnavailable(std::string("CUDA driver too old: ") + library + " has no " + name +
                              " for CUDA " + version_string(version) + " (" +
                              query_status_name(status) + ", CUresult " +
                              std::to_string(static_cast<int>(r)) + ")");
    }
  };
#define GVM_CUDA_RESOLVE(name) resolve(#name, reinterpret_cast<void**>(&api.name##_));
  GVM_CUDA_ENTRY_POINTS(GVM_CUDA_RESOLVE)
#undef GVM_CUDA_RESOLVE

  // From here on the library stays loaded even on failure: cuInit may have
  // started driver threads, and unloading under them is not safe.
  CUresult r = api.cuInit_(0);
  if (r != CUDA_SUCCESS)
    throw DriverUnavailable("CUDA driver found but cuInit failed: " + error_name(api, r));

  int version = 0;
  r = api.cuDriverGetVersion_(&version);
  if (r != CUDA_SUCCESS)
    throw DriverUnavailable("CUDA driver found but cuDriverGetVersion failed: " +
                            error_name(api, r));

  int count = 0;
  r = api.cuDeviceGetCount_(&count);
  if (r != CUDA_SUCCESS)
    throw DriverUnavailable("CUDA driver found but cuDeviceGetCount failed: " + error_name(api, r));
  if (count <= 0) throw DriverUnavailable("CUDA driver found but it shows no device");

  std::vector<CUdevice> devices(static_cast<std::size_t>(count));
  for (int d = 0; d < count; ++d) {
    r = api.cuDeviceGet_(&devices[static_cast<std::size_t>(d)], d);
    if (r != CUDA_SUCCESS)
      throw DriverUnavailable("CUDA driver found but cuDeviceGet(" + std::to_string(d) +
                              ") failed: " + error_name(api, r));
  }
  return std::make_unique<CudaDriver>(lib, api, std::move(devices), version);
}

std::unique_ptr<TestDriver> load_cuda_test_driver() {
  return load_cuda_test_driver_from("libcuda.so.1");
}

std::unique_ptr<TestDriver> try_load_cuda_test_driver(std::string* why) {
  try {
    auto d = load_cuda_test_driver();
    if (why != nullptr) why->clear();
    return d;
  } catch (const std::exception& e) {
    if (why != nullptr) *why = e.what();
    return nullptr;
  }
}

std::unique_ptr<Driver> load_cuda_driver_from(const char* library) {
  return load_cuda_test_driver_from(library);
}

std::unique_ptr<Driver> load_cuda_driver() {
  return load_cuda_test_driver();
}

std::unique_ptr<Driver> try_load_cuda_driver(std::string* why) {
  return try_load_cuda_test_driver(why);
}

int cuda_driver_version(const Driver& driver) noexcept {
  auto* d = dynamic_cast<const CudaDriver*>(&driver);
  return d != nullptr ? d->version() : 0;
}

int cuda_current_device(const Driver& driver) noexcept {
  auto* d = dynamic_cast<const CudaDriver*>(&driver);
  return d != nullptr ? d->current_device() : -1;
}

}  // namespace gvm::vmm
