/*
 * fuzz_api, the operations that build and finalize graphs: tensors, nodes, recomputable, info.
 * A part of fuzz_api.c's one translation unit, included by it in order (each part uses what
 * the parts before it define); c_tests/CMakeLists.txt makes a test only of each .c file directly in c_tests.
 */

static uint64_t tensor_size(world *w) {
  int c = below(&w->rng, 10);
  if (c < 7) return 4ull * (1 + below(&w->rng, 8)) * (1 + below(&w->rng, 8));
  if (c < 9) {
    static const uint64_t big[] = {256 * 4, 1000 * 4, 4096 * 4};
    return big[below(&w->rng, 3)];
  }
  return 1 + below(&w->rng, 37); /* any byte count: only copy (and errors) use these */
}

static void op_add_tensor(world *w) {
  w->op = "add_tensor";
  int gi = pick_live_graph(w);
  gkrt_tensor out = SENT_U64;
  if (gi < 0) {
    CALL(w, gkrt_graph_add_tensor((gkrt_graph *)bogus_handle(w), 16, GKRT_TENSOR_INPUT, "x", &out), S_ARG);
    return;
  }
  mgraph *g = &w->g[gi];
  char name[40];
  snprintf(name, sizeof name, "s%llu_t%d_g%d_%d", (unsigned long long)w->seed, w->thread, gi, g->nt);
  int c = below(&w->rng, 10);
  if (c == 0) {
    static const uint64_t bad[] = {0, (1ull << 48) + 1, 1ull << 63, UINT64_MAX - 255, UINT64_MAX};
    uint64_t size = bad[below(&w->rng, 5)];
    gkrt_status st = CALL(w, gkrt_graph_add_tensor(g->h, size, below(&w->rng, 4), name, &out),
                          g->finalized ? S_ARG | S_STATE : S_ARG);
    if (st == GKRT_STATUS_INVALID_ARGUMENT && !g->finalized && !strstr(error_text(), name))
      FAIL(w, "add_tensor of %llu bytes: message \"%s\" does not name %s", (unsigned long long)size, error_text(), name);
  } else if (c == 1) {
    CALL(w, gkrt_graph_add_tensor(g->h, 16, 4 + (uint32_t)below(&w->rng, 0xFFFFFF00u), name, &out),
         g->finalized ? S_ARG | S_STATE : S_ARG);
  } else if (c == 2) {
    CALL(w, gkrt_graph_add_tensor(g->h, 16, GKRT_TENSOR_INPUT, name, NULL), g->finalized ? S_ARG | S_STATE : S_ARG);
  }
  if (c <= 2) {
    if (out != SENT_U64) FAIL(w, "add_tensor wrote *out on failure");
    return;
  }
  if (g->finalized) {
    CALL(w, gkrt_graph_add_tensor(g->h, 16, GKRT_TENSOR_INPUT, name, &out), S_STATE);
    if (out != SENT_U64) FAIL(w, "add_tensor wrote *out on failure");
    return;
  }
  if (g->nt >= MAXT) return;
  uint64_t size = tensor_size(w);
  uint32_t kind = below(&w->rng, 4);
  if (kind == GKRT_TENSOR_OUTPUT && size % 4) size = 4 * size; /* outputs can always be filled */
  int named = chance(&w->rng, 85);
  if (CALL(w, gkrt_graph_add_tensor(g->h, size, kind, named ? name : NULL, &out), S_OK) != GKRT_STATUS_OK) return;
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].id == out) FAIL(w, "add_tensor gave id %llu twice", (unsigned long long)out);
  mtensor *t = &g->t[g->nt++];
  memset(t, 0, sizeof *t);
  t->id = out;
  t->size = size;
  t->kind = kind;
  if (named) snprintf(t->name, sizeof t->name, "%s", name);
  t->val = calloc(1, size);
}

static int readable(mtensor *t) {
  return t->kind == GKRT_TENSOR_INPUT || t->kind == GKRT_TENSOR_PARAMETER || t->produced;
}
static int writable(mtensor *t) { return t->kind != GKRT_TENSOR_INPUT; }

/* Picks a tensor of graph g with `size` (0: any size that is a whole number of floats, or any
 * size when `any_bytes`) that is readable (want_read) or writable (!want_read). -1 if none. */
static int pick_tensor(world *w, mgraph *g, uint64_t size, int want_read, int any_bytes) {
  int idx[MAXT], n = 0;
  for (int t = 0; t < g->nt; t++) {
    mtensor *x = &g->t[t];
    if (size ? x->size != size : (!any_bytes && x->size % 4 != 0)) continue;
    if (want_read ? !readable(x) : !writable(x)) continue;
    idx[n++] = t;
  }
  return n ? idx[below(&w->rng, n)] : -1;
}

/* A valid node, built from the graph's tensors; returns 0 when none could be found. */
static int plan_node(world *w, mgraph *g, int kind, mnode *n) {
  memset(n, 0, sizeof *n);
  n->kind = kind;
  if (kind == GKRT_BUILTIN_MATMUL) {
    for (int tries = 0; tries < 12; tries++) {
      uint32_t m = 1 + below(&w->rng, 8), nn = 1 + below(&w->rng, 8), k = 1 + below(&w->rng, 8);
      int a = pick_tensor(w, g, 4ull * m * k, 1, 0), b = pick_tensor(w, g, 4ull * k * nn, 1, 0);
      int o = pick_tensor(w, g, 4ull * m * nn, 0, 0);
      if (a < 0 || b < 0 || o < 0 || o == a || o == b) continue;
      n->nin = 2;
      n->in[0] = a;
      n->in[1] = b;
      n->out = o;
      n->mnk[0] = m;
      n->mnk[1] = nn;
      n->mnk[2] = k;
      return 1;
    }
    return 0;
  }
  int o = pick_tensor(w, g, 0, 0, kind == GKRT_BUILTIN_COPY);
  if (o < 0) return 0;
  n->out = o;
  uint64_t size = g->t[o].size;
  n->nin = kind == GKRT_BUILTIN_FILL ? 0 : (kind == GKRT_BUILTIN_ADD || kind == GKRT_BUILTIN_RELU_GRAD) ? 2 : 1;
  for (int j = 0; j < n->nin; j++) {
    n->in[j] = pick_tensor(w, g, size, 1, 1);
    if (n->in[j] < 0) return 0;
  }
  static const float params[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.3333333f, 1e-30f, 65504.0f};
  n->param = params[below(&w->rng, 7)];
  return 1;
}

static void op_add_node(world *w) {
  w->op = "add_kernel";
  int gi = pick_live_graph(w);
  if (gi < 0) return;
  mgraph *g = &w->g[gi];
  int c = below(&w->rng, 100);
  /* A kernel of the graph's runtime. */
  int ki = pick_live_kernel(w, g->rt, -1);
  if (ki < 0) return;
  mkern *k = &w->k[ki];
  mnode n;
  int kind = k->kind == K_FAIL ? K_NEG : k->kind;
  if (!plan_node(w, g, kind, &n)) return;
  gkrt_tensor in[2], out = g->t[n.out].id;
  for (int j = 0; j < n.nin; j++) in[j] = g->t[n.in[j]].id;
  gkrt_launch l = {{1, 1, 1}, {1, 1, 1}, 0, NULL, 0};
  if (kind == GKRT_BUILTIN_FILL || kind == GKRT_BUILTIN_SCALE) {
    l.params = &n.param;
    l.params_size = 4;
  } else if (kind == GKRT_BUILTIN_MATMUL) {
    l.params = n.mnk;
    l.params_size = 12;
  }
  uint64_t ws[3] = {1 + below(&w->rng, 5000), 1 + below(&w->rng, 300), 256};
  size_t nws = below(&w->rng, 4);
  uint32_t node = 0xabcdu;
  const gkrt_launch *lp = (l.params_size == 0 && chance(&w->rng, 50)) ? NULL : &l;
  unsigned ok_or_state = g->finalized ? S_STATE : S_OK;
  unsigned bad = g->finalized ? S_ARG | S_STATE : S_ARG; /* which check comes first is not said */

  if (c < 30) { /* one defect */
    int d = below(&w->rng, 13);
    gkrt_status st = GKRT_STATUS_OK;
    gkrt_tensor badid;
    switch (d) {
      case 0: st = CALL(w, gkrt_graph_add_kernel(NULL, k->h, in, n.nin, &out, 1, ws, nws, lp, &node), S_ARG); break;
      case 1:
        st = CALL(w, gkrt_graph_add_kernel(g->h, (gkrt_kernel *)bogus_handle(w), in, n.nin, &out, 1, ws, nws, lp, &node),
                  bad);
        break;
      case 2: /* a kernel of another runtime */ {
        int other = -1;
        for (int i = 0; i < w->nk; i++)
          if (w->k[i].live && w->k[i].rt != g->rt) other = i;
        if (other < 0) return;
        st = CALL(w, gkrt_graph_add_kernel(g->h, w->k[other].h, in, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      }
      case 3: /* an id of another graph, or made up */ {
        int og = pick_live_graph(w);
        badid = (og >= 0 && og != gi && w->g[og].nt) ? w->g[og].t[0].id : rnd(&w->rng);
        if (n.nin && chance(&w->rng, 50))
          in[0] = badid;
        else
          out = badid;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      }
      case 4:
        if (!n.nin) return;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, NULL, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      case 5: st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, NULL, 1, ws, nws, lp, &node), bad); break;
      case 6: st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, NULL, 1 + below(&w->rng, 4), lp, &node), bad); break;
      case 7: /* a zero launch dimension */ {
        gkrt_launch z = l;
        if (chance(&w->rng, 50))
          z.grid[below(&w->rng, 3)] = 0;
        else
          z.block[below(&w->rng, 3)] = 0;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, &z, &node), bad);
        break;
      }
      case 8: /* a workspace of 0 or past 2^48 bytes */ {
        uint64_t bw[2] = {256, chance(&w->rng, 50) ? 0 : (1ull << 48) + 1 + below(&w->rng, 1000)};
        if (chance(&w->rng, 30)) bw[1] = UINT64_MAX;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, bw, 2, lp, &node), bad);
        break;
      }
      case 9: /* params NULL with a size */ {
        gkrt_launch z = l;
        z.params = NULL;
        z.params_size = 4 + below(&w->rng, 64);
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, &z, &node), bad);
        break;
      }
      case 10: /* a built-in with a parameter blob of the wrong size */ {
        if (kind >= K_NEG) return;
        double wide = 1.0;
        gkrt_launch z = l;
        z.params = &wide;
        z.params_size = l.params_size == 4 ? 8 : l.params_size == 12 ? 8 : 4;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, &z, &node), bad);
        break;
      }
      case 11: /* a built-in with the wrong number of inputs or outputs */ {
        if (kind >= K_NEG) return;
        gkrt_tensor more[3];
        for (int j = 0; j < 3; j++) more[j] = n.nin ? in[j % n.nin] : out;
        if (chance(&w->rng, 50))
          st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, more, n.nin + 1, &out, 1, ws, nws, lp, &node), bad);
        else
          st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 0, ws, nws, lp, &node), bad);
        break;
      }
      case 12: /* a tensor of the wrong size, or an intermediate nobody wrote yet */ {
        int wrong = -1;
        for (int t = 0; t < g->nt; t++) {
          mtensor *x = &g->t[t];
          int unwritten = x->kind == GKRT_TENSOR_INTERMEDIATE && !x->produced;
          if (n.nin && (unwritten || (readable(x) && x->size != g->t[n.in[0]].size && kind != GKRT_BUILTIN_MATMUL)))
            wrong = t;
        }
        /* Callbacks take any sizes: for them only the unwritten intermediate is a defect. */
        if (wrong >= 0 && kind >= K_NEG && !(g->t[wrong].kind == GKRT_TENSOR_INTERMEDIATE && !g->t[wrong].produced))
          return;
        if (wrong < 0 || !n.nin) return;
        in[0] = g->t[wrong].id;
        st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, lp, &node), bad);
        break;
      }
    }
    (void)st;
    if (node != 0xabcdu) FAIL(w, "add_kernel wrote *node_out on failure");
    return;
  }
  /* A good node (refused as a whole once the graph is final). */
  if (g->nn >= MAXN - 8 && !g->finalized) return;
  gkrt_status st = CALL(w, gkrt_graph_add_kernel(g->h, k->h, in, n.nin, &out, 1, ws, nws, lp,
                                                  chance(&w->rng, 80) ? &node : NULL),
                        ok_or_state);
  if (st != GKRT_STATUS_OK) return;
  if (node != 0xabcdu && node != (uint32_t)g->nn) FAIL(w, "add_kernel gave node %u, expected %d", node, g->nn);
  n.kind = k->kind;
  g->n[g->nn++] = n;
  g->t[n.out].produced = 1;
  if (k->kind == K_FAIL) g->has_fail_node = 1;
}

static void op_recomputable(world *w) {
  w->op = "set_node_recomputable";
  int gi = pick_live_graph(w);
  if (gi < 0) {
    CALL(w, gkrt_graph_set_node_recomputable((gkrt_graph *)bogus_handle(w), 0, 1), S_ARG);
    return;
  }
  mgraph *g = &w->g[gi];
  uint32_t node = chance(&w->rng, 15) ? (uint32_t)g->nn + below(&w->rng, 3) * 1000 : below(&w->rng, g->nn + 1);
  if (chance(&w->rng, 5)) node = UINT32_MAX;
  int yes = chance(&w->rng, 70) ? 1 + (int)below(&w->rng, 5) : 0;
  unsigned want;
  if (g->finalized)
    want = node < (uint32_t)g->nn ? S_STATE : S_STATE | S_ARG;
  else if (node >= (uint32_t)g->nn)
    want = S_ARG;
  else {
    mnode *n = &g->n[node];
    int reads_own = 0;
    for (int j = 0; j < n->nin; j++) reads_own |= n->in[j] == n->out;
    want = (!yes || !reads_own) ? S_OK : S_ARG;
  }
  CALL(w, gkrt_graph_set_node_recomputable(g->h, node, yes), want);
}

static void op_finalize(world *w) {
  w->op = "finalize";
  int gi = pick_live_graph(w);
  if (gi < 0 || chance(&w->rng, 5)) {
    CALL(w, gkrt_graph_finalize(chance(&w->rng, 50) ? NULL : (gkrt_graph *)bogus_handle(w)), S_ARG);
    return;
  }
  mgraph *g = &w->g[gi];
  if (g->finalized) {
    CALL(w, gkrt_graph_finalize(g->h), S_STATE);
    return;
  }
  int unwritten_output = 0;
  for (int t = 0; t < g->nt; t++)
    if (g->t[t].kind == GKRT_TENSOR_OUTPUT && !g->t[t].produced) unwritten_output = 1;
  if (g->nn == 0) {
    /* The header says it fails; api_graph accepts either status for an empty graph. */
    CALL(w, gkrt_graph_finalize(g->h), S_ARG | S_STATE);
    return;
  }
  if (unwritten_output) {
    CALL(w, gkrt_graph_finalize(g->h), S_ARG);
    return;
  }
  /* A finalize may refuse a graph no budget can run (OUT_OF_MEMORY) only under a limit. */
  gkrt_status st = CALL(w, gkrt_graph_finalize(g->h), w->rt[g->rt].tight ? S_OK | S_OOM : S_OK);
  g->finalized = st == GKRT_STATUS_OK;
}

static void op_get_info(world *w) {
  w->op = "get_info";
  int gi = pick_live_graph(w);
  gkrt_graph_info info;
  memset(&info, 0xAB, sizeof info);
  if (gi < 0 || chance(&w->rng, 10)) {
    CALL(w, gkrt_graph_get_info((gkrt_graph *)bogus_handle(w), &info), S_ARG);
    if (info.num_nodes != 0xABABABABABABABABull) FAIL(w, "get_info wrote *out on failure");
    return;
  }
  mgraph *g = &w->g[gi];
  if (chance(&w->rng, 10)) {
    CALL(w, gkrt_graph_get_info(g->h, NULL), S_ARG);
    return;
  }
  if (CALL(w, gkrt_graph_get_info(g->h, &info), S_OK) != GKRT_STATUS_OK) return;
  if (info.num_tensors != (uint64_t)g->nt || info.num_nodes != (uint64_t)g->nn || info.finalized != (uint32_t)g->finalized)
    FAIL(w, "get_info: %llu tensors, %llu nodes, finalized %u; the model has %d, %d, %d",
         (unsigned long long)info.num_tensors, (unsigned long long)info.num_nodes, info.finalized, g->nt, g->nn,
         g->finalized);
  if (g->finalized && info.peak_node >= (uint32_t)g->nn) FAIL(w, "get_info: peak_node %u of %d nodes", info.peak_node, g->nn);
}
