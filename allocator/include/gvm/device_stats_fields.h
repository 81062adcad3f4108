/* Every field of gvmalloc's per-device statistics, once: the C++ struct
 * (gvm::DeviceStats, stats.hpp), its C mirror (gvm_device_stats_t, gvm.h), the
 * JSON snapshot (stats.cpp) and the Python view (gvmalloc.device_stats, which
 * reads the table from the library: gvm_device_stats_schema) all follow it.
 * A field added here is added everywhere.
 *
 *   X(C type, name, what it counts)
 *
 * C and C++ alike: the types are those of <stddef.h> and <stdint.h>; `device`
 * is the only signed field. */
#ifndef GVM_DEVICE_STATS_FIELDS_H
#define GVM_DEVICE_STATS_FIELDS_H

#define GVM_DEVICE_STATS_FIELDS(X)                                                          \
  X(int, device, "the device (-1: none)")                                                   \
  X(size_t, live_bytes, "handed out to callers (requested sizes rounded up)")                 \
  X(size_t, reserved_bytes, "physically mapped (every heap: arenas, scratch, pools)")         \
  X(size_t, cached_bytes, "reserved but not live")                                          \
  X(size_t, peak_live_bytes, "the peak of live_bytes")                                      \
  X(size_t, peak_reserved_bytes, "the peak of reserved_bytes")                              \
  X(size_t, scratch_reserved_bytes, "the peer scratch's part of reserved_bytes")            \
  X(uint64_t, allocations, "allocations served")                                            \
  X(uint64_t, frees, "blocks freed")                                                        \
  X(uint64_t, cache_hits, "allocations served without growing")                             \
  X(uint64_t, chunks_mapped, "physical chunks mapped (cuMemMap, or cuMemAlloc)")             \
  X(uint64_t, chunks_unmapped, "physical chunks given back")                                \
  X(uint64_t, oom_retries, "out-of-memory retries (cached memory released, then again)")    \
  X(uint64_t, fences, "fences (host waits) before a release or an access change")           \
  X(uint64_t, cross_stream_waits, "blocks handed to another stream behind an event")        \
  X(uint64_t, chunks_reused, "chunks mapped with a handle a release before the growth kept")

#endif
