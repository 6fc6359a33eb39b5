// `strata bench finetune --method lora|qlora` before any worker runs: the inventory it trains
// (the base frozen, adapters after the weights they adapt, counted as the planner counts them),
// the bytes QLoRA stores, and the FLOPs its modelled compute waits for.
#include <gtest/gtest.h>
#include <strata/strata.h>

#include <string>
#include <vector>

#include "finetune/finetune_options.h"
#include "finetune/layer_compute.h"
#include "model/plan.h"
#include "model/test_dir.h"

namespace strata::bench::finetune {
namespace {

FinetuneOptions lora_options(const std::string& method) {
  FinetuneOptions o;
  o.model = "llama-2-7b";
  o.scale = 0.05;
  o.layers = 2;
  o.method = method;
  o.nvme_dir = testing::scratch_dir("lora-plan-" + method).string();
  return o;
}

TEST(LoraBenchPlan, AdaptersFollowTheirWeightsAndCountAsThePlannerCounts) {
  FinetuneOptions o = lora_options("lora");
  o.lora_rank = 8;
  o.lora_targets = "q,v";
  Result<FinetunePlan> plan = make_plan(o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  EXPECT_EQ(plan->options.strategy, "strata");
  ASSERT_EQ(plan->contenders.size(), 2u);  // strata and strata-overlap, no DeepSpeed
  const auto& inv = plan->inventory;
  ASSERT_EQ(inv.size(), plan->roles.size());
  uint64_t adapters = 0, frozen = 0;
  for (size_t i = 0; i < inv.size(); ++i) {
    const std::string& name = inv[i].name;
    if (plan->roles[i] != TensorRole::kTrained) {
      ++frozen;
      EXPECT_EQ(inv[i].kind, TensorKind::kParameter) << name;
      EXPECT_EQ(plan->roles[i], TensorRole::kFrozen) << name;  // lora: nothing in NF4
      continue;
    }
    // An adapter right after its weight (or after the other adapter), then its gradient.
    ASSERT_TRUE(name.find(".lora_A") != std::string::npos ||
                name.find(".lora_B") != std::string::npos)
        << name;
    EXPECT_TRUE(name.find("q_proj") != std::string::npos ||
                name.find("v_proj") != std::string::npos)
        << name;
    if (inv[i].kind == TensorKind::kGradient) {
      EXPECT_EQ(inv[i - 1].name + "#grad", name);
      continue;
    }
    adapters += inv[i].elements();
    const size_t weight = name.find(".lora_A") != std::string::npos ? i - 1 : i - 3;
    EXPECT_EQ(inv[weight].name, name.substr(0, name.rfind('.')) + ".weight");
    if (name.ends_with(".lora_A")) {
      EXPECT_EQ(inv[i].shape, (std::vector<uint64_t>{8, inv[weight].shape[1]}));
    } else {
      EXPECT_EQ(inv[i].shape, (std::vector<uint64_t>{inv[weight].shape[0], 8}));
    }
  }
  EXPECT_GT(frozen, 0u);
  EXPECT_EQ(adapters, plan->adapter_parameters);
  LoraTargets qv{false, false, false, false, false, false, false};
  qv.q = qv.v = true;
  EXPECT_EQ(plan->adapter_parameters, lora_trainable_parameters(plan->model, 8, qv));
}

TEST(LoraBenchPlan, QloraStoresLayerLinearWeightsInNf4Only) {
  Result<FinetunePlan> plan = make_plan(lora_options("qlora"));
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  uint64_t stored = 0;
  for (size_t i = 0; i < plan->inventory.size(); ++i) {
    const TensorSpec& t = plan->inventory[i];
    if (plan->roles[i] == TensorRole::kTrained) continue;
    const bool nf4 = plan->roles[i] == TensorRole::kFrozenNf4;
    EXPECT_EQ(nf4, qlora_quantizes(t)) << t.name;
    EXPECT_EQ(stored_bytes(*plan, i), nf4 ? strata_nf4_packed_bytes(t.elements()) : t.bytes())
        << t.name;
    stored += stored_bytes(*plan, i);
  }
  EXPECT_EQ(stored, plan->frozen_stored_bytes);
}

TEST(LoraBenchPlan, FrozenWeightsCostTheInputGradientOnlyInBackward) {
  const TensorSpec weight{
      "layers.0.mlp.up_proj.weight", {64, 32}, DType::kBFloat16, TensorKind::kParameter, 0};
  const TensorSpec embed{
      "embed_tokens.weight", {100, 32}, DType::kBFloat16, TensorKind::kParameter, -1};
  int grad = 0;
  const ComputeTensor trained{&weight, nullptr, &grad, nullptr, false};
  const ComputeTensor frozen{&weight, nullptr, nullptr, nullptr, true};
  const ComputeTensor lookup{&embed, nullptr, nullptr, nullptr, false};
  const std::vector<ComputeTensor> both = {trained, frozen, lookup};
  const double n = 64.0 * 32.0, tokens = 10.0;
  EXPECT_DOUBLE_EQ(compute_flops(both, 10, false), 2 * (2 * n * tokens));
  EXPECT_DOUBLE_EQ(compute_flops(both, 10, true), 4 * n * tokens + 2 * n * tokens);
  // Only the NF4 one is dequantized: its packing read, bf16 written.
  EXPECT_EQ(dequantize_bytes(both), strata_nf4_packed_bytes(64 * 32) + 64 * 32 * 2);
}

}  // namespace
}  // namespace strata::bench::finetune
