// The portable NF4 decoder: the format contract (nf4.h) written out element by element, built for
// the baseline ISA. It is the fallback on CPUs without AVX2 and the definition the SIMD and CUDA
// paths are tested against bit for bit.
#include <cstring>

#include "optim/half_convert.h"
#include "quant/nf4_kernels.h"

namespace strata::quant::detail {
namespace {

template <int kOut>
void store(void* dst, uint64_t i, float value) {
  if constexpr (kOut == 0) {
    std::memcpy(static_cast<unsigned char*>(dst) + 4 * i, &value, 4);
  } else {
    const uint16_t h = kOut == 1 ? optim::float_to_bf16(value) : optim::float_to_fp16(value);
    std::memcpy(static_cast<unsigned char*>(dst) + 2 * i, &h, 2);
  }
}

template <int kOut>
void dequantize(const unsigned char* absmax, const unsigned char* codes, uint64_t n, void* dst) {
  for (uint64_t begin = 0; begin < n; begin += kNf4BlockElements) {
    float scale;
    std::memcpy(&scale, absmax + kNf4AbsmaxBytes * (begin / kNf4BlockElements), 4);
    const uint64_t end = n - begin < kNf4BlockElements ? n : begin + kNf4BlockElements;
    for (uint64_t i = begin; i < end; ++i) {
      const unsigned code = (codes[i / 2] >> (4 * (i & 1))) & 0xFu;
      store<kOut>(dst, i, kNf4Codebook[code] * scale);
    }
  }
}

constexpr Nf4KernelTable kTable = {"scalar", {&dequantize<0>, &dequantize<1>, &dequantize<2>}};

}  // namespace

const Nf4KernelTable& nf4_scalar_kernels() {
  return kTable;
}

}  // namespace strata::quant::detail
