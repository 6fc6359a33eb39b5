#include "optim/adamw.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/align.h"

namespace strata::optim {
namespace {

bool is_gradient_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

bool is_param_out_dtype(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

std::string number(double x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", x);
  return buffer;
}

}  // namespace

Status validate(const AdamWParams& p) {
  if (!std::isfinite(p.lr) || p.lr < 0)
    return invalid_argument("Adam: lr must be >= 0, got " + number(p.lr));
  if (!std::isfinite(p.eps) || p.eps < 0)
    return invalid_argument("Adam: eps must be >= 0, got " + number(p.eps));
  if (!(p.beta1 >= 0 && p.beta1 < 1)) {
    return invalid_argument("Adam: beta1 must be in [0, 1), got " + number(p.beta1));
  }
  if (!(p.beta2 >= 0 && p.beta2 < 1)) {
    return invalid_argument("Adam: beta2 must be in [0, 1), got " + number(p.beta2));
  }
  if (!std::isfinite(p.weight_decay) || p.weight_decay < 0) {
    return invalid_argument("Adam: weight_decay must be >= 0, got " + number(p.weight_decay));
  }
  if (p.step < 1)
    return invalid_argument("Adam: step counts from 1, got " + std::to_string(p.step));
  if (!std::isfinite(p.grad_scale)) {
    return invalid_argument("Adam: grad_scale must be finite, got " + number(p.grad_scale));
  }
  return Status::ok();
}

Status validate(const AdamWSlice& s) {
  if (!is_gradient_dtype(s.grad_dtype)) {
    return invalid_argument(std::string("Adam: gradients must be fp32, bf16 or fp16, got ") +
                            to_string(s.grad_dtype));
  }
  if (s.param_out != nullptr && !is_param_out_dtype(s.param_out_dtype)) {
    return invalid_argument(std::string("Adam: param_out must be bf16 or fp16, got ") +
                            to_string(s.param_out_dtype));
  }
  if (s.n == 0) return Status::ok();
  if (s.param == nullptr || s.m == nullptr || s.v == nullptr || s.grad == nullptr) {
    return invalid_argument("Adam: a slice of " + std::to_string(s.n) +
                            " elements has a null param, m, v or grad pointer");
  }
  const size_t grad_size = dtype_size(s.grad_dtype);
  if (!is_aligned(s.param, 4) || !is_aligned(s.m, 4) || !is_aligned(s.v, 4) ||
      !is_aligned(s.grad, grad_size) ||
      (s.param_out != nullptr && !is_aligned(s.param_out, dtype_size(s.param_out_dtype)))) {
    return invalid_argument("Adam: a buffer is not aligned to its element size");
  }
  if (s.n > SIZE_MAX / 4) return invalid_argument("Adam: slice length overflows");
  const size_t bytes = s.n * 4;
  const void* streams[] = {s.param, s.m, s.v, s.grad, s.param_out};
  const size_t sizes[] = {bytes, bytes, bytes, s.n * grad_size,
                          s.param_out != nullptr ? s.n * dtype_size(s.param_out_dtype) : 0};
  for (int i = 0; i < 5; ++i) {
    for (int j = i + 1; j < 5; ++j) {
      if (sizes[i] != 0 && sizes[j] != 0 && overlaps(streams[i], sizes[i], streams[j], sizes[j])) {
        return invalid_argument("Adam: param, m, v, grad and param_out of a slice overlap");
      }
    }
  }
  return Status::ok();
}

Status validate(const GradSlice& s) {
  if (!is_gradient_dtype(s.dtype)) {
    return invalid_argument(
        std::string("gradient check: gradients must be fp32, bf16 or fp16, got ") +
        to_string(s.dtype));
  }
  if (s.n == 0) return Status::ok();
  if (s.data == nullptr) {
    return invalid_argument("gradient check: a slice of " + std::to_string(s.n) +
                            " elements has a null pointer");
  }
  if (!is_aligned(s.data, dtype_size(s.dtype))) {
    return invalid_argument("gradient check: a buffer is not aligned to its element size");
  }
  return Status::ok();
}

AdamWConstants derive_constants(const AdamWParams& p) {
  // As torch: bias corrections, step size and the decay factor in double, then fp32.
  const double bias1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
  const double bias2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  AdamWConstants c{};
  c.beta1 = static_cast<float>(p.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.eps = static_cast<float>(p.eps);
  c.decay = p.decoupled ? static_cast<float>(1.0 - p.lr * p.weight_decay) : 1.0f;
  c.l2 = p.decoupled ? 0.0f : static_cast<float>(p.weight_decay);
  c.step_size = static_cast<float>(p.lr / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  c.grad_scale = p.grad_scale;
  return c;
}

float unscale_and_clip(const GradStats& stats, double loss_scale, double max_norm) {
  const double unscale = loss_scale > 0 ? 1.0 / loss_scale : 1.0;
  if (max_norm <= 0 || !std::isfinite(stats.sum_squares)) return static_cast<float>(unscale);
  const double norm = std::sqrt(stats.sum_squares) * unscale;
  const double clip = max_norm / (norm + 1e-6);
  return static_cast<float>(clip < 1.0 ? unscale * clip : unscale);
}

}  // namespace strata::optim
