// nf4_cuda.h in a build without nvcc: every entry point says so.
#include "quant/nf4_cuda.h"

namespace strata::quant::cuda {
namespace {
Status not_built() {
  return unsupported(
      "NF4 CUDA dequantization: this build of Strata has no CUDA (nvcc was not found)");
}
}  // namespace

bool nf4_kernels_built() {
  return false;
}
Status nf4_dequantize(const Nf4Packed&, void*, uint64_t, DType, void*) {
  return not_built();
}
Status nf4_dequantize_range(const Nf4Packed&, uint64_t, uint64_t, void*, uint64_t, DType, void*) {
  return not_built();
}

}  // namespace strata::quant::cuda
