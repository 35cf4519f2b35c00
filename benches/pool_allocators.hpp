// The allocators the pool benchmarks compare, behind one small interface, all in one process on
// the same GPU: gkrt's pool through gkrt_malloc / gkrt_free (a runtime handle) and through the
// PyTorch entry points (the process-wide runtime), cuMemAllocAsync from a dedicated memory pool
// with its release threshold at the maximum, and PyTorch's CUDACachingAllocator from C++
// (raw_alloc_with_stream / raw_delete; compiled in only with -DWITH_TORCH).
//
// Every allocator reports the peak of the memory it holds from the device since the last reset.
#pragma once

// PyTorch's headers first: gkrt.h defines macros that must not reach them.
#ifdef WITH_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cuda.h>
#include <gkrt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#define CU_CHECK(call)                                                                   \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      const char *n_ = "?";                                                              \
      cuGetErrorName(r_, &n_);                                                           \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, n_);   \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

static inline void gkrt_die(const char *what, gkrt_status st) {
  char buf[512];
  gkrt_last_error_message(buf, sizeof buf);
  std::fprintf(stderr, "%s -> %s: %s\n", what, gkrt_status_name(st), buf);
  std::exit(2);
}

struct Allocator {
  virtual ~Allocator() = default;
  virtual const char *name() const = 0;
  virtual void *alloc(size_t size, CUstream stream) = 0;
  virtual void free(void *p, size_t size, CUstream stream) = 0;
  virtual void reset_peak() = 0;
  virtual uint64_t peak_reserved() = 0;
  /// Gives every cached byte back (between benchmarks).
  virtual void trim() {}
};

/// gkrt_malloc / gkrt_free on a runtime made for this benchmark. `env` ("NAME=VALUE;NAME=VALUE",
/// may be empty) is set while the runtime is created: the pool and the device read their knobs
/// then.
struct GkrtRaw : Allocator {
  gkrt_runtime *rt = nullptr;
  std::string label;
  explicit GkrtRaw(std::string label_, const std::string &env = "") : label(std::move(label_)) {
    std::vector<std::pair<std::string, std::string>> saved;  // name, old value ("\1" = unset)
    size_t at = 0;
    while (at < env.size()) {
      size_t end = env.find(';', at);
      if (end == std::string::npos) end = env.size();
      std::string kv = env.substr(at, end - at);
      at = end + 1;
      size_t eq = kv.find('=');
      if (eq == std::string::npos) continue;
      std::string key = kv.substr(0, eq);
      const char *o = std::getenv(key.c_str());
      saved.emplace_back(key, o ? o : "\1");
      setenv(key.c_str(), kv.substr(eq + 1).c_str(), 1);
    }
    gkrt_config cfg;
    gkrt_config_init(&cfg);
    cfg.device = GKRT_DEVICE_CUDA;
    cfg.log_level = 1;
    gkrt_status st = gkrt_runtime_create(&cfg, &rt);
    if (st != GKRT_STATUS_OK) gkrt_die("gkrt_runtime_create", st);
    // Make the pool take its address range and first page now, as the others warm up too.
    void *p = nullptr;
    if ((st = gkrt_malloc(rt, 256, nullptr, &p)) != GKRT_STATUS_OK) gkrt_die("gkrt_malloc", st);
    gkrt_free(rt, p, nullptr);
    for (auto &kv : saved) {
      if (kv.second == "\1")
        unsetenv(kv.first.c_str());
      else
        setenv(kv.first.c_str(), kv.second.c_str(), 1);
    }
  }
  ~GkrtRaw() override { gkrt_runtime_release(rt); }
  const char *name() const override { return label.c_str(); }
  void *alloc(size_t size, CUstream stream) override {
    void *p = nullptr;
    gkrt_status st = gkrt_malloc(rt, size, stream, &p);
    if (st != GKRT_STATUS_OK) gkrt_die("gkrt_malloc", st);
    return p;
  }
  void free(void *p, size_t, CUstream stream) override {
    gkrt_status st = gkrt_free(rt, p, stream);
    if (st != GKRT_STATUS_OK) gkrt_die("gkrt_free", st);
  }
  void reset_peak() override { gkrt_runtime_reset_peak_stats(rt); }
  uint64_t peak_reserved() override {
    gkrt_stats s;
    gkrt_runtime_stats(rt, &s);
    return s.peak_reserved_bytes;
  }
  void trim() override { gkrt_runtime_release_cached(rt, nullptr); }
};

/// The PyTorch entry points (process-wide runtime of device 0), as PyTorch calls them.
struct GkrtTorchEntry : Allocator {
  gkrt_runtime *rt = nullptr;
  GkrtTorchEntry() {
    gkrt_status st = gkrt_torch_runtime(0, &rt);
    if (st != GKRT_STATUS_OK) gkrt_die("gkrt_torch_runtime", st);
  }
  ~GkrtTorchEntry() override { gkrt_runtime_release(rt); }
  const char *name() const override { return "gkrt torch entry"; }
  void *alloc(size_t size, CUstream stream) override {
    void *p = gkrt_torch_alloc(size, 0, stream);
    if (!p) gkrt_die("gkrt_torch_alloc", GKRT_STATUS_OUT_OF_MEMORY);
    return p;
  }
  void free(void *p, size_t size, CUstream stream) override { gkrt_torch_free(p, size, 0, stream); }
  void reset_peak() override { gkrt_runtime_reset_peak_stats(rt); }
  uint64_t peak_reserved() override {
    gkrt_stats s;
    gkrt_runtime_stats(rt, &s);
    return s.peak_reserved_bytes;
  }
  void trim() override { gkrt_runtime_release_cached(rt, nullptr); }
};

/// cuMemAllocFromPoolAsync / cuMemFreeAsync on a pool that never releases (threshold max).
struct CudaAsync : Allocator {
  CUmemoryPool pool = nullptr;
  CudaAsync() {
    CUmemPoolProps props = {};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CU_CHECK(cuMemPoolCreate(&pool, &props));
    cuuint64_t max = UINT64_MAX;
    CU_CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
  }
  ~CudaAsync() override {
    cuCtxSynchronize();
    cuMemPoolTrimTo(pool, 0);
    cuMemPoolDestroy(pool);
  }
  const char *name() const override { return "cuMemAllocAsync"; }
  void *alloc(size_t size, CUstream stream) override {
    CUdeviceptr p = 0;
    CU_CHECK(cuMemAllocFromPoolAsync(&p, size, pool, stream));
    return (void *)p;
  }
  void free(void *p, size_t, CUstream stream) override { CU_CHECK(cuMemFreeAsync((CUdeviceptr)p, stream)); }
  void reset_peak() override {
    cuuint64_t zero = 0;
    CU_CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  }
  uint64_t peak_reserved() override {
    cuuint64_t v = 0;
    CU_CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v));
    return v;
  }
  void trim() override {
    cuCtxSynchronize();
    cuMemPoolTrimTo(pool, 0);
  }
};

#ifdef WITH_TORCH
namespace cca = c10::cuda::CUDACachingAllocator;
/// PyTorch's caching allocator from C++ (its default configuration).
struct TorchCaching : Allocator {
  TorchCaching() {
    if (!cca::get()->initialized()) cca::init(1);
  }
  const char *name() const override { return "PyTorch caching"; }
  void *alloc(size_t size, CUstream stream) override {
    return cca::raw_alloc_with_stream(size, (cudaStream_t)stream);
  }
  void free(void *p, size_t, CUstream) override { cca::raw_delete(p); }
  void reset_peak() override { cca::resetPeakStats(0); }
  uint64_t peak_reserved() override {
    auto s = cca::getDeviceStats(0);
    return (uint64_t)s.reserved_bytes[0].peak;
  }
  void trim() override {
    cuCtxSynchronize();
    cca::emptyCache();
  }
};
#endif

/// The allocators to compare, in order; `which` filters by name substring ("" = all).
static inline std::vector<std::unique_ptr<Allocator>> make_allocators(const std::string &which) {
  std::vector<std::unique_ptr<Allocator>> out;
  auto want = [&](const char *n) { return which.empty() || which.find(n) != std::string::npos; };
  // gkrt_malloc on a runtime made with the default configuration: the streams it brings grow by
  // virtual ranges (gkrt_config.pool_growth AUTO).
  if (want("gkrt")) out.emplace_back(new GkrtRaw("gkrt_malloc"));
  if (want("entry")) out.emplace_back(new GkrtTorchEntry());
  if (want("async")) out.emplace_back(new CudaAsync());
#ifdef WITH_TORCH
  if (want("torch")) out.emplace_back(new TorchCaching());
#else
  if (want("torch"))
    std::printf("# PyTorch caching allocator: skipped (built without torch: %s)\n",
#ifdef TORCH_SKIP_REASON
                TORCH_SKIP_REASON
#else
                "torch not found"
#endif
    );
#endif
  if (want("diag")) {
    // No marker events: the pool's only driver calls on a warm stream.
    out.emplace_back(new GkrtRaw("gkrt_malloc no markers", "GKRT_POOL_MARKER_EVERY=4000000000"));
  }
  if (want("variants")) {
    // Segments for comparison; the other knobs act on the virtual ranges of the default: no
    // recycling for the slack, physical allocations of up to 64 MiB (fewer driver calls, less
    // of the holes reclaimable), page moves allowed 10% of wall time instead of 1%, and small
    // requests taking the range's short mapped tail before cutting a warm hole twice their size.
    out.emplace_back(new GkrtRaw("gkrt_malloc segments", "GKRT_POOL_VMM=0"));
    out.emplace_back(new GkrtRaw("gkrt_malloc no recycling", "GKRT_POOL_SLACK_PERMILLE=100000"));
    out.emplace_back(new GkrtRaw("gkrt_malloc 64 MiB chunks", "GKRT_POOL_PAGE_MIB=64"));
    out.emplace_back(new GkrtRaw("gkrt_malloc moves 10%", "GKRT_POOL_RECYCLE_TIME_PERMILLE=100"));
    out.emplace_back(new GkrtRaw("gkrt_malloc tail first", "GKRT_POOL_TAIL_PREFIX_FIRST=1"));
    // The default declines a slack move that saves less than half of the pages over the cap
    // (when more than one physical allocation is over it); "all moves" makes every one, the
    // default before session 12 (ARCHITECTURE.md, "The pool's fragmentation").
    out.emplace_back(new GkrtRaw("gkrt_malloc all moves", "GKRT_POOL_MAJORITY_MOVES=0"));
  }
  if (want("variants") || want("lifetime")) {
    // Placement by lifetime: as "tail first", only for requests whose size the pool has seen
    // live fewer allocations than there are live blocks (ARCHITECTURE.md, "Placement by
    // lifetime"). "lifetime" alone in --only selects it without the other variants.
    out.emplace_back(new GkrtRaw("gkrt_malloc short-lived at tail", "GKRT_POOL_SHORT_LIVED_TAIL=1"));
  }
  if (want("variants") || want("aliases")) {
    // Page moves keep the moved chunk's old address mapped as an alias, so moving it back is
    // bookkeeping (ARCHITECTURE.md, "Alias mappings"); and, second, pages a move placed may
    // move again within the time budget (their moves back are then free switches); third, the
    // same until a move is first undone at the cost of an unmap (a count, not the time budget:
    // the same at any pace). "aliases" alone in --only selects these three without the other
    // variants.
    out.emplace_back(new GkrtRaw("gkrt_malloc aliases", "GKRT_POOL_ALIASES=1"));
    out.emplace_back(new GkrtRaw("gkrt_malloc aliases, moves again", "GKRT_POOL_ALIASES=2"));
    out.emplace_back(new GkrtRaw("gkrt_malloc aliases, again until undone", "GKRT_POOL_ALIASES=3"));
  }
  return out;
}

/// Cycles of the time-stamp counter per nanosecond, measured over `ms` milliseconds.
#include <chrono>
#include <thread>
#include <x86intrin.h>
static inline double tsc_per_ns(int ms = 200) {
  auto t0 = std::chrono::steady_clock::now();
  uint64_t c0 = __rdtsc();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  uint64_t c1 = __rdtsc();
  auto t1 = std::chrono::steady_clock::now();
  return (double)(c1 - c0) / (double)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
}

static inline CUcontext init_cuda() {
  CU_CHECK(cuInit(0));
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}
