// The portable path: plain C++ on fp32, built for the baseline ISA. It is the fallback on CPUs
// without AVX2 and the definition the SIMD paths are tested against bit for bit.
#include "optim/adam_kernels.h"
#include "optim/adamw_element.h"
#include "optim/half_convert.h"

namespace strata::optim::detail {
namespace {

template <int kGrad>
float load_grad(const void* grad, size_t i) {
  if constexpr (kGrad == 0) return static_cast<const float*>(grad)[i];
  if constexpr (kGrad == 1) return bf16_to_float(static_cast<const uint16_t*>(grad)[i]);
  if constexpr (kGrad == 2) return fp16_to_float(static_cast<const uint16_t*>(grad)[i]);
}

// kTraffic: the TrafficKernel (adam_kernels.h), the same memory operations with none of the
// update's arithmetic.
template <int kGrad, int kOut, bool kL2, bool kTraffic = false>
void adamw(const AdamWConstants& c, float* param, float* m, float* v, const void* grad, void* out,
           size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float p = param[i];
    float mi = m[i];
    float vi = v[i];
    if constexpr (kTraffic) {
      const float x = load_grad<kGrad>(grad, i) * c.grad_scale;
      p += x;
      mi += x;
      vi += x;
    } else {
      adamw_element<kL2>(c, load_grad<kGrad>(grad, i), p, mi, vi);
    }
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kOut == 1) static_cast<uint16_t*>(out)[i] = float_to_bf16(p);
    if constexpr (kOut == 2) static_cast<uint16_t*>(out)[i] = float_to_fp16(p);
  }
}

template <int kGrad>
double sum_squares(const void* grad, size_t n) {
  // Four accumulators: shorter dependency chains, and partial sums of a quarter of the terms.
  double acc[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const double x = load_grad<kGrad>(grad, i + k);
      acc[k] += x * x;
    }
  }
  for (; i < n; ++i) {
    const double x = load_grad<kGrad>(grad, i);
    acc[0] += x * x;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

void triad(float* a, const float* b, const float* c, float scalar, size_t n, bool /*streaming*/) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
}

template <int kGrad, int kOut>
constexpr AdamWKernel pick(bool l2) {
  return l2 ? &adamw<kGrad, kOut, true> : &adamw<kGrad, kOut, false>;
}

template <int kGrad>
constexpr void fill_grad(KernelTable& t) {
  t.adamw[kGrad][0][0] = pick<kGrad, 0>(false);
  t.adamw[kGrad][0][1] = pick<kGrad, 0>(true);
  t.adamw[kGrad][1][0] = pick<kGrad, 1>(false);
  t.adamw[kGrad][1][1] = pick<kGrad, 1>(true);
  t.adamw[kGrad][2][0] = pick<kGrad, 2>(false);
  t.adamw[kGrad][2][1] = pick<kGrad, 2>(true);
  t.traffic[kGrad][0] = &adamw<kGrad, 0, false, true>;
  t.traffic[kGrad][1] = &adamw<kGrad, 1, false, true>;
  t.traffic[kGrad][2] = &adamw<kGrad, 2, false, true>;
  t.sum_squares[kGrad] = &sum_squares<kGrad>;
}

constexpr KernelTable make_table() {
  KernelTable t{};
  t.name = "scalar";
  fill_grad<0>(t);
  fill_grad<1>(t);
  fill_grad<2>(t);
  t.triad = &triad;
  return t;
}

constexpr KernelTable kTable = make_table();

}  // namespace

const KernelTable& scalar_kernels() {
  return kTable;
}

}  // namespace strata::optim::detail
