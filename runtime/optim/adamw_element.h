// The update of one element, as every path computes it. The scalar kernel and the CUDA kernel
// call this directly; the AVX2 and AVX-512 kernels spell the same operations with intrinsics, in
// the same order. Each operation rounds once to fp32 (no fused multiply-add: the scalar kernel is
// built with -ffp-contract=off and CUDA uses the explicit _rn intrinsics), so all paths agree to
// the bit. The order follows torch's _single_tensor_adam(w):
//   Adam:  g = g + wd * p                       AdamW: p = p * (1 - lr * wd)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + ((1 - beta2) * g) * g
//   denom = sqrt(v) * (1 / sqrt(1 - beta2^t)) + eps   (torch divides by sqrt(bias2): <= 1 ulp)
//   p = p - step_size * (m / denom)
#pragma once

#include "optim/adamw.h"
#include "optim/half_convert.h"

namespace strata::optim::detail {

#if defined(__CUDA_ARCH__)
#define STRATA_FMUL(a, b) __fmul_rn((a), (b))
#define STRATA_FADD(a, b) __fadd_rn((a), (b))
#define STRATA_FSUB(a, b) __fsub_rn((a), (b))
#define STRATA_FDIV(a, b) __fdiv_rn((a), (b))
#define STRATA_FSQRT(a) __fsqrt_rn(a)
#else
#define STRATA_FMUL(a, b) ((a) * (b))
#define STRATA_FADD(a, b) ((a) + (b))
#define STRATA_FSUB(a, b) ((a) - (b))
#define STRATA_FDIV(a, b) ((a) / (b))
#define STRATA_FSQRT(a) __builtin_sqrtf(a)
#endif

// Updates p, m, v in place from the fp32 gradient g (not yet scaled by grad_scale).
template <bool kL2>
STRATA_HOST_DEVICE inline void adamw_element(const AdamWConstants& c, float g, float& p, float& m,
                                             float& v) {
  g = STRATA_FMUL(g, c.grad_scale);
  float param = p;
  if constexpr (kL2) {
    g = STRATA_FADD(g, STRATA_FMUL(c.l2, param));
  } else {
    param = STRATA_FMUL(param, c.decay);
  }
  const float m1 = STRATA_FADD(STRATA_FMUL(c.beta1, m), STRATA_FMUL(c.one_minus_beta1, g));
  const float v1 =
      STRATA_FADD(STRATA_FMUL(c.beta2, v), STRATA_FMUL(STRATA_FMUL(c.one_minus_beta2, g), g));
  const float denom = STRATA_FADD(STRATA_FMUL(STRATA_FSQRT(v1), c.inv_sqrt_bias2), c.eps);
  p = STRATA_FSUB(param, STRATA_FMUL(c.step_size, STRATA_FDIV(m1, denom)));
  m = m1;
  v = v1;
}

}  // namespace strata::optim::detail
