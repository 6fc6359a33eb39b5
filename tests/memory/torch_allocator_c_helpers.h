/* C functions (torch_allocator_c_helpers.c) that the C++ allocator test calls. */
#ifndef STRATA_TESTS_TORCH_ALLOCATOR_C_HELPERS_H
#define STRATA_TESTS_TORCH_ALLOCATOR_C_HELPERS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void* c_torch_alloc(long long size, int device);
void c_torch_free(void* ptr, long long size, int device);
int c_torch_round_trip(long long size, int device);
size_t c_stats_struct_size(void);

#ifdef __cplusplus
}
#endif

#endif
