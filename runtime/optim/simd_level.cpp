#include "optim/simd_level.h"

#if defined(STRATA_OPTIM_X86)
#include <cpuid.h>
#endif

namespace strata::optim {
namespace {

#if defined(STRATA_OPTIM_X86)
// F16C straight from CPUID: not every compiler's __builtin_cpu_supports knows the name. The OS
// side (YMM state) is covered by the AVX2 check it always comes with.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

const char* to_string(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<SimdLevel> parse_simd_level(std::string_view name) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (name == to_string(level)) return level;
  }
  return std::nullopt;
}

bool cpu_supports(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
#if defined(STRATA_OPTIM_X86)
    // __builtin_cpu_supports also checks (through XGETBV) that the OS saves the wider registers.
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case SimdLevel::kAvx512:
      return cpu_supports(SimdLevel::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    case SimdLevel::kAvx2:
    case SimdLevel::kAvx512:
      return false;
#endif
  }
  return false;
}

SimdLevel best_simd_level() {
  if (cpu_supports(SimdLevel::kAvx512)) return SimdLevel::kAvx512;
  if (cpu_supports(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (cpu_supports(level)) levels.push_back(level);
  }
  return levels;
}

const char* simd_level_name() {
  return to_string(best_simd_level());
}

}  // namespace strata::optim
