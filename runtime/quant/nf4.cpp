// NF4 quantization (exact, scalar: it runs once per weight) and the checks and dispatch in front
// of the dequantization kernels (nf4_kernels.h). The format and its error bound: nf4.h.
#include "quant/nf4.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/assert.h"
#include "optim/half_convert.h"
#include "quant/nf4_kernels.h"

namespace strata::quant {
namespace {

// The absmax section is read and written with memcpy of host floats.
static_assert(std::endian::native == std::endian::little, "NF4 buffers are little-endian");

constexpr bool codebook_is_the_contract() {
  for (int k = 0; k + 1 < 16; ++k) {
    if (!(kNf4Codebook[k] < kNf4Codebook[k + 1])) return false;
  }
  return kNf4Codebook[0] == -1.0f && kNf4Codebook[kNf4ZeroCode] == 0.0f && kNf4Codebook[15] == 1.0f;
}
static_assert(codebook_is_the_contract(), "sorted, -1 first, 0 at index 7, 1 last");

// The exact midpoints between neighbouring codes: the decision thresholds of the quantizer.
struct Midpoints {
  double value[15];
};
constexpr Midpoints midpoints() {
  Midpoints m{};
  for (int k = 0; k < 15; ++k) {
    // Two floats of nearby exponents: their sum, and half of it, are exact in double.
    m.value[k] = (static_cast<double>(kNf4Codebook[k]) + kNf4Codebook[k + 1]) / 2;
  }
  return m;
}
constexpr Midpoints kMidpoints = midpoints();

// Bits from the leading to the trailing 1 of a normal double's significand.
constexpr int significant_bits(double x) {
  const uint64_t significand =
      (std::bit_cast<uint64_t>(x) & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
  return 53 - std::countr_zero(significand);
}
constexpr bool midpoints_scale_exactly() {
  // midpoint * absmax is then exact in double (<= 29 + 24 significant bits), so the quantizer's
  // comparisons are exact, whatever the absmax (a subnormal one has fewer bits still, and the
  // products stay far above double's subnormal range).
  for (double m : kMidpoints.value) {
    if (significant_bits(m) > 29) return false;
  }
  return true;
}
static_assert(midpoints_scale_exactly());

constexpr double largest_half_gap() {
  double gap = 0;
  for (int k = 0; k + 1 < 16; ++k) {
    const double g = static_cast<double>(kNf4Codebook[k + 1]) - kNf4Codebook[k];
    if (g > gap) gap = g;
  }
  return gap / 2;
}
constexpr double kMaxAbsErrorFraction = largest_half_gap();
static_assert(kMaxAbsErrorFraction == (static_cast<double>(kNf4Codebook[1]) - kNf4Codebook[0]) / 2,
              "nf4.h names the gap between codes 0 and 1 as the largest");

bool is_float_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

std::string dtype_name(DType dtype) {
  const auto value = static_cast<unsigned>(dtype);
  return value < static_cast<unsigned>(kDTypeCount) ? to_string(dtype)
                                                    : "#" + std::to_string(value);
}

std::string float_text(float value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(value));
  return text;
}

Status check_count(const char* who, uint64_t count) {
  if (count == 0) return invalid_argument(std::string(who) + ": count is 0");
  if (count > kNf4MaxElements) {
    return invalid_argument(std::string(who) + ": count " + std::to_string(count) +
                            " is above the limit of 2^56 elements");
  }
  return Status::ok();
}

template <DType kIn>
float element(const unsigned char* src, uint64_t i) {
  if constexpr (kIn == DType::kFloat32) {
    float x;
    std::memcpy(&x, src + 4 * i, 4);
    return x;
  } else {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    return kIn == DType::kBFloat16 ? optim::bf16_to_float(h) : optim::fp16_to_float(h);
  }
}

// The first NaN or infinity, before anything is written: a failed call leaves dst as it was.
template <DType kIn>
Status check_finite(const unsigned char* src, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    const float x = element<kIn>(src, i);
    if (!std::isfinite(x)) {
      return invalid_argument("NF4 quantize: element " + std::to_string(i) + " is " +
                              float_text(x) + ": only finite values can be quantized");
    }
  }
  return Status::ok();
}

template <DType kIn>
void quantize(const unsigned char* src, uint64_t count, unsigned char* dst) {
  const uint64_t blocks = nf4_blocks(count);
  unsigned char* codes = dst + kNf4AbsmaxBytes * blocks;
  // Codes are OR-ed in, and an odd count's last high nibble must read 0.
  std::memset(codes, 0, (count + 1) / 2);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t begin = b * kNf4BlockElements;
    const uint64_t end = count - begin < kNf4BlockElements ? count : begin + kNf4BlockElements;
    float absmax = 0.0f;
    for (uint64_t i = begin; i < end; ++i)
      absmax = std::fmax(absmax, std::fabs(element<kIn>(src, i)));
    std::memcpy(dst + kNf4AbsmaxBytes * b, &absmax, 4);
    double threshold[15];
    for (int k = 0; k < 15; ++k) threshold[k] = kMidpoints.value[k] * absmax;  // exact
    for (uint64_t i = begin; i < end; ++i) {
      unsigned code = kNf4ZeroCode;  // a block of zeros: every threshold is 0
      if (absmax > 0.0f) {
        // The number of midpoints strictly below x: the nearest code, ties to the lower one.
        const double x = element<kIn>(src, i);
        code = 0;
        for (double t : threshold) code += x > t ? 1u : 0u;
      }
      STRATA_ASSERT(code < 16);
      codes[i / 2] = static_cast<unsigned char>(codes[i / 2] | code << (4 * (i & 1)));
    }
  }
}

// What is known of src without reading it: pointer, count, size, and the output dtype.
Status check_source(const char* who, const Nf4Packed& src, DType dst_dtype) {
  const std::string what = who;
  if (src.data == nullptr) return invalid_argument(what + ": src is NULL");
  STRATA_TRY(check_count(who, src.count));
  const uint64_t packed = nf4_packed_bytes(src.count);
  if (src.bytes != packed) {
    return invalid_argument(what + ": src is " + std::to_string(src.bytes) + " bytes, but " +
                            std::to_string(src.count) + " elements pack into exactly " +
                            std::to_string(packed) + " (nf4_packed_bytes)");
  }
  if (!is_float_dtype(dst_dtype)) {
    return invalid_argument(what + ": output dtype " + dtype_name(dst_dtype) +
                            " is not fp32, bf16 or fp16");
  }
  return Status::ok();
}

// The first bit pattern of a non-negative fp32 absmax that the output dtype cannot hold: at or
// above it, code 15 (absmax itself) would round to infinity. tests/quant checks them against
// half_convert.h.
uint32_t overflowing_absmax_bits(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 0x7F7F8000u;  // halfway between bf16's largest finite 0x7F7F and infinity
    case DType::kFloat16:
      return 0x477FF000u;  // 65520, halfway between 65504 and 65536
    default:
      return 0x7F800000u;  // infinity
  }
}

// What dequantizing the range reads from src, checked: each block's scale, and the padding
// nibble when the range reaches an odd count's end.
Status check_contents(const char* who, const Nf4Packed& src, uint64_t first, uint64_t n,
                      DType dst_dtype) {
  const auto* bytes = static_cast<const unsigned char*>(src.data);
  const uint32_t limit = overflowing_absmax_bits(dst_dtype);
  const uint64_t last_block = nf4_blocks(first + n);
  for (uint64_t b = first / kNf4BlockElements; b < last_block; ++b) {
    uint32_t bits;
    std::memcpy(&bits, bytes + kNf4AbsmaxBytes * b, 4);
    if (bits < limit) continue;
    const float absmax = optim::bits_float(bits);
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", bits);
    if (bits >= 0x7F800000u) {
      return invalid_argument(std::string(who) + ": block " + std::to_string(b) + "'s absmax is " +
                              float_text(absmax) + " (bits " + hex +
                              "), not a finite number >= 0: the buffer is not NF4 data");
    }
    return invalid_argument(std::string(who) + ": block " + std::to_string(b) + "'s absmax " +
                            float_text(absmax) + " overflows " + dtype_name(dst_dtype) +
                            " (it would decode to infinity): dequantize to fp32 instead");
  }
  if (src.count % 2 == 1 && first + n == src.count) {
    const unsigned padding = bytes[src.bytes - 1] >> 4;
    if (padding != 0) {
      return invalid_argument(std::string(who) + ": the padding nibble after element " +
                              std::to_string(src.count - 1) + " is " + std::to_string(padding) +
                              ", not 0: the buffer is not NF4 data of " +
                              std::to_string(src.count) + " elements");
    }
  }
  return Status::ok();
}

Result<const detail::Nf4KernelTable*> kernels_for(std::optional<optim::SimdLevel> forced) {
  // Chosen once: the CPU does not change under a process (and cpu_supports runs CPUID).
  static const optim::SimdLevel best = optim::best_simd_level();
  if (forced && !optim::cpu_supports(*forced)) {
    return unsupported(std::string("NF4 dequantize: SIMD level ") + optim::to_string(*forced) +
                       " is not supported by this CPU or build");
  }
  switch (forced.value_or(best)) {
#if defined(STRATA_OPTIM_X86)
    case optim::SimdLevel::kAvx512:
      return &detail::nf4_avx512_kernels();
    case optim::SimdLevel::kAvx2:
      return &detail::nf4_avx2_kernels();
#endif
    default:
      return &detail::nf4_scalar_kernels();
  }
}

int out_kind(DType dtype) {
  return dtype == DType::kFloat32 ? 0 : dtype == DType::kBFloat16 ? 1 : 2;
}

}  // namespace

double nf4_max_abs_error_fraction() {
  return kMaxAbsErrorFraction;
}

double nf4_error_bound(float absmax, float decoded, DType dtype) {
  double relative = 0;
  double absolute = 0;
  switch (dtype) {
    case DType::kFloat32:
      relative = 0x1p-24;
      absolute = 0x1p-150;
      break;
    case DType::kBFloat16:
      relative = 0x1p-8 + 0x1p-23;
      absolute = 0x1p-133;
      break;
    case DType::kFloat16:
      relative = 0x1p-11 + 0x1p-23;
      absolute = 0x1p-24;
      break;
    default:
      return -1;
  }
  return static_cast<double>(absmax) * kMaxAbsErrorFraction +
         relative * std::fabs(static_cast<double>(decoded)) + absolute;
}

Status nf4_quantize(const void* src, DType src_dtype, uint64_t count, void* dst,
                    uint64_t dst_bytes) {
  if (src == nullptr || dst == nullptr) {
    return invalid_argument(std::string("NF4 quantize: ") + (src == nullptr ? "src" : "dst") +
                            " is NULL");
  }
  STRATA_TRY(check_count("NF4 quantize", count));
  if (!is_float_dtype(src_dtype)) {
    return invalid_argument("NF4 quantize: input dtype " + dtype_name(src_dtype) +
                            " is not fp32, bf16 or fp16");
  }
  const uint64_t packed = nf4_packed_bytes(count);
  if (dst_bytes < packed) {
    return invalid_argument("NF4 quantize: dst holds " + std::to_string(dst_bytes) + " bytes; " +
                            std::to_string(count) + " elements pack into " +
                            std::to_string(packed) + " (nf4_packed_bytes)");
  }
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  switch (src_dtype) {
    case DType::kFloat32:
      STRATA_TRY(check_finite<DType::kFloat32>(in, count));
      quantize<DType::kFloat32>(in, count, out);
      break;
    case DType::kBFloat16:
      STRATA_TRY(check_finite<DType::kBFloat16>(in, count));
      quantize<DType::kBFloat16>(in, count, out);
      break;
    default:
      STRATA_TRY(check_finite<DType::kFloat16>(in, count));
      quantize<DType::kFloat16>(in, count, out);
      break;
  }
  return Status::ok();
}

namespace detail {

Status check_dequantize_arguments(const char* who, const Nf4Packed& src, uint64_t first, uint64_t n,
                                  const void* dst, uint64_t dst_bytes, DType dst_dtype) {
  STRATA_TRY(check_source(who, src, dst_dtype));
  const std::string what = who;
  if (dst == nullptr) return invalid_argument(what + ": dst is NULL");
  if (n == 0) return invalid_argument(what + ": the range is empty");
  if (first % kNf4BlockElements != 0) {
    return invalid_argument(what + ": the range starts at element " + std::to_string(first) +
                            ", not at a block boundary (a multiple of 64)");
  }
  if (first >= src.count || n > src.count - first) {
    return invalid_argument(what + ": the range of " + std::to_string(n) +
                            " elements from element " + std::to_string(first) +
                            " goes past the end of src's " + std::to_string(src.count));
  }
  const uint64_t needed = n * dtype_size(dst_dtype);
  if (dst_bytes < needed) {
    return invalid_argument(what + ": dst holds " + std::to_string(dst_bytes) + " bytes; " +
                            std::to_string(n) + " " + dtype_name(dst_dtype) + " elements need " +
                            std::to_string(needed));
  }
  return Status::ok();
}

}  // namespace detail

Status nf4_dequantize_range(const Nf4Packed& src, uint64_t first, uint64_t n, void* dst,
                            uint64_t dst_bytes, DType dst_dtype,
                            std::optional<optim::SimdLevel> level) {
  constexpr const char* kWho = "NF4 dequantize";
  STRATA_TRY(detail::check_dequantize_arguments(kWho, src, first, n, dst, dst_bytes, dst_dtype));
  STRATA_ASSIGN_OR_RETURN(const detail::Nf4KernelTable* kernels, kernels_for(level));
  STRATA_TRY(check_contents(kWho, src, first, n, dst_dtype));
  const auto* bytes = static_cast<const unsigned char*>(src.data);
  const uint64_t blocks = nf4_blocks(src.count);
  const unsigned char* absmax = bytes + kNf4AbsmaxBytes * (first / kNf4BlockElements);
  const unsigned char* codes = bytes + kNf4AbsmaxBytes * blocks + first / 2;
  kernels->dequantize[out_kind(dst_dtype)](absmax, codes, n, dst);
  return Status::ok();
}

Status nf4_dequantize(const Nf4Packed& src, void* dst, uint64_t dst_bytes, DType dst_dtype,
                      std::optional<optim::SimdLevel> level) {
  return nf4_dequantize_range(src, 0, src.count, dst, dst_bytes, dst_dtype, level);
}

Status nf4_check_packed(const Nf4Packed& src, DType dst_dtype) {
  constexpr const char* kWho = "NF4 check";
  STRATA_TRY(check_source(kWho, src, dst_dtype));
  return check_contents(kWho, src, 0, src.count, dst_dtype);
}

}  // namespace strata::quant
