// Which instruction set the CPU optimizer kernels use. One binary carries every level; the best
// one the CPU supports is chosen at run time unless a caller forces another (tests compare them,
// and users can rule out a path they distrust).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace strata::optim {

enum class SimdLevel : uint8_t {
  kScalar = 0,  // portable C++, any x86-64 (or any other architecture)
  kAvx2 = 1,    // AVX2 + FMA + F16C (Haswell, Zen and later)
  kAvx512 = 2,  // AVX512F + AVX512BW + AVX512VL (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4)
};

// "scalar", "avx2", "avx512".
const char* to_string(SimdLevel level);
// Accepts the names to_string returns.
std::optional<SimdLevel> parse_simd_level(std::string_view name);

// Whether this CPU (and OS, for the register state) can run the level and this build has it.
bool cpu_supports(SimdLevel level);
// The fastest level cpu_supports.
SimdLevel best_simd_level();
// Every level cpu_supports, from kScalar up.
std::vector<SimdLevel> supported_simd_levels();
// The name of best_simd_level(), for `strata doctor` and logs.
const char* simd_level_name();

}  // namespace strata::optim
