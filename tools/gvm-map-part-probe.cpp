// gvm-map-part-probe: can the physical pages under a free hole be mapped
// somewhere else while the rest of their handle stays where it is?
//
// A hole inside a chunk that still holds live blocks keeps its granules: the
// chunk is one handle, and a handle goes back only whole
// (docs/design-notes.md, "What it found"). VMM would let an allocator reuse
// those pages without a copy if one handle could be mapped in parts - the
// hole's granules a second time, at the address of the block that needs
// them (cuMemMap's `offset`). gvmalloc's driver boundary maps whole handles
// only (vmm/include/gvm/vmm/driver_calls.hpp), so this asks the CUDA driver
// directly, one question per line:
//   1. a handle of 8 granules mapped whole (the control)
//   2. granules 2-4 of it mapped again at another address (offset 2 granules)
//   3. granules 0-2 of another handle mapped alone (offset 0, part of its size)
//   4. A mapped whole a second time, at another address, while its first
//      mapping stands; then the first unmapped, the second still read
//   5. a sub-range of a whole mapping unmapped
//   6. two handles mapped side by side: one cuMemSetAccess and one
//      cuMemUnmap over both mappings at once (the simulated driver allows
//      both; this asks the real one)
//   7. what those calls cost: 32 one-granule handles side by side, access
//      set and unmapped one call per mapping, then one call over all of
//      them (medians of 5 rounds, host wall clock)
// and, where 2 or 4 maps, whether a write through one address reads back
// through the other. Question 4 is what a release could do without a host
// wait: hand the handle to the growth at its new address while the old one is
// still mapped, and unmap the old one later (docs/design-notes.md, "Records
// kept"). One GPU, a second. Exit 0 when the questions were asked, 1
// without a device (it links libcuda itself: where no driver is installed the
// loader refuses to start it).
//
//   gvm-map-part-probe [--device N]
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* name_of(CUresult r) {
  const char* s = nullptr;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s != nullptr ? s : "(unknown)";
}

CUresult ask(const char* question, CUresult r) {
  std::printf("%-68s %s\n", question, name_of(r));
  return r;
}

bool same_bytes(CUdeviceptr write_at, CUdeviceptr read_at, std::size_t n, unsigned char value) {
  std::vector<unsigned char> in(n, value), out(n, 0);
  if (cuMemcpyHtoD(write_at, in.data(), n) != CUDA_SUCCESS) return false;
  if (cuMemcpyDtoH(out.data(), read_at, n) != CUDA_SUCCESS) return false;
  return std::memcmp(in.data(), out.data(), n) == 0;
}

// Fills n bytes at `at` with value; reads_back(at, n, value) says whether
// they still hold it.
bool fill(CUdeviceptr at, std::size_t n, unsigned char value) {
  std::vector<unsigned char> in(n, value);
  return cuMemcpyHtoD(at, in.data(), n) == CUDA_SUCCESS;
}

bool reads_back(CUdeviceptr at, std::size_t n, unsigned char value) {
  std::vector<unsigned char> out(n, 0);
  if (cuMemcpyDtoH(out.data(), at, n) != CUDA_SUCCESS) return false;
  for (unsigned char c : out)
    if (c != value) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--device" && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: gvm-map-part-probe [--device N]\n");
      return 2;
    }
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    std::printf("gvm-map-part-probe: no CUDA driver or no device %d here\n", device);
    return 1;
  }
  char gpu[128] = {};
  (void)cuDeviceGetName(gpu, sizeof gpu, dev);
  int version = 0;
  (void)cuDriverGetVersion(&version);
  std::printf("device %d: %s, CUDA driver API %d\n", device, gpu, version);

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  std::size_t g = 0;
  (void)cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  std::printf("granularity %zu bytes\n", g);
  CUmemAccessDesc rw = {};
  rw.location = prop.location;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  CUdeviceptr va = 0;
  if (ask("reserve 32 granules", cuMemAddressReserve(&va, 32 * g, 0, 0, 0)) != CUDA_SUCCESS) return 1;
  CUmemGenericAllocationHandle a = 0, b = 0;
  if (ask("create handle A, 8 granules", cuMemCreate(&a, 8 * g, &prop, 0)) != CUDA_SUCCESS) return 1;
  if (ask("create handle B, 8 granules", cuMemCreate(&b, 8 * g, &prop, 0)) != CUDA_SUCCESS) return 1;

  // 1. The control: the way gvmalloc maps every chunk.
  const bool whole = ask("1. map A whole at va (offset 0, its size)", cuMemMap(va, 8 * g, 0, a, 0)) ==
                         CUDA_SUCCESS &&
                     ask("   set access on it", cuMemSetAccess(va, 8 * g, &rw, 1)) == CUDA_SUCCESS;

  // 2. The hole's granules a second time, elsewhere.
  const CUdeviceptr alias = va + 16 * g;
  if (ask("2. map A's granules 2-4 at va + 16 granules (offset 2 granules)",
          cuMemMap(alias, 3 * g, 2 * g, a, 0)) == CUDA_SUCCESS) {
    if (ask("   set access on them", cuMemSetAccess(alias, 3 * g, &rw, 1)) == CUDA_SUCCESS && whole) {
      std::printf("   a write through va + 3 granules reads back through the alias: %s\n",
                  same_bytes(va + 3 * g, alias + g, g, 0xab) ? "yes" : "no");
    }
    (void)cuMemUnmap(alias, 3 * g);
  }

  // 3. Part of a handle from its start.
  const CUdeviceptr part = va + 24 * g;
  if (ask("3. map B's granules 0-2 alone at va + 24 granules (offset 0)",
          cuMemMap(part, 3 * g, 0, b, 0)) == CUDA_SUCCESS) {
    (void)cuMemUnmap(part, 3 * g);
  }

  // 4. A whole a second time, elsewhere, while va still maps it.
  const CUdeviceptr twin = va + 8 * g;
  if (whole && ask("4. map A whole again at va + 8 granules (va still maps it)",
                   cuMemMap(twin, 8 * g, 0, a, 0)) == CUDA_SUCCESS) {
    if (ask("   set access on it", cuMemSetAccess(twin, 8 * g, &rw, 1)) == CUDA_SUCCESS) {
      std::printf("   a write through va + 5 granules reads back through the second mapping: %s\n",
                  same_bytes(va + 5 * g, twin + 5 * g, g, 0xcd) ? "yes" : "no");
      // The first mapping goes; what was written through it stays under the second.
      const bool filled = fill(va + 6 * g, g, 0xef);
      if (ask("   unmap the first mapping (va, whole)", cuMemUnmap(va, 8 * g)) == CUDA_SUCCESS) {
        std::printf("   the second mapping reads what was written through the first: %s\n",
                    filled && reads_back(twin + 6 * g, g, 0xef) ? "yes" : "no");
        const bool back = ask("   map A at va again (for question 5)", cuMemMap(va, 8 * g, 0, a, 0)) ==
                              CUDA_SUCCESS &&
                          cuMemSetAccess(va, 8 * g, &rw, 1) == CUDA_SUCCESS;
        if (!back) std::printf("   (question 5 asked without A at va)\n");
      }
    }
    (void)cuMemUnmap(twin, 8 * g);
  }

  // 5. Half of a whole mapping back.
  if (whole) {
    if (ask("5. unmap granules 2-4 of A's whole mapping", cuMemUnmap(va + 2 * g, 3 * g)) ==
        CUDA_SUCCESS) {
      std::printf("   (the rest of A's mapping is left as it is)\n");
    }
    (void)cuMemUnmap(va, 8 * g);
  }
  // 6. Two whole mappings side by side, one call over both.
  const bool pair = ask("6. map A at va and B at va + 8 granules (both whole)",
                        cuMemMap(va, 8 * g, 0, a, 0)) == CUDA_SUCCESS &&
                    cuMemMap(va + 8 * g, 8 * g, 0, b, 0) == CUDA_SUCCESS;
  if (pair) {
    if (ask("   one cuMemSetAccess over both (16 granules)", cuMemSetAccess(va, 16 * g, &rw, 1)) ==
        CUDA_SUCCESS) {
      std::printf("   a write across the seam reads back: %s\n",
                  same_bytes(va + 7 * g, va + 7 * g, 2 * g, 0x5a) ? "yes" : "no");
    }
    if (ask("   one cuMemUnmap over both (16 granules)", cuMemUnmap(va, 16 * g)) != CUDA_SUCCESS) {
      (void)cuMemUnmap(va, 8 * g);
      (void)cuMemUnmap(va + 8 * g, 8 * g);
    }
  }
  (void)cuMemRelease(a);
  (void)cuMemRelease(b);
  (void)cuMemAddressFree(va, 32 * g);

  // 7. The price of one call per mapping against one call over all.
  constexpr int kN = 32, kRounds = 5;
  CUdeviceptr row = 0;
  std::vector<CUmemGenericAllocationHandle> hs(kN, 0);
  bool ok = cuMemAddressReserve(&row, kN * g, 0, 0, 0) == CUDA_SUCCESS;
  for (int i = 0; ok && i < kN; ++i) ok = cuMemCreate(&hs[i], g, &prop, 0) == CUDA_SUCCESS;
  auto map_all = [&] {
    for (int i = 0; i < kN; ++i)
      if (cuMemMap(row + i * g, g, 0, hs[i], 0) != CUDA_SUCCESS) return false;
    return true;
  };
  auto us_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> set_each, unmap_each, set_once, unmap_once;
  for (int r = 0; ok && r < kRounds; ++r) {
    ok = map_all();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; ok && i < kN; ++i) ok = cuMemSetAccess(row + i * g, g, &rw, 1) == CUDA_SUCCESS;
    set_each.push_back(us_since(t0));
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; ok && i < kN; ++i) ok = cuMemUnmap(row + i * g, g) == CUDA_SUCCESS;
    unmap_each.push_back(us_since(t0));
    ok = ok && map_all();
    t0 = std::chrono::steady_clock::now();
    ok = ok && cuMemSetAccess(row, kN * g, &rw, 1) == CUDA_SUCCESS;
    set_once.push_back(us_since(t0));
    t0 = std::chrono::steady_clock::now();
    ok = ok && cuMemUnmap(row, kN * g) == CUDA_SUCCESS;
    unmap_once.push_back(us_since(t0));
  }
  if (ok) {
    std::printf("7. %d one-granule mappings side by side, medians of %d rounds:\n", kN, kRounds);
    std::printf("   cuMemSetAccess: one call each %.1f us in all, one call over all %.1f us\n",
                median(set_each), median(set_once));
    std::printf("   cuMemUnmap:     one call each %.1f us in all, one call over all %.1f us\n",
                median(unmap_each), median(unmap_once));
  } else {
    std::printf("7. not measured: a call failed (question 6 says which)\n");
  }
  for (auto h : hs)
    if (h != 0) (void)cuMemRelease(h);
  if (row != 0) (void)cuMemAddressFree(row, kN * g);
  return 0;
}
