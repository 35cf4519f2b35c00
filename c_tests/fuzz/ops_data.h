/*
 * fuzz_api, the operations on data and runs: writes, reads, runs, raw blocks, the rest.
 * A part of fuzz_api.c's one translation unit, included by it in order (each part uses what
 * the parts before it define); c_tests/CMakeLists.txt makes a test only of each .c file directly in c_tests.
 */

static void random_floats(world *w, mtensor *t) {
  if (t->size % 4) {
    for (uint64_t i = 0; i < t->size; i++) t->val[i] = (unsigned char)rnd(&w->rng);
  } else {
    fill_floats((float *)t->val, t->size / 4, (uint32_t)rnd(&w->rng));
  }
}

static void op_write(world *w) {
  w->op = "write_tensor";
  int gi = pick_live_graph(w);
  if (gi < 0 || w->g[gi].nt == 0) return;
  mgraph *g = &w->g[gi];
  int ti = below(&w->rng, g->nt);
  for (int tries = 0; tries < 6 && chance(&w->rng, 70); tries++) {
    mtensor *x = &g->t[ti];
    if ((x->kind == GKRT_TENSOR_INPUT || x->kind == GKRT_TENSOR_PARAMETER) && x->has != 1) break;
    ti = below(&w->rng, g->nt);
  }
  mtensor *t = &g->t[ti];
  unsigned char *buf = malloc(t->size + 512);
  memcpy(buf, t->val, t->size);
  int c = below(&w->rng, 12);
  if (c == 0) {
    static const size_t off[] = {1, 4, 256};
    size_t size = chance(&w->rng, 50) ? t->size + off[below(&w->rng, 3)] : t->size - 1;
    if (chance(&w->rng, 20)) size = SIZE_MAX - below(&w->rng, 2);
    gkrt_status st = CALL(w, gkrt_graph_write_tensor(g->h, t->id, buf, size), S_ARG);
    if (st == GKRT_STATUS_INVALID_ARGUMENT && t->name[0] && !strstr(error_text(), t->name))
      FAIL(w, "write of %zu bytes to %s: message \"%s\" does not name it", size, t->name, error_text());
  } else if (c == 1) {
    CALL(w, gkrt_graph_write_tensor(g->h, t->id, NULL, t->size), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_write_tensor((gkrt_graph *)bogus_handle(w), t->id, buf, t->size), S_ARG);
  } else if (c == 3) {
    int og = pick_live_graph(w);
    if (og >= 0 && og != gi) CALL(w, gkrt_graph_write_tensor(w->g[og].h, t->id, buf, t->size), S_ARG);
  } else if (t->kind == GKRT_TENSOR_INTERMEDIATE) {
    CALL(w, gkrt_graph_write_tensor(g->h, t->id, buf, t->size), S_ARG);
  } else {
    mtensor scratch = *t;
    scratch.val = buf;
    random_floats(w, &scratch);
    gkrt_status st = CALL(w, gkrt_graph_write_tensor(g->h, t->id, buf, t->size), w->rt[g->rt].tight ? S_OK | S_OOM : S_OK);
    if (st == GKRT_STATUS_OK) {
      memcpy(t->val, buf, t->size);
      t->has = 1;
      t->known = 1;
      /* Copied at the call: scribbling on the buffer now changes nothing. */
      memset(buf, 0xEE, t->size);
    }
  }
  free(buf);
}

static void op_read(world *w) {
  w->op = "read_tensor";
  int gi = pick_live_graph(w);
  if (gi < 0 || w->g[gi].nt == 0) return;
  mgraph *g = &w->g[gi];
  mtensor *t = &g->t[below(&w->rng, g->nt)];
  size_t cap = t->size + 16;
  unsigned char *buf = malloc(cap);
  memset(buf, 0xC3, cap);
  int c = below(&w->rng, 10);
  int untouched = 1;
  if (c == 0) {
    size_t size = chance(&w->rng, 50) ? t->size + 1 + below(&w->rng, 16) : t->size - 1;
    if (chance(&w->rng, 20)) size = SIZE_MAX;
    CALL(w, gkrt_graph_read_tensor(g->h, t->id, buf, size), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_graph_read_tensor(g->h, t->id, NULL, t->size), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_read_tensor((gkrt_graph *)bogus_handle(w), t->id, buf, t->size), S_ARG);
  } else if (t->kind == GKRT_TENSOR_INTERMEDIATE) {
    CALL(w, gkrt_graph_read_tensor(g->h, t->id, buf, t->size), S_ARG);
  } else {
    unsigned want = t->has == 1 ? S_OK : t->has == 2 ? S_OK | S_STATE : S_STATE;
    gkrt_status st = CALL(w, gkrt_graph_read_tensor(g->h, t->id, buf, t->size), want);
    if (st == GKRT_STATUS_INVALID_STATE) t->has = 0;
    if (st == GKRT_STATUS_OK) {
      untouched = 0;
      t->has = 1;
      if (t->known) {
        w->reads_checked++;
        if (memcmp(buf, t->val, t->size) != 0) {
          size_t i = 0;
          while (buf[i] == t->val[i]) i++;
          FAIL(w, "read of %s (%llu bytes, kind %u): byte %zu is 0x%02x, the model says 0x%02x", t->name[0] ? t->name : "(unnamed)",
               (unsigned long long)t->size, t->kind, i, buf[i], t->val[i]);
        }
      } else {
        memcpy(t->val, buf, t->size); /* from now on the model knows these bytes */
        t->known = 1;
      }
    }
  }
  for (size_t i = untouched ? 0 : t->size; i < cap; i++)
    if (buf[i] != 0xC3) {
      FAIL(w, "read_tensor wrote byte %zu of the caller's buffer (%s)", i, untouched ? "on failure" : "past the tensor");
      break;
    }
  free(buf);
}

/* Which status a run of graph gi must give. */
static unsigned run_expectation(world *w, mgraph *g) {
  if (!g->finalized) return S_STATE;
  unsigned want = S_OK;
  /* Inputs and parameters whose first use reads them need contents. */
  int missing = 0, maybe = 0;
  for (int t = 0; t < g->nt; t++) {
    mtensor *x = &g->t[t];
    if (x->kind != GKRT_TENSOR_INPUT && x->kind != GKRT_TENSOR_PARAMETER) continue;
    for (int i = 0; i < g->nn; i++) {
      mnode *n = &g->n[i];
      int reads = 0;
      for (int j = 0; j < n->nin; j++) reads |= n->in[j] == t;
      if (reads) {
        missing |= x->has == 0;
        maybe |= x->has == 2;
        break;
      }
      if (n->out == t) break;
    }
  }
  if (missing) return S_STATE | S_ARG; /* the header does not say which; api_tensor_io takes both */
  if (maybe) want |= S_STATE | S_ARG;
  if (w->rt[g->rt].tight) want |= S_OOM;
  if (g->has_fail_node) want = (want & ~S_OK) | S_CB;
  return want;
}

static void op_run(world *w) {
  w->op = "run";
  int gi = pick_live_graph(w);
  if (gi < 0) return;
  for (int tries = 0; tries < 4 && !w->g[gi].finalized && chance(&w->rng, 80); tries++) gi = pick_live_graph(w);
  mgraph *g = &w->g[gi];
  int c = below(&w->rng, 12);
  if (c == 0) {
    CALL(w, gkrt_runtime_run((gkrt_runtime *)bogus_handle(w), g->h), S_ARG);
    return;
  }
  if (c == 1) {
    int ri = pick_live_rt(w);
    if (ri >= 0) CALL(w, gkrt_runtime_run(w->rt[ri].h, chance(&w->rng, 50) ? NULL : (gkrt_graph *)bogus_handle(w)), S_ARG);
    return;
  }
  if (c == 2) { /* another runtime's handle */
    for (int ri = 0; ri < w->nrt; ri++)
      if (ri != g->rt && w->rt[ri].handle_live) {
        CALL(w, gkrt_runtime_run(w->rt[ri].h, g->h), g->finalized ? S_ARG : S_ARG | S_STATE);
        return;
      }
    return;
  }
  mrt *r = &w->rt[g->rt];
  if (!r->handle_live) return; /* its runtime lives on, but no handle names it any more */
  unsigned want = run_expectation(w, g);
  gkrt_status st = CALL(w, gkrt_runtime_run(r->h, g->h), want);
  if (st == GKRT_STATUS_OK) {
    w->runs_ok++;
    model_run(g);
  } else if (st == GKRT_STATUS_OUT_OF_MEMORY || st == GKRT_STATUS_CALLBACK_FAILED) {
    w->runs_oom += st == GKRT_STATUS_OUT_OF_MEMORY;
    model_failed_run(g);
  } else if (g->finalized && (st == GKRT_STATUS_INVALID_STATE || st == GKRT_STATUS_INVALID_ARGUMENT)) {
    /* Refused for a missing input: nothing ran. A "maybe" tensor turned out to be empty. */
  }
  check_stats(w, g->rt);
}

static void op_raw(world *w) {
  w->op = "malloc_free";
  int ri = pick_live_rt(w);
  if (ri < 0) return;
  mrt *r = &w->rt[ri];
  void *p = SENT_PTR;
  int c = below(&w->rng, 12);
  if (c == 0) {
    CALL(w, gkrt_malloc(r->h, 0, NULL, &p), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_malloc(r->h, SIZE_MAX - below(&w->rng, 300), NULL, &p), S_OOM | S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_malloc(r->h, 64, NULL, NULL), S_ARG);
  } else if (c == 3) {
    CALL(w, gkrt_malloc((gkrt_runtime *)bogus_handle(w), 64, NULL, &p), S_ARG);
  } else if (c == 4) {
    CALL(w, gkrt_malloc(r->h, 64, (void *)(uintptr_t)(rnd(&w->rng) | 1), &p), S_ARG); /* a stream host code cannot name */
  } else if (c == 5) {
    CALL(w, gkrt_free(r->h, (void *)(uintptr_t)(rnd(&w->rng) | 1), NULL), S_ARG);
  } else if (c == 6) {
    CALL(w, gkrt_free(r->h, NULL, NULL), S_OK);
  }
  if (c <= 6) {
    if (p != SENT_PTR) FAIL(w, "gkrt_malloc wrote *out on failure");
    return;
  }
  if (r->shared) return; /* raw blocks on the shared runtime would make its statistics unpredictable */
  if ((c < 10 && r->nraw < MAXRAW) || r->nraw == 0) {
    size_t size = 1 + below(&w->rng, chance(&w->rng, 20) ? 3u << 20 : 5000);
    gkrt_status st = CALL(w, gkrt_malloc(r->h, size, NULL, &p), r->tight ? S_OK | S_OOM : S_OK);
    if (st == GKRT_STATUS_OK) {
      if (p == SENT_PTR || p == NULL || ((uintptr_t)p & 255) != 0) FAIL(w, "gkrt_malloc gave %p", p);
      r->raw[r->nraw] = p;
      r->raw_size[r->nraw++] = size;
    } else if (p != SENT_PTR) {
      FAIL(w, "gkrt_malloc wrote *out on failure");
    }
  } else {
    int i = below(&w->rng, r->nraw);
    void *q = r->raw[i];
    if (CALL(w, gkrt_free(r->h, q, NULL), S_OK) != GKRT_STATUS_OK) return;
    r->raw[i] = r->raw[--r->nraw];
    r->raw_size[i] = r->raw_size[r->nraw];
    CALL(w, gkrt_free(r->h, q, NULL), S_ARG); /* freed twice */
  }
  check_stats(w, ri);
}

static void op_misc(world *w) {
  w->op = "runtime_misc";
  int ri = pick_live_rt(w);
  gkrt_runtime *h = ri >= 0 ? w->rt[ri].h : NULL;
  gkrt_stats s;
  memset(&s, 0xAB, sizeof s);
  uint64_t released = SENT_U64;
  gkrt_device_kind kind = 77;
  switch (below(&w->rng, 12)) {
    case 0: CALL(w, gkrt_runtime_synchronize(h), h ? S_OK : S_ARG); break;
    case 1: CALL(w, gkrt_runtime_synchronize((gkrt_runtime *)bogus_handle(w)), S_ARG); break;
    case 2:
      CALL(w, gkrt_runtime_stats((gkrt_runtime *)bogus_handle(w), &s), S_ARG);
      if (s.allocated_bytes != 0xABABABABABABABABull) FAIL(w, "runtime_stats wrote *out on failure");
      break;
    case 3: if (h) CALL(w, gkrt_runtime_stats(h, NULL), S_ARG); break;
    case 4: CALL(w, gkrt_runtime_reset_peak_stats(h), h ? S_OK : S_ARG); break;
    case 5:
      CALL(w, gkrt_runtime_release_cached(h, chance(&w->rng, 50) ? &released : NULL), h ? S_OK : S_ARG);
      break;
    case 6:
      CALL(w, gkrt_runtime_device((gkrt_runtime *)bogus_handle(w), &kind), S_ARG);
      if (kind != 77) FAIL(w, "runtime_device wrote *out on failure");
      break;
    case 7: if (h) CALL(w, gkrt_runtime_device(h, NULL), S_ARG); break;
    case 8: CALL(w, gkrt_config_init(NULL), S_ARG); break;
    case 9: {
      int32_t v = (int32_t)rnd(&w->rng);
      const char *name = gkrt_status_name(v);
      w->call++;
      if (!name || ((v < 0 || v > 9) && strcmp(name, "GKRT_STATUS_UNKNOWN") != 0)) FAIL(w, "status_name(%d)", v);
      break;
    }
    case 10: { /* a graph handle where a runtime goes, and the reverse */
      int gi = pick_live_graph(w);
      if (gi >= 0) CALL(w, gkrt_runtime_stats((gkrt_runtime *)w->g[gi].h, &s), S_ARG);
      if (h) CALL(w, gkrt_graph_finalize((gkrt_graph *)h), S_ARG);
      break;
    }
    default: if (ri >= 0) check_stats(w, ri); break;
  }
}

/* The graph every thread of a shared-runtime seed runs: same inputs, so always the same output. */
static void op_shared_graph(world *w) {
  w->op = "shared_graph";
  if (!shared_graph.g) return;
  int shared = -1;
  for (int i = 0; i < w->nrt; i++)
    if (w->rt[i].shared) shared = i;
  if (shared < 0) return;
  CALL(w, gkrt_runtime_run(w->rt[shared].h, shared_graph.g), S_OK);
  float y[64];
  memset(y, 0, sizeof y);
  if (CALL(w, gkrt_graph_read_tensor(shared_graph.g, shared_graph.y, y, sizeof y), S_OK) == GKRT_STATUS_OK &&
      memcmp(y, shared_graph.want, sizeof y) != 0)
    FAIL(w, "the shared graph's output differs from its reference");
}

/* The happy path, so that runs and bit-exact reads are many: complete a graph (a fill for
 * every output nobody writes), finalize it, write every input and parameter without contents,
 * run, and read back every persistent tensor. */
static void op_cycle(world *w) {
  w->op = "write_run_read";
  int gi = pick_live_graph(w);
  for (int tries = 0; tries < 4 && gi >= 0 && w->g[gi].nn == 0; tries++) gi = pick_live_graph(w);
  if (gi < 0) return;
  mgraph *g = &w->g[gi];
  mrt *r = &w->rt[g->rt];
  if (!g->finalized) {
    int fk = pick_live_kernel(w, g->rt, GKRT_BUILTIN_FILL);
    for (int t = 0; t < g->nt && !w->failed; t++) {
      mtensor *x = &g->t[t];
      if (x->kind != GKRT_TENSOR_OUTPUT || x->produced) continue;
      if (fk < 0 || g->nn >= MAXN) return;
      mnode n = {GKRT_BUILTIN_FILL, 0, {0, 0}, t, (float)t - 2.5f, {0, 0, 0}};
      gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, &n.param, 4};
      if (CALL(w, gkrt_graph_add_kernel(g->h, w->k[fk].h, NULL, 0, &x->id, 1, NULL, 0, &l, NULL), S_OK) != GKRT_STATUS_OK)
        return;
      g->n[g->nn++] = n;
      x->produced = 1;
    }
    if (g->nn == 0) return;
    gkrt_status st = CALL(w, gkrt_graph_finalize(g->h), r->tight ? S_OK | S_OOM : S_OK);
    if (st != GKRT_STATUS_OK) return;
    g->finalized = 1;
  }
  for (int t = 0; t < g->nt && !w->failed; t++) {
    mtensor *x = &g->t[t];
    if ((x->kind != GKRT_TENSOR_INPUT && x->kind != GKRT_TENSOR_PARAMETER) || x->has == 1) continue;
    unsigned char *buf = malloc(x->size);
    mtensor scratch = *x;
    scratch.val = buf;
    random_floats(w, &scratch);
    if (CALL(w, gkrt_graph_write_tensor(g->h, x->id, buf, x->size), r->tight ? S_OK | S_OOM : S_OK) == GKRT_STATUS_OK) {
      memcpy(x->val, buf, x->size);
      x->has = x->known = 1;
    }
    free(buf);
  }
  if (!r->handle_live || w->failed) return;
  gkrt_status st = CALL(w, gkrt_runtime_run(r->h, g->h), run_expectation(w, g));
  if (st == GKRT_STATUS_OK) {
    w->runs_ok++;
    model_run(g);
  } else if (st == GKRT_STATUS_OUT_OF_MEMORY || st == GKRT_STATUS_CALLBACK_FAILED) {
    w->runs_oom += st == GKRT_STATUS_OUT_OF_MEMORY;
    model_failed_run(g);
  }
  check_stats(w, g->rt);
  for (int t = 0; t < g->nt && !w->failed; t++) {
    mtensor *x = &g->t[t];
    if (x->kind == GKRT_TENSOR_INTERMEDIATE || x->has == 0) continue;
    unsigned char *buf = malloc(x->size);
    gkrt_status rs = CALL(w, gkrt_graph_read_tensor(g->h, x->id, buf, x->size), x->has == 1 ? S_OK : S_OK | S_STATE);
    if (rs == GKRT_STATUS_OK) {
      x->has = 1;
      if (x->known) {
        w->reads_checked++;
        if (memcmp(buf, x->val, x->size) != 0) {
          size_t i = 0;
          while (buf[i] == x->val[i]) i++;
          FAIL(w, "read of %s (%llu bytes, kind %u) after a run: byte %zu is 0x%02x, the model says 0x%02x",
               x->name[0] ? x->name : "(unnamed)", (unsigned long long)x->size, x->kind, i, buf[i], x->val[i]);
        }
      } else {
        memcpy(x->val, buf, x->size);
        x->known = 1;
      }
    } else {
      x->has = 0;
    }
    free(buf);
  }
}
