// half_convert.h: the conversions every optimizer path shares, against independent references
// (exact double arithmetic for round-to-nearest-even, and the CPU's own F16C instructions).
#include "optim/half_convert.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "optim/simd_level.h"

namespace strata::optim {
namespace {

__attribute__((target("f16c"))) uint16_t f16c_from_float(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float f16c_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

// F16C comes with every AVX2 CPU the optimizer accepts (simd_level.cpp checks it through CPUID).
bool have_f16c() {
  return cpu_supports(SimdLevel::kAvx2);
}

// Round-to-nearest-even into a format whose values are all exact doubles: choose between the two
// neighbours of x by exact comparison, ties to the even encoding.
uint16_t reference_round(float x, uint16_t lo, uint16_t hi, double lo_value, double hi_value) {
  const double d = x;
  const double below = std::fabs(d - lo_value);  // exact: the neighbours share x's binade
  const double above = std::fabs(hi_value - d);
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1) ? hi : lo;
}

uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t u = float_bits(x);
  const uint16_t truncated = static_cast<uint16_t>(u >> 16);
  if ((u & 0xFFFF) == 0) return truncated;
  // Magnitude neighbours: truncated (towards zero) and the next encoding away from zero.
  const uint16_t away = static_cast<uint16_t>(truncated + 1);
  // Past the largest finite bf16, the next step up is 2^128 (which encodes as infinity).
  const double away_value =
      (away & 0x7FFF) == 0x7F80 ? std::copysign(std::ldexp(1.0, 128), x) : bf16_to_float(away);
  return reference_round(x, truncated, away, bf16_to_float(truncated), away_value);
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSubnormals) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3F808000)), 0x3F80);  // tie, even below
  EXPECT_EQ(float_to_bf16(bits_float(0x3F818000)), 0x3F82);  // tie, even above
  EXPECT_EQ(float_to_bf16(bits_float(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(float_to_bf16(bits_float(0x3F807FFF)), 0x3F80);  // just below the tie
  EXPECT_EQ(float_to_bf16(3.4028235e38f), 0x7F80);           // rounds past the largest: infinity
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bf16(NAN), 0x7FC0);
  EXPECT_EQ(float_to_bf16(-NAN), 0x7FC0);
  EXPECT_EQ(float_to_bf16(bits_float(0x00018000)), 0x0002);  // subnormal tie rounds to even
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(Bf16, AgreesWithExactReferenceOverASweepOfAllFloats) {
  // Every 61st bit pattern (70 million), plus every pattern near each bf16 rounding boundary.
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 61) {
    const float x = bits_float(static_cast<uint32_t>(u));
    ASSERT_EQ(float_to_bf16(x), reference_bf16(x)) << std::hex << u;
  }
  for (uint32_t hi = 0; hi <= 0xFFFF; ++hi) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float x = bits_float((hi << 16) | low);
      ASSERT_EQ(float_to_bf16(x), reference_bf16(x)) << std::hex << ((hi << 16) | low);
    }
  }
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float x = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(x)) ASSERT_EQ(float_to_bf16(x), h);  // exact round trip
  }
}

TEST(Fp16, AgreesWithF16cOnEveryHalfAndEveryRoundingBoundary) {
  if (!have_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float want = f16c_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(fp16_to_float(static_cast<uint16_t>(h))), float_bits(want))
        << std::hex << h;
  }
  // Around every fp16 value: the value, its fp32 neighbours, and the midpoints to the next fp16
  // value with their fp32 neighbours - all the places a rounding decision changes.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float x = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    const float next = fp16_to_float(static_cast<uint16_t>(h + 1));
    const float mid =
        std::isfinite(next) ? static_cast<float>((static_cast<double>(x) + next) / 2) : x;
    for (float base : {x, mid}) {
      for (int delta = -2; delta <= 2; ++delta) {
        const float y = bits_float(float_bits(base) + delta);
        ASSERT_EQ(float_to_fp16(y), f16c_from_float(y)) << std::hex << float_bits(y);
      }
    }
  }
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 61) {
    const float x = bits_float(static_cast<uint32_t>(u));
    ASSERT_EQ(float_to_fp16(x), f16c_from_float(x)) << std::hex << u;
  }
}

TEST(Fp16, HandlesTheEdgesOfTheRange) {
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // the tie above the largest rounds to infinity
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.0f, -14)), 0x8400);
  EXPECT_EQ(float_to_fp16(1e-40f), 0x0000);
}

}  // namespace
}  // namespace strata::optim
