#include "vocabulary/tensor_spec.h"

namespace strata {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
  }
  return "?";
}

const char* optimizer_state_word(TensorKind kind) {
  switch (kind) {
    case TensorKind::kMasterWeight:
      return "master";
    case TensorKind::kAdamM:
      return "exp_avg";
    case TensorKind::kAdamV:
      return "exp_avg_sq";
    default:
      return nullptr;
  }
}

std::string optimizer_state_name(const std::string& parameter, TensorKind kind,
                                 uint64_t sub_group) {
  const char* word = optimizer_state_word(kind);
  return parameter + "." + (word != nullptr ? word : to_string(kind)) + "[" +
         std::to_string(sub_group) + "]";
}

const char* to_string(TensorKind kind) {
  switch (kind) {
    case TensorKind::kParameter:
      return "parameter";
    case TensorKind::kGradient:
      return "gradient";
    case TensorKind::kMasterWeight:
      return "master_weight";  // STRATA_KIND_MASTER_WEIGHT, as traces and Python name it
    case TensorKind::kAdamM:
      return "adam_m";
    case TensorKind::kAdamV:
      return "adam_v";
    case TensorKind::kActivationCheckpoint:
      return "activation_checkpoint";
    case TensorKind::kOther:
      return "other";
  }
  return "?";
}

}  // namespace strata
