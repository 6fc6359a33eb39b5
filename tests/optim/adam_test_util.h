// Shared by the optimizer tests: deterministic inputs, the float64 reference of one Adam/AdamW
// step, and the error measure the tests hold the kernels to.
//
// Error measure. A sum like m' = b1*m + (1-b1)*g can cancel, and then no fp32 implementation (not
// torch's either) gets m' to 1e-6 of its own tiny value. So each output is compared relative to
// the magnitude of the terms it is made of - the standard first-order forward-error bound:
//   S_g = |g*scale| + wd*|p| (Adam's L2 term)      S_m = b1*|m| + (1-b1)*S_g
//   S_v = b2*v + (1-b2)*S_g^2                      S_p = |p*decay| + step*(S_m/denom + |m'| *
//                                                        S_v/(2*sqrt(v')*sqrt(bias2)) / denom^2)
// and the test demands |ours - reference| <= 1e-6 * max(|reference|, S). Without cancellation S
// equals |reference| and this is plain relative error. Over several steps the same recursion runs
// on the magnitudes (|m| becomes S_m of the step before, and so on).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/half_convert.h"
#include "optim/simd_level.h"

namespace strata::optim {
// Lets GoogleTest print "avx512" instead of "1-byte object <02>".
inline void PrintTo(SimdLevel level, std::ostream* os) {
  *os << to_string(level);
}
}  // namespace strata::optim

namespace strata::optim::testing {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    const double unit = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return static_cast<float>(lo + (hi - lo) * unit);
  }

 private:
  uint64_t state_;
};

// Gradients held in one of the three dtypes, with their exact fp32 values at hand.
struct Gradients {
  DType dtype = DType::kFloat32;
  std::vector<float> f32;
  std::vector<uint16_t> h16;

  const void* data() const {
    return dtype == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                    : static_cast<const void*>(h16.data());
  }
  float value(size_t i) const {
    switch (dtype) {
      case DType::kFloat32:
        return f32[i];
      case DType::kBFloat16:
        return bf16_to_float(h16[i]);
      default:
        return fp16_to_float(h16[i]);
    }
  }
  void set(size_t i, float x) {
    switch (dtype) {
      case DType::kFloat32:
        f32[i] = x;
        break;
      case DType::kBFloat16:
        h16[i] = float_to_bf16(x);
        break;
      default:
        h16[i] = float_to_fp16(x);
        break;
    }
  }
  size_t size() const { return dtype == DType::kFloat32 ? f32.size() : h16.size(); }
};

inline Gradients make_gradients(size_t n, DType dtype, Rng& rng, float magnitude) {
  Gradients g;
  g.dtype = dtype;
  if (dtype == DType::kFloat32) {
    g.f32.resize(n);
  } else {
    g.h16.resize(n);
  }
  for (size_t i = 0; i < n; ++i) g.set(i, rng.uniform(-magnitude, magnitude));
  return g;
}

// Master weights and states as a training run has them: weights O(1), m of the order of the
// gradients, v of their squares (never far below what the gradients put in).
struct States {
  std::vector<float> p, m, v;
};

inline States make_states(size_t n, Rng& rng, float grad_magnitude) {
  States s;
  s.p.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = rng.uniform(-1.0f, 1.0f);
    s.m[i] = rng.uniform(-grad_magnitude, grad_magnitude) * 0.5f;
    const float rms = rng.uniform(0.0f, grad_magnitude);
    s.v[i] = rms * rms;
  }
  return s;
}

// The magnitudes an output is compared against (see the top of this file).
struct Magnitudes {
  double p, m, v;
};

struct Reference {
  double p, m, v;     // the float64 result
  double sp, sm, sv;  // its magnitudes
};

// One step on one element in float64, from fp32 inputs; `grad` is the stored (scaled) gradient.
// Over several steps, pass the previous step's magnitudes as `prior`: rounding differences made
// while m was large persist after m cancels, so the bound follows the recursion
// (S_m = b1*S_m' + (1-b1)*S_g, and so on). Without `prior` the inputs are taken as exact.
inline Reference reference_step(const AdamWParams& h, double grad, double p, double m, double v,
                                const Magnitudes* prior = nullptr) {
  const Magnitudes before = prior ? *prior : Magnitudes{std::fabs(p), std::fabs(m), v};
  const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  double g = grad * static_cast<double>(h.grad_scale);
  double sg = std::fabs(g);
  double pd = p;
  double decay = 1.0;
  if (h.decoupled) {
    decay = 1.0 - h.lr * h.weight_decay;
    pd = p * decay;
  } else {
    g += h.weight_decay * p;
    sg += h.weight_decay * before.p;
  }
  Reference r{};
  r.m = h.beta1 * m + (1.0 - h.beta1) * g;
  r.v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  r.sm = h.beta1 * before.m + (1.0 - h.beta1) * sg;
  r.sv = h.beta2 * before.v + (1.0 - h.beta2) * sg * sg;
  const double root = std::sqrt(r.v);
  const double denom = root / std::sqrt(bias2) + h.eps;
  const double step_size = h.lr / bias1;
  r.p = pd - step_size * r.m / denom;
  const double denom_error = root > 0 ? r.sv / (2.0 * root) / std::sqrt(bias2) : r.sv;
  r.sp = decay * before.p +
         step_size * (r.sm / denom + std::fabs(r.m) * denom_error / (denom * denom));
  return r;
}

// |got - want| / max(|want|, scale): see the top of this file.
inline double scaled_error(double got, double want, double scale) {
  const double denominator = std::max(std::fabs(want), scale);
  if (denominator == 0) return got == want ? 0.0 : INFINITY;
  return std::fabs(got - want) / denominator;
}

inline bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;  // payloads may differ between NaN inputs
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

inline std::string dtype_name(DType d) {
  return to_string(d);
}

}  // namespace strata::optim::testing
