// What a tensor is, independent of where it lives: the vocabulary shared by model inventories,
// the memory tiers, the scheduler and the C API. Values equal strata.h's STRATA_DTYPE_* and
// STRATA_KIND_* (checked at compile time in c_api_values.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

enum class DType : uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kInt8 = 3, kUInt8 = 4 };
inline constexpr int kDTypeCount = 5;

enum class TensorKind : uint8_t {
  kParameter = 0,     // low-precision weights the forward and backward read
  kGradient = 1,      // low-precision gradients backward produces
  kMasterWeight = 2,  // fp32 master copy the optimizer updates
  kAdamM = 3,
  kAdamV = 4,
  kActivationCheckpoint = 5,
  kOther = 6,
};
inline constexpr int kTensorKindCount = 7;

constexpr uint32_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kInt8:
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

const char* to_string(DType dtype);
const char* to_string(TensorKind kind);

// The optimizer's fp32 states of a parameter (kinds kMasterWeight, kAdamM, kAdamV) are tensors
// of its own, one per sub-group, named "<parameter>.<word>[<sub-group>]" with the words of
// torch.optim.AdamW's state: "master", "exp_avg", "exp_avg_sq". Its messages and traces use
// these names, and so do the planner's simulated traces (sched::runtime_state_name). The word is
// nullptr for another kind (whose name then takes to_string(kind) as its word).
const char* optimizer_state_word(TensorKind kind);
std::string optimizer_state_name(const std::string& parameter, TensorKind kind, uint64_t sub_group);

struct TensorSpec {
  std::string name;             // "layers.3.mlp.up_proj.weight", "layers.3.mlp.up_proj.weight/m"
  std::vector<uint64_t> shape;  // empty for a flat buffer
  DType dtype = DType::kBFloat16;
  TensorKind kind = TensorKind::kParameter;
  int32_t layer = -1;  // -1: not part of a transformer layer (embedding, head, final norm)

  uint64_t elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const { return elements() * dtype_size(dtype); }
};

}  // namespace strata
