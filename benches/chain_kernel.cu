// The small kernel of the launch-overhead benchmark: out[i] = a * in[i] + b over n floats.
// Parameter layout is gkrt's: input pointers, output pointers, then the parameter struct.
struct AxpbParams {
  float a;
  float b;
  unsigned n;
};

extern "C" __global__ void axpb(const float *in, float *out, AxpbParams p) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) out[i] = p.a * in[i] + p.b;
}
