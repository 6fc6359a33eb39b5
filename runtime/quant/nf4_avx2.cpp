// The AVX2 NF4 decoder (AVX2 + F16C). Per block, the 16 possible outputs are computed once, with
// the same fp32 multiplications and the same round-to-nearest-even narrowing as the scalar path
// (so each is bit for bit what the scalar path writes for that code), and the block's 64 codes
// then only select among them: VPERMPS for fp32, PSHUFB over the two byte halves for bf16 and
// fp16. A short last block selects from the same 16 outputs, one element at a time. Built with
// its own -m flags (see CMakeLists.txt) and entered only after cpu_supports says so. Nothing here
// has vague linkage: see nf4_kernels.h.
#include <immintrin.h>

#include <cstring>

#include "quant/nf4_kernels.h"

namespace strata::quant::detail {
namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

STRATA_INLINE __m256 load_scale(const unsigned char* absmax, uint64_t block) {
  float scale;
  std::memcpy(&scale, absmax + kNf4AbsmaxBytes * block, sizeof scale);
  return _mm256_set1_ps(scale);
}

// 16 packed bytes -> 32 codes in element order, one per byte: the low nibble of byte j is
// element 2j, the high nibble element 2j + 1.
STRATA_INLINE void unpack_codes(__m128i packed, __m128i& first16, __m128i& second16) {
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m128i low = _mm_and_si128(packed, nibble);
  const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble);
  first16 = _mm_unpacklo_epi8(low, high);
  second16 = _mm_unpackhi_epi8(low, high);
}

// The fp32 outputs of the 8 codes in the low 8 bytes: VPERMPS reads only 3 index bits, so both
// halves of the 16-entry table are looked up and bit 3 of the code, moved to the sign bit, picks.
STRATA_INLINE __m256 lookup8(__m256 table_low, __m256 table_high, __m128i codes) {
  const __m256i index = _mm256_cvtepu8_epi32(codes);
  const __m256 low = _mm256_permutevar8x32_ps(table_low, index);
  const __m256 high = _mm256_permutevar8x32_ps(table_high, index);
  return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)));
}

// Round to nearest even, the integer form of half_convert.h's float_to_bf16 for finite values
// (the scales are finite, so the products are).
STRATA_INLINE __m128i narrow_bf16(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i h = _mm256_srli_epi32(rounded, 16);
  // Every lane is <= 0xFFFF, so unsigned saturation packs exactly.
  return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

template <int kOut>
STRATA_INLINE __m128i narrow(__m256 p) {
  if constexpr (kOut == 1) return narrow_bf16(p);
  return _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// The 16 16-bit outputs (entries 0-7, 8-15) as two PSHUFB tables: their low bytes, their high.
STRATA_INLINE void byte_planes(__m128i first8, __m128i second8, __m128i& low, __m128i& high) {
  const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i a = _mm_shuffle_epi8(first8, split);
  const __m128i b = _mm_shuffle_epi8(second8, split);
  low = _mm_unpacklo_epi64(a, b);
  high = _mm_unpackhi_epi64(a, b);
}

// 16 codes -> 16 16-bit outputs at dst.
STRATA_INLINE void store16(unsigned char* dst, __m128i low_plane, __m128i high_plane,
                           __m128i codes) {
  const __m128i low = _mm_shuffle_epi8(low_plane, codes);
  const __m128i high = _mm_shuffle_epi8(high_plane, codes);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi8(low, high));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm_unpackhi_epi8(low, high));
}

template <int kOut>
void dequantize(const unsigned char* absmax, const unsigned char* codes, uint64_t n, void* dst) {
  constexpr uint64_t kOutBytes = kOut == 0 ? 4 : 2;
  const __m256 book_low = _mm256_loadu_ps(kNf4Codebook);
  const __m256 book_high = _mm256_loadu_ps(kNf4Codebook + 8);
  auto* out = static_cast<unsigned char*>(dst);
  const uint64_t full_blocks = n / kNf4BlockElements;
  for (uint64_t b = 0; b < full_blocks; ++b) {
    const __m256 scale = load_scale(absmax, b);
    const __m256 table_low = _mm256_mul_ps(book_low, scale);
    const __m256 table_high = _mm256_mul_ps(book_high, scale);
    const unsigned char* in = codes + kNf4BlockElements / 2 * b;
    unsigned char* o = out + kNf4BlockElements * kOutBytes * b;
    __m128i c[4];
    unpack_codes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)), c[0], c[1]);
    unpack_codes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16)), c[2], c[3]);
    if constexpr (kOut == 0) {
      for (size_t q = 0; q < 4; ++q) {
        auto* o32 = reinterpret_cast<float*>(o) + 16 * q;
        _mm256_storeu_ps(o32, lookup8(table_low, table_high, c[q]));
        _mm256_storeu_ps(o32 + 8, lookup8(table_low, table_high, _mm_srli_si128(c[q], 8)));
      }
    } else {
      __m128i low_plane, high_plane;
      byte_planes(narrow<kOut>(table_low), narrow<kOut>(table_high), low_plane, high_plane);
      for (size_t q = 0; q < 4; ++q) store16(o + 32 * q, low_plane, high_plane, c[q]);
    }
  }

  const uint64_t rest = n % kNf4BlockElements;
  if (rest == 0) return;
  const __m256 scale = load_scale(absmax, full_blocks);
  const __m256 table_low = _mm256_mul_ps(book_low, scale);
  const __m256 table_high = _mm256_mul_ps(book_high, scale);
  alignas(32) unsigned char table[16 * kOutBytes];
  if constexpr (kOut == 0) {
    _mm256_store_ps(reinterpret_cast<float*>(table), table_low);
    _mm256_store_ps(reinterpret_cast<float*>(table) + 8, table_high);
  } else {
    _mm_store_si128(reinterpret_cast<__m128i*>(table), narrow<kOut>(table_low));
    _mm_store_si128(reinterpret_cast<__m128i*>(table + 16), narrow<kOut>(table_high));
  }
  const unsigned char* in = codes + kNf4BlockElements / 2 * full_blocks;
  unsigned char* o = out + kNf4BlockElements * kOutBytes * full_blocks;
  for (uint64_t i = 0; i < rest; ++i) {
    const unsigned code = (in[i / 2] >> (4 * (i & 1))) & 0xFu;
    std::memcpy(o + kOutBytes * i, table + kOutBytes * code, kOutBytes);
  }
}

constexpr Nf4KernelTable kTable = {"avx2", {&dequantize<0>, &dequantize<1>, &dequantize<2>}};

}  // namespace

const Nf4KernelTable& nf4_avx2_kernels() {
  return kTable;
}

}  // namespace strata::quant::detail
