/* Compiled as strict C11: proves gvm.h is valid C and usable from C. */
#include <string.h>

#include "gvm/gvm.h"

/* Every entry point, with the exact types the frameworks call them with. */
static void* (*const torch_malloc_fn)(ssize_t, int, void*) = gvm_torch_malloc;
static void (*const torch_free_fn)(void*, ssize_t, int, void*) = gvm_torch_free;
static intptr_t (*const cupy_malloc_fn)(intptr_t, size_t, int) = gvm_cupy_malloc;
static void (*const cupy_free_fn)(intptr_t, intptr_t, int) = gvm_cupy_free;

/* A round trip from C on the simulated driver. Returns 0 on success, else the
 * line that failed. Expects no allocator to be running. */
int gvm_c_round_trip(void) {
  gvm_device_stats_t s;
  gvm_device_stats_t t;
  void* p;
  intptr_t q;
  char small[2];
  size_t needed = 0;

  if (torch_malloc_fn == NULL || torch_free_fn == NULL || cupy_malloc_fn == NULL ||
      cupy_free_fn == NULL)
    return __LINE__;
  if (gvm_is_initialized() != 0) return __LINE__;
  if (gvm_init_simulated("h200", 1, "small_max:4KiB") != GVM_OK) return __LINE__;
  p = gvm_malloc(1000, 0, NULL);
  if (p == NULL) return __LINE__;
  memset(&s, 0, sizeof s);
  if (gvm_device_stats(0, &s) != GVM_OK || s.allocations != 1 || s.live_bytes < 1000)
    return __LINE__;
  if (gvm_free(p, 1000, 0, NULL) != GVM_OK) return __LINE__;
  q = cupy_malloc_fn(0, 4096, 0);
  if (q == 0) return __LINE__;
  cupy_free_fn(0, q, 0);
  p = torch_malloc_fn(4096, 0, NULL);
  if (p == NULL) return __LINE__;
  torch_free_fn(p, 4096, 0, NULL);
  if (gvm_device_stats(0, &t) != GVM_OK || t.live_bytes != 0 || t.frees != 3) return __LINE__;
  if (gvm_stats_json(small, sizeof small, &needed) != GVM_ERROR_INVALID_ARGUMENT) return __LINE__;
  if (needed <= sizeof small || gvm_last_status() != GVM_ERROR_INVALID_ARGUMENT) return __LINE__;
  if (strlen(gvm_last_error()) == 0) return __LINE__;
  if (strcmp(gvm_status_name(GVM_ERROR_CONFIG), "GVM_ERROR_CONFIG") != 0) return __LINE__;
  gvm_clear_last_error();
  if (gvm_last_status() != GVM_OK || gvm_last_error()[0] != '\0') return __LINE__;
  if (gvm_trim(-1) != GVM_OK) return __LINE__;
  if (gvm_shutdown() != GVM_OK) return __LINE__;
  return 0;
}
