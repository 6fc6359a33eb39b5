// The per-step fp32 scalars every kernel consumes. Kept apart from adamw.h, free of includes and
// inline code, because the ISA-specific kernel files include it (see adam_kernels.h).
#pragma once

namespace strata::optim {

// The fp32 scalars of one step, derived once on the host in double as torch does. Every path
// applies them in the same order with the same roundings (no fused multiply-add), which is why
// scalar, AVX2, AVX-512 and CUDA results are bit-identical.
struct AdamWConstants {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float decay;           // AdamW: 1 - lr * wd; Adam: 1
  float l2;              // Adam: wd; AdamW: 0 (the kernels skip the term when it is 0)
  float step_size;       // lr / (1 - beta1^step)
  float inv_sqrt_bias2;  // 1 / sqrt(1 - beta2^step)
  float grad_scale;
};

}  // namespace strata::optim
