// Replays allocation traces (../shared/traces/README.md: "a ID BYTES STREAM" / "f ID", gzipped
// or not, first line "# {json}") through each allocator of pool_allocators.hpp, in one process.
//
//   trace_replay [--passes N] [--only NAMES] [--hot] TRACE...
//
// Per trace, all allocators interleaved (the GPU machine's pace changes between processes and
// within one, by up to 1.7x in our runs, so allocators timed one after the other compare badly):
// one warm-up pass each (its mean time is reported apart: it includes taking memory from the
// device), then 2N rounds giving every allocator one pass, in a rotating order. N rounds time
// whole passes — the mean time per operation is the median over them of pass time / operations,
// and "÷ PyTorch" / "÷ cuMemAllocAsync" are medians over them of the ratio of pass times in the
// same round — and N read the time-stamp counter after every operation, for the median and 99th
// percentile of single operations (they include one counter read, whose cost is printed first).
// With --hot, every timed pass follows an untimed pass of the same allocator, so it starts with
// the allocator's data in the CPU caches (without it, a pass starts after the other allocators'
// passes, as an allocator's calls come between other work in a program).
// Also reported: the peak memory held from the device over all passes divided by the trace's
// peak of live (requested) bytes. Every trace stream gets its own CUstream. Each trace is
// replayed on allocators made for it (trace_events.hpp), and blocks a trace never frees are freed
// after each pass, untimed (a line says so). Output: one table row per allocator and trace, in
// Markdown.
#include "pool_allocators.hpp"
#include "trace_events.hpp"

#include <algorithm>
#include <cstring>

/// One allocator's replay of one trace: its pointers, and the timings of its passes.
struct Replay : ReplayState<CUstream> {
  using ReplayState<CUstream>::ReplayState;
  std::vector<uint32_t> cycles;  // per operation, counter ticks (per-op passes)
  std::vector<double> pass_ns;   // per operation, whole-pass timing (one per round)
  double warm_ns = 0;
};

/// One pass of trace `t` through `a`; returns ns per operation. With `per_op`, the counter is
/// read after every operation (for p50 / p99) and the pass time includes those reads. Blocks the
/// trace never frees are freed after the pass, untimed, so passes do not pile them up.
static double pass(Allocator &a, const Trace &t, Replay &r, bool per_op, const std::vector<CUstream> &streams) {
  auto t0 = std::chrono::steady_clock::now();
  uint64_t prev = __rdtsc();
  if (per_op) {
    replay_pass(a, t, r, streams, [&] {
      uint64_t now = __rdtsc();
      r.cycles.push_back((uint32_t)std::min<uint64_t>(now - prev, UINT32_MAX));
      prev = now;
    });
  } else {
    replay_pass(a, t, r, streams, [] {});
  }
  auto t1 = std::chrono::steady_clock::now();
  free_leftovers(a, t, r);
  return (double)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() / t.evs.size();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Replays `t` through every allocator, interleaved: a warm-up pass each, then 2N rounds, each
/// giving every allocator one pass (in a rotating order), so that the machine's changes of pace
/// over time (large on the GPU machine, between processes and within one) touch all alike.
/// Odd rounds read the counter per operation; even rounds time whole passes, and the ratios
/// between allocators are medians over those rounds of the ratio of their pass times.
static void replay_all(std::vector<std::unique_ptr<Allocator>> &allocators, const Trace &t, int passes, double tpn,
                       const std::vector<CUstream> &streams, bool hot) {
  size_t n = allocators.size();
  std::vector<Replay> rs;
  for (size_t k = 0; k < n; k++) rs.emplace_back(t);
  for (size_t k = 0; k < n; k++) {
    rs[k].cycles.reserve((size_t)passes * t.evs.size());
    allocators[k]->reset_peak();
    rs[k].warm_ns = pass(*allocators[k], t, rs[k], false, streams);
  }
  for (int round = 1; round <= 2 * passes; round++) {
    bool per_op = round % 2 == 1;
    for (size_t j = 0; j < n; j++) {
      size_t k = (j + round) % n;
      if (hot) pass(*allocators[k], t, rs[k], false, streams);  // untimed: warms its caches
      double ns = pass(*allocators[k], t, rs[k], per_op, streams);
      if (!per_op) rs[k].pass_ns.push_back(ns);
    }
  }
  CU_CHECK(cuCtxSynchronize());
  auto find = [&](const char *name) -> int {
    for (size_t k = 0; k < n; k++)
      if (!std::strcmp(allocators[k]->name(), name)) return (int)k;
    return -1;
  };
  int torch = find("PyTorch caching"), async = find("cuMemAllocAsync");
  auto ratio = [&](size_t k, int base) -> std::string {
    if (base < 0 || (int)k == base) return "—";
    std::vector<double> q;
    for (size_t i = 0; i < rs[k].pass_ns.size(); i++) q.push_back(rs[k].pass_ns[i] / rs[base].pass_ns[i]);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", median(q));
    return buf;
  };
  for (size_t k = 0; k < n; k++) {
    Replay &r = rs[k];
    std::sort(r.cycles.begin(), r.cycles.end());
    double p50 = r.cycles[r.cycles.size() / 2] / tpn, p99 = r.cycles[r.cycles.size() * 99 / 100] / tpn;
    double frag = (double)allocators[k]->peak_reserved() / (double)t.peak_live;
    std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.4f | %s | %s |\n", t.name.c_str(), allocators[k]->name(),
                median(r.pass_ns), p50, p99, r.warm_ns, frag, ratio(k, torch).c_str(), ratio(k, async).c_str());
  }
  std::fflush(stdout);
}

int main(int argc, char **argv) {
  int passes = 30;
  std::string only;
  bool hot = false;
  std::vector<const char *> paths;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--passes") && i + 1 < argc)
      passes = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--hot"))
      hot = true;
    else
      paths.push_back(argv[i]);
  }
  if (paths.empty() || passes < 1) {
    std::fprintf(stderr, "usage: %s [--passes N] [--only NAMES] [--hot] TRACE...\n", argv[0]);
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
  for (auto p : paths) traces.push_back(load_trace(p));
  uint32_t nstreams = 1;
  for (auto &t : traces) nstreams = std::max(nstreams, t.nstreams);
  std::vector<CUstream> streams(nstreams);
  for (auto &s : streams) CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  std::printf("\n| trace | allocator | ns/op mean | ns/op p50 | ns/op p99 | first pass ns/op | peak reserved / peak live "
              "| mean ÷ PyTorch (same rounds) | mean ÷ cuMemAllocAsync (same rounds) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (auto &t : traces) {
    if (!t.unfreed.empty())
      std::printf("# %s: %zu blocks are never freed by the trace: freed after every pass, untimed\n", t.name.c_str(),
                  t.unfreed.size());
    // Fresh allocators for every trace (PyTorch's is one per process: the previous trace left it
    // empty, and it is trimmed and its peaks reset), so no trace's memory counts in another's.
    auto allocators = make_allocators(only);
    replay_all(allocators, t, passes, tpn, streams, hot);
    for (auto &a : allocators) a->trim();
  }
  for (auto &s : streams) cuStreamDestroy(s);
  return 0;
}
