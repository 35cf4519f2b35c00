/*
 * fuzz_api, host callbacks and the operations on runtimes, kernels and graphs as objects.
 * A part of fuzz_api.c's one translation unit, included by it in order (each part uses what
 * the parts before it define); c_tests/CMakeLists.txt makes a test only of each .c file directly in c_tests.
 */

/* ------------------------------------------------------------------------------------------ */
/* Host callbacks (run on the host backend's stream worker, with host pointers). */

static int32_t neg_cb(const gkrt_callback_args *args, void *user) {
  (void)user;
  if (args->num_inputs != 1 || args->num_outputs != 1 || args->inputs[0].size != args->outputs[0].size) return 99;
  const float *in = args->inputs[0].ptr;
  float *out = args->outputs[0].ptr;
  for (size_t i = 0; i < args->outputs[0].size / 4; i++) out[i] = -in[i];
  return 0;
}

static int32_t fail_cb(const gkrt_callback_args *args, void *user) {
  (void)args;
  (void)user;
  return 7;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations. Each makes one to a few API calls, good or with exactly one defect. */

static void graph_release_model(world *w, int gi);

static void op_runtime_create(world *w) {
  w->op = "runtime_create";
  gkrt_config cfg;
  if (CALL(w, gkrt_config_init(&cfg), S_OK) != GKRT_STATUS_OK) return;
  cfg.device = GKRT_DEVICE_HOST;
  cfg.log_level = 0;
  cfg.seed = rnd(&w->rng);
  cfg.host_jitter_us = chance(&w->rng, 30) ? below(&w->rng, 20) : 0;
  gkrt_runtime *out = SENT_PTR;
  int defect = chance(&w->rng, 25) ? 1 + below(&w->rng, 5) : 0;
  switch (defect) {
    case 1: cfg.device = 3 + below(&w->rng, 1000); break;
    case 2: cfg.memory_mode = 2 + (uint32_t)below(&w->rng, 0xFFFFFFF0u); break;
    case 3: cfg.log_level = 6 + below(&w->rng, 100); break;
    case 4: cfg.pool_growth = 3 + below(&w->rng, 1000); break;
    case 5: CALL(w, gkrt_runtime_create(&cfg, NULL), S_ARG); return;
    default: break;
  }
  if (defect) {
    CALL(w, gkrt_runtime_create(&cfg, &out), S_ARG);
    if (out != SENT_PTR) FAIL(w, "runtime_create wrote *out on failure");
    return;
  }
  /* Live runtime objects are bounded (each has stream threads). */
  int slot = -1;
  for (int i = 0; i < w->nrt; i++)
    if (!rt_object_alive(w, i)) slot = i;
  if (slot < 0 && w->nrt < MAXRT) slot = w->nrt;
  if (slot < 0) {
    /* Every slot holds a runtime kept alive by graphs or kernels after its handle went: release
     * those of one such runtime (its last references) to make room. */
    int victim = -1;
    for (int i = 0; i < w->nrt; i++)
      if (!w->rt[i].handle_live && !w->rt[i].shared) victim = i;
    if (victim < 0) return;
    for (int i = 0; i < w->ng; i++)
      if (w->g[i].live && w->g[i].rt == victim && CALL(w, gkrt_graph_release(w->g[i].h), S_OK) == GKRT_STATUS_OK)
        graph_release_model(w, i);
    for (int i = 0; i < w->nk; i++)
      if (w->k[i].live && w->k[i].rt == victim && CALL(w, gkrt_kernel_release(w->k[i].h), S_OK) == GKRT_STATUS_OK) {
        w->k[i].live = 0;
        remember_dead(w, w->k[i].h);
      }
    slot = victim;
  }
  static const uint64_t limits[] = {2 << 10, 4 << 10, 8 << 10, 64 << 10};
  int tight = chance(&w->rng, 45);
  cfg.memory_limit = tight ? limits[below(&w->rng, 4)] : 0;
  cfg.host_memory_limit = chance(&w->rng, 10) ? (16 << 10) : 0;
  cfg.memory_mode = chance(&w->rng, 30) ? GKRT_MEMORY_PLANNED : GKRT_MEMORY_DYNAMIC;
  cfg.pool_growth = below(&w->rng, 3);
  int defaults = chance(&w->rng, 5);
  if (CALL(w, gkrt_runtime_create(defaults ? NULL : &cfg, &out), S_OK) != GKRT_STATUS_OK) return;
  if (out == SENT_PTR || out == NULL) {
    FAIL(w, "runtime_create succeeded without writing *out");
    return;
  }
  mrt *r = &w->rt[slot];
  memset(r, 0, sizeof *r);
  r->h = out;
  r->handle_live = 1;
  r->tight = !defaults && (cfg.memory_limit != 0 || cfg.host_memory_limit != 0);
  r->planned = !defaults && cfg.memory_mode == GKRT_MEMORY_PLANNED;
  if (slot == w->nrt) w->nrt++;
  /* A NULL config gives the defaults: dynamic, no limit. */
  gkrt_device_kind kind = 77;
  CALL(w, gkrt_runtime_device(out, &kind), S_OK);
  if (kind != GKRT_DEVICE_HOST && kind != GKRT_DEVICE_CUDA) FAIL(w, "runtime_device gave %u", kind);
  check_stats(w, slot);
}

static void op_runtime_release(world *w) {
  w->op = "runtime_release";
  int c = below(&w->rng, 10);
  if (c == 0) {
    CALL(w, gkrt_runtime_release(NULL), S_OK);
    return;
  }
  if (c <= 2) {
    CALL(w, gkrt_runtime_release((gkrt_runtime *)bogus_handle(w)), S_ARG);
    return;
  }
  if (c == 3 && w->ng) { /* a graph or kernel handle passed as a runtime */
    int gi = pick_live_graph(w);
    if (gi >= 0) CALL(w, gkrt_runtime_release((gkrt_runtime *)w->g[gi].h), S_ARG);
    return;
  }
  int ri = pick_live_rt(w);
  if (ri < 0 || w->rt[ri].shared) return;
  /* Graphs and kernels made from it keep it alive; its raw blocks go with it. */
  gkrt_stats st;
  if (CALL(w, gkrt_runtime_stats(w->rt[ri].h, &st), S_OK) == GKRT_STATUS_OK) w->swapped += st.tensors_swapped_out;
  if (CALL(w, gkrt_runtime_release(w->rt[ri].h), S_OK) != GKRT_STATUS_OK) return;
  w->rt[ri].handle_live = 0;
  w->rt[ri].nraw = 0;
  remember_dead(w, w->rt[ri].h);
}

static void op_kernel_create(world *w) {
  w->op = "kernel_create";
  int ri = pick_live_rt(w);
  gkrt_kernel *out = SENT_PTR;
  if (ri < 0) return;
  gkrt_runtime *rt = w->rt[ri].h;
  int c = below(&w->rng, 12);
  if (c == 0) {
    CALL(w, gkrt_kernel_builtin(rt, 7 + (gkrt_builtin)below(&w->rng, 0xFFFFFFF0u), &out), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_kernel_builtin((gkrt_runtime *)bogus_handle(w), GKRT_BUILTIN_ADD, &out), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_kernel_builtin(rt, GKRT_BUILTIN_ADD, NULL), S_ARG);
  } else if (c == 3) {
    CALL(w, gkrt_kernel_from_callback(rt, NULL, NULL, &out), S_ARG);
  } else if (c == 4) {
    /* PTX on the host backend: UNSUPPORTED; a NULL text: INVALID_ARGUMENT. */
    if (chance(&w->rng, 50))
      CALL(w, gkrt_kernel_from_ptx(rt, ".version 7.0\n", "f", &out), S_(GKRT_STATUS_UNSUPPORTED));
    else
      CALL(w, gkrt_kernel_from_ptx(rt, NULL, "f", &out), S_ARG);
  }
  if (c <= 4) {
    if (out != SENT_PTR) FAIL(w, "kernel creation wrote *out on failure");
    return;
  }
  int slot = -1;
  for (int i = 0; i < w->nk; i++)
    if (!w->k[i].live) slot = i;
  if (slot < 0 && w->nk < MAXK) slot = w->nk;
  if (slot < 0) return;
  int kind;
  gkrt_status st;
  if (c == 11) {
    kind = chance(&w->rng, 25) ? K_FAIL : K_NEG;
    st = CALL(w, gkrt_kernel_from_callback(rt, kind == K_NEG ? neg_cb : fail_cb, w, &out), S_OK);
  } else {
    kind = (int)below(&w->rng, 7);
    st = CALL(w, gkrt_kernel_builtin(rt, (gkrt_builtin)kind, &out), S_OK);
  }
  if (st != GKRT_STATUS_OK) return;
  if (out == SENT_PTR || out == NULL) {
    FAIL(w, "kernel creation succeeded without writing *out");
    return;
  }
  w->k[slot] = (mkern){out, 1, ri, kind};
  if (slot == w->nk) w->nk++;
}

static void op_kernel_release(world *w) {
  w->op = "kernel_release";
  int c = below(&w->rng, 8);
  if (c == 0) {
    CALL(w, gkrt_kernel_release(NULL), S_OK);
  } else if (c == 1) {
    CALL(w, gkrt_kernel_release((gkrt_kernel *)bogus_handle(w)), S_ARG);
  } else if (c == 2) {
    int ri = pick_live_rt(w);
    if (ri >= 0) CALL(w, gkrt_kernel_release((gkrt_kernel *)w->rt[ri].h), S_ARG);
  } else {
    int ki = pick_live_kernel(w, -1, -1);
    if (ki < 0) return;
    /* Graphs that use it keep what they need. */
    if (CALL(w, gkrt_kernel_release(w->k[ki].h), S_OK) != GKRT_STATUS_OK) return;
    w->k[ki].live = 0;
    remember_dead(w, w->k[ki].h);
  }
}

static void op_graph_create(world *w) {
  w->op = "graph_create";
  gkrt_graph *out = SENT_PTR;
  int ri = pick_live_rt(w);
  int c = below(&w->rng, 10);
  if (c == 0 || ri < 0) {
    CALL(w, gkrt_graph_create((gkrt_runtime *)bogus_handle(w), &out), S_ARG);
  } else if (c == 1) {
    CALL(w, gkrt_graph_create(w->rt[ri].h, NULL), S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_create(NULL, &out), S_ARG);
  }
  if (c <= 2 || ri < 0) {
    if (out != SENT_PTR) FAIL(w, "graph_create wrote *out on failure");
    return;
  }
  int slot = -1;
  for (int i = 0; i < w->ng; i++)
    if (!w->g[i].live) slot = i;
  if (slot < 0 && w->ng < MAXG) slot = w->ng;
  if (slot < 0) return;
  if (CALL(w, gkrt_graph_create(w->rt[ri].h, &out), S_OK) != GKRT_STATUS_OK) return;
  if (out == SENT_PTR || out == NULL) {
    FAIL(w, "graph_create succeeded without writing *out");
    return;
  }
  mgraph *g = &w->g[slot];
  for (int t = 0; t < g->nt; t++) free(g->t[t].val);
  memset(g, 0, sizeof *g);
  g->h = out;
  g->live = 1;
  g->rt = ri;
  if (slot == w->ng) w->ng++;
}

static void graph_release_model(world *w, int gi) {
  mgraph *g = &w->g[gi];
  for (int t = 0; t < g->nt; t++) {
    free(g->t[t].val);
    g->t[t].val = NULL;
  }
  g->live = 0;
  g->nt = g->nn = 0;
  remember_dead(w, g->h);
}

static void op_graph_release(world *w) {
  w->op = "graph_release";
  int c = below(&w->rng, 8);
  if (c == 0) {
    CALL(w, gkrt_graph_release(NULL), S_OK);
  } else if (c == 1) {
    CALL(w, gkrt_graph_release((gkrt_graph *)bogus_handle(w)), S_ARG);
  } else if (c == 2) {
    int ki = pick_live_kernel(w, -1, -1);
    if (ki >= 0) CALL(w, gkrt_graph_release((gkrt_graph *)w->k[ki].h), S_ARG);
  } else {
    int gi = pick_live_graph(w);
    if (gi < 0) return;
    int ri = w->g[gi].rt;
    if (CALL(w, gkrt_graph_release(w->g[gi].h), S_OK) != GKRT_STATUS_OK) return;
    graph_release_model(w, gi);
    check_stats(w, ri);
  }
}
