/* The cheapest correct pluggable allocator for PyTorch on one stream: freed blocks are cached by
 * exact size and handed out again, memory comes from cudaMalloc, nothing is split or merged.
 * It is a control, not a contender: run side by side with PyTorch's own allocator, it measures
 * what PyTorch's pluggable-allocator path costs by itself, so that gkrt's entry points are judged
 * on their own share (benches/torch_workloads.py --against so:...). Not thread-safe beyond its
 * one lock; ignores streams (PyTorch's workloads here use one).
 *   gcc -O2 -shared -fPIC benches/exact_size_allocator.c -I$CUDA_HOME/include \
 *       -L$CUDA_HOME/lib64 -lcudart -o exact_size_allocator.so                               */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define SLOTS 65536 /* distinct sizes; a power of two */

struct slot {
  size_t size;        /* 0 = empty */
  void **free_ptrs;   /* cached blocks of this size */
  size_t count, cap;
};

static struct slot table[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static struct slot *find(size_t size) {
  size_t h = (size * 0x9E3779B97F4A7C15ull) >> 48;
  for (size_t i = 0; i < SLOTS; i++) {
    struct slot *s = &table[(h + i) & (SLOTS - 1)];
    if (s->size == size || s->size == 0) {
      s->size = size;
      return s;
    }
  }
  return NULL;
}

void *exact_alloc(size_t size, int device, cudaStream_t stream) {
  (void)device, (void)stream;
  if (size == 0) size = 1;
  pthread_mutex_lock(&lock);
  struct slot *s = find(size);
  void *p = NULL;
  if (s && s->count) p = s->free_ptrs[--s->count];
  pthread_mutex_unlock(&lock);
  if (!p && cudaMalloc(&p, size) != cudaSuccess) {
    /* Out of memory: give every cached block back and try once more. */
    pthread_mutex_lock(&lock);
    cudaDeviceSynchronize();
    for (size_t i = 0; i < SLOTS; i++)
      while (table[i].count) cudaFree(table[i].free_ptrs[--table[i].count]);
    pthread_mutex_unlock(&lock);
    if (cudaMalloc(&p, size) != cudaSuccess) p = NULL;
  }
  return p;
}

void exact_free(void *ptr, size_t size, int device, cudaStream_t stream) {
  (void)device, (void)stream;
  if (!ptr) return;
  if (size == 0) size = 1;
  pthread_mutex_lock(&lock);
  struct slot *s = find(size);
  if (s && s->count == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 8;
    void **grown = realloc(s->free_ptrs, cap * sizeof(void *));
    if (grown) s->free_ptrs = grown, s->cap = cap;
  }
  if (s && s->count < s->cap) {
    s->free_ptrs[s->count++] = ptr;
    ptr = NULL;
  }
  pthread_mutex_unlock(&lock);
  if (ptr) cudaFree(ptr); /* table full: give it back */
}
