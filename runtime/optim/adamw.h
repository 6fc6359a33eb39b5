// The vocabulary of the optimizer: hyperparameters of one Adam/AdamW step, the buffers one step
// updates, and gradient statistics. Shared by the CPU path (cpu_adam.h) and the CUDA path
// (adamw_cuda.h); the scheduler hands slices of sub-groups to either.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "optim/adamw_constants.h"
#include "vocabulary/tensor_spec.h"

namespace strata::optim {

// One optimizer step, in torch.optim.Adam / torch.optim.AdamW terms. Hyperparameters are doubles
// because torch keeps them as Python floats and derives the per-step scalars in double before
// rounding them to fp32; doing the same keeps Strata within an ulp of torch.
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // true: AdamW, decoupled decay (p *= 1 - lr * wd). false: classic Adam, L2 decay (g += wd * p).
  bool decoupled = true;
  // The step being taken, counting from 1 (torch's state['step'] after its increment).
  int64_t step = 1;
  // Multiplies every gradient element before use: 1/loss_scale times the clipping coefficient,
  // so unscaling and clipping cost nothing beyond the update's own pass. See unscale_and_clip().
  float grad_scale = 1.0f;
};

// One contiguous run of n parameters and their states. Sub-group slices of a larger tensor are
// plain pointer offsets: every element is updated independently.
struct AdamWSlice {
  float* param = nullptr;  // fp32 master weights, updated in place
  float* m = nullptr;      // first moment (exp_avg), fp32, updated in place
  float* v = nullptr;      // second moment (exp_avg_sq), fp32, updated in place
  const void* grad = nullptr;
  DType grad_dtype = DType::kFloat32;  // kFloat32, kBFloat16 or kFloat16
  // Optional low-precision copy of the updated weights for the device, written in the same pass
  // (round to nearest even). nullptr: none.
  void* param_out = nullptr;
  DType param_out_dtype = DType::kBFloat16;  // kBFloat16 or kFloat16
  size_t n = 0;
};

// Gradients to check and measure before a step.
struct GradSlice {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;  // kFloat32, kBFloat16 or kFloat16
  size_t n = 0;
};

struct GradStats {
  // A NaN or infinity somewhere (the step must be skipped and the loss scale lowered).
  bool found_nonfinite = false;
  // Sum of squares of every element, accumulated in double. Not finite iff found_nonfinite.
  double sum_squares = 0.0;
};

// Checks hyperparameters the way torch's constructor does (lr, eps, weight_decay >= 0;
// 0 <= beta < 1) plus step >= 1 and finite values.
Status validate(const AdamWParams& params);
// Checks pointers (non-null when n > 0, natural alignment), dtypes and that the streams of one
// slice do not overlap. Never touches the data.
Status validate(const AdamWSlice& slice);
Status validate(const GradSlice& slice);

AdamWConstants derive_constants(const AdamWParams& params);

// The combined gradient multiplier for a step from the statistics of the (loss-scaled) gradients:
// 1/loss_scale, times torch.nn.utils.clip_grad_norm_'s coefficient
// min(1, max_norm / (norm + 1e-6)) where norm is the unscaled gradient norm. max_norm <= 0
// disables clipping. Pass it as AdamWParams::grad_scale.
float unscale_and_clip(const GradStats& scaled_grad_stats, double loss_scale, double max_norm);

}  // namespace strata::optim
