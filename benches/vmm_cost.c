// What CUDA's virtual-memory calls cost by the size of one physical allocation (a "chunk"), on
// the device the pool runs on: the figures behind the host replay's cost model
// (src/memory/pool/tests/replay.rs, `CostModel`) and behind the pool's largest chunk
// (`PoolConfig::vmm_page_bytes`). For each chunk size it times, median of REPS:
//   create    cuMemCreate
//   map       cuMemMap + cuMemSetAccess of a new allocation at a reserved address
//   unmap     cuMemUnmap
//   release   cuMemRelease
//   remap     cuMemMap + cuMemSetAccess of an allocation unmapped elsewhere (what a page move
//             pays beside its unmap: the pool keeps unmapped allocations as spares)
//   region    a 256 MiB region mapped from scratch with chunks of this size (create + map each,
//             one cuMemSetAccess for the region), then unmapped and released: per MiB
// Usage: vmm_cost [REPS]  (default 64). Build: cc -O2 -Iinclude -I$CUDA_HOME/include
// benches/vmm_cost.c -L$CUDA_HOME/lib64/stubs -lcuda -o vmm_cost
#include "bench_util.h"

/* Microseconds on the monotonic clock (bench_host.h's). */
static double now_us(void) { return now_ns() / 1e3; }

static CUmemAllocationProp prop;
static CUmemAccessDesc access_desc;

static void set_access(CUdeviceptr at, size_t bytes) {
  CU(cuMemSetAccess(at, bytes, &access_desc, 1));
}

int main(int argc, char** argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 64;
  if (reps < 1) reps = 1;
  CUdevice dev = use_primary_context();
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  access_desc.location = prop.location;
  access_desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  char name[256];
  CU(cuDeviceGetName(name, sizeof name, dev));
  printf("# %s, granularity %zu KiB, %d repetitions, times in microseconds (median)\n\n", name,
         gran >> 10, reps);
  printf("| chunk MiB | create | map | unmap | release | remap | region 256 MiB per MiB: map, unmap |\n");
  printf("|---|---|---|---|---|---|---|\n");
  const size_t region = (size_t)256 << 20;
  double* t[5];
  for (int k = 0; k < 5; k++) t[k] = malloc(sizeof(double) * reps);
  double* rmap = malloc(sizeof(double) * reps);
  double* runmap = malloc(sizeof(double) * reps);
  size_t sizes[] = {2, 4, 8, 16, 32, 64};
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    size_t bytes = sizes[si] << 20;
    if (bytes % gran) continue;
    CUdeviceptr va, vb;
    CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CU(cuMemAddressReserve(&vb, bytes, 0, 0, 0));
    for (int r = 0; r < reps; r++) {
      CUmemGenericAllocationHandle h;
      double t0 = now_us();
      CU(cuMemCreate(&h, bytes, &prop, 0));
      double t1 = now_us();
      CU(cuMemMap(va, bytes, 0, h, 0));
      set_access(va, bytes);
      double t2 = now_us();
      CU(cuMemUnmap(va, bytes));
      double t3 = now_us();
      CU(cuMemMap(vb, bytes, 0, h, 0));
      set_access(vb, bytes);
      double t4 = now_us();
      CU(cuMemUnmap(vb, bytes));
      double t5 = now_us();
      CU(cuMemRelease(h));
      double t6 = now_us();
      t[0][r] = t1 - t0;
      t[1][r] = t2 - t1;
      t[2][r] = (t3 - t2 + t5 - t4) / 2;
      t[3][r] = t6 - t5;
      t[4][r] = t4 - t3;
    }
    CU(cuMemAddressFree(va, bytes));
    CU(cuMemAddressFree(vb, bytes));
    // The region: chunks created and mapped one after another, one access call for it all.
    CUdeviceptr base;
    CU(cuMemAddressReserve(&base, region, 0, 0, 0));
    size_t n = region / bytes;
    CUmemGenericAllocationHandle* hs = malloc(sizeof *hs * n);
    int rr = reps < 8 ? reps : 8;
    for (int r = 0; r < rr; r++) {
      double t0 = now_us();
      for (size_t i = 0; i < n; i++) {
        CU(cuMemCreate(&hs[i], bytes, &prop, 0));
        CU(cuMemMap(base + i * bytes, bytes, 0, hs[i], 0));
      }
      set_access(base, region);
      double t1 = now_us();
      for (size_t i = 0; i < n; i++) {
        CU(cuMemUnmap(base + i * bytes, bytes));
        CU(cuMemRelease(hs[i]));
      }
      double t2 = now_us();
      rmap[r] = (t1 - t0) / (region >> 20);
      runmap[r] = (t2 - t1) / (region >> 20);
    }
    free(hs);
    CU(cuMemAddressFree(base, region));
    printf("| %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f, %.2f |\n", sizes[si],
           median(t[0], reps), median(t[1], reps), median(t[2], reps), median(t[3], reps),
           median(t[4], reps), median(rmap, rr), median(runmap, rr));
  }
  for (int k = 0; k < 5; k++) free(t[k]);
  free(rmap);
  free(runmap);
  CU(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
