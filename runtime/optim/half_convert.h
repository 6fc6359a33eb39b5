// Scalar conversions between fp32 and the two 16-bit float formats, bit-exact with the SIMD and
// CUDA paths. Every path of the optimizer (scalar, AVX2, AVX-512, CUDA) rounds with these exact
// rules, so results do not depend on which machine ran the step:
//  - fp32 -> bf16: round to nearest, ties to even; fp32 subnormals are kept (no flush to zero,
//    unlike AVX512_BF16's VCVTNEPS2BF16); every NaN becomes 0x7FC0 (what torch writes).
//  - fp32 -> fp16: IEEE round to nearest even with subnormals, overflow to infinity; NaN keeps
//    its sign and upper payload and is quieted (what F16C's VCVTPS2PH does).
//  - 16-bit -> fp32: exact. fp16 signalling NaNs are quieted (what F16C's VCVTPH2PS does).
// Header-only and free of target-specific code so host code, tests and nvcc share it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::optim {

STRATA_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

STRATA_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

STRATA_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  // Adding 0x7FFF rounds halfway cases down and the rest to nearest; the extra lsb makes ties
  // round to even. Values that round past the largest finite bf16 carry into the exponent and
  // become infinity, as they should.
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

STRATA_HOST_DEVICE inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

STRATA_HOST_DEVICE inline uint16_t float_to_fp16(float f) {
  const uint32_t bits = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t u = bits & 0x7FFFFFFFu;
  if (u >= 0x7F800000u) {  // infinity or NaN
    if (u == 0x7F800000u) return sign | 0x7C00u;
    return static_cast<uint16_t>(sign | 0x7E00u | ((u >> 13) & 0x3FFu));
  }
  // 65520 is halfway between the largest finite fp16 (65504, odd mantissa) and 65536: ties to
  // even round it, and everything above, to infinity.
  if (u >= 0x477FF000u) return sign | 0x7C00u;
  if (u < 0x38800000u) {  // below 2^-14: an fp16 subnormal or zero
    // 2^-25 is halfway between zero and the smallest subnormal 2^-24: ties to even give zero.
    if (u <= 0x33000000u) return sign;
    const uint32_t exponent = u >> 23;
    const uint32_t mantissa = (u & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // value = mantissa * 2^(exponent - 150); unit 2^-24
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);  // a carry into 0x400 is the smallest normal
  }
  const uint32_t rounded = u + 0xFFFu + ((u >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
}

STRATA_HOST_DEVICE inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return bits_float(sign | float_bits(magnitude));
  }
  if (exponent == 0x1Fu) {
    const uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return bits_float(sign | 0x7F800000u | quiet | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace strata::optim
