// The per-ISA NF4 dequantization kernels behind nf4_dequantize. Each ISA lives in its own
// translation unit compiled with its own -m flags (nf4_avx2.cpp, nf4_avx512.cpp), so one binary
// carries every path and picks one at run time. Those files must not define anything with vague
// linkage (inline functions, template instantiations from shared headers): the linker could keep
// their AVX-512 copy and hand it to the scalar path. Hence plain pointers here, and from nf4.h
// they use only constants (the block size, the codebook), never a function.
#pragma once

#include <cstdint>

#include "quant/nf4.h"

namespace strata::quant::detail {

// Index of an output dtype in the tables: fp32, bf16, fp16.
inline constexpr int kNf4OutKinds = 3;

// Decodes n >= 1 elements starting at a block boundary. `absmax` points at the first block's
// scale (4 little-endian bytes, any alignment), `codes` at the byte holding the first element;
// element i belongs to block i / 64. Every scale is finite, >= 0 and does not overflow the output
// dtype (nf4.cpp checks that first). dst needs no alignment.
using Nf4DequantizeKernel = void (*)(const unsigned char* absmax, const unsigned char* codes,
                                     uint64_t n, void* dst);

struct Nf4KernelTable {
  const char* name;
  Nf4DequantizeKernel dequantize[kNf4OutKinds];
};

// The definition: element by element, kNf4Codebook[code] * absmax, then half_convert.h.
const Nf4KernelTable& nf4_scalar_kernels();
#if defined(STRATA_OPTIM_X86)
const Nf4KernelTable& nf4_avx2_kernels();
const Nf4KernelTable& nf4_avx512_kernels();
#endif

}  // namespace strata::quant::detail
