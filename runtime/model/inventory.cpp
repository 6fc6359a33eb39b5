#include "model/inventory.h"

#include <algorithm>
#include <string>

#include "common/assert.h"

namespace strata {
namespace {

class InventoryBuilder {
 public:
  InventoryBuilder(const InventoryOptions& options, std::vector<TensorSpec>& out)
      : options_(options), out_(out) {}

  // Adds one parameter and the training states the options ask for.
  void parameter(const std::string& name, std::vector<uint64_t> shape, int32_t layer) {
    const DType low = options_.param_dtype;
    out_.push_back({name, shape, low, TensorKind::kParameter, layer});
    if (options_.include_gradients) {
      out_.push_back({name + "#grad", shape, low, TensorKind::kGradient, layer});
    }
    if (options_.include_optimizer) {
      // An fp32 master for every parameter, fp32 ones included: both offload engines keep a
      // copy of their own. Strata's optimizer registers a master sub-group beside m and v for
      // every parameter (optim/tiered_optimizer.cpp, add_param); DeepSpeed 0.16.5 gives every
      // sub-group an fp32 master, on NVMe (stage3.py:868-871) or cloned in memory (900-906),
      // whatever the model's dtype. Only torch's own AdamW updates fp32 weights in place, which
      // the planner counts without an inventory (plan.cpp, optimizer_bytes_per_param).
      out_.push_back({name + "#master", shape, DType::kFloat32, TensorKind::kMasterWeight, layer});
      out_.push_back({name + "#adam_m", shape, DType::kFloat32, TensorKind::kAdamM, layer});
      out_.push_back(
          {name + "#adam_v", std::move(shape), DType::kFloat32, TensorKind::kAdamV, layer});
    }
  }

  void linear(const std::string& prefix, uint64_t in, uint64_t out, bool bias, int32_t layer) {
    parameter(prefix + ".weight", {out, in}, layer);
    if (bias) parameter(prefix + ".bias", {out}, layer);
  }

 private:
  const InventoryOptions& options_;
  std::vector<TensorSpec>& out_;
};

size_t states_per_parameter(const InventoryOptions& o) {
  size_t n = 1;
  if (o.include_gradients) ++n;
  if (o.include_optimizer) n += 3;
  return n;
}

}  // namespace

Status check_inventory_options(const InventoryOptions& options) {
  return check_scale_options(options.scale, options.layers);
}

std::vector<TensorSpec> build_inventory(const ModelConfig& config,
                                        const InventoryOptions& options) {
  STRATA_ASSERT(check_inventory_options(options).is_ok());
  const ModelConfig c = scale_model(config, options.scale, options.layers);
  STRATA_ASSERT(validate(c).is_ok());

  const uint64_t h = c.hidden_size;
  const uint64_t experts = c.is_moe() ? c.num_local_experts : 1;
  const size_t params_per_layer = (c.qkv_bias ? 7 : 4) + (c.o_bias ? 1 : 0) + 2 +
                                  (c.is_moe() ? 1 : 0) + experts * (c.mlp_bias ? 6 : 3);
  std::vector<TensorSpec> out;
  out.reserve(states_per_parameter(options) * (c.num_hidden_layers * params_per_layer + 3));
  InventoryBuilder b(options, out);

  b.parameter("embed_tokens.weight", {c.vocab_size, h}, -1);
  for (uint32_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto layer = static_cast<int32_t>(i);
    const std::string p = "layers." + std::to_string(i) + ".";
    b.parameter(p + "input_layernorm.weight", {h}, layer);
    b.linear(p + "self_attn.q_proj", h, c.q_dim(), c.qkv_bias, layer);
    b.linear(p + "self_attn.k_proj", h, c.kv_dim(), c.qkv_bias, layer);
    b.linear(p + "self_attn.v_proj", h, c.kv_dim(), c.qkv_bias, layer);
    b.linear(p + "self_attn.o_proj", c.q_dim(), h, c.o_bias, layer);
    b.parameter(p + "post_attention_layernorm.weight", {h}, layer);
    if (c.is_moe()) {
      b.parameter(p + "block_sparse_moe.gate.weight", {c.num_local_experts, h}, layer);
      for (uint32_t e = 0; e < c.num_local_experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        b.linear(x + "w1", h, c.intermediate_size, c.mlp_bias, layer);  // gate
        b.linear(x + "w3", h, c.intermediate_size, c.mlp_bias, layer);  // up
        b.linear(x + "w2", c.intermediate_size, h, c.mlp_bias, layer);  // down
      }
    } else {
      b.linear(p + "mlp.gate_proj", h, c.intermediate_size, c.mlp_bias, layer);
      b.linear(p + "mlp.up_proj", h, c.intermediate_size, c.mlp_bias, layer);
      b.linear(p + "mlp.down_proj", c.intermediate_size, h, c.mlp_bias, layer);
    }
  }
  b.parameter("norm.weight", {h}, -1);
  if (!c.tie_word_embeddings) b.parameter("lm_head.weight", {c.vocab_size, h}, -1);
  return out;
}

InventoryTotals summarize(const std::vector<TensorSpec>& inventory) {
  InventoryTotals t;
  for (const TensorSpec& spec : inventory) {
    const uint64_t bytes = spec.bytes();
    const auto kind = static_cast<size_t>(spec.kind);
    ++t.tensors;
    t.bytes += bytes;
    t.bytes_by_kind[kind] += bytes;
    t.elements_by_kind[kind] += spec.elements();
    t.largest_tensor_bytes = std::max(t.largest_tensor_bytes, bytes);
    if (spec.kind == TensorKind::kParameter) {
      t.largest_parameter_elements = std::max(t.largest_parameter_elements, spec.elements());
    }
  }
  return t;
}

}  // namespace strata
