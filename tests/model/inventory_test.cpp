#include "model/inventory.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace strata {
namespace {

ModelConfig preset(const std::string& name) {
  Result<ModelConfig> r = load_model(name);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? *r : ModelConfig{};
}

const TensorSpec* find(const std::vector<TensorSpec>& inventory, const std::string& name) {
  for (const auto& spec : inventory) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

TEST(Inventory, ParametersAddUpToTheExactCountForEveryPreset) {
  for (const auto& name : model_preset_names()) {
    const ModelConfig config = preset(name);
    InventoryOptions options;
    options.include_gradients = options.include_optimizer = false;
    const InventoryTotals t = summarize(build_inventory(config, options));
    EXPECT_EQ(t.elements_by_kind[static_cast<int>(TensorKind::kParameter)], parameter_count(config))
        << name;
  }
}

TEST(Inventory, MixedPrecisionAdamNeedsSixteenBytesPerParameter) {
  const ModelConfig llama70 = preset("llama-2-70b");
  const InventoryTotals t = summarize(build_inventory(llama70, {}));
  const uint64_t params = parameter_count(llama70);
  EXPECT_EQ(t.bytes, 16 * params);
  EXPECT_NEAR(static_cast<double>(t.bytes) / 1e12, 1.10, 0.005);  // "1.10 TB for Llama-2-70B"
  auto kind_bytes = [&](TensorKind k) { return t.bytes_by_kind[static_cast<int>(k)]; };
  EXPECT_EQ(kind_bytes(TensorKind::kParameter), 2 * params);
  EXPECT_EQ(kind_bytes(TensorKind::kGradient), 2 * params);
  EXPECT_EQ(kind_bytes(TensorKind::kMasterWeight), 4 * params);
  EXPECT_EQ(kind_bytes(TensorKind::kAdamM), 4 * params);
  EXPECT_EQ(kind_bytes(TensorKind::kAdamV), 4 * params);
}

// The offload engines keep an fp32 master of fp32 weights too (Strata's optimizer registers one
// per sub-group, DeepSpeed clones or swaps one): the inventory is what they hold. Until
// 2026-12-05 it left fp32 masters out, and the simulated optimizer step refused the sub-grouped
// parameters ("different numbers of master, m and v sub-groups"), failing every fp32 full plan.
TEST(Inventory, Fp32ParametersKeepAMasterCopyAsTheOffloadEnginesDo) {
  InventoryOptions options;
  options.param_dtype = DType::kFloat32;
  const ModelConfig tiny = preset("tinyllama-1.1b");
  const InventoryTotals t = summarize(build_inventory(tiny, options));
  EXPECT_EQ(t.bytes_by_kind[static_cast<int>(TensorKind::kMasterWeight)],
            4 * parameter_count(tiny));
  EXPECT_EQ(t.bytes, 20 * parameter_count(tiny));  // 4 weight + 4 grad + 4 master + 4 m + 4 v
}

TEST(Inventory, NamesShapesAndStatesFollowTheHuggingFaceLayout) {
  const auto inv = build_inventory(preset("llama-2-70b"), {});
  const TensorSpec* up = find(inv, "layers.3.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape, (std::vector<uint64_t>{28672, 8192}));
  EXPECT_EQ(up->layer, 3);
  EXPECT_EQ(up->kind, TensorKind::kParameter);
  EXPECT_EQ(up->dtype, DType::kBFloat16);
  // GQA: k/v project to num_key_value_heads * head_dim.
  EXPECT_EQ(find(inv, "layers.0.self_attn.k_proj.weight")->shape,
            (std::vector<uint64_t>{1024, 8192}));
  EXPECT_EQ(find(inv, "layers.0.self_attn.q_proj.weight")->shape,
            (std::vector<uint64_t>{8192, 8192}));
  EXPECT_EQ(find(inv, "layers.79.post_attention_layernorm.weight")->shape,
            (std::vector<uint64_t>{8192}));
  const TensorSpec* grad = find(inv, "layers.3.mlp.up_proj.weight#grad");
  ASSERT_NE(grad, nullptr);
  EXPECT_EQ(grad->kind, TensorKind::kGradient);
  EXPECT_EQ(grad->dtype, DType::kBFloat16);
  for (const char* suffix : {"#master", "#adam_m", "#adam_v"}) {
    const TensorSpec* state = find(inv, std::string("layers.3.mlp.up_proj.weight") + suffix);
    ASSERT_NE(state, nullptr) << suffix;
    EXPECT_EQ(state->dtype, DType::kFloat32);
    EXPECT_EQ(state->shape, up->shape);
  }
  EXPECT_EQ(find(inv, "layers.3.mlp.up_proj.weight#master")->kind, TensorKind::kMasterWeight);
  // Forward order: embedding first, LM head last, outside any layer.
  EXPECT_EQ(inv.front().name, "embed_tokens.weight");
  EXPECT_EQ(inv.front().layer, -1);
  EXPECT_EQ(inv[inv.size() - 5].name, "lm_head.weight");
  EXPECT_EQ(inv.back().name, "lm_head.weight#adam_v");
}

TEST(Inventory, TiedEmbeddingsHaveNoSeparateHeadAndQwenHasQkvBiases) {
  const auto inv = build_inventory(preset("qwen2.5-0.5b"), {});
  EXPECT_EQ(find(inv, "lm_head.weight"), nullptr);
  ASSERT_NE(find(inv, "layers.0.self_attn.k_proj.bias"), nullptr);
  EXPECT_EQ(find(inv, "layers.0.self_attn.k_proj.bias")->shape, (std::vector<uint64_t>{128}));
  EXPECT_EQ(find(inv, "layers.0.self_attn.o_proj.bias"), nullptr);
}

TEST(Inventory, MoeLayersHoldEveryExpertAndTheRouter) {
  const ModelConfig mixtral = preset("mixtral-8x7b");
  const auto inv = build_inventory(mixtral, {});
  const TensorSpec* router = find(inv, "layers.0.block_sparse_moe.gate.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->shape, (std::vector<uint64_t>{8, 4096}));
  for (int e = 0; e < 8; ++e) {
    const std::string x = "layers.31.block_sparse_moe.experts." + std::to_string(e) + ".";
    ASSERT_NE(find(inv, x + "w1.weight"), nullptr) << e;
    EXPECT_EQ(find(inv, x + "w2.weight")->shape, (std::vector<uint64_t>{4096, 14336}));
    EXPECT_EQ(find(inv, x + "w3.weight")->shape, (std::vector<uint64_t>{14336, 4096}));
  }
  EXPECT_EQ(find(inv, "layers.0.block_sparse_moe.experts.8.w1.weight"), nullptr);
  EXPECT_EQ(find(inv, "layers.0.mlp.up_proj.weight"), nullptr);
}

// Shapes relative to hidden size, as a multiset: the "mix" a scaled-down benchmark must keep.
std::multiset<std::string> shape_mix(const std::vector<TensorSpec>& inv, int layer) {
  std::multiset<std::string> mix;
  for (const auto& spec : inv) {
    if (spec.layer != layer || spec.kind != TensorKind::kParameter) continue;
    std::string key = spec.name.substr(spec.name.find('.', spec.name.find('.') + 1) + 1) + ":";
    for (uint64_t d : spec.shape) key += std::to_string(d) + ",";
    mix.insert(key);
  }
  return mix;
}

TEST(Inventory, ScaleShrinksWidthButKeepsTheMixOfShapes) {
  const ModelConfig llama70 = preset("llama-2-70b");
  InventoryOptions options;
  options.scale = 0.125;
  options.layers = 2;
  const auto small = build_inventory(llama70, options);
  const ModelConfig scaled = scale_model(llama70, 0.125, 2);
  // Same tensors per layer, same ratios: q is square, k/v are 1/8 of q, MLP is 3.5x hidden.
  EXPECT_EQ(shape_mix(small, 0).size(), shape_mix(build_inventory(llama70, {}), 0).size());
  EXPECT_EQ(find(small, "layers.1.self_attn.q_proj.weight")->shape,
            (std::vector<uint64_t>{1024, 1024}));
  EXPECT_EQ(find(small, "layers.1.self_attn.k_proj.weight")->shape,
            (std::vector<uint64_t>{128, 1024}));
  EXPECT_EQ(find(small, "layers.1.mlp.down_proj.weight")->shape,
            (std::vector<uint64_t>{1024, 3584}));
  EXPECT_EQ(find(small, "embed_tokens.weight")->shape, (std::vector<uint64_t>{4000, 1024}));
  EXPECT_EQ(find(small, "layers.2.mlp.up_proj.weight"), nullptr);
  InventoryOptions params_only = options;
  params_only.include_gradients = params_only.include_optimizer = false;
  EXPECT_EQ(summarize(build_inventory(llama70, params_only))
                .elements_by_kind[static_cast<int>(TensorKind::kParameter)],
            parameter_count(scaled));
}

TEST(Inventory, LayersAloneSetsTheDepth) {
  const ModelConfig tiny = preset("tinyllama-1.1b");
  InventoryOptions options;
  options.layers = 3;
  const auto inv = build_inventory(tiny, options);
  std::set<int32_t> layers;
  for (const auto& spec : inv) layers.insert(spec.layer);
  EXPECT_EQ(layers, (std::set<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(find(inv, "layers.0.mlp.gate_proj.weight")->shape, (std::vector<uint64_t>{5632, 2048}));
}

TEST(Inventory, StatesCanBeLeftOut) {
  InventoryOptions options;
  options.include_optimizer = false;
  const ModelConfig tiny = preset("tinyllama-1.1b");
  const InventoryTotals t = summarize(build_inventory(tiny, options));
  EXPECT_EQ(t.bytes, 4 * parameter_count(tiny));
  EXPECT_EQ(t.largest_parameter_elements, 32000u * 2048u);
  EXPECT_FALSE(check_inventory_options({.scale = 0.0}).is_ok());
  EXPECT_FALSE(check_inventory_options({.layers = 0}).is_ok());
}

}  // namespace
}  // namespace strata
