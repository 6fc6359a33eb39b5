// The AVX-512 path (AVX512F + BW + VL): 16 fp32 lanes, masked loads and stores for tails so a
// tail element goes through exactly the instructions a body element does. Built with its own -m
// flags (see CMakeLists.txt) and entered only after __builtin_cpu_supports says so. Everything is
// in an anonymous namespace and nothing comes from shared inline code: see adam_kernels.h.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass deliberately undefined vectors (_mm512_undefined_*) as merge
// sources, which -Wmaybe-uninitialized misreports once inlined here (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "optim/adam_kernels.h"

namespace strata::optim::detail {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

// No software prefetch: the hardware prefetchers stream the seven arrays (p, m, v and g read, p,
// m, v written). Measured at several code placements (bench/adam_placement.sh, docs/optimizer.md
// "Code placement"): on an AMD family 26 (Zen 5 class) guest, with prefetches 256 bytes or 1 KiB
// ahead the same loop ran at full rate or at 0.6 of it depending only on where the linker put it
// (two threads, 50M parameters, fp32 gradients), and the placements that are slow move by as
// little as 16 bytes, so no alignment chosen here would stay good; without prefetches the loop kept
// its rate at every placement, 0.90-0.93 of 1 KiB's rate at 1 KiB's good placements at two
// threads, level at one. Earlier distances were chosen at one placement each (4 KiB on an
// Emerald Rapids guest, then 1 KiB, then 256 bytes on AMD guests), so what they measured included
// where the loop happened to sit.

// The bound's second traffic pass (adam_kernels.h, traffic_prefetched) reads each stream this
// many bytes ahead in software. On the Zen 5 class guest it moved the step's bytes 9-14% faster
// than the loop without, at every code placement tried; the update prefetched the same way gained
// 4-6% at most placements and lost 37-41% at two (as above), so the update keeps none and the
// bound takes the faster pass (docs/optimizer.md, "The bound, measured again").
constexpr size_t kTrafficPrefetchBytes = 1024;

// Integer arithmetic: the address may lie past the end of the buffer, where a pointer may not.
STRATA_INLINE void prefetch(const void* base, size_t byte_offset) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the integer arithmetic above is the point.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + byte_offset),
               _MM_HINT_T0);
}

// The lines that 32 elements further on will read, kTrafficPrefetchBytes ahead of element i:
// two of each fp32 stream, one of a 16-bit gradient.
template <int kGrad>
STRATA_INLINE void prefetch_ahead(const float* param, const float* m, const float* v,
                                  const void* grad, size_t i) {
  const size_t at = i * 4 + kTrafficPrefetchBytes;
  prefetch(param, at);
  prefetch(param, at + 64);
  prefetch(m, at);
  prefetch(m, at + 64);
  prefetch(v, at);
  prefetch(v, at + 64);
  if constexpr (kGrad == 0) {
    prefetch(grad, at);
    prefetch(grad, at + 64);
  } else {
    prefetch(grad, i * 2 + kTrafficPrefetchBytes);
  }
}

struct Constants {
  __m512 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, l2, step_size, inv_sqrt_bias2,
      grad_scale;
};

STRATA_INLINE Constants broadcast(const AdamWConstants& c) {
  return {_mm512_set1_ps(c.beta1),
          _mm512_set1_ps(c.one_minus_beta1),
          _mm512_set1_ps(c.beta2),
          _mm512_set1_ps(c.one_minus_beta2),
          _mm512_set1_ps(c.eps),
          _mm512_set1_ps(c.decay),
          _mm512_set1_ps(c.l2),
          _mm512_set1_ps(c.step_size),
          _mm512_set1_ps(c.inv_sqrt_bias2),
          _mm512_set1_ps(c.grad_scale)};
}

STRATA_INLINE __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int kGrad>
STRATA_INLINE __m512 load_grad(const void* grad, size_t i) {
  if constexpr (kGrad == 0) return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  const auto* g16 = static_cast<const uint16_t*>(grad) + i;
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g16));
  if constexpr (kGrad == 1) return widen_bf16(h);
  if constexpr (kGrad == 2) return _mm512_cvtph_ps(h);
}

template <int kGrad>
STRATA_INLINE __m512 load_grad_masked(const void* grad, size_t i, __mmask16 k) {
  if constexpr (kGrad == 0) return _mm512_maskz_loadu_ps(k, static_cast<const float*>(grad) + i);
  const auto* g16 = static_cast<const uint16_t*>(grad) + i;
  const __m256i h = _mm256_maskz_loadu_epi16(k, g16);
  if constexpr (kGrad == 1) return widen_bf16(h);
  if constexpr (kGrad == 2) return _mm512_cvtph_ps(h);
}

// Round to nearest even, NaN -> 0x7FC0: the integer form of half_convert.h's float_to_bf16.
STRATA_INLINE __m256i narrow_bf16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  __m512i h = _mm512_srli_epi32(rounded, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  h = _mm512_mask_mov_epi32(h, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(h);
}

template <int kOut>
STRATA_INLINE __m256i narrow(__m512 p) {
  if constexpr (kOut == 1) return narrow_bf16(p);
  return _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// adamw_element.h's operations, in its order, one rounding each.
template <bool kL2>
STRATA_INLINE void update(const Constants& c, __m512 g, __m512& p, __m512& m, __m512& v) {
  g = _mm512_mul_ps(g, c.grad_scale);
  if constexpr (kL2) {
    g = _mm512_add_ps(g, _mm512_mul_ps(c.l2, p));
  } else {
    p = _mm512_mul_ps(p, c.decay);
  }
  m = _mm512_add_ps(_mm512_mul_ps(c.beta1, m), _mm512_mul_ps(c.one_minus_beta1, g));
  v = _mm512_add_ps(_mm512_mul_ps(c.beta2, v),
                    _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), c.inv_sqrt_bias2), c.eps);
  p = _mm512_sub_ps(p, _mm512_mul_ps(c.step_size, _mm512_div_ps(m, denom)));
}

// kTraffic: the TrafficKernel (adam_kernels.h), the same memory operations with none of the
// update's arithmetic.
template <bool kL2, bool kTraffic>
STRATA_INLINE void apply(const Constants& c, __m512 g, __m512& p, __m512& m, __m512& v) {
  if constexpr (kTraffic) {
    const __m512 x = _mm512_mul_ps(g, c.grad_scale);
    p = _mm512_add_ps(p, x);
    m = _mm512_add_ps(m, x);
    v = _mm512_add_ps(v, x);
  } else {
    update<kL2>(c, g, p, m, v);
  }
}

template <int kGrad, bool kL2, bool kTraffic>
STRATA_INLINE __m512 step16_states(const Constants& c, float* param, float* m, float* v,
                                   const void* grad, size_t i) {
  __m512 p = _mm512_loadu_ps(param + i);
  __m512 mm = _mm512_loadu_ps(m + i);
  __m512 vv = _mm512_loadu_ps(v + i);
  apply<kL2, kTraffic>(c, load_grad<kGrad>(grad, i), p, mm, vv);
  _mm512_storeu_ps(param + i, p);
  _mm512_storeu_ps(m + i, mm);
  _mm512_storeu_ps(v + i, vv);
  return p;
}

template <int kGrad, int kOut, bool kL2, bool kTraffic>
STRATA_INLINE void step16(const Constants& c, float* param, float* m, float* v, const void* grad,
                          void* out, size_t i) {
  const __m512 p = step16_states<kGrad, kL2, kTraffic>(c, param, m, v, grad, i);
  if constexpr (kOut != 0) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i),
                        narrow<kOut>(p));
  }
}

template <int kGrad, int kOut, bool kL2, bool kTraffic>
STRATA_INLINE void step_masked(const Constants& c, float* param, float* m, float* v,
                               const void* grad, void* out, size_t i, size_t count) {
  const __mmask16 k = static_cast<__mmask16>((1u << count) - 1u);
  __m512 p = _mm512_maskz_loadu_ps(k, param + i);
  __m512 mm = _mm512_maskz_loadu_ps(k, m + i);
  __m512 vv = _mm512_maskz_loadu_ps(k, v + i);
  apply<kL2, kTraffic>(c, load_grad_masked<kGrad>(grad, i, k), p, mm, vv);
  _mm512_mask_storeu_ps(param + i, k, p);
  _mm512_mask_storeu_ps(m + i, k, mm);
  _mm512_mask_storeu_ps(v + i, k, vv);
  if constexpr (kOut != 0) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, k, narrow<kOut>(p));
  }
}

// The weight copy with its lines written whole by non-temporal stores: 32 elements per iteration
// are exactly one 64-byte line of bf16 or fp16, once out + i is 64-byte aligned. The copy is
// written and never read in this pass, so an ordinary store first reads each of its lines for
// ownership: 2 of the 30 bytes per parameter that move, and with them Strata moved more than
// DeepSpeed's fp32 step (28). One full-line store per iteration leaves no partly filled
// write-combining buffer behind; p, m and v, just read into the cache, keep ordinary stores.
// Measured in A/B runs against the two 32-byte ordinary stores (docs/optimizer.md). Returns the
// index the ordinary loop goes on from; the caller's fence orders the stores.
template <int kGrad, int kOut, bool kL2, bool kTraffic, bool kPrefetch>
STRATA_INLINE size_t adamw_streaming_copy(const Constants& c, float* param, float* m, float* v,
                                          const void* grad, void* out, size_t n) {
  auto* out16 = static_cast<uint16_t*>(out);
  const uintptr_t address = reinterpret_cast<uintptr_t>(out);
  if ((address & 1) != 0) return 0;  // not even 2-byte aligned: no line is ever whole
  // At most 31 elements, through the masked path, up to the first whole line. (No std::min: no
  // standard-library template may be instantiated in this file, see the top.)
  const size_t to_line = static_cast<size_t>(((64 - (address & 63)) & 63) / 2);
  const size_t head = to_line < n ? to_line : n;
  size_t i = 0;
  while (i < head) {
    const size_t count = head - i < 16 ? head - i : 16;
    step_masked<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, i, count);
    i += count;
  }
  for (; i + 32 <= n; i += 32) {
    if constexpr (kPrefetch) prefetch_ahead<kGrad>(param, m, v, grad, i);
    const __m512 p0 = step16_states<kGrad, kL2, kTraffic>(c, param, m, v, grad, i);
    const __m512 p1 = step16_states<kGrad, kL2, kTraffic>(c, param, m, v, grad, i + 16);
    const __m512i line =
        _mm512_inserti64x4(_mm512_castsi256_si512(narrow<kOut>(p0)), narrow<kOut>(p1), 1);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out16 + i), line);
  }
  return i;
}

// kPrefetch (traffic passes only): every read stream prefetched kTrafficPrefetchBytes ahead.
template <int kGrad, int kOut, bool kL2, bool kTraffic = false, bool kPrefetch = false>
void adamw(const AdamWConstants& constants, float* param, float* m, float* v, const void* grad,
           void* out, size_t n) {
  STRATA_OPTIM_PLACEMENT_PAD();
  const Constants c = broadcast(constants);
  size_t i = 0;
  if constexpr (kOut != 0)
    i = adamw_streaming_copy<kGrad, kOut, kL2, kTraffic, kPrefetch>(c, param, m, v, grad, out, n);
  // Two vectors per iteration: two independent divide/sqrt chains in flight.
  for (; i + 32 <= n; i += 32) {
    if constexpr (kPrefetch) prefetch_ahead<kGrad>(param, m, v, grad, i);
    step16<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, i);
    step16<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, i + 16);
  }
  for (; i + 16 <= n; i += 16) step16<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, i);
  if (i < n) step_masked<kGrad, kOut, kL2, kTraffic>(c, param, m, v, grad, out, i, n - i);
  // Non-temporal stores are weakly ordered: fence them before the caller publishes the copy.
  if constexpr (kOut != 0) _mm_sfence();
}

STRATA_INLINE void accumulate(__m512 x, __m512d& lo, __m512d& hi) {
  const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d b =
      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  lo = _mm512_fmadd_pd(a, a, lo);
  hi = _mm512_fmadd_pd(b, b, hi);
}

template <int kGrad>
double sum_squares(const void* grad, size_t n) {
  // fp32 squares are exact in double and cannot overflow it, so the only error is the rounding
  // of the additions, spread over 32 lanes; NaN and infinity propagate to the result.
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  __m512d acc2 = _mm512_setzero_pd(), acc3 = _mm512_setzero_pd();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    accumulate(load_grad<kGrad>(grad, i), acc0, acc1);
    accumulate(load_grad<kGrad>(grad, i + 16), acc2, acc3);
  }
  for (; i + 16 <= n; i += 16) accumulate(load_grad<kGrad>(grad, i), acc0, acc1);
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    accumulate(load_grad_masked<kGrad>(grad, i, k), acc2, acc3);
  }
  const __m512d sum = _mm512_add_pd(_mm512_add_pd(acc0, acc1), _mm512_add_pd(acc2, acc3));
  return _mm512_reduce_add_pd(sum);
}

void triad(float* a, const float* b, const float* c, float scalar, size_t n, bool streaming) {
  const __m512 s = _mm512_set1_ps(scalar);
  size_t i = 0;
  if (streaming) {
    // Non-temporal stores need 64-byte alignment: peel the head.
    while (i < n && (reinterpret_cast<uintptr_t>(a + i) & 63) != 0) {
      a[i] = b[i] + scalar * c[i];
      ++i;
    }
    for (; i + 16 <= n; i += 16) {
      _mm512_stream_ps(
          a + i, _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(s, _mm512_loadu_ps(c + i))));
    }
    _mm_sfence();
  } else {
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(
          a + i, _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(s, _mm512_loadu_ps(c + i))));
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
  t.traffic_prefetched[kGrad][0] = &adamw<kGrad, 0, false, true, true>;
  t.traffic_prefetched[kGrad][1] = &adamw<kGrad, 1, false, true, true>;
  t.traffic_prefetched[kGrad][2] = &adamw<kGrad, 2, false, true, true>;
  t.sum_squares[kGrad] = &sum_squares<kGrad>;
}

constexpr KernelTable make_table() {
  KernelTable t{};
  t.name = "avx512";
  fill_grad<0>(t);
  fill_grad<1>(t);
  fill_grad<2>(t);
  t.triad = &triad;
  return t;
}

constexpr KernelTable kTable = make_table();

}  // namespace

const KernelTable& avx512_kernels() {
  return kTable;
}

}  // namespace strata::optim::detail
