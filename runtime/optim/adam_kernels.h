// The per-ISA kernels behind CpuAdam. Each ISA lives in its own translation unit compiled with
// its own -m flags (adam_avx2.cpp, adam_avx512.cpp), so one binary carries every path and picks
// one at run time. Those files must not define anything with vague linkage (inline functions,
// template instantiations from shared headers): the linker could keep their AVX-512 copy and
// hand it to the scalar path. Hence plain pointers and PODs here, nothing inline.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/adamw_constants.h"

// Benchmark hygiene, never for a release (CMake STRATA_OPTIM_CODE_PAD, bench/adam_placement.sh):
// a jump over that many bytes at the top of a kernel's body moves its loop by as much. On an AMD
// family 26 guest the same AVX-512 kernel ran at half its rate or at full rate by where the
// linker happened to put it (docs/optimizer.md, "Code placement"), so a variant is timed at
// several placements before a change is kept. Nothing at all when 0, the default.
#if defined(STRATA_OPTIM_CODE_PAD) && STRATA_OPTIM_CODE_PAD > 0
#define STRATA_OPTIM_STRINGIFY_(x) #x
#define STRATA_OPTIM_STRINGIFY(x) STRATA_OPTIM_STRINGIFY_(x)
#define STRATA_OPTIM_PLACEMENT_PAD() \
  asm volatile("jmp 1f\n.skip " STRATA_OPTIM_STRINGIFY(STRATA_OPTIM_CODE_PAD) ", 0xcc\n1:")
#else
#define STRATA_OPTIM_PLACEMENT_PAD() static_cast<void>(0)
#endif

namespace strata::optim::detail {

// Index of a gradient dtype in the tables: fp32, bf16, fp16.
inline constexpr int kGradKinds = 3;
// Index of a param_out kind: none, bf16, fp16.
inline constexpr int kOutKinds = 3;

// Updates n elements; the pointers are already offset to the first one. `out` may be null only
// when the table entry is the "none" one.
using AdamWKernel = void (*)(const AdamWConstants& c, float* param, float* m, float* v,
                             const void* grad, void* out, size_t n);
// The same loads, stores, prefetches and loop as the AdamWKernel of the same [grad][out] entry,
// with the update's arithmetic replaced by p, m, v += c.grad_scale * g (the copy is still p
// narrowed): what the memory system allows the update, measured with its own access pattern.
using TrafficKernel = AdamWKernel;
// Sum of squares of n gradient elements in double; NaN or infinity propagates.
using SumSquaresKernel = double (*)(const void* grad, size_t n);
// a = b + scalar * c, the STREAM triad; non-temporal stores when `streaming`.
using TriadKernel = void (*)(float* a, const float* b, const float* c, float scalar, size_t n,
                             bool streaming);

struct KernelTable {
  const char* name;
  AdamWKernel adamw[kGradKinds][kOutKinds][2];  // [grad][out][l2 term present]
  TrafficKernel traffic[kGradKinds][kOutKinds];
  // The same traffic with every read stream also prefetched ahead in software, where the update
  // does not prefetch (AVX-512): the hardware prefetchers alone may not be the best this memory
  // system does with the pattern, and a bound must be. Null where the update's own loop already
  // prefetches (AVX2) or is not limited by memory (scalar).
  TrafficKernel traffic_prefetched[kGradKinds][kOutKinds];
  SumSquaresKernel sum_squares[kGradKinds];
  TriadKernel triad;
};

const KernelTable& scalar_kernels();
#if defined(STRATA_OPTIM_X86)
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
#endif

}  // namespace strata::optim::detail
