// Allocation traces and their replay, without CUDA: loading a trace (../shared/traces/README.md:
// "a ID BYTES STREAM" / "f ID", gzipped or not, "# {json}" first line), one pass of it through an
// allocator, and how each trace is measured — with allocators made for it alone, and the blocks
// it never frees given back (untimed) after every pass. Allocators kept from one trace to the
// next, and passes that re-allocate blocks still live, let one trace's leftovers count in the
// next trace's memory figures (issue 19: a 3.2 and a 34.8 were reported that way).
//
// An allocator here is any class with `void *alloc(size_t, Stream)`, `void free(void *, size_t,
// Stream)`, `void reset_peak()` and `uint64_t peak_reserved()`. trace_replay.cpp uses this with
// the GPU allocators; c_tests/int_trace_replay_fresh.cpp with gkrt_malloc on the host backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

struct TraceEv {
  bool alloc;
  uint32_t id;
  uint64_t bytes;
  uint32_t stream;
};

struct Trace {
  std::string name;
  std::vector<TraceEv> evs;
  uint32_t nids = 0, nstreams = 0;
  uint64_t peak_live = 0;
  /// Blocks the trace allocates and never frees (dense ids): given back after every pass.
  std::vector<std::pair<uint32_t, uint64_t>> unfreed;
};

/// Reads a trace from `f` (the text form). Returns false, with a message, on a line it cannot use.
static inline bool parse_trace(FILE *f, const std::string &name, Trace &t, std::string &err) {
  t = Trace();
  t.name = name;
  std::unordered_map<uint64_t, uint32_t> ids;
  std::map<uint64_t, uint32_t> streams;
  std::vector<uint64_t> size;
  uint64_t live = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    if (line[0] == '#') {
      // A comment (the metadata line) may be longer than the buffer: skip to its end, so its
      // tail is not read as an event.
      while (!std::strchr(line, '\n') && std::fgets(line, sizeof line, f)) {
      }
      continue;
    }
    if (line[0] == '\n') continue;
    char op = 0;
    unsigned long long id = 0, bytes = 0, stream = 0;
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
        err = name + ": free of unknown id " + std::to_string(id);
        return false;
      }
      t.evs.push_back({false, it->second, size[it->second], 0});
      live -= size[it->second];
      ids.erase(it);
    } else {
      err = name + ": unreadable line: " + line;
      return false;
    }
  }
  for (auto &kv : ids) t.unfreed.emplace_back(kv.second, size[kv.second]);
  std::sort(t.unfreed.begin(), t.unfreed.end());
  t.nstreams = (uint32_t)std::max<size_t>(1, streams.size());
  return true;
}

/// Loads the trace at `path` (through gzip -dcf); exits with a message when it cannot.
static inline Trace load_trace(const char *path) {
  std::string cmd = std::string("gzip -dcf '") + path + "'";
  FILE *f = popen(cmd.c_str(), "r");
  if (!f) {
    std::perror(path);
    std::exit(2);
  }
  std::string base = path;
  base = base.substr(base.rfind('/') + 1);
  Trace t;
  std::string err;
  bool ok = parse_trace(f, base.substr(0, base.find('.')), t, err);
  pclose(f);
  if (!ok || t.evs.empty()) {
    std::fprintf(stderr, "%s\n", ok ? (std::string(path) + ": no events").c_str() : err.c_str());
    std::exit(2);
  }
  return t;
}

/// One allocator's pointers during a replay of one trace.
template <class Stream>
struct ReplayState {
  std::vector<void *> ptr;
  std::vector<Stream> owner;
  explicit ReplayState(const Trace &t) : ptr(t.nids, nullptr), owner(t.nids, Stream()) {}
};

/// One pass of `t` through `a`, calling `after_op()` after every operation (a timing hook).
template <class A, class Stream, class F>
static inline void replay_pass(A &a, const Trace &t, ReplayState<Stream> &r, const std::vector<Stream> &streams,
                               F after_op) {
  for (const TraceEv &e : t.evs) {
    if (e.alloc) {
      Stream s = streams[e.stream];
      r.ptr[e.id] = a.alloc(e.bytes, s);
      r.owner[e.id] = s;
    } else {
      a.free(r.ptr[e.id], e.bytes, r.owner[e.id]);
    }
    after_op();
  }
}

/// Frees the blocks a pass left live (the trace never frees them); returns how many.
template <class A, class Stream>
static inline size_t free_leftovers(A &a, const Trace &t, ReplayState<Stream> &r) {
  size_t n = 0;
  for (auto [id, bytes] : t.unfreed) {
    if (r.ptr[id]) {
      a.free(r.ptr[id], bytes, r.owner[id]);
      r.ptr[id] = nullptr;
      n++;
    }
  }
  return n;
}

/// Peak memory held from the device over `passes` passes of `t` through a fresh allocator from
/// `make()`, divided by the trace's peak of live bytes; leftovers are freed after each pass.
template <class Stream, class Make>
static inline double fresh_fragmentation(Make make, const Trace &t, int passes, const std::vector<Stream> &streams) {
  auto a = make();
  ReplayState<Stream> r(t);
  a->reset_peak();
  for (int p = 0; p < passes; p++) {
    replay_pass(*a, t, r, streams, [] {});
    free_leftovers(*a, t, r);
  }
  return (double)a->peak_reserved() / (double)t.peak_live;
}
