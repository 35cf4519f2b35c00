// A manual check of the GPT-2 example's CUDA kernels without a GPU (run by cuda_on_cpu.sh, not by
// CI: it takes minutes). The NVRTC source (gpt2_cuda_source), compiled here as C++, runs on the CPU
// with one OS thread per CUDA thread (barriers for __syncthreads and warp shuffles), each kernel
// as a host callback of the host backend with the grid and block gpt2_launch_dims gives it; matrix
// products stay the CPU ones. Losses, gradients and five training steps are compared with the
// CPU kernels (ops_host.c) on tiny models whose sizes are not multiples of the warp or block.
// Built once per element type (-DGPT2_ACT_BF16=0 or 1, as NVRTC gets it).
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
extern "C" {
#include "model.h"
}
struct dim3_ { unsigned x = 0, y = 0, z = 0; };
thread_local dim3_ threadIdx;
static dim3_ blockIdx, blockDim, gridDim;
static std::barrier<> *g_block;
static std::barrier<> *g_warp[64];
static float g_slots[64][32];
static void __syncthreads() { g_block->arrive_and_wait(); }
static float __shfl_xor_sync(unsigned, float v, int o) {
  unsigned t = threadIdx.x + threadIdx.y * blockDim.x, w = t / 32, lane = t % 32;
  g_slots[w][lane] = v;
  g_warp[w]->arrive_and_wait();
  float r = g_slots[w][lane ^ (unsigned)o];
  g_warp[w]->arrive_and_wait();
  return r;
}
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
#define __forceinline__ inline
static float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define __global__
#define __device__ static
#define __shared__ static
namespace cu {
#include GPT2_KERNELS_FILE
}
using namespace cu;

static void launch(const gkrt_launch &l, const std::function<void()> &body) {
  blockDim = {l.block[0], l.block[1], l.block[2]};
  gridDim = {l.grid[0], l.grid[1], l.grid[2]};
  unsigned nt = l.block[0] * l.block[1] * l.block[2];
  for (unsigned by = 0; by < l.grid[1]; by++)
    for (unsigned bx = 0; bx < l.grid[0]; bx++) {
      blockIdx = {bx, by, 0};
      std::barrier<> bar(nt);
      g_block = &bar;
      std::vector<std::unique_ptr<std::barrier<>>> warps;
      for (unsigned w = 0; w * 32 < nt; w++) {
        warps.emplace_back(new std::barrier<>(std::min(32u, nt - w * 32)));
        g_warp[w] = warps.back().get();
      }
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < nt; t++)
        ts.emplace_back([&, t] {
          threadIdx = {t % l.block[0], t / l.block[0], 0};
          body();
        });
      for (auto &th : ts) th.join();
    }
}

// A tensor's pointer, converted to whatever pointer type the kernel's parameter is (act_t or float).
struct anyp {
  void *p;
  template <class T> operator T *() const { return (T *)p; }
};
#define F(i) (anyp{a->inputs[i].ptr})
#define I(i) ((int *)a->inputs[i].ptr)
#define O(i) (anyp{a->outputs[i].ptr})
template <class T> static T par(const gkrt_callback_args *a) { T p; memcpy(&p, a->params, sizeof p); return p; }

static int32_t emu_op(const gkrt_callback_args *a, void *user) {
  gpt2_op op = (gpt2_op)(intptr_t)user;
  gkrt_launch l;
  gpt2_launch_dims(op, a->params, &l);
  switch (op) {
    case OP_EMBED: { auto p = par<cu::p_dims>(a); launch(l, [&] { g_embed(I(0), F(1), F(2), O(0), p); }); break; }
    case OP_LN_STATS: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_ln_stats(F(0), O(0), p); }); break; }
    case OP_LN_APPLY: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_ln_apply(F(0), F(1), F(2), O(0), p); }); break; }
    case OP_SPLIT_HEADS: { auto p = par<cu::p_perm>(a); launch(l, [&] { g_split_heads(F(0), O(0), p); }); break; }
    case OP_MERGE_HEADS: { auto p = par<cu::p_perm>(a); launch(l, [&] { g_merge_heads(F(0), O(0), p); }); break; }
    case OP_SOFTMAX: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_softmax(F(0), O(0), p); }); break; }
    case OP_SOFTMAX_BWD: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_softmax_bwd(F(0), F(1), O(0), p); }); break; }
    case OP_ADD: { auto p = par<cu::p_n>(a); launch(l, [&] { g_add(F(0), F(1), O(0), p); }); break; }
    case OP_GELU: { auto p = par<cu::p_n>(a); launch(l, [&] { g_gelu(F(0), O(0), p); }); break; }
    case OP_GELU_BWD: { auto p = par<cu::p_n>(a); launch(l, [&] { g_gelu_bwd(F(0), F(1), O(0), p); }); break; }
    case OP_CE_ROWS: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_ce_rows(F(0), I(1), O(0), p); }); break; }
    case OP_MEAN: { auto p = par<cu::p_n>(a); launch(l, [&] { g_mean(F(0), O(0), p); }); break; }
    case OP_CE_BWD: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_ce_bwd(F(0), I(1), O(0), p); }); break; }
    case OP_LN_BWD_DX: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_ln_bwd_dx(F(0), F(1), F(2), F(3), O(0), p); }); break; }
    case OP_LN_BWD_DX_RES: { auto p = par<cu::p_rows>(a); launch(l, [&] { g_ln_bwd_dx_res(F(0), F(1), F(2), F(3), F(4), O(0), p); }); break; }
    case OP_LN_BWD_WB: { auto p = par<cu::p_chunks>(a); launch(l, [&] { g_ln_bwd_wb(F(0), F(1), F(2), O(0), p); }); break; }
    case OP_EMBED_BWD_WTE: { auto p = par<cu::p_dims>(a); launch(l, [&] { g_embed_bwd_wte(F(0), I(1), I(2), I(3), F(4), O(0), p); }); break; }
    case OP_EMBED_BWD_WPE: { auto p = par<cu::p_dims>(a); launch(l, [&] { g_embed_bwd_wpe(F(0), O(0), p); }); break; }
    case OP_ADAMW: {
      auto p = par<cu::p_adam>(a);
      if (GPT2_ACT_BF16) launch(l, [&] { g_adamw_copy(F(0), F(1), F(2), F(3), F(4), O(0), O(1), O(2), O(3), p); });
      else launch(l, [&] { g_adamw(F(0), F(1), F(2), F(3), F(4), O(0), O(1), O(2), p); });
      break;
    }
    case OP_SUM_CHUNKS: { auto p = par<cu::p_chunks>(a); launch(l, [&] { g_sum_chunks(F(0), O(0), p); }); break; }
    default: return 1;
  }
  return 0;
}

static void check(gkrt_status st) { if (st) { char m[512]; gkrt_last_error_message(m, 512); fprintf(stderr, "%s\n", m); exit(1); } }

static std::vector<float> run(int emulate, const gpt2_config &cfg, float std_, std::vector<float> &grads, int steps) {
  gkrt_config c; check(gkrt_config_init(&c)); c.device = GKRT_DEVICE_HOST;
  gkrt_runtime *rt; check(gkrt_runtime_create(&c, &rt));
  const gpt2_dtype dt = GPT2_ACT_BF16 ? GPT2_BF16 : GPT2_F32;
  gpt2_kernels ks; if (gpt2_kernels_host(rt, dt, &ks)) exit(1);
  if (emulate)
    for (int op = 0; op < OP_COUNT; op++) {
      if (op == OP_GEMM) continue;
      check(gkrt_kernel_release(ks.k[op]));
      check(gkrt_kernel_from_callback(rt, emu_op, (void *)(intptr_t)op, &ks.k[op]));
    }
  gpt2_options o; gpt2_default_options(&o); o.lr = 1e-2f; o.weight_decay = 0.01f; o.dtype = dt;
  o.grads_as_outputs = steps == 0;
  auto *m = (gpt2_model *)calloc(1, sizeof(gpt2_model));
  if (gpt2_build(rt, &ks, &cfg, &o, m)) exit(1);
  std::vector<float> w(m->num_weights); std::vector<int32_t> tok(cfg.batch * cfg.seq), tg(cfg.batch * cfg.seq);
  gpt2_init_weights(m, 11, std_, w.data()); gpt2_make_batch(&cfg, 11, tok.data(), tg.data());
  if (gpt2_upload(m, w.data(), tok.data(), tg.data())) exit(1);
  std::vector<float> losses;
  for (int s = 1; s <= (steps ? steps : 1); s++) { float loss; if (gpt2_step(rt, m, s, &loss)) exit(1); losses.push_back(loss); }
  if (!steps) { grads.resize(m->num_weights); if (gpt2_read_grads(m, grads.data())) exit(1); }
  else { grads.resize(m->num_weights); if (gpt2_download(m, grads.data())) exit(1); }
  check(gkrt_graph_release(m->graph)); gpt2_kernels_release(&ks); check(gkrt_runtime_release(rt)); free(m);
  return losses;
}

int main() {
  const gpt2_config cfgs[] = {{2, 16, 2, 8, 2, 32}, {1, 40, 5, 37, 3, 300}};
  int bad = 0;
  for (auto &cfg : cfgs) {
    std::vector<float> g_ref, g_emu, w_ref, w_emu;
    auto l_ref = run(0, cfg, 0.3f, g_ref, 0), l_emu = run(1, cfg, 0.3f, g_emu, 0);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < g_ref.size(); i++) scale = std::max(scale, (double)fabsf(g_ref[i]));
    for (size_t i = 0; i < g_ref.size(); i++) worst = std::max(worst, fabs((double)g_ref[i] - g_emu[i]) / scale);
    printf("C=%u T=%u V=%u: loss ref %.7f emu %.7f; grads max diff / max |g| = %.2e\n", cfg.channels, cfg.seq, cfg.vocab, l_ref[0], l_emu[0], worst);
    /* bf16: sums in another order can round a stored element one bf16 step (2^-8) the other way. */
    const double tol_loss = GPT2_ACT_BF16 ? 2e-3 : 1e-5, tol_grad = GPT2_ACT_BF16 ? 3e-2 : 1e-4;
    bad += fabs(l_ref[0] - l_emu[0]) > tol_loss * fabs(l_ref[0]) || worst > tol_grad;
    auto t_ref = run(0, cfg, 0.02f, w_ref, 5), t_emu = run(1, cfg, 0.02f, w_emu, 5);
    double wd = 0;
    for (size_t i = 0; i < w_ref.size(); i++) wd = std::max(wd, fabs((double)w_ref[i] - w_emu[i]));
    /* Adam moves a weight by about lr whatever its gradient's size, so weights whose gradients
     * are rounding noise may differ by up to lr; the losses must agree. */
    printf("  5 steps: losses ref %.6f..%.6f emu %.6f..%.6f; weights max diff %.2e\n", t_ref[0], t_ref[4], t_emu[0], t_emu[4], wd);
    bad += fabs(t_ref[4] - t_emu[4]) > tol_loss * fabs(t_ref[4]) + 1e-6 || wd > 1e-2;
  }
  printf(bad ? "EMULATION MISMATCH (%s)\n" : "emulated CUDA kernels agree with the CPU reference (%s)\n",
         GPT2_ACT_BF16 ? "bf16" : "f32");
  return bad != 0;
}
