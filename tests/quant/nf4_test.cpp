// The NF4 format (quant/nf4.h) against independent references: the codebook's defining
// properties, the byte layout built by hand, the quantizer against a brute-force nearest code,
// the documented error bound, every SIMD level (and the GPU where there is one) bit for bit
// against the scalar definition, the errors, and the C API over it.
#include "quant/nf4.h"

#include <gtest/gtest.h>
#include <strata/strata.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "optim/half_convert.h"
#include "optim/simd_level.h"
#include "quant/nf4_cuda.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace strata::quant {
namespace {

using optim::SimdLevel;

constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Normal N(0, sigma) values, exactly representable in `dtype` (so the fp32 the quantizer sees is
// the value the test holds).
std::vector<float> normal_values(uint64_t count, float sigma, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> values(count);
  for (float& v : values) {
    v = normal(rng);
    if (dtype == DType::kBFloat16) v = optim::bf16_to_float(optim::float_to_bf16(v));
    if (dtype == DType::kFloat16) v = optim::fp16_to_float(optim::float_to_fp16(v));
  }
  return values;
}

// The values in `dtype`'s encoding, as the quantizer's input.
std::vector<unsigned char> encode(const std::vector<float>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBFloat16 ? optim::float_to_bf16(values[i])
                                                   : optim::float_to_fp16(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

// Element i of a dequantized buffer, widened to fp32 (exact).
float decoded(const std::vector<unsigned char>& out, DType dtype, uint64_t i) {
  if (dtype == DType::kFloat32) {
    float v;
    std::memcpy(&v, &out[4 * i], 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, &out[2 * i], 2);
  return dtype == DType::kBFloat16 ? optim::bf16_to_float(h) : optim::fp16_to_float(h);
}

// Reading a packed buffer by the contract, independently of the library.
float absmax_of(const std::vector<unsigned char>& packed, uint64_t block) {
  float a;
  std::memcpy(&a, &packed[4 * block], 4);
  return a;
}
unsigned code_of(const std::vector<unsigned char>& packed, uint64_t count, uint64_t i) {
  const uint64_t codes = 4 * ((count + 63) / 64);
  return (packed[codes + i / 2] >> (i % 2 == 0 ? 0 : 4)) & 0xFu;
}

std::vector<unsigned char> quantized(const std::vector<float>& values, DType dtype) {
  const std::vector<unsigned char> in = encode(values, dtype);
  std::vector<unsigned char> packed(nf4_packed_bytes(values.size()));
  const Status status = nf4_quantize(in.data(), dtype, values.size(), packed.data(), packed.size());
  EXPECT_TRUE(status.is_ok()) << status.message();
  return packed;
}

std::vector<unsigned char> dequantized(const std::vector<unsigned char>& packed, uint64_t count,
                                       DType dtype, std::optional<SimdLevel> level = {}) {
  std::vector<unsigned char> out(count * dtype_size(dtype));
  const Status status =
      nf4_dequantize({packed.data(), packed.size(), count}, out.data(), out.size(), dtype, level);
  EXPECT_TRUE(status.is_ok()) << status.message();
  return out;
}

std::vector<SimdLevel> every_level() {
  return optim::supported_simd_levels();
}

// A packed buffer of random codes (every nibble value, padding 0) under the given scales, one
// per block, cycling: what the SIMD paths are compared on, beyond what the quantizer writes.
std::vector<unsigned char> random_packed(uint64_t count, const std::vector<float>& scales,
                                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> packed(nf4_packed_bytes(count));
  const uint64_t blocks = (count + 63) / 64;
  for (uint64_t b = 0; b < blocks; ++b) std::memcpy(&packed[4 * b], &scales[b % scales.size()], 4);
  for (uint64_t j = 4 * blocks; j < packed.size(); ++j)
    packed[j] = static_cast<unsigned char>(rng());
  if (count % 2 == 1) packed.back() &= 0x0F;
  return packed;
}

// Scales that exercise every rounding: ordinary weights, fp32 subnormals, values near fp16's
// subnormal range and its largest finite value, bf16-only magnitudes, exact zero, and scales that
// codes 0 and 15 (-absmax, +absmax) turn into exact ties of the 16-bit roundings, to the even
// neighbour below and above: bf16 (1 + 2^-8, 1 + 3 * 2^-8), fp16 (1 + 2^-11, 1 + 3 * 2^-11), and
// fp16 subnormals (2^-25, 3 * 2^-25).
const std::vector<float> kAwkwardScales = {
    0.037f,     1.0f,       3.3e-3f,     1e-40f,      1.17e-38f,  6.1e-5f,   2.9e-7f,
    65519.0f,   0.0f,       1e-12f,      7.77f,       123.456f,   1e-30f,    5.96e-8f,
    0x1.01p+0f, 0x1.03p+0f, 0x1.002p+0f, 0x1.006p+0f, 0x1.0p-25f, 0x1.8p-24f};

TEST(Nf4Codebook, IsSortedWithAnExactZeroAtIndexSevenAndEndsAtMinusOneAndOne) {
  for (int k = 0; k + 1 < 16; ++k) EXPECT_LT(kNf4Codebook[k], kNf4Codebook[k + 1]) << k;
  EXPECT_EQ(kNf4Codebook[0], -1.0f);
  EXPECT_EQ(kNf4Codebook[kNf4ZeroCode], 0.0f);
  EXPECT_EQ(kNf4ZeroCode, 7u);
  EXPECT_EQ(kNf4Codebook[15], 1.0f);
  // Asymmetric: 7 negative values, 8 positive ones.
  EXPECT_EQ(std::count_if(std::begin(kNf4Codebook), std::end(kNf4Codebook),
                          [](float c) { return c < 0; }),
            7);
}

TEST(Nf4Codebook, ValuesAreNormalQuantilesOfThePaperToFp32Precision) {
  // Phi^-1 by bisection on erfc, in double: the recipe of nf4.h's comment, independent of how the
  // table was written down. The published fp32 values differ from an all-double computation by a
  // few ulps (fp32 probabilities), hence the tolerance; tests/quant/nf4_codebook.py checks them
  // exactly.
  const auto inverse_normal = [](double p) {
    double lo = -10, hi = 10;
    for (int i = 0; i < 200; ++i) {
      const double mid = (lo + hi) / 2;
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
    }
    return (lo + hi) / 2;
  };
  const double offset = 1 - 0.5 * (1.0 / 32 + 1.0 / 30);
  std::vector<double> values = {0.0};
  for (int i = 0; i < 8; ++i) values.push_back(inverse_normal(offset + (0.5 - offset) * i / 8));
  for (int i = 0; i < 7; ++i) values.push_back(-inverse_normal(offset + (0.5 - offset) * i / 7));
  std::sort(values.begin(), values.end());
  for (int k = 0; k < 16; ++k) {
    EXPECT_NEAR(kNf4Codebook[k], values[k] / values[15], 4e-7) << "code " << k;
  }
}

TEST(Nf4, PackedSizeIsOneFp32ScalePerBlockAndHalfAByteAnElement) {
  EXPECT_EQ(kNf4BlockElements, 64u);
  EXPECT_EQ(nf4_packed_bytes(1), 4u + 1);
  EXPECT_EQ(nf4_packed_bytes(2), 4u + 1);
  EXPECT_EQ(nf4_packed_bytes(3), 4u + 2);
  EXPECT_EQ(nf4_packed_bytes(63), 4u + 32);
  EXPECT_EQ(nf4_packed_bytes(64), 4u + 32);
  EXPECT_EQ(nf4_packed_bytes(65), 8u + 33);
  EXPECT_EQ(nf4_packed_bytes(4097), 4u * 65 + 2049);
  EXPECT_EQ(nf4_packed_bytes(uint64_t{1} << 56), (uint64_t{1} << 52) + (uint64_t{1} << 55));
  EXPECT_EQ(nf4_packed_bytes(0), 0u);
  EXPECT_EQ(nf4_packed_bytes((uint64_t{1} << 56) + 1), 0u);
  EXPECT_EQ(nf4_packed_bytes(UINT64_MAX), 0u);
}

TEST(Nf4, MaxAbsErrorFractionIsHalfTheLargestGapBetweenNeighbouringCodes) {
  double largest = 0;
  for (int k = 0; k + 1 < 16; ++k) {
    largest = std::max(largest, static_cast<double>(kNf4Codebook[k + 1]) - kNf4Codebook[k]);
  }
  EXPECT_EQ(nf4_max_abs_error_fraction(), largest / 2);
  EXPECT_NEAR(nf4_max_abs_error_fraction(), 0.15190359950065613, 1e-17);
}

// Byte layout by hand: absmax 2 (00 00 00 40), then element 0 in the low nibble of byte 0.
TEST(Nf4, ElementsTwoIAndTwoIPlusOneAreTheLowAndHighNibbleOfByteI) {
  const std::vector<unsigned char> packed = {0x00, 0x00, 0x00, 0x40,  // absmax 2.0f
                                             0xF0, 0x8E, 0x07};       // codes 0,15, 14,8, 7,pad
  const std::vector<float> expected = {-2.0f, 2.0f, kNf4Codebook[14] * 2.0f, kNf4Codebook[8] * 2.0f,
                                       0.0f};
  for (SimdLevel level : every_level()) {
    SCOPED_TRACE(optim::to_string(level));
    const std::vector<unsigned char> out = dequantized(packed, 5, DType::kFloat32, level);
    for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(decoded(out, DType::kFloat32, i), expected[i]) << i;
  }
  // And the quantizer writes exactly those bytes for those values.
  EXPECT_EQ(quantized(expected, DType::kFloat32), packed);
}

TEST(Nf4, ScalesComeFirstOnePerBlockThenTheCodesOfEveryBlock) {
  // Block 0 is all 1.0, block 1 all -3.0, block 2 (one element) 0.5.
  std::vector<float> values(129, 1.0f);
  std::fill(values.begin() + 64, values.begin() + 128, -3.0f);
  values[128] = 0.5f;
  const std::vector<unsigned char> packed = quantized(values, DType::kFloat32);
  ASSERT_EQ(packed.size(), 12u + 65);
  EXPECT_EQ(absmax_of(packed, 0), 1.0f);
  EXPECT_EQ(absmax_of(packed, 1), 3.0f);
  EXPECT_EQ(absmax_of(packed, 2), 0.5f);
  for (int j = 12; j < 12 + 32; ++j) EXPECT_EQ(packed[j], 0xFF) << j;
  for (int j = 12 + 32; j < 12 + 64; ++j) EXPECT_EQ(packed[j], 0x00) << j;
  EXPECT_EQ(packed[12 + 64], 0x0F);  // element 128 is code 15; the padding nibble is 0
}

TEST(Nf4, QuantizerPicksTheNearestCodeOfEveryElementAndStoresTheExactAbsmax) {
  for (DType dtype : kFloatTypes) {
    for (uint64_t count : {1u, 63u, 64u, 65u, 4097u}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " count " + std::to_string(count));
      const std::vector<float> values = normal_values(count, 0.02f, dtype, count);
      const std::vector<unsigned char> packed = quantized(values, dtype);
      for (uint64_t b = 0; b * 64 < count; ++b) {
        float absmax = 0;
        for (uint64_t i = b * 64; i < std::min(count, b * 64 + 64); ++i) {
          absmax = std::max(absmax, std::fabs(values[i]));
        }
        ASSERT_EQ(absmax_of(packed, b), absmax) << "block " << b;
      }
      for (uint64_t i = 0; i < count; ++i) {
        // Distances in long double: c * absmax (48 bits) and x - it are exact there.
        const long double x = values[i];
        const long double a = absmax_of(packed, i / 64);
        const unsigned k = code_of(packed, count, i);
        const long double mine = std::fabs(x - static_cast<long double>(kNf4Codebook[k]) * a);
        for (unsigned j = 0; j < 16; ++j) {
          const long double other = std::fabs(x - static_cast<long double>(kNf4Codebook[j]) * a);
          if (j < k) {
            ASSERT_LT(mine, other) << "element " << i << " code " << k << " vs " << j;
          } else if (j > k) {
            ASSERT_LE(mine, other) << "element " << i << " code " << k << " vs " << j;
          }
        }
      }
    }
  }
}

TEST(Nf4, ValuesNextToTheMidpointBetweenTwoCodesGoToTheNearerOne) {
  // The floats around each exact midpoint * absmax, for several scales: where a quantizer that
  // divided, or rounded its thresholds, would pick the farther code.
  for (float absmax : {1.0f, 0.037f, 3.3e-3f, 7.77f, 1e-40f, 6.1e-5f}) {
    std::vector<float> values = {absmax};
    for (int k = 0; k < 15; ++k) {
      const double midpoint = (static_cast<double>(kNf4Codebook[k]) + kNf4Codebook[k + 1]) / 2;
      const float near = static_cast<float>(midpoint * absmax);
      for (float x : {std::nextafter(near, -1.0f), near, std::nextafter(near, 1.0f)}) {
        if (std::fabs(x) <= absmax) values.push_back(x);
      }
    }
    const std::vector<unsigned char> packed = quantized(values, DType::kFloat32);
    ASSERT_EQ(absmax_of(packed, 0), absmax);
    for (uint64_t i = 0; i < values.size(); ++i) {
      const long double x = values[i];
      const unsigned k = code_of(packed, values.size(), i);
      const long double mine = std::fabs(x - static_cast<long double>(kNf4Codebook[k]) * absmax);
      for (unsigned j = 0; j < 16; ++j) {
        const long double other = std::fabs(x - static_cast<long double>(kNf4Codebook[j]) * absmax);
        if (j < k) {
          ASSERT_LT(mine, other) << "absmax " << absmax << " x " << values[i] << " code " << k;
        } else if (j > k) {
          ASSERT_LE(mine, other) << "absmax " << absmax << " x " << values[i] << " code " << k;
        }
      }
    }
  }
}

TEST(Nf4, QuantizingOverOldBytesWritesTheSameBufferWithAZeroPaddingNibble) {
  const std::vector<float> values = normal_values(129, 1.0f, DType::kFloat32, 12);
  std::vector<unsigned char> dirty(nf4_packed_bytes(129), 0xFF);
  ASSERT_TRUE(
      nf4_quantize(values.data(), DType::kFloat32, 129, dirty.data(), dirty.size()).is_ok());
  EXPECT_EQ(dirty, quantized(values, DType::kFloat32));
  EXPECT_EQ(dirty.back() >> 4, 0);
}

TEST(Nf4, DequantizedWeightsStayWithinTheDocumentedErrorOfAFloatReference) {
  for (DType in : kFloatTypes) {
    for (DType out : kFloatTypes) {
      for (uint64_t count : {1u, 63u, 64u, 65u, 4097u}) {
        SCOPED_TRACE(std::string(to_string(in)) + " -> " + to_string(out) + ", count " +
                     std::to_string(count));
        const std::vector<float> values = normal_values(count, 0.02f, in, 7 * count + 1);
        const std::vector<unsigned char> packed = quantized(values, in);
        const std::vector<unsigned char> y = dequantized(packed, count, out);
        for (uint64_t i = 0; i < count; ++i) {
          const float a = absmax_of(packed, i / 64);
          const float yi = decoded(y, out, i);
          const long double error = std::fabs(static_cast<long double>(values[i]) - yi);
          ASSERT_LE(error, nf4_error_bound(a, yi, out)) << "element " << i << " x " << values[i];
          // The bound is relative to the block, so it is small: within 16% of the block's scale.
          ASSERT_LE(error, 0.16L * a + 1e-6L);
        }
      }
    }
  }
}

TEST(Nf4, AnOutlierWidensTheErrorOfItsOwnBlockOnly) {
  std::vector<float> values = normal_values(4097, 0.02f, DType::kFloat32, 99);
  values[100] = 40.0f;    // block 1
  values[3000] = -75.5f;  // block 46
  const std::vector<unsigned char> packed = quantized(values, DType::kFloat32);
  for (DType out : kFloatTypes) {
    SCOPED_TRACE(to_string(out));
    const std::vector<unsigned char> y = dequantized(packed, values.size(), out);
    for (uint64_t i = 0; i < values.size(); ++i) {
      const float a = absmax_of(packed, i / 64);
      const float yi = decoded(y, out, i);
      ASSERT_LE(std::fabs(static_cast<long double>(values[i]) - yi), nf4_error_bound(a, yi, out))
          << i;
      const uint64_t block = i / 64;
      if (block != 1 && block != 46) {
        ASSERT_LT(a, 1.0f) << "block " << block;
      }
    }
    // The outliers themselves are their blocks' absmax: exact.
    EXPECT_EQ(decoded(y, out, 100), 40.0f);
    EXPECT_EQ(decoded(y, out, 3000), -75.5f);
  }
}

TEST(Nf4, TheBoundIsReachedBetweenTheTwoMostNegativeCodes) {
  // x just off the midpoint of -1 and code 1, in a block whose absmax is 1: the error is E up to
  // x's own rounding to fp32.
  const float x = static_cast<float>((-1.0 + kNf4Codebook[1]) / 2);
  const std::vector<unsigned char> packed = quantized({1.0f, x}, DType::kFloat32);
  const float y = decoded(dequantized(packed, 2, DType::kFloat32), DType::kFloat32, 1);
  const double error = std::fabs(static_cast<double>(x) - y);
  EXPECT_LE(error, nf4_error_bound(1.0f, y, DType::kFloat32));
  EXPECT_GE(error, nf4_max_abs_error_fraction() - 0x1p-24);
}

TEST(Nf4, TiesBetweenTwoCodesGoToTheLowerOne) {
  // With absmax 1, half of codes 6 and 8 are exact fp32 midpoints next to code 7 (zero).
  const float up_tie = kNf4Codebook[8] / 2;    // between 7 and 8
  const float down_tie = kNf4Codebook[6] / 2;  // between 6 and 7
  const std::vector<unsigned char> packed = quantized({1.0f, up_tie, down_tie}, DType::kFloat32);
  EXPECT_EQ(code_of(packed, 3, 1), 7u);
  EXPECT_EQ(code_of(packed, 3, 2), 6u);
  // Just past the ties, the upper codes.
  const std::vector<unsigned char> past = quantized(
      {1.0f, std::nextafter(up_tie, 1.0f), std::nextafter(down_tie, 1.0f)}, DType::kFloat32);
  EXPECT_EQ(code_of(past, 3, 1), 8u);
  EXPECT_EQ(code_of(past, 3, 2), 7u);
}

TEST(Nf4, ZeroAndTheBlockExtremesDecodeExactly) {
  const std::vector<float> values = {0.25f, -0.25f, 0.0f, -0.0f, 0.1f};
  const std::vector<unsigned char> packed = quantized(values, DType::kFloat32);
  for (DType out : kFloatTypes) {
    const std::vector<unsigned char> y = dequantized(packed, values.size(), out);
    EXPECT_EQ(decoded(y, out, 0), 0.25f);
    EXPECT_EQ(decoded(y, out, 1), -0.25f);
    EXPECT_EQ(decoded(y, out, 2), 0.0f);
    EXPECT_EQ(decoded(y, out, 3), 0.0f);
  }
}

TEST(Nf4, ABlockOfZerosHasAbsmaxZeroAndDecodesToPositiveZero) {
  std::vector<float> values(130, 0.0f);
  values[5] = -0.0f;
  for (uint64_t i = 64; i < 128; ++i) values[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  const std::vector<unsigned char> packed = quantized(values, DType::kFloat32);
  EXPECT_EQ(absmax_of(packed, 0), 0.0f);
  EXPECT_FALSE(std::signbit(absmax_of(packed, 0)));
  EXPECT_EQ(absmax_of(packed, 2), 0.0f);
  for (uint64_t i = 0; i < 64; ++i) EXPECT_EQ(code_of(packed, 130, i), kNf4ZeroCode) << i;
  for (DType out : kFloatTypes) {
    for (SimdLevel level : every_level()) {
      const std::vector<unsigned char> y = dequantized(packed, values.size(), out, level);
      for (uint64_t i : {0u, 5u, 63u, 128u, 129u}) {
        const float v = decoded(y, out, i);
        EXPECT_EQ(v, 0.0f) << i;
        EXPECT_FALSE(std::signbit(v)) << i;
      }
    }
  }
}

TEST(Nf4, QuantizingIsDeterministicAndIndependentOfTheInputEncoding) {
  const std::vector<float> values = normal_values(1000, 1.0f, DType::kBFloat16, 5);
  const std::vector<unsigned char> from_bf16 = quantized(values, DType::kBFloat16);
  EXPECT_EQ(quantized(values, DType::kBFloat16), from_bf16);
  EXPECT_EQ(quantized(values, DType::kFloat32), from_bf16);
  const std::vector<float> halves = normal_values(1000, 1.0f, DType::kFloat16, 6);
  EXPECT_EQ(quantized(halves, DType::kFloat16), quantized(halves, DType::kFloat32));
}

TEST(Nf4, EverySimdLevelWritesTheScalarBitsForEveryOutputDtype) {
  for (uint64_t count : {1u, 2u, 31u, 63u, 64u, 65u, 127u, 128u, 129u, 1000u, 4097u, 8192u}) {
    const std::vector<unsigned char> packed = random_packed(count, kAwkwardScales, count);
    for (DType out : kFloatTypes) {
      // Scales that overflow fp16 are refused there (tested below): leave 65519 in, which fits.
      const std::vector<unsigned char> scalar = dequantized(packed, count, out, SimdLevel::kScalar);
      for (SimdLevel level : every_level()) {
        SCOPED_TRACE(std::string(optim::to_string(level)) + " " + to_string(out) + " count " +
                     std::to_string(count));
        EXPECT_EQ(dequantized(packed, count, out, level), scalar);
      }
    }
  }
}

TEST(Nf4, EverySimdLevelWritesTheScalarBitsForRangesAndUnalignedBuffers) {
  const uint64_t count = 4097;
  const std::vector<unsigned char> packed = random_packed(count, kAwkwardScales, 11);
  for (DType out : kFloatTypes) {
    const std::vector<unsigned char> whole = dequantized(packed, count, out, SimdLevel::kScalar);
    const uint64_t size = dtype_size(out);
    for (SimdLevel level : every_level()) {
      for (uint64_t first : {0u, 64u, 640u, 4032u, 4096u}) {
        for (uint64_t n : {1u, 3u, 64u, 65u, 100u, 1000u}) {
          if (first + n > count) continue;
          SCOPED_TRACE(std::string(optim::to_string(level)) + " " + to_string(out) + " [" +
                       std::to_string(first) + ", +" + std::to_string(n) + ")");
          // Both buffers one byte off any alignment.
          std::vector<unsigned char> src(packed.size() + 1);
          std::memcpy(src.data() + 1, packed.data(), packed.size());
          std::vector<unsigned char> dst(n * size + 1, 0xAB);
          const Status status = nf4_dequantize_range({src.data() + 1, packed.size(), count}, first,
                                                     n, dst.data() + 1, n * size, out, level);
          ASSERT_TRUE(status.is_ok()) << status.message();
          EXPECT_EQ(dst[0], 0xAB);
          EXPECT_EQ(0, std::memcmp(dst.data() + 1, whole.data() + first * size, n * size));
        }
      }
    }
  }
}

TEST(Nf4, RangesDequantizedOnSeveralThreadsEqualOneWholeCall) {
  const uint64_t count = 100000;
  const std::vector<float> values = normal_values(count, 0.05f, DType::kFloat32, 3);
  const std::vector<unsigned char> packed = quantized(values, DType::kFloat32);
  const std::vector<unsigned char> whole = dequantized(packed, count, DType::kBFloat16);
  std::vector<unsigned char> split(whole.size());
  const uint64_t chunk = 64 * 397;  // a multiple of the block, not of the count
  std::vector<std::thread> threads;
  std::vector<Status> statuses((count + chunk - 1) / chunk);
  for (uint64_t t = 0; t * chunk < count; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t first = t * chunk;
      const uint64_t n = std::min(chunk, count - first);
      statuses[t] = nf4_dequantize_range({packed.data(), packed.size(), count}, first, n,
                                         split.data() + 2 * first, 2 * n, DType::kBFloat16);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : statuses) EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(split, whole);
}

TEST(Nf4, NonFiniteInputIsRefusedAndLeavesDstUntouched) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType in : kFloatTypes) {
    for (float bad : {nan, inf, -inf}) {
      std::vector<float> values = normal_values(200, 1.0f, in, 1);
      values[150] = bad;
      const std::vector<unsigned char> bytes = encode(values, in);
      std::vector<unsigned char> dst(nf4_packed_bytes(200), 0xAB);
      const Status status = nf4_quantize(bytes.data(), in, 200, dst.data(), dst.size());
      EXPECT_EQ(status.code(), STRATA_E_INVALID) << to_string(in) << " " << bad;
      EXPECT_NE(status.message().find("element 150"), std::string::npos) << status.message();
      EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == 0xAB; }));
    }
  }
}

TEST(Nf4, QuantizeRefusesBadSizesPointersAndDtypes) {
  const std::vector<float> values(65, 1.0f);
  std::vector<unsigned char> dst(nf4_packed_bytes(65) + 8);
  const auto quantize = [&](const void* src, DType dtype, uint64_t count, void* out,
                            uint64_t bytes) {
    return nf4_quantize(src, dtype, count, out, bytes).code();
  };
  EXPECT_EQ(quantize(values.data(), DType::kFloat32, 65, dst.data(), dst.size()), STRATA_OK);
  EXPECT_EQ(quantize(values.data(), DType::kFloat32, 65, dst.data(), nf4_packed_bytes(65)),
            STRATA_OK);
  EXPECT_EQ(quantize(values.data(), DType::kFloat32, 65, dst.data(), nf4_packed_bytes(65) - 1),
            STRATA_E_INVALID);
  EXPECT_EQ(quantize(values.data(), DType::kFloat32, 0, dst.data(), dst.size()), STRATA_E_INVALID);
  EXPECT_EQ(
      quantize(values.data(), DType::kFloat32, (uint64_t{1} << 56) + 1, dst.data(), UINT64_MAX),
      STRATA_E_INVALID);
  EXPECT_EQ(quantize(nullptr, DType::kFloat32, 65, dst.data(), dst.size()), STRATA_E_INVALID);
  EXPECT_EQ(quantize(values.data(), DType::kFloat32, 65, nullptr, dst.size()), STRATA_E_INVALID);
  EXPECT_EQ(quantize(values.data(), DType::kInt8, 65, dst.data(), dst.size()), STRATA_E_INVALID);
  EXPECT_EQ(quantize(values.data(), static_cast<DType>(42), 65, dst.data(), dst.size()),
            STRATA_E_INVALID);
}

TEST(Nf4, DequantizeRefusesBadSizesRangesAndDtypesWithoutWriting) {
  const std::vector<unsigned char> packed =
      quantized(normal_values(130, 1.0f, DType::kFloat32, 2), DType::kFloat32);
  std::vector<unsigned char> dst(130 * 4, 0xAB);
  const auto run = [&](uint64_t src_bytes, uint64_t count, uint64_t first, uint64_t n,
                       uint64_t dst_bytes, DType dtype, void* out) {
    const Status s =
        nf4_dequantize_range({packed.data(), src_bytes, count}, first, n, out, dst_bytes, dtype);
    if (!s.is_ok()) {
      EXPECT_FALSE(s.message().empty());
    }
    return s.code();
  };
  const uint64_t size = packed.size();
  EXPECT_EQ(run(size, 130, 0, 130, dst.size(), DType::kFloat32, dst.data()), STRATA_OK);
  std::fill(dst.begin(), dst.end(), 0xAB);
  EXPECT_EQ(run(size - 1, 130, 0, 130, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size + 1, 130, 0, 130, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 129, 0, 129, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 0, 0, 0, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 0, 130, 130 * 4 - 1, DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 0, 130, 130 * 2 - 1, DType::kBFloat16, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 32, 10, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 64, 67, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 192, 1, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 64, UINT64_MAX, dst.size(), DType::kFloat32, dst.data()),
            STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 64, 0, dst.size(), DType::kFloat32, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 0, 130, dst.size(), DType::kUInt8, dst.data()), STRATA_E_INVALID);
  EXPECT_EQ(run(size, 130, 0, 130, dst.size(), DType::kFloat32, nullptr), STRATA_E_INVALID);
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == 0xAB; }));
  EXPECT_EQ(nf4_dequantize({nullptr, size, 130}, dst.data(), dst.size(), DType::kFloat32).code(),
            STRATA_E_INVALID);
  // A range that ends exactly at the count is fine.
  EXPECT_EQ(run(size, 130, 128, 2, dst.size(), DType::kFloat32, dst.data()), STRATA_OK);
}

TEST(Nf4, ABufferThatIsNotNf4DataIsRefusedNotDecoded) {
  const std::vector<unsigned char> good =
      quantized(normal_values(129, 1.0f, DType::kFloat32, 4), DType::kFloat32);
  const auto with_scale = [&](uint64_t block, uint32_t bits) {
    std::vector<unsigned char> bad = good;
    std::memcpy(&bad[4 * block], &bits, 4);
    return bad;
  };
  for (uint32_t bits : {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0xBF800000u, 0x80000000u}) {
    const std::vector<unsigned char> bad = with_scale(1, bits);
    std::vector<unsigned char> dst(129 * 4, 0xAB);
    const Nf4Packed src{bad.data(), bad.size(), 129};
    const Status status = nf4_dequantize(src, dst.data(), dst.size(), DType::kFloat32);
    EXPECT_EQ(status.code(), STRATA_E_INVALID) << std::hex << bits;
    EXPECT_NE(status.message().find("block 1"), std::string::npos) << status.message();
    EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == 0xAB; }));
    EXPECT_EQ(nf4_check_packed(src, DType::kFloat32).code(), STRATA_E_INVALID);
    // A range that does not cover the bad block still decodes.
    EXPECT_TRUE(nf4_dequantize_range(src, 0, 64, dst.data(), dst.size(), DType::kFloat32).is_ok());
  }
  std::vector<unsigned char> padded = good;
  padded.back() |= 0x30;
  const Nf4Packed src{padded.data(), padded.size(), 129};
  std::vector<unsigned char> dst(129 * 4);
  const Status status = nf4_dequantize(src, dst.data(), dst.size(), DType::kFloat32);
  EXPECT_EQ(status.code(), STRATA_E_INVALID);
  EXPECT_NE(status.message().find("padding"), std::string::npos) << status.message();
  EXPECT_EQ(nf4_check_packed({good.data(), good.size(), 129}, DType::kFloat16).code(), STRATA_OK);
}

TEST(Nf4, AScaleBeyondA16BitFormatIsRefusedForThatFormatOnly) {
  const auto fp32_bits = [](uint32_t bits) { return optim::bits_float(bits); };
  // The first scales that round to infinity, by half_convert.h, and the ones just below.
  ASSERT_EQ(optim::float_to_fp16(fp32_bits(0x477FF000u)), 0x7C00);
  ASSERT_EQ(optim::float_to_fp16(fp32_bits(0x477FEFFFu)), 0x7BFF);
  ASSERT_EQ(optim::float_to_bf16(fp32_bits(0x7F7F8000u)), 0x7F80);
  ASSERT_EQ(optim::float_to_bf16(fp32_bits(0x7F7F7FFFu)), 0x7F7F);
  struct Case {
    uint32_t scale_bits;
    DType dtype;
    bool fits;
  };
  for (const Case& c :
       {Case{0x477FF000u, DType::kFloat16, false}, Case{0x477FEFFFu, DType::kFloat16, true},
        Case{0x477FF000u, DType::kBFloat16, true}, Case{0x7F7F8000u, DType::kBFloat16, false},
        Case{0x7F7F7FFFu, DType::kBFloat16, true}, Case{0x7F7FFFFFu, DType::kFloat32, true}}) {
    const float scale = fp32_bits(c.scale_bits);
    const std::vector<unsigned char> packed = quantized({scale, -scale / 3}, DType::kFloat32);
    std::vector<unsigned char> dst(2 * dtype_size(c.dtype));
    const Status status =
        nf4_dequantize({packed.data(), packed.size(), 2}, dst.data(), dst.size(), c.dtype);
    EXPECT_EQ(status.is_ok(), c.fits) << std::hex << c.scale_bits << " " << to_string(c.dtype);
    if (c.fits) {
      EXPECT_TRUE(std::isfinite(decoded(dst, c.dtype, 0)));
    } else {
      EXPECT_NE(status.message().find("overflows"), std::string::npos) << status.message();
    }
  }
}

TEST(Nf4, ForcingALevelTheCpuLacksIsUnsupported) {
  const std::vector<unsigned char> packed = quantized({1.0f, 0.5f}, DType::kFloat32);
  std::vector<unsigned char> dst(8);
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    const Status status = nf4_dequantize({packed.data(), packed.size(), 2}, dst.data(), dst.size(),
                                         DType::kFloat32, level);
    EXPECT_EQ(status.code(), optim::cpu_supports(level) ? STRATA_OK : STRATA_E_UNSUPPORTED)
        << optim::to_string(level);
  }
}

TEST(Nf4ErrorBound, AddsTheOutputRoundingOfEachDtype) {
  const double e = nf4_max_abs_error_fraction();
  EXPECT_EQ(nf4_error_bound(2.0f, 1.0f, DType::kFloat32), 2 * e + 0x1p-24 + 0x1p-150);
  EXPECT_EQ(nf4_error_bound(2.0f, -1.0f, DType::kBFloat16), 2 * e + 0x1p-8 + 0x1p-23 + 0x1p-133);
  EXPECT_EQ(nf4_error_bound(0.0f, 0.0f, DType::kFloat16), 0x1p-24);
  EXPECT_EQ(nf4_error_bound(1.0f, 1.0f, DType::kInt8), -1);
}

// The C API (strata.h's strata_nf4_*): the same results, and codes only.
TEST(Nf4CApi, QuantizeAndDequantizeMatchTheInternalFunctions) {
  EXPECT_EQ(STRATA_NF4_BLOCK_ELEMENTS, 64);
  EXPECT_EQ(strata_nf4_packed_bytes(65), nf4_packed_bytes(65));
  EXPECT_EQ(strata_nf4_packed_bytes(0), 0u);
  const std::vector<float> values = normal_values(1001, 0.1f, DType::kFloat32, 8);
  std::vector<unsigned char> packed(strata_nf4_packed_bytes(values.size()));
  ASSERT_EQ(strata_nf4_quantize(values.data(), STRATA_DTYPE_F32, values.size(), packed.data(),
                                packed.size()),
            STRATA_OK);
  EXPECT_EQ(packed, quantized(values, DType::kFloat32));
  const std::pair<strata_dtype, DType> outputs[] = {{STRATA_DTYPE_F32, DType::kFloat32},
                                                    {STRATA_DTYPE_BF16, DType::kBFloat16},
                                                    {STRATA_DTYPE_F16, DType::kFloat16}};
  for (const auto& [c_dtype, dtype] : outputs) {
    std::vector<unsigned char> out(values.size() * dtype_size(dtype));
    ASSERT_EQ(
        strata_nf4_dequantize(packed.data(), packed.size(), values.size(), out.data(), c_dtype),
        STRATA_OK);
    EXPECT_EQ(out, dequantized(packed, values.size(), dtype));
  }
}

TEST(Nf4CApi, BadArgumentsReturnInvalid) {
  const float values[3] = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN()};
  unsigned char packed[16] = {};
  EXPECT_EQ(strata_nf4_quantize(values, STRATA_DTYPE_F32, 2, packed, sizeof packed), STRATA_OK);
  EXPECT_EQ(strata_nf4_quantize(values, STRATA_DTYPE_F32, 3, packed, sizeof packed),
            STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_quantize(values, STRATA_DTYPE_I8, 2, packed, sizeof packed),
            STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_quantize(values, static_cast<strata_dtype>(99), 2, packed, sizeof packed),
            STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_quantize(values, STRATA_DTYPE_F32, 2, packed, 4), STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_quantize(nullptr, STRATA_DTYPE_F32, 2, packed, sizeof packed),
            STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_quantize(values, STRATA_DTYPE_F32, 0, packed, sizeof packed),
            STRATA_E_INVALID);
  float out[2];
  EXPECT_EQ(strata_nf4_dequantize(packed, 5, 2, out, STRATA_DTYPE_F32), STRATA_OK);
  EXPECT_EQ(out[0], kNf4Codebook[12] * 2.0f);  // 1 / 2 = 0.5 is nearest to 0.4407 (code 12)
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(strata_nf4_dequantize(packed, 6, 2, out, STRATA_DTYPE_F32), STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_dequantize(packed, 5, 2, out, STRATA_DTYPE_U8), STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_dequantize(packed, 5, 2, nullptr, STRATA_DTYPE_F32), STRATA_E_INVALID);
  EXPECT_EQ(strata_nf4_dequantize(packed, 5, UINT64_MAX, out, STRATA_DTYPE_F32), STRATA_E_INVALID);
}

TEST(Nf4CApi, CudaDequantizeIsUnsupportedWithoutCudaAndRefusesHostMemoryWithIt) {
  unsigned char packed[5] = {0, 0, 0x80, 0x3F, 0xF0};
  float out[2];
  const int code = strata_nf4_dequantize_cuda(packed, 5, 2, out, STRATA_DTYPE_F32, nullptr);
  if (!cuda::nf4_kernels_built()) {
    EXPECT_EQ(code, STRATA_E_UNSUPPORTED);
  } else {
    // Pageable host memory is not device memory: refused, not a device fault (or, without a
    // usable GPU, the lookup itself fails).
    EXPECT_TRUE(code == STRATA_E_INVALID || code == STRATA_E_DEVICE) << code;
    EXPECT_EQ(strata_nf4_dequantize_cuda(packed, 6, 2, out, STRATA_DTYPE_F32, nullptr),
              STRATA_E_INVALID);
  }
}

TEST(Nf4Cuda, EntryPointsSayUnsupportedInABuildWithoutCuda) {
  if (cuda::nf4_kernels_built()) GTEST_SKIP() << "this build has the CUDA kernel";
  unsigned char packed[5] = {};
  float out[2];
  const Status status = cuda::nf4_dequantize({packed, 5, 2}, out, 8, DType::kFloat32, nullptr);
  EXPECT_EQ(status.code(), STRATA_E_UNSUPPORTED);
  EXPECT_NE(status.message().find("no CUDA"), std::string::npos);
  EXPECT_EQ(
      cuda::nf4_dequantize_range({packed, 5, 2}, 0, 2, out, 8, DType::kFloat32, nullptr).code(),
      STRATA_E_UNSUPPORTED);
}

#if defined(STRATA_HAVE_CUDA)

// Device memory for the test, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr_, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Aligned buffers take the 8-elements-per-thread kernel, buffers one byte off the per-element
// one: both must write the CPU's bits, for every output dtype, whole and in ranges.
TEST(Nf4Cuda, DequantizingOnTheGpuWritesTheCpuBits) {
  if (!cuda::nf4_kernels_built()) GTEST_SKIP() << "this build of Strata has no CUDA kernel";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device on this machine";
  }
  for (uint64_t count : {1u, 7u, 64u, 65u, 4097u, 1000003u}) {
    const std::vector<unsigned char> packed = random_packed(count, kAwkwardScales, count);
    for (DType out : kFloatTypes) {
      const uint64_t bytes = count * dtype_size(out);
      const std::vector<unsigned char> cpu = dequantized(packed, count, out);
      for (uint64_t offset : {0u, 1u}) {
        SCOPED_TRACE(std::string(to_string(out)) + " count " + std::to_string(count) + " offset " +
                     std::to_string(offset));
        // The source may sit at any byte; the destination needs its dtype's alignment.
        const uint64_t dst_offset = offset * dtype_size(out);
        DeviceBuffer src(packed.size() + 1);
        DeviceBuffer dst(bytes + 16);
        ASSERT_EQ(
            cudaMemcpy(src.get() + offset, packed.data(), packed.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
        const Nf4Packed device_src{src.get() + offset, packed.size(), count};
        Status status =
            cuda::nf4_dequantize(device_src, dst.get() + dst_offset, bytes, out, nullptr);
        ASSERT_TRUE(status.is_ok()) << status.message();
        std::vector<unsigned char> gpu(bytes);
        ASSERT_EQ(cudaMemcpy(gpu.data(), dst.get() + dst_offset, bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(gpu, cpu);
        if (count > 128) {
          const uint64_t first = 64, n = count - 64 - 3;
          status = cuda::nf4_dequantize_range(device_src, first, n, dst.get(), n * dtype_size(out),
                                              out, nullptr);
          ASSERT_TRUE(status.is_ok()) << status.message();
          std::vector<unsigned char> part(n * dtype_size(out));
          ASSERT_EQ(cudaMemcpy(part.data(), dst.get(), part.size(), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          EXPECT_EQ(0, std::memcmp(part.data(), cpu.data() + first * dtype_size(out), part.size()));
        }
      }
    }
  }
}

TEST(Nf4Cuda, ADestinationOffItsDtypesAlignmentIsRefused) {
  if (!cuda::nf4_kernels_built()) GTEST_SKIP() << "this build of Strata has no CUDA kernel";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device on this machine";
  }
  const std::vector<unsigned char> packed = quantized({1.0f, 0.5f}, DType::kFloat32);
  DeviceBuffer src(packed.size());
  DeviceBuffer dst(16);
  const Nf4Packed device_src{src.get(), packed.size(), 2};
  EXPECT_EQ(cuda::nf4_dequantize(device_src, dst.get() + 2, 8, DType::kFloat32, nullptr).code(),
            STRATA_E_INVALID);
  EXPECT_EQ(cuda::nf4_dequantize(device_src, dst.get() + 1, 4, DType::kFloat16, nullptr).code(),
            STRATA_E_INVALID);
}

#endif  // STRATA_HAVE_CUDA

}  // namespace
}  // namespace strata::quant
