// Replays allocation traces (../shared/traces/README.md: "a ID BYTES STREAM" / "f ID", gzipped
// or not, first line "# {json}") through each allocator of pool_allocators.hpp, in one process.
//
//   trace_replay [--passes N] [--only NAMES] TRACE...
//
// Per allocator and trace: one warm-up pass (its mean time is reported apart: it includes the
// allocator taking memory from the device), then 2N passes: N timed as a whole — the mean time
// per operation is the median over them of pass time / operations — and N with the time-stamp
// counter read after every operation, for the median and 99th percentile of single operations
// (they include one counter read, whose cost is printed first). Also reported: the peak memory
// held from the device over all passes divided by the trace's peak of live (requested) bytes. Every trace stream gets its own CUstream. Output: one table
// row per allocator and trace, in Markdown.
#include "pool_allocators.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

struct Ev {
  bool alloc;
  uint32_t id;
  uint64_t bytes;
  uint32_t stream;
};

struct Trace {
  std::string name;
  std::vector<Ev> evs;
  uint32_t nids = 0, nstreams = 0;
  uint64_t peak_live = 0;
};

static Trace load(const char *path) {
  std::string cmd = std::string("gzip -dcf '") + path + "'";
  FILE *f = popen(cmd.c_str(), "r");
  if (!f) {
    std::perror(path);
    std::exit(2);
  }
  Trace t;
  std::string base = path;
  base = base.substr(base.rfind('/') + 1);
  t.name = base.substr(0, base.find('.'));
  std::unordered_map<uint64_t, uint32_t> ids;
  std::map<uint64_t, uint32_t> streams;
  std::vector<uint64_t> size;
  uint64_t live = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '\n') continue;
    char op;
    unsigned long long id, bytes = 0, stream = 0;
    int n = std::sscanf(line, "%c %llu %llu %llu", &op, &id, &bytes, &stream);
    if (op == 'a' && n == 4) {
      uint32_t k = t.nids++;
      ids[id] = k;
      auto s = streams.emplace(stream, (uint32_t)streams.size()).first->second;
      size.push_back(bytes);
      t.evs.push_back({true, k, bytes, s});
      live += bytes;
      t.peak_live = std::max(t.peak_live, live);
    } else if (op == 'f' && n >= 2) {
      auto it = ids.find(id);
      if (it == ids.end()) {
        std::fprintf(stderr, "%s: free of unknown id %llu\n", path, id);
        std::exit(2);
      }
      t.evs.push_back({false, it->second, size[it->second], 0});
      live -= size[it->second];
      ids.erase(it);
    }
  }
  pclose(f);
  t.nstreams = (uint32_t)streams.size();
  return t;
}

struct Result {
  double warm_ns, mean_ns, p50_ns, p99_ns, frag;
};

static Result replay(Allocator &a, const Trace &t, int passes, double tpn,
                     const std::vector<CUstream> &streams) {
  std::vector<void *> ptr(t.nids, nullptr);
  std::vector<CUstream> owner(t.nids, nullptr);
  std::vector<uint32_t> cycles;
  cycles.reserve((size_t)passes * t.evs.size());
  std::vector<double> pass_ns;
  a.reset_peak();
  double warm = 0;
  // Pass 0 warms up; then odd passes time every operation (for p50 / p99) and even ones only
  // the whole pass (for the mean, free of the timer's own cost).
  for (int pass = 0; pass <= 2 * passes; pass++) {
    bool per_op = pass % 2 == 1;
    auto t0 = std::chrono::steady_clock::now();
    uint64_t prev = __rdtsc();
    for (const Ev &e : t.evs) {
      if (e.alloc) {
        CUstream s = streams[e.stream];
        ptr[e.id] = a.alloc(e.bytes, s);
        owner[e.id] = s;
      } else {
        a.free(ptr[e.id], e.bytes, owner[e.id]);
      }
      if (per_op) {
        uint64_t now = __rdtsc();
        cycles.push_back((uint32_t)std::min<uint64_t>(now - prev, UINT32_MAX));
        prev = now;
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    double ns = (double)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() / t.evs.size();
    if (pass == 0)
      warm = ns;
    else if (!per_op)
      pass_ns.push_back(ns);
  }
  CU_CHECK(cuCtxSynchronize());
  Result r;
  r.warm_ns = warm;
  std::sort(pass_ns.begin(), pass_ns.end());
  r.mean_ns = pass_ns[pass_ns.size() / 2];
  std::sort(cycles.begin(), cycles.end());
  r.p50_ns = cycles[cycles.size() / 2] / tpn;
  r.p99_ns = cycles[cycles.size() * 99 / 100] / tpn;
  r.frag = (double)a.peak_reserved() / (double)t.peak_live;
  return r;
}

int main(int argc, char **argv) {
  int passes = 30;
  std::string only;
  std::vector<const char *> paths;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--passes") && i + 1 < argc)
      passes = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else
      paths.push_back(argv[i]);
  }
  if (paths.empty() || passes < 1) {
    std::fprintf(stderr, "usage: %s [--passes N] [--only NAMES] TRACE...\n", argv[0]);
    return 2;
  }
  init_cuda();
  double tpn = tsc_per_ns();
  {
    std::vector<uint32_t> d;
    uint64_t prev = __rdtsc();
    for (int i = 0; i < 100000; i++) {
      uint64_t now = __rdtsc();
      d.push_back((uint32_t)(now - prev));
      prev = now;
    }
    std::sort(d.begin(), d.end());
    std::printf("# time-stamp counter: %.3f ticks/ns, one read costs %.1f ns (median)\n", tpn, d[d.size() / 2] / tpn);
  }
  std::vector<Trace> traces;
  for (auto p : paths) traces.push_back(load(p));
  uint32_t nstreams = 1;
  for (auto &t : traces) nstreams = std::max(nstreams, t.nstreams);
  std::vector<CUstream> streams(nstreams);
  for (auto &s : streams) CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  auto allocators = make_allocators(only);
  std::printf("\n| trace | allocator | ns/op mean | ns/op p50 | ns/op p99 | first pass ns/op | peak reserved / peak live |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (auto &t : traces) {
    for (auto &a : allocators) {
      Result r = replay(*a, t, passes, tpn, streams);
      std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.4f |\n", t.name.c_str(), a->name(),
                  r.mean_ns, r.p50_ns, r.p99_ns, r.warm_ns, r.frag);
      std::fflush(stdout);
      a->trim();
    }
  }
  allocators.clear();
  for (auto &s : streams) cuStreamDestroy(s);
  return 0;
}
