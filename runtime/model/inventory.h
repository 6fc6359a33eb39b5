// Every tensor a training step touches, in forward order: what the memory plans, the scheduler,
// the simulator and the planner size themselves from.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_config.h"
#include "vocabulary/tensor_spec.h"

namespace strata {

struct InventoryOptions {
  double scale = 1.0;  // width factor, see scale_model(); must be > 0
  int layers = -1;     // transformer layers to include; -1: all of the config's
  DType param_dtype = DType::kBFloat16;
  bool include_gradients = true;  // "#grad" in param_dtype
  bool include_optimizer = true;  // "#master" (fp32, for fp32 parameters too), "#adam_m/v"
};

// Tensors in forward order: "embed_tokens.weight", then per layer "layers.N.input_layernorm",
// attention (q/k/v/o, GQA-sized k/v, biases where the config has them), "post_attention_layernorm",
// the MLP (gate/up/down, or for MoE "block_sparse_moe.gate" (router) and
// "block_sparse_moe.experts.E.w1/w3/w2" as in HF Mixtral), then "norm.weight" and "lm_head.weight"
// (absent when tied). Each parameter is followed by its states: "NAME#grad", "NAME#master",
// "NAME#adam_m", "NAME#adam_v". Shapes are [out, in] like torch.nn.Linear. layer = -1 outside the
// transformer layers. Options must pass check_inventory_options (an invariant, not input checking).
std::vector<TensorSpec> build_inventory(const ModelConfig& config, const InventoryOptions& options);

// Scale and layer limits a user-supplied InventoryOptions must satisfy.
Status check_inventory_options(const InventoryOptions& options);

// Sums over an inventory, by kind.
struct InventoryTotals {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t bytes_by_kind[kTensorKindCount] = {};
  uint64_t elements_by_kind[kTensorKindCount] = {};
  uint64_t largest_tensor_bytes = 0;
  uint64_t largest_parameter_elements = 0;  // over kParameter only
};
InventoryTotals summarize(const std::vector<TensorSpec>& inventory);

}  // namespace strata
