/* A program built against the installed package: it creates a runtime on the host backend,
 * runs one node and checks its result. */
#include <gkrt.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  gkrt_config cfg;
  gkrt_runtime *rt;
  gkrt_graph *g;
  gkrt_kernel *relu;
  gkrt_tensor x, y;
  float in[4] = {-1.0f, 2.0f, -3.0f, 4.0f}, out[4];
  if (gkrt_config_init(&cfg) || (cfg.device = GKRT_DEVICE_HOST, gkrt_runtime_create(&cfg, &rt))) return 1;
  if (gkrt_graph_create(rt, &g) || gkrt_kernel_builtin(rt, GKRT_BUILTIN_RELU, &relu)) return 2;
  if (gkrt_graph_add_tensor(g, sizeof in, GKRT_TENSOR_INPUT, "x", &x) ||
      gkrt_graph_add_tensor(g, sizeof out, GKRT_TENSOR_OUTPUT, "y", &y))
    return 3;
  if (gkrt_graph_add_kernel(g, relu, &x, 1, &y, 1, NULL, 0, NULL, NULL) || gkrt_graph_finalize(g)) return 4;
  if (gkrt_graph_write_tensor(g, x, in, sizeof in) || gkrt_runtime_run(rt, g) ||
      gkrt_graph_read_tensor(g, y, out, sizeof out))
    return 5;
  if (gkrt_graph_release(g) || gkrt_kernel_release(relu) || gkrt_runtime_release(rt)) return 7;
  if (out[0] != 0.0f || out[1] != 2.0f || out[2] != 0.0f || out[3] != 4.0f) return 6;
  printf("consumer of gkrt %s: ok\n", gkrt_version());
  return 0;
}
