// Micro-benchmarks of the allocators of pool_allocators.hpp, in one process:
//  1. alloc + free pairs of one size, 512 B to 64 MiB, on one stream, the cache warm: median
//     time of a pair (time-stamp counter around each pair);
//  2. throughput with 1, 2, 4 and 8 threads, each on its own stream, allocating and freeing
//     a mix of sizes (512 B .. 1 MiB, up to 4 blocks live per thread): pairs per second in all.
//
//   pool_micro [--only NAMES] [--pairs N] [--thread-pairs N]
#include "pool_allocators.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

static double pair_ns(Allocator &a, size_t size, int pairs, double tpn, CUstream s) {
  a.free(a.alloc(size, s), size, s);  // warm
  std::vector<uint32_t> c;
  c.reserve(pairs);
  for (int i = 0; i < pairs; i++) {
    uint64_t t0 = __rdtsc();
    void *p = a.alloc(size, s);
    a.free(p, size, s);
    c.push_back((uint32_t)std::min<uint64_t>(__rdtsc() - t0, UINT32_MAX));
  }
  std::sort(c.begin(), c.end());
  return c[c.size() / 2] / tpn;
}

static double throughput(Allocator &a, int threads, int pairs, const std::vector<CUstream> &streams) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> th;
  for (int t = 0; t < threads; t++) {
    th.emplace_back([&, t] {
      CUcontext ctx;
      cuDevicePrimaryCtxRetain(&ctx, 0);
      cuCtxSetCurrent(ctx);
      CUstream s = streams[t];
      static const size_t sizes[] = {512, 4096, 65536, 1 << 20, 8192, 200000, 1536, 300000};
      void *live[4] = {nullptr, nullptr, nullptr, nullptr};
      size_t live_size[4] = {0, 0, 0, 0};
      ready++;
      while (!go.load()) {
      }
      for (int i = 0; i < pairs; i++) {
        int k = i & 3;
        if (live[k]) a.free(live[k], live_size[k], s);
        live_size[k] = sizes[(i * 5 + t) & 7];
        live[k] = a.alloc(live_size[k], s);
      }
      for (int k = 0; k < 4; k++)
        if (live[k]) a.free(live[k], live_size[k], s);
      cuDevicePrimaryCtxRelease(0);
    });
  }
  while (ready.load() < threads) {
  }
  auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto &x : th) x.join();
  auto t1 = std::chrono::steady_clock::now();
  double s = std::chrono::duration<double>(t1 - t0).count();
  return threads * (double)pairs / s;
}

int main(int argc, char **argv) {
  std::string only;
  int pairs = 20000, tpairs = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--pairs")) pairs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--thread-pairs")) tpairs = std::atoi(argv[i + 1]);
  }
  init_cuda();
  double tpn = tsc_per_ns();
  std::vector<CUstream> streams(8);
  for (auto &s : streams) CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  auto allocators = make_allocators(only);
  const size_t sizes[] = {512, 4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  // One untimed round of every allocator first: on the GPU machine the first allocator measured
  // ran at half speed for about a second (session 10: 169 ns against 91 for the same pool
  // measured later), whichever it was.
  for (auto &a : allocators)
    for (size_t n : sizes) pair_ns(*a, n, pairs, tpn, streams[0]);
  std::printf("\n| allocator | 512 B | 4 KiB | 64 KiB | 1 MiB | 16 MiB | 64 MiB |\n|---|---|---|---|---|---|---|\n");
  for (auto &a : allocators) {
    std::printf("| %s |", a->name());
    for (size_t n : sizes) std::printf(" %.0f |", pair_ns(*a, n, pairs, tpn, streams[0]));
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("(median ns per alloc+free pair, one stream, warm)\n");
  std::printf("\n| allocator | 1 thread | 2 threads | 4 threads | 8 threads |\n|---|---|---|---|---|\n");
  for (auto &a : allocators) {
    std::printf("| %s |", a->name());
    for (int t : {1, 2, 4, 8}) std::printf(" %.2f |", throughput(*a, t, tpairs / t, streams) / 1e6);
    std::printf("\n");
    std::fflush(stdout);
    a->trim();
  }
  std::printf("(million alloc+free pairs per second in all, a stream per thread)\n");
  allocators.clear();
  for (auto &s : streams) cuStreamDestroy(s);
  return 0;
}
