/* gvm.h: the C ABI of gvmalloc.
 *
 * One process-wide allocator sits behind these functions. Start it with
 * gvm_init (the real CUDA driver) or gvm_init_simulated (a CPU simulation, for
 * tests, trace replay and demos on machines without a GPU); stop it with
 * gvm_shutdown. The PyTorch and CuPy entry points start it lazily from
 * GVM_CONF, because those frameworks call the allocator before user code can.
 *
 * Errors. No C++ exception crosses this ABI. A failing call returns a status
 * (or NULL / 0 where it returns a pointer) and records, for the calling thread
 * only, the status and a one-line message: gvm_last_status() and
 * gvm_last_error(). A successful call leaves them as they were (like errno),
 * so read them only after a call has said it failed. A call that fails on bad
 * input changes nothing in the allocator.
 *
 * Threads. Every function may be called from any thread. gvm_malloc / gvm_free
 * and the framework entry points take no process-wide lock. gvm_shutdown must
 * not run while another thread is inside a gvmalloc call (the same contract as
 * cudaDeviceReset): it destroys the allocator those calls are using.
 *
 * Streams are CUstream / cudaStream_t values passed as void*; NULL is the
 * legacy default stream of the device named in the call.
 *
 * docs/c-api.md says more, with examples for PyTorch and CuPy. */
#ifndef GVM_GVM_H_
#define GVM_GVM_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t (gvmalloc is Linux-only, like its dlopen of libcuda.so.1) */

#include "gvm/device_stats_fields.h"

#define GVM_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gvm_status {
  GVM_OK = 0,
  GVM_ERROR_INVALID_ARGUMENT,    /* bad input: unknown pointer, double free, size 0, ... */
  GVM_ERROR_OUT_OF_MEMORY,       /* the device could not supply it, even after trimming */
  GVM_ERROR_DRIVER,              /* a CUDA driver call failed (the message names it) */
  GVM_ERROR_NO_DRIVER,           /* no usable CUDA driver on this machine */
  GVM_ERROR_CONFIG,              /* a bad GVM_CONF / conf string (the message names the key) */
  GVM_ERROR_NOT_INITIALIZED,     /* gvm_init has not run (or gvm_shutdown has) */
  GVM_ERROR_ALREADY_INITIALIZED, /* gvm_init while an allocator is running */
  GVM_ERROR_INTERNAL             /* a bug in gvmalloc; please report the message */
} gvm_status;

/* ---- lifecycle ---------------------------------------------------------- */

/* Starts the allocator on the real CUDA driver. `conf` is "key:value,..."
 * (docs/config.md) applied over GVM_CONF's values; NULL means GVM_CONF alone.
 * GVM_ERROR_NO_DRIVER when there is no usable driver, GVM_ERROR_CONFIG for a
 * bad key or value, GVM_ERROR_ALREADY_INITIALIZED when one is running. */
GVM_API gvm_status gvm_init(const char* conf);

/* Starts the allocator on the simulated driver: `device_count` devices of
 * `profile` ("p40", "v100", "t4", "a100", "l4", "h100", "h200", "b200"), every
 * pair peer-capable. `conf` as for gvm_init (also over GVM_CONF). */
GVM_API gvm_status gvm_init_simulated(const char* profile, int device_count, const char* conf);

/* Fences every device, then returns all memory to the driver, including
 * blocks still live: their pointers die here. GVM_ERROR_NOT_INITIALIZED when
 * nothing is running. */
GVM_API gvm_status gvm_shutdown(void);

/* 1 while an allocator is running, else 0. */
GVM_API int gvm_is_initialized(void);

/* ---- allocation --------------------------------------------------------- */

/* A block of at least `size` bytes (512-byte aligned) on `device`, ordered on
 * `stream`. NULL on failure (size 0 is a failure: GVM_ERROR_INVALID_ARGUMENT). */
GVM_API void* gvm_malloc(size_t size, int device, void* stream);

/* Returns a block. `size` is what was asked for, or 0 when unknown (then the
 * size check is skipped); `stream` is the stream of its last use. A NULL,
 * unknown, interior or already freed pointer, or a size or device that does
 * not match, is GVM_ERROR_INVALID_ARGUMENT and frees nothing. */
GVM_API gvm_status gvm_free(void* ptr, size_t size, int device, void* stream);

/* The block `ptr` is also used on `stream`: its free waits for that work. */
GVM_API gvm_status gvm_record_stream(void* ptr, void* stream);
/* The stream is being destroyed: gvmalloc never uses its handle again, and a
 * new stream that gets the same handle is a new stream (gvm::Allocator::
 * forget_stream). Call it before or right after cuStreamDestroy. A stream
 * gvmalloc never saw is ignored; without a running allocator, nothing to do. */
GVM_API gvm_status gvm_forget_stream(void* stream);

/* ---- peer scratch (docs/peer-access.md) ----------------------------------
 * A block in `device`'s scratch buffer, which the peers admitted by the peer
 * policy may read and write; ordinary blocks stay private to their device.
 * Free it with gvm_free. NULL on failure (see gvm_last_error). */
GVM_API void* gvm_scratch_malloc(size_t size, int device, void* stream);
/* record_stream for a stream of any device (`stream_device`): a peer's stream
 * is waited for by the fence before the block's memory changes access. */
GVM_API gvm_status gvm_record_stream_on(void* ptr, void* stream, int stream_device);
/* "auto", "per_allocation", "global" or "none", for every device pair, at a
 * phase boundary: fences first, then grants, revokes or toggles. */
GVM_API gvm_status gvm_set_peer_policy(const char* policy);
/* The policy under which `peer` reaches `owner`'s scratch; NULL on bad input. */
GVM_API const char* gvm_peer_policy(int owner, int peer);
/* Copies `size` bytes, ordered on `stream` (a stream of dst_device): direct
 * when src is in src_device's scratch and the policy admits dst_device,
 * staged by the driver otherwise. */
GVM_API gvm_status gvm_peer_copy(void* dst, int dst_device, const void* src, int src_device,
                                 size_t size, void* stream);

/* Returns the cached (free but mapped) memory of `device` to the driver;
 * -1: of every device. Live blocks are untouched. */
GVM_API gvm_status gvm_trim(int device);

/* ---- PyTorch: torch.cuda.memory.CUDAPluggableAllocator ------------------
 * torch.cuda.memory.CUDAPluggableAllocator("libgvmalloc.so",
 *                                          "gvm_torch_malloc", "gvm_torch_free")
 * Both start the allocator from GVM_CONF on first use (real driver) when
 * gvm_init has not run. Size 0 gives NULL and is not an error (PyTorch asks
 * for 0 bytes for empty tensors, and frees them with NULL). PyTorch does not
 * check the pointer these return and has no way to take an error from the
 * free, so on any failure they also write one line, "gvmalloc: <message>", to
 * stderr: otherwise the reason would be lost. */
GVM_API void* gvm_torch_malloc(ssize_t size, int device, void* stream);
GVM_API void gvm_torch_free(void* ptr, ssize_t size, int device, void* stream);
/* gvm_torch_free, then gvm_trim(device): the free of a torch.cuda.MemPool
 * backed by gvmalloc (docs/pytorch.md). PyTorch's caching allocator keeps a
 * pool's segments and hands them back only when it empties the pool (the pool
 * dies, torch.cuda.empty_cache, an OOM retry), and that is when their memory
 * should go back to the driver: cached in gvmalloc it would serve nobody. */
GVM_API void gvm_torch_pool_free(void* ptr, ssize_t size, int device, void* stream);

/* ---- CuPy: cupy.cuda.memory.CFunctionAllocator --------------------------
 * `param` is the opaque value CuPy hands back on every call; gvmalloc reads it
 * as the stream (0 = the legacy default stream), so the Python side builds the
 * CFunctionAllocator with the current stream's pointer as `param`. Start the
 * allocator lazily from GVM_CONF like the PyTorch entry points. Size 0 gives 0
 * without an error; the free takes no size (the size check is skipped) and
 * ignores 0. Failures return 0 / write the stderr line as above. */
GVM_API intptr_t gvm_cupy_malloc(intptr_t param, size_t size, int device);
GVM_API void gvm_cupy_free(intptr_t param, intptr_t ptr, int device);

/* ---- errors ------------------------------------------------------------- */

/* The message of the last failure on the calling thread; "" when none. Valid
 * until the next failure on this thread. */
GVM_API const char* gvm_last_error(void);
/* The status of the last failure on the calling thread; GVM_OK when none. */
GVM_API gvm_status gvm_last_status(void);
/* Forgets the last failure of the calling thread. */
GVM_API void gvm_clear_last_error(void);
/* "GVM_ERROR_OUT_OF_MEMORY" for GVM_ERROR_OUT_OF_MEMORY, etc. */
GVM_API const char* gvm_status_name(gvm_status status);

/* ---- statistics --------------------------------------------------------- */

/* Copies the stats snapshot (one JSON object, NUL-terminated) into `buf`.
 * `*needed` (when not NULL) is set to the size it takes, NUL included. When
 * `buf_size` is smaller, `buf` is untouched and the result is
 * GVM_ERROR_INVALID_ARGUMENT: call with (NULL, 0, &needed) to learn the size. */
GVM_API gvm_status gvm_stats_json(char* buf, size_t buf_size, size_t* needed);

/* Mirrors gvm::DeviceStats (stats.hpp): both come from the one table of
 * device_stats_fields.h. Named with _t because C gives a type and a function
 * one namespace: gvm_device_stats is the function. */
typedef struct gvm_device_stats_t {
#define GVM_STATS_C_MEMBER(type, name, doc) type name;
  GVM_DEVICE_STATS_FIELDS(GVM_STATS_C_MEMBER)
#undef GVM_STATS_C_MEMBER
} gvm_device_stats_t;

/* The table itself, for bindings that build their view at run time (the
 * Python package): one line per field, "type name doc", in order. */
GVM_API const char* gvm_device_stats_schema(void);

/* The counters of `device`. GVM_ERROR_INVALID_ARGUMENT for a NULL `out` or a
 * device that does not exist. */
GVM_API gvm_status gvm_device_stats(int device, gvm_device_stats_t* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GVM_GVM_H_ */
