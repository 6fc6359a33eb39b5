// The AVX2 path (AVX2 + FMA + F16C): 8 fp32 lanes. AVX2 has no 16-bit masked loads, so a tail is
// copied into zeroed vectors on the stack, run through the same instructions as the body and
// copied back. Built with its own -m flags (see CMakeLists.txt) and entered only after
// __builtin_cpu_supports says so. Nothing here has vague linkage: see adam_kernels.h.
#include <immintrin.h>

#include <cstring>

#include "optim/adam_kernels.h"

namespace strata::optim::detail {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

// Software prefetch 4 KiB ahead of the 32 elements in flight. The hardware streamers stop at page
// boundaries and track only so many streams; with p, m, v and g to read and p, m, v to write,
// asking one page ahead was faster in A/B runs on 50M parameters (2 threads, Emerald Rapids
// guest), 8 KiB ahead slower; see docs/optimizer.md.
// Prefetches never fault, so running past the end of a slice is harmless.
constexpr size_t kPrefetchAhead = 1024;

// Integer arithmetic: the address may lie past the end of the buffer, where a pointer may not.
STRATA_INLINE void prefetch(const void* base, size_t byte_offset) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the integer arithmetic above is the point.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + byte_offset),
               _MM_HINT_T0);
}

template <int kGrad>
STRATA_INLINE void prefetch_ahead(const float* param, const float* m, const float* v,
                                  const void* grad, size_t i) {
  const size_t at = (i + kPrefetchAhead) * 4;  // two cache lines of each fp32 stream
  prefetch(param, at);
  prefetch(param, at + 64);
  prefetch(m, at);
  prefetch(m, at + 64);
  prefetch(v, at);
  prefetch(v, at + 64);
  prefetch(grad, kGrad == 0 ? at : at / 2);
  if constexpr (kGrad == 0) prefetch(grad, at + 64);
}

struct Constants {
  __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, l2, step_size, inv_sqrt_bias2,
      grad_scale;
};

STRATA_INLINE Constants broadcast(const AdamWConstants& c) {
  return {_mm256_set1_ps(c.beta1),
          _mm256_set1_ps(c.one_minus_beta1),
          _mm256_set1_ps(c.beta2),
          _mm256_set1_ps(c.one_minus_beta2),
          _mm256_set1_ps(c.eps),
          _mm256_set1_ps(c.decay),
          _mm256_set1_ps(c.l2),
          _mm256_set1_ps(c.step_size),
          _mm256_set1_ps(c.inv_sqrt_bias2),
          _mm256_set1_ps(c.grad_scale)};
}

template <int kGrad>
STRATA_INLINE __m256 load_grad(const void* grad, size_t i) {
  if constexpr (kGrad == 0) return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  const auto* g16 = static_cast<const uint16_t*>(grad) + i;
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g16));
  if constexpr (kGrad == 1) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  if constexpr (kGrad == 2) return _mm256_cvtph_ps(h);
}

// Round to nearest even, NaN -> 0x7FC0: the integer form of half_convert.h's float_to_bf16.
STRATA_INLINE __m128i narrow_bf16(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
  __m256i h = _mm256_srli_epi32(rounded, 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  h = _mm256_blendv_epi8(h, _mm256_set1_epi32(0x7FC0), nan);
  // Every lane is <= 0xFFFF, so unsigned saturation packs exactly.
  return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

template <int kOut>
STRATA_INLINE __m128i narrow(__m256 p) {
  if constexpr (kOut == 1) return narrow_bf16(p);
  return _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// adamw_element.h's operations, in its order, one rounding each.
template <bool kL2>
STRATA_INLINE void update(const Constants& c, __m256 g, __m256& p, __m256& m, __m256& v) {
  g = _mm256_mul_ps(g, c.grad_scale);
  if constexpr (kL2) {
    g = _mm256_add_ps(g, _mm256_mul_ps(c.l2, p));
  } else {
    p = _mm256_mul_ps(p, c.decay);
  }
  m = _mm256_add_ps(_mm256_mul_ps(c.beta1, m), _mm256_mul_ps(c.one_minus_beta1, g));
  v = _mm256_add_ps(_mm256_mul_ps(c.beta2, v),
                    _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), c.inv_sqrt_bias2), c.eps);
  p = _mm256_sub_ps(p, _mm256_mul_ps(c.step_size, _mm256_div_ps(m, denom)));
}

// kStream: the weight copy goes out with non-temporal stores (out + i 16-byte aligned). The copy
// is written and never read in this pass, so an ordinary store would first read each of its
// lines from memory (a read for ownership) only to overwrite it: 2 of the 30 bytes per parameter
// wasted. Streaming p, m and v, which were just read into the cache, halved the rate in A/B runs
// instead (docs/optimizer.md), so they keep ordinary stores.
// kTraffic: the TrafficKernel (adam_kernels.h), the same memory operations with none of the
// update's arithmetic.
template <int kGrad, int kOut, bool kL2, bool kTraffic, bool kStream = false>
STRATA_INLINE void step8(const Constants& c, float* param, float* m, float* v, const void* grad,
                         void* out, size_t i) {
  __m256 p = _mm256_loadu_ps(param + i);
  __m256 mm = _mm256_loadu_ps(m + i);
  __m256 vv = _mm256_loadu_ps(v + i);
  if constexpr (kTraffic) {
    const __m256 x = _mm256_mul_ps(load_grad<kGrad>(grad, i), c.grad_scale);
    p = _mm256_add_ps(p, x);
    mm = _mm256_add_ps(mm, x);
    vv = _mm256_add_ps(vv, x);
  } else {
    update<kL2>(c, load_grad<kGrad>(grad, i), p, mm, vv);
  }
  _mm256_storeu_ps(param + i, p);
  _mm256_storeu_ps(m + i, mm);
  _mm256_storeu_ps(v + i, vv);
  if constexpr (kOut != 0) {
    auto* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i);
    if constexpr (kStream) {
      _mm_stream_si128(dst, narrow<kOut>(p));
    } else {
      _mm_storeu_si128(dst, narrow<kOut>(p));
    }
  }
}

// Fewer than 8 elements at i: copied into zeroed vectors, run through step8, copied back.
template <int kGrad, int kOut, bool kL2, bool kTraffic>
STRATA_INLINE void step_partial(const Constants& c, float* param, float* m, float* v,
                                const void* grad, void* out, size_t i, size_t count) {
  const size_t grad_bytes = kGrad == 0 ? 4 : 2;
  alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {};
  alignas(32) unsigned char tg[32] = {}, to[16] = {};
  std::memcpy(tp, param + i, count * 4);
  std::memcpy(tm, m + i, count * 4);
  std::memcpy(tv, v + i, count * 4);
  std::memcpy(tg, static_cast<const unsigned char*>(grad) + i * grad_bytes, count * grad_bytes);
  step8<kGrad, kOut, kL2, kTraffic>(c, tp, tm, tv, tg, to, 0);
  std::memcpy(param + i, tp, count * 4);
  std::memcpy(m + i, tm, count * 4);
  std::memcpy(v + i, tv, count * 4);
  if constexpr (kOut != 0) std::memcpy(static_cast<uint16_t*>(out) + i, to, count * 2);
}

template <int kGrad, int kOut, bool kL2, bool kTraffic = false>
void adamw(const AdamWConstants& constants, float* param, float* m, float* v, const void* grad,
           void* out, size_t n) {
  STRATA_OPTIM_PLACEMENT_PAD();
  const Constants c = broadcast(constants);
  size_t i = 0;
  // Streaming stores need out + i 16-byte aligned: a 2-byte aligned copy gets there after at
  // most 7 elements, which go through the partial path (the same instructions, the same bits).
  constexpr bool kStream = kOut != 0;
  if constexpr (kStream) {
    const size_t misaligned = reinterpret_cast<uintptr_t>(out) & 15;
    size_t head = ((16 - misaligned) & 15) / 2;
    if (head > n) head = n;  // not std::min: no vague linkage here (adam_kernels.h)
    if (head != 0) step_partial<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, 0, head);
    i = head;
  }
  // Four vectors per iteration; eight, and fused multiply-adds, were no faster here (docs).
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead<kGrad>(param, m, v, grad, i);
    step8<kGrad, kOut, kL2, kTraffic, kStream>(c, param, m, v, grad, out, i);
    step8<kGrad, kOut, kL2, kTraffic, kStream>(c, param, m, v, grad, out, i + 8);
    step8<kGrad, kOut, kL2, kTraffic, kStream>(c, param, m, v, grad, out, i + 16);
    step8<kGrad, kOut, kL2, kTraffic, kStream>(c, param, m, v, grad, out, i + 24);
  }
  for (; i + 8 <= n; i += 8)
    step8<kGrad, kOut, kL2, kTraffic, kStream>(c, param, m, v, grad, out, i);
  if (i < n) step_partial<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, i, n - i);
  // Streaming stores are weakly ordered: make them visible before the step reports done.
  if constexpr (kStream) _mm_sfence();
}

STRATA_INLINE void accumulate(__m256 x, __m256d& lo, __m256d& hi) {
  const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  lo = _mm256_fmadd_pd(a, a, lo);
  hi = _mm256_fmadd_pd(b, b, hi);
}

template <int kGrad>
double sum_squares(const void* grad, size_t n) {
  // fp32 squares are exact in double and cannot overflow it; NaN and infinity propagate.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    accumulate(load_grad<kGrad>(grad, i), acc0, acc1);
    accumulate(load_grad<kGrad>(grad, i + 8), acc2, acc3);
  }
  for (; i + 8 <= n; i += 8) accumulate(load_grad<kGrad>(grad, i), acc0, acc1);
  if (i < n) {
    const size_t grad_bytes = kGrad == 0 ? 4 : 2;
    alignas(32) unsigned char tg[32] = {};
    std::memcpy(tg, static_cast<const unsigned char*>(grad) + i * grad_bytes, (n - i) * grad_bytes);
    accumulate(load_grad<kGrad>(tg, 0), acc2, acc3);
  }
  const __m256d sum = _mm256_add_pd(_mm256_add_pd(acc0, acc1), _mm256_add_pd(acc2, acc3));
  const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(sum), _mm256_extractf128_pd(sum, 1));
  return _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
}

// The same look-ahead as the update's, so that the bound is measured with the best streaming
// this machine allows, not with a weaker kernel.
STRATA_INLINE void prefetch_triad(const float* b, const float* c, size_t i) {
  const size_t at = (i + kPrefetchAhead) * 4;
  prefetch(b, at);
  prefetch(c, at);
}

void triad(float* a, const float* b, const float* c, float scalar, size_t n, bool streaming) {
  const __m256 s = _mm256_set1_ps(scalar);
  size_t i = 0;
  if (streaming) {
    while (i < n && (reinterpret_cast<uintptr_t>(a + i) & 31) != 0) {
      a[i] = b[i] + scalar * c[i];
      ++i;
    }
    for (; i + 8 <= n; i += 8) {
      prefetch_triad(b, c, i);
      _mm256_stream_ps(
          a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(s, _mm256_loadu_ps(c + i))));
    }
    _mm_sfence();
  } else {
    for (; i + 8 <= n; i += 8) {
      prefetch_triad(b, c, i);
      _mm256_storeu_ps(
          a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(s, _mm256_loadu_ps(c + i))));
    }
  }
  for (; i < n; ++i) a[i] = b[i] + scalar * c[i];
}

template <int kGrad>
constexpr void fill_grad(KernelTable& t) {
  t.adamw[kGrad][0][0] = &adamw<kGrad, 0, false>;
  t.adamw[kGrad][0][1] = &adamw<kGrad, 0, true>;
  t.adamw[kGrad][1][0] = &adamw<kGrad, 1, false>;
  t.adamw[kGrad][1][1] = &adamw<kGrad, 1, true>;
  t.adamw[kGrad][2][0] = &adamw<kGrad, 2, false>;
  t.adamw[kGrad][2][1] = &adamw<kGrad, 2, true>;
  t.traffic[kGrad][0] = &adamw<kGrad, 0, false, true>;
  t.traffic[kGrad][1] = &adamw<kGrad, 1, false, true>;
  t.traffic[kGrad][2] = &adamw<kGrad, 2, false, true>;
  t.sum_squares[kGrad] = &sum_squares<kGrad>;
}

constexpr KernelTable make_table() {
  KernelTable t{};
  t.name = "avx2";
  fill_grad<0>(t);
  fill_grad<1>(t);
  fill_grad<2>(t);
  t.triad = &triad;
  return t;
}

constexpr KernelTable kTable = make_table();

}  // namespace

const KernelTable& avx2_kernels() {
  return kTable;
}

}  // namespace strata::optim::detail
