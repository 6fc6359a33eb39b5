/* A C11 program linked against the shared libstrata, as PyTorch loads it: the allocator entry
 * points are exported and, with no runtime alive, behave without crashing: NULL (or plain
 * cudaMalloc memory where a GPU is usable), and frees of NULL or foreign pointers are no-ops. */
#include <stdio.h>
#include <stdlib.h>
#include <strata/strata.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(void) {
  /* Exported with the exact types torch expects. */
  void* (*alloc_fn)(ssize_t, int, strata_cuda_stream) = strata_torch_alloc;
  void (*free_fn)(void*, ssize_t, int, strata_cuda_stream) = strata_torch_free;
  CHECK(alloc_fn != NULL && free_fn != NULL);

  void* p = strata_torch_alloc(1 << 20, 0, NULL);
  /* STRATA_TEST_EXPECT_GPU=1 on GPU machines: the fallback must then hand out CUDA memory. */
  const char* expect_gpu = getenv("STRATA_TEST_EXPECT_GPU");
  if (expect_gpu != NULL && expect_gpu[0] == '1') {
    CHECK(p != NULL);
  }
  if (p != NULL) strata_torch_free(p, 1 << 20, 0, NULL);

  CHECK(strata_torch_alloc(0, 0, NULL) == NULL);
  CHECK(strata_torch_alloc(-5, 0, NULL) == NULL);
  strata_torch_free(NULL, 0, 0, NULL);
  int not_ours = 0;
  strata_torch_free(&not_ours, sizeof not_ours, 0, NULL); /* warns, ignores */
  CHECK(not_ours == 0);

  strata_stats stats;
  stats.struct_size = sizeof stats;
  CHECK(stats.struct_size >= sizeof(strata_tier_stats) * 4);
  printf("torch allocator C ABI: ok (fallback %s)\n", p != NULL ? "cudaMalloc" : "NULL");
  return 0;
}
