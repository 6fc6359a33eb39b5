// The AVX-512 NF4 decoder (AVX512F + BW + VL). As in nf4_avx2.cpp, the 16 outputs of a block are
// computed once with the scalar path's operations and the codes only select among them, here
// with one instruction per 16 (VPERMPS, fp32) or 32 (VPERMW, bf16 and fp16) elements over the
// whole 16-entry table. A short last block selects from the same 16 outputs one element at a
// time. Built with its own -m flags (see CMakeLists.txt) and entered only after cpu_supports says
// so. Everything is in an anonymous namespace and nothing comes from shared inline code: see
// nf4_kernels.h.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass deliberately undefined vectors (_mm512_undefined_*) as merge
// sources, which -Wmaybe-uninitialized misreports once inlined here (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <cstring>

#include "quant/nf4_kernels.h"

namespace strata::quant::detail {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

STRATA_INLINE __m512 load_scale(const unsigned char* absmax, uint64_t block) {
  float scale;
  std::memcpy(&scale, absmax + kNf4AbsmaxBytes * block, sizeof scale);
  return _mm512_set1_ps(scale);
}

// 32 packed bytes -> 64 codes in element order, one per byte (elements 0-31, 32-63). Within each
// 128-bit lane, interleaving the low and high nibbles of bytes 0-7 gives 16 elements in order;
// the two permutes put the lanes back in element order.
STRATA_INLINE void unpack_codes(__m256i packed, __m256i& first32, __m256i& second32) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i low = _mm256_and_si256(packed, nibble);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
  const __m256i a = _mm256_unpacklo_epi8(low, high);  // elements 0-15 | 32-47
  const __m256i b = _mm256_unpackhi_epi8(low, high);  // elements 16-31 | 48-63
  first32 = _mm256_permute2x128_si256(a, b, 0x20);
  second32 = _mm256_permute2x128_si256(a, b, 0x31);
}

// Round to nearest even, the integer form of half_convert.h's float_to_bf16 for finite values
// (the scales are finite, so the products are).
STRATA_INLINE __m256i narrow_bf16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

template <int kOut>
STRATA_INLINE __m256i narrow(__m512 p) {
  if constexpr (kOut == 1) return narrow_bf16(p);
  return _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <int kOut>
void dequantize(const unsigned char* absmax, const unsigned char* codes, uint64_t n, void* dst) {
  constexpr uint64_t kOutBytes = kOut == 0 ? 4 : 2;
  const __m512 book = _mm512_loadu_ps(kNf4Codebook);
  auto* out = static_cast<unsigned char*>(dst);
  const uint64_t full_blocks = n / kNf4BlockElements;
  for (uint64_t b = 0; b < full_blocks; ++b) {
    const __m512 table = _mm512_mul_ps(book, load_scale(absmax, b));
    const unsigned char* in = codes + kNf4BlockElements / 2 * b;
    unsigned char* o = out + kNf4BlockElements * kOutBytes * b;
    __m256i c[2];
    unpack_codes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)), c[0], c[1]);
    if constexpr (kOut == 0) {
      for (size_t q = 0; q < 4; ++q) {
        const __m128i codes16 =
            q % 2 == 0 ? _mm256_castsi256_si128(c[q / 2]) : _mm256_extracti128_si256(c[q / 2], 1);
        _mm512_storeu_ps(o + 64 * q, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes16), table));
      }
    } else {
      // VPERMW reads 5 index bits; codes are < 16, so the upper half of the table is never read.
      const __m512i table16 = _mm512_zextsi256_si512(narrow<kOut>(table));
      for (size_t q = 0; q < 2; ++q) {
        _mm512_storeu_si512(o + 64 * q,
                            _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(c[q]), table16));
      }
    }
  }

  const uint64_t rest = n % kNf4BlockElements;
  if (rest == 0) return;
  const __m512 products = _mm512_mul_ps(book, load_scale(absmax, full_blocks));
  alignas(64) unsigned char table[16 * kOutBytes];
  if constexpr (kOut == 0) {
    _mm512_store_ps(table, products);
  } else {
    _mm256_store_si256(reinterpret_cast<__m256i*>(table), narrow<kOut>(products));
  }
  const unsigned char* in = codes + kNf4BlockElements / 2 * full_blocks;
  unsigned char* o = out + kNf4BlockElements * kOutBytes * full_blocks;
  for (uint64_t i = 0; i < rest; ++i) {
    const unsigned code = (in[i / 2] >> (4 * (i & 1))) & 0xFu;
    std::memcpy(o + kOutBytes * i, table + kOutBytes * code, kOutBytes);
  }
}

constexpr Nf4KernelTable kTable = {"avx512", {&dequantize<0>, &dequantize<1>, &dequantize<2>}};

}  // namespace

const Nf4KernelTable& nf4_avx512_kernels() {
  return kTable;
}

}  // namespace strata::quant::detail
