/* The PyTorch allocator entry points called from C11, as torch's CUDAPluggableAllocator calls
 * them (by symbol, with C linkage). The C++ test installs or removes a runtime's device around
 * these calls. */
#include "torch_allocator_c_helpers.h"

#include <stddef.h>
#include <strata/strata.h>
#include <string.h>

void* c_torch_alloc(long long size, int device) {
  return strata_torch_alloc((ssize_t)size, device, (strata_cuda_stream)0);
}

void c_torch_free(void* ptr, long long size, int device) {
  strata_torch_free(ptr, (ssize_t)size, device, (strata_cuda_stream)0);
}

/* Allocates, writes every byte, frees: 0 on success. */
int c_torch_round_trip(long long size, int device) {
  unsigned char* p = (unsigned char*)strata_torch_alloc((ssize_t)size, device, NULL);
  if (p == NULL) return 1;
  memset(p, 0xab, (size_t)size);
  if (p[size - 1] != 0xab) return 2;
  strata_torch_free(p, (ssize_t)size, device, NULL);
  return 0;
}

/* The stats struct is plain C: its first member is the size. */
size_t c_stats_struct_size(void) {
  strata_stats stats;
  stats.struct_size = sizeof stats;
  return stats.struct_size;
}
