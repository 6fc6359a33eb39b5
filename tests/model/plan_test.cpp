#include "model/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "common/align.h"
#include "model/inventory.h"
#include "model/plan_report.h"
#include "sched/memory_plan.h"

namespace strata {
namespace {

ModelConfig preset(const std::string& name) {
  Result<ModelConfig> r = load_model(name);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? *r : ModelConfig{};
}

GpuChoice gpu(const std::string& name, uint32_t count = 1) {
  Result<GpuChoice> g = parse_gpu_choice(name + ":" + std::to_string(count));
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? *g : GpuChoice{};
}

PlanRequest request(const std::string& model, FinetuneMethod method) {
  PlanRequest r;
  r.model = preset(model);
  r.method = method;
  r.nvme = *parse_nvme("1:gen4");
  return r;
}

// The GPU plans alone (make_gpu_plans): most tests need neither the comparison with
// ZeRO-Infinity nor the advice, whose extra simulations would make the suite slow.
Plan must_plan(const PlanRequest& r) {
  Result<Plan> p = make_gpu_plans(r);
  EXPECT_TRUE(p.is_ok()) << p.status().message();
  return p.is_ok() ? *p : Plan{};
}

// The GPU plans and the comparison with ZeRO-Infinity (no advice).
Plan must_compare(const PlanRequest& r) {
  Plan p = must_plan(r);
  const Status compared = compare_with_zero_infinity(p);
  EXPECT_TRUE(compared.is_ok()) << compared.message();
  return p;
}

double gib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1ull << 30);
}

// ---- LoRA ------------------------------------------------------------------------------------

TEST(LoraParameters, MatchPeftCountsForLlama2_7b) {
  const ModelConfig llama7 = preset("llama-2-7b");
  // r * (in + out) per adapted matrix: 8 * (4096 + 4096) * 4 projections * 32 layers.
  EXPECT_EQ(lora_trainable_parameters(llama7, 8, *parse_lora_targets("q,k,v,o")), 8'388'608u);
  // PEFT's Llama default (q_proj, v_proj), r = 8: "trainable params: 4,194,304".
  EXPECT_EQ(lora_trainable_parameters(llama7, 8, *parse_lora_targets("q_proj,v_proj")), 4'194'304u);
  // All linear layers, r = 16: "trainable params: 39,976,960".
  EXPECT_EQ(lora_trainable_parameters(llama7, 16, LoraTargets{}), 39'976'960u);
}

TEST(LoraParameters, GqaAndMoeUseTheRealShapesAndSkipTheRouter) {
  const ModelConfig llama70 = preset("llama-2-70b");
  // k/v are 8192 -> 1024: r * (8192 + 1024) each.
  const uint64_t per_layer = 2 * 8 * (8192 + 8192) + 2 * 8 * (8192 + 1024);
  EXPECT_EQ(lora_trainable_parameters(llama70, 8, *parse_lora_targets("q,k,v,o")), 80 * per_layer);
  const ModelConfig mixtral = preset("mixtral-8x7b");
  // gate/up/down map to every expert's w1/w3/w2.
  EXPECT_EQ(lora_trainable_parameters(mixtral, 4, *parse_lora_targets("up")),
            32u * 8u * 4u * (4096u + 14336u));
}

TEST(LoraTargets, ParseListsAndRejectUnknownNames) {
  Result<LoraTargets> t = parse_lora_targets("q,v");
  ASSERT_TRUE(t.is_ok());
  EXPECT_TRUE(t->q && t->v);
  EXPECT_FALSE(t->k || t->o || t->gate || t->up || t->down);
  EXPECT_EQ(to_string(*t), "q,v");
  EXPECT_EQ(to_string(*parse_lora_targets("all-linear")), "all-linear");
  EXPECT_FALSE(parse_lora_targets("q,lm_head").is_ok());
  EXPECT_FALSE(parse_lora_targets("").is_ok());
}

// ---- QLoRA -----------------------------------------------------------------------------------

uint64_t nf4(uint64_t n) {  // 4-bit codes, 8-bit absmax per 64, fp32 per 256 absmax, fp32 offset
  return n / 2 + n / 64 + 4 * ((n / 64 + 255) / 256) + 4;
}

TEST(QloraWeights, AreHalfAByteAParameterPlusQuantizationConstants) {
  const ModelConfig llama7 = preset("llama-2-7b");
  const uint64_t per_layer = 4 * nf4(4096ull * 4096) + 3 * nf4(4096ull * 11008);
  const uint64_t bf16_rest = 2 * (2 * 32000ull * 4096 + 2 * 4096 * 32 + 4096);
  EXPECT_EQ(qlora_base_weight_bytes(llama7, DType::kBFloat16), 32 * per_layer + bf16_rest);
  EXPECT_EQ(32 * per_layer, 3'340'772'224u);

  const ModelConfig llama70 = preset("llama-2-70b");
  const uint64_t q = qlora_quantized_parameters(llama70);
  const uint64_t rest = parameter_count(llama70) - q;
  const double per_quantized =
      static_cast<double>(qlora_base_weight_bytes(llama70, DType::kBFloat16) - 2 * rest) / q;
  // 4 bits + 8/64 bits + 32/(64*256) bits = 4.127 bits (QLoRA paper, section 3).
  EXPECT_NEAR(per_quantized * 8, 4.127, 0.001);
  // 68.45e9 quantized x 4.127 bits + 0.53e9 bf16 parameters x 2 B = 36.36 GB.
  EXPECT_NEAR(static_cast<double>(qlora_base_weight_bytes(llama70, DType::kBFloat16)) / 1e9, 36.36,
              0.01);
}

// ---- Activations -----------------------------------------------------------------------------

// Llama-3.1-8B: h 4096, 32 heads of 128, 8 KV heads (kv 1024), intermediate 14336; bf16.
constexpr uint64_t kH = 4096, kKv = 1024, kInter = 14336, kHeads = 32, kHeadDim = 128;
// The two norms' fp32 input copies and 1/rms, and their bf16 outputs when the weights train.
constexpr uint64_t kNormsFull = 2 * (4 * kH + 4 + 2 * kH);
constexpr uint64_t kNormsFrozen = 2 * (4 * kH + 4);
// q, k and v's input, RoPE's cos and sin.
constexpr uint64_t kAttentionInputs = 2 * kH + 2 * 2 * kHeadDim;
// Flash: q, k, v, the output, the log-sum-exp.
constexpr uint64_t kFlash = 2 * (kH + kKv + kKv + kH) + 4 * kHeads;
// The gated MLP's input and four intermediates.
constexpr uint64_t kMlp = 2 * kH + 4 * 2 * kInter;

TEST(Activations, ALlamaLayerKeepsEachSavedTensorOnce) {
  const ModelConfig m = preset("llama-3.1-8b");
  const uint64_t s = 4096;
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kFlash, false),
            s * (kNormsFull + kAttentionInputs + kFlash + kMlp));
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kFlash, false),
            824'737'792u);  // 201,352 bytes a token: 49 x h, against GPT's 34 x h
  // Batch scales linearly.
  EXPECT_EQ(activation_bytes_per_layer(m, s, 3, DType::kBFloat16, Attention::kFlash, false),
            3 * 824'737'792ull);
  // Eager: q, k and v repeated to 32 heads, o_proj's input copied, and with the scores the
  // softmax's fp32 output beside its bf16 copy: 6 bytes a score against Korthikanti's 5.
  const uint64_t eager = s * (kNormsFull + kAttentionInputs + 4 * 2 * kH + kMlp);
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kEager, false), eager);
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kEager, true),
            eager + (4 + 2) * kHeads * s * s);
  // fp32: the softmax's output is the tensor the product keeps: 4 bytes a score.
  const uint64_t eager32 =
      activation_bytes_per_layer(m, s, 1, DType::kFloat32, Attention::kEager, true) -
      activation_bytes_per_layer(m, s, 1, DType::kFloat32, Attention::kEager, false);
  EXPECT_EQ(eager32, 4 * kHeads * s * s);
}

TEST(Activations, FollowTheCheckpointingMode) {
  const ModelConfig m = preset("llama-3.1-8b");
  const uint64_t s = 2048;
  const uint64_t layer_eager =
      activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kEager, true);
  const uint64_t layer_no_scores =
      activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kEager, false);
  EXPECT_EQ(activation_bytes(m, s, 1, Checkpointing::kNone, DType::kBFloat16, Attention::kEager),
            32 * layer_eager);
  // Selective recomputation drops the scores.
  EXPECT_EQ(
      activation_bytes(m, s, 1, Checkpointing::kSelective, DType::kBFloat16, Attention::kEager),
      32 * layer_no_scores);
  // Full checkpointing: each layer's bf16 input, plus one layer being recomputed.
  EXPECT_EQ(activation_bytes(m, s, 1, Checkpointing::kFull, DType::kBFloat16, Attention::kEager),
            32 * 2 * s * kH + layer_eager);
}

TEST(Activations, AdaptersKeepOnlyTheInputsOfTheLinearsTheyAdapt) {
  const ModelConfig m = preset("llama-3.1-8b");
  const uint64_t s = 4096;
  // All linears adapted at rank 16: the frozen norms keep no bf16 output; every input stays
  // (A's), and B keeps A's 16 outputs a token for each of the 7.
  const SavedInputs all = saved_inputs(FinetuneMethod::kLora, LoraTargets{}, 16);
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kFlash, false, all),
            s * (kNormsFrozen + kAttentionInputs + kFlash + kMlp + 7 * 2 * 16));
  // PEFT's Llama default, q and v: the MLP keeps its intermediates only (SiLU's input and the
  // product's factors), not its input nor down's.
  const SavedInputs qv =
      saved_inputs(FinetuneMethod::kQLora, *parse_lora_targets("q_proj,v_proj"), 16);
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kFlash, false, qv),
            s * (kNormsFrozen + kAttentionInputs + kFlash + 3 * 2 * kInter + 2 * 2 * 16));
  // Eager attention keeps o_proj's input only when o is adapted.
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kEager, false, all) -
                activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kEager, false, qv),
            s * (2 * kH + 2 * kH + 2 * kInter + 5 * 2 * 16));  // o's, the MLP's, down's inputs
}

TEST(Activations, MoeLayersStoreTheMlpPartPerRoutedExpert) {
  ModelConfig m = preset("mixtral-8x7b");  // the same attention and MLP shapes, 8 experts, top 2
  const uint64_t s = 4096;
  // The router's input and fp32 probabilities; per routed expert the gathered input's copy, the
  // MLP, its output kept by the routing weight's product, the product kept by index_add_, and
  // the routing's three int64 indices, fp32 probability and bf16 weight; the renormalising sum.
  const uint64_t moe = 2 * kH + 4 * 8 + 2 * (kMlp + 2 * kH + 2 * kH) + 2 * (3 * 8 + 4 + 2) + 4;
  EXPECT_EQ(activation_bytes_per_layer(m, s, 1, DType::kBFloat16, Attention::kFlash, false),
            s * (kNormsFull + kAttentionInputs + kFlash + moe));
  EXPECT_EQ(logits_bytes(m, 4096, 1, DType::kBFloat16), 4096ull * 32000 * 10);
}

// ---- DeepSpeed's estimator -------------------------------------------------------------------

double gb2(uint64_t bytes) {
  return std::round(gib(bytes) * 100) / 100;
}

TEST(DeepSpeedEstimator, ReproducesStage3PrintoutForT5Small) {
  // estimate_zero3_model_states_mem_needs_all_live(t5-small) on 1 GPU prints
  // "60M total params, 16M largest layer params" and, per CPU | per GPU:
  //  1.52GB | 0.06GB  offload_param=cpu,  offload_optimizer=cpu,  zero_init=1 (and =0)
  //  1.35GB | 0.17GB  offload_param=none, offload_optimizer=cpu,  zero_init=1 (and =0)
  //  0.09GB | 1.08GB  offload_param=none, offload_optimizer=none, zero_init=1
  //  0.34GB | 1.08GB  offload_param=none, offload_optimizer=none, zero_init=0
  const uint64_t total = 60'506'624, largest = 32128ull * 512;
  Zero3Estimate e = deepspeed_zero3_estimate(total, largest, 1, 1, true, true, true);
  EXPECT_DOUBLE_EQ(gb2(e.cpu_bytes), 1.52);
  EXPECT_DOUBLE_EQ(gb2(e.gpu_bytes), 0.06);
  EXPECT_DOUBLE_EQ(gb2(deepspeed_zero3_estimate(total, largest, 1, 1, true, true, false).cpu_bytes),
                   1.52);
  e = deepspeed_zero3_estimate(total, largest, 1, 1, true, false, true);
  EXPECT_DOUBLE_EQ(gb2(e.cpu_bytes), 1.35);
  EXPECT_DOUBLE_EQ(gb2(e.gpu_bytes), 0.17);
  e = deepspeed_zero3_estimate(total, largest, 1, 1, false, false, true);
  EXPECT_DOUBLE_EQ(gb2(e.cpu_bytes), 0.09);
  EXPECT_DOUBLE_EQ(gb2(e.gpu_bytes), 1.08);
  EXPECT_DOUBLE_EQ(
      gb2(deepspeed_zero3_estimate(total, largest, 1, 1, false, false, false).cpu_bytes), 0.34);
}

TEST(DeepSpeedEstimator, Llama70bFullOffloadNeeds27BytesPerParamOnCpu) {
  const ModelConfig llama70 = preset("llama-2-70b");
  // The largest module is the embedding (and the untied LM head): 32000 x 8192.
  EXPECT_EQ(deepspeed_largest_layer_params(llama70), 262'144'000u);
  const Zero3Estimate ds =
      deepspeed_zero3_estimate(parameter_count(llama70), deepspeed_largest_layer_params(llama70));
  EXPECT_EQ(ds.gpu_bytes, 4 * 262'144'000ull);
  EXPECT_EQ(ds.cpu_bytes, 68'976'648'192ull * 27);  // 18 B/param x 1.5 margin

  // Strata's CPU offload of the same job keeps exact-size states: 16 B/param, no margin.
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kFull);
  r.offload = Offload::kCpu;
  r.gpus = {gpu("h100-sxm")};
  const Plan p = must_plan(r);
  EXPECT_NEAR(static_cast<double>(p.gpus[0].host_bytes), 16.0 * 68'976'648'192, 3 * 4096);
  EXPECT_LT(p.gpus[0].host_bytes, ds.cpu_bytes);
  // Streaming layers needs at least DeepSpeed's largest-layer working set on the GPU.
  EXPECT_GE(p.gpus[0].memory.buffers, ds.largest_layer_memory);
}

// ---- Model states ----------------------------------------------------------------------------

TEST(ModelStates, FullFineTuningIsSixteenBytesPerParameter) {
  const Plan p = must_plan(request("llama-2-70b", FinetuneMethod::kFull));
  EXPECT_EQ(p.states.params, 68'976'648'192u);
  EXPECT_EQ(p.states.trainable_params, p.states.params);
  EXPECT_EQ(p.states.model_state_bytes, 16 * p.states.params);
  EXPECT_NEAR(static_cast<double>(p.states.model_state_bytes) / 1e12, 1.10, 0.005);
  // The same total the inventory gives.
  EXPECT_EQ(p.states.model_state_bytes,
            summarize(build_inventory(preset("llama-2-70b"), {})).bytes);
}

TEST(ModelStates, LoraKeepsFrozenWeightsAndSixteenBytesPerAdapterParameter) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kLora);
  r.lora_rank = 8;
  r.lora_targets = *parse_lora_targets("q,v");
  const Plan p = must_plan(r);
  EXPECT_EQ(p.states.trainable_params, 4'194'304u);
  EXPECT_EQ(p.states.model_state_bytes, 2 * 6'738'415'616ull + 16 * 4'194'304ull);
  r.method = FinetuneMethod::kQLora;
  const Plan q = must_plan(r);
  EXPECT_EQ(q.states.weight_bytes, qlora_base_weight_bytes(r.model, DType::kBFloat16));
}

// ---- Time ------------------------------------------------------------------------------------

TEST(StepTime, FullFineTuningIsSixFlopsPerParameterPerTokenAtTheStatedMfu) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  r.checkpointing = Checkpointing::kNone;
  r.seq_len = 2048;
  r.micro_batch = 1;
  r.grad_accum = 4;
  r.offload = Offload::kNone;
  r.gpus = {gpu("h200")};
  const Plan p = must_plan(r);
  // Matmul parameters: every layer's projections plus the LM head (the embedding is a lookup,
  // norms are elementwise).
  const double n = 6'738'415'616.0 - 32000.0 * 4096 - 4096 - 32 * 2 * 4096;
  EXPECT_EQ(matmul_parameters_per_token(r.model), static_cast<uint64_t>(n));
  // Plus attention's score and context matmuls, 12 * L * h * s per token (PaLM's MFU).
  const double attention = 12.0 * 32 * 4096 * 2048;
  EXPECT_DOUBLE_EQ(attention_flops_per_token(r.model, 2048, Checkpointing::kNone), attention);
  const double expected = (6 * n + attention) * 2048 * 4 / (989e12 * 0.4);
  EXPECT_NEAR(p.gpus[0].step_seconds, expected, expected * 1e-9);
  EXPECT_EQ(p.gpus[0].bottleneck, "compute");
  EXPECT_NEAR(p.gpus[0].tokens_per_s, 2048 * 4 / expected, 1e-6);

  // Full checkpointing adds one forward pass: 8N instead of 6N, 16 L h s instead of 12.
  r.checkpointing = Checkpointing::kFull;
  EXPECT_NEAR(must_plan(r).gpus[0].step_seconds,
              expected * (8 * n + attention * 16 / 12) / (6 * n + attention), expected * 1e-9);
  // MFU is a divisor.
  r.checkpointing = Checkpointing::kNone;
  r.assume.mfu = 0.2;
  EXPECT_NEAR(must_plan(r).gpus[0].step_seconds, 2 * expected, expected * 1e-9);
}

// A LoRA job without checkpointing or offload on one GPU: its step is the compute formula's.
PlanRequest lora_compute_only(const std::string& model, const std::string& gpu_name, uint32_t rank,
                              const std::string& targets) {
  PlanRequest r = request(model, FinetuneMethod::kLora);
  r.checkpointing = Checkpointing::kNone;
  r.offload = Offload::kNone;
  r.gpus = {gpu(gpu_name)};
  r.lora_rank = rank;
  r.lora_targets = *parse_lora_targets(targets);
  return r;
}

TEST(StepTime, LoraSkipsFrozenWeightGradientsAndQloraPaysForDequantization) {
  PlanRequest r = lora_compute_only("llama-2-7b", "h100-sxm", 8, "q,v");
  const double n = static_cast<double>(matmul_parameters_per_token(r.model));
  const double tokens = 4096;
  const double lora = must_plan(r).gpus[0].step_seconds;
  const double attention = 12.0 * 32 * 4096 * 4096;  // no weights: LoRA runs it in full
  EXPECT_NEAR(lora, (4 * n + 6 * 4'194'304.0 + attention) * tokens / (989e12 * 0.4), 1e-9);
  r.method = FinetuneMethod::kQLora;
  const double q = static_cast<double>(qlora_quantized_parameters(r.model));
  const double dequant = 2 * (q * 0.5 + q * 2) / 3350e9;  // forward + backward, NF4 -> bf16
  EXPECT_NEAR(must_plan(r).gpus[0].step_seconds, lora + dequant, 1e-9);
}

// A token runs the adapters of the experts the router sends it to, k of E (Mixtral: 2 of 8), and
// full checkpointing runs the adapters' forward again too. Until 2026-12-05 every expert's
// adapters were charged to every token (15% too slow at r = 256) and the recomputation left the
// adapters out.
TEST(StepTime, LoraChargesTheRoutedExpertsAdaptersAndRecomputesThem) {
  PlanRequest r = lora_compute_only("mixtral-8x7b", "h200", 256, "all-linear");
  const ModelConfig& m = r.model;
  const double h = m.hidden_size, kv = m.kv_dim(), inter = m.intermediate_size;
  // Per layer and token: q, k, v, o (A: r x in, B: out x r), and 2 of the 8 experts' w1, w3, w2.
  const double attention_adapters = 256 * ((h + h) + 2 * (h + kv) + (h + h));
  const double expert_adapters = 256 * 3 * (h + inter);
  const double adapters = m.num_hidden_layers * (attention_adapters + 2 * expert_adapters);
  EXPECT_DOUBLE_EQ(model_states(r).adapter_params_per_token, adapters);
  const double n = static_cast<double>(matmul_parameters_per_token(m));
  const double attention = attention_flops_per_token(m, r.seq_len, Checkpointing::kNone);
  const double tokens = static_cast<double>(r.seq_len) * r.micro_batch * r.grad_accum;
  const double peak = 989e12 * 0.4;  // the h200's bf16 dense peak at MFU 0.4
  EXPECT_NEAR(must_plan(r).gpus[0].stages.compute_seconds,
              (4 * n + 6 * adapters + attention) * tokens / peak, 1e-9);
  r.checkpointing = Checkpointing::kFull;
  const double recomputed = attention_flops_per_token(m, r.seq_len, Checkpointing::kFull);
  EXPECT_NEAR(must_plan(r).gpus[0].stages.compute_seconds,
              (6 * n + 8 * adapters + recomputed) * tokens / peak, 1e-9);
}

// ---- NVMe offload: a simulated step ----------------------------------------------------------

GpuPlan nvme_plan(PlanRequest r, const std::string& gpu_name) {
  r.offload = Offload::kNvme;
  r.gpus = {gpu(gpu_name)};
  const Plan p = must_plan(r);
  return p.gpus.empty() ? GpuPlan{} : p.gpus[0];
}

TEST(NvmeOffload, StepIsSimulatedAndNoShorterThanAnyResourcesBusyTime) {
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kFull);
  const GpuPlan g = nvme_plan(r, "h100-sxm");
  EXPECT_FALSE(g.params_resident);
  const OffloadEstimate& s = g.stages;
  EXPECT_EQ(s.model, "simulated");
  EXPECT_EQ(s.policy, "strata");
  // The simulated GPU computes exactly the formula's FLOPs at the stated MFU: 8 x N x tokens
  // (6, plus a recomputed forward) and attention's 16 x L x h x s, over 989 TFLOPS x 0.4.
  const double n = static_cast<double>(matmul_parameters_per_token(r.model));
  const double attention = 16.0 * 80 * 8192 * 4096;
  EXPECT_NEAR(s.compute_seconds, (8 * n + attention) * 4096 / (989e12 * 0.4), 1e-6);
  // Every resource works at most the step; the busiest names the bottleneck.
  for (double busy : {s.compute_seconds, s.pcie_seconds, s.nvme_seconds, s.cpu_optimizer_seconds}) {
    EXPECT_LE(busy, g.step_seconds * (1 + 1e-9));
  }
  EXPECT_EQ(g.bottleneck.rfind("nvme", 0), 0u) << g.bottleneck;  // one Gen4 drive, 1.1 TB
  EXPECT_GE(s.nvme_seconds, std::max({s.compute_seconds, s.pcie_seconds}));
  // The CPU optimizer: Adam over every parameter once at 2e9/s, and the measurement of every
  // bf16 gradient element as backward finishes it (strata_optimizer_grad_ready), one pass at the
  // default host scan rate of 20 GB/s.
  EXPECT_NEAR(s.cpu_optimizer_seconds, 68'976'648'192.0 / 2e9 + 68'976'648'192.0 / (20e9 / 2),
              1e-6);
  // Each step reads and writes fp32 master, m and v (12 B/param) and writes the new bf16 weights.
  const double p = 68'976'648'192.0;
  EXPECT_GE(static_cast<double>(s.nvme_read_bytes), 12 * p);
  EXPECT_GE(static_cast<double>(s.nvme_write_bytes), 14 * p);
  // Weights cross PCIe at least twice (forward, backward), gradients once back.
  EXPECT_GE(static_cast<double>(s.pcie_h2d_bytes), 4 * p);
  EXPECT_GE(static_cast<double>(s.pcie_d2h_bytes), 2 * p);
  EXPECT_EQ(g.step_seconds, s.step_seconds);

  // More drives: a shorter step, more tokens/s.
  r.nvme = *parse_nvme("8:gen5");
  const GpuPlan fast = nvme_plan(r, "h100-sxm");
  EXPECT_LT(fast.step_seconds, g.step_seconds);
  EXPECT_GT(fast.tokens_per_s, g.tokens_per_s);
}

TEST(NvmeOffload, DeviceModelSpreadsTheFormulasComputeOverTheSimulatedLayers) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  r.grad_accum = 2;
  const GpuPlan g = nvme_plan(r, "a100-80gb");
  const OffloadJob& job = g.job;
  const sched::DeviceModel d = offload_device_model(job);
  // 32 layers plus the LM head (32000 x 4096, relative to a layer's 202,383,360 parameters),
  // twice (two micro-batches), forward and backward, add up to the formula's compute time.
  const double units = 32 + 32000.0 * 4096 / 202'383'360 + 4096.0 / 202'383'360;
  EXPECT_NEAR((d.forward_seconds_per_layer + d.backward_seconds_per_layer) * units * 2,
              job.compute_seconds, job.compute_seconds * 1e-9);
  // Forward is 2 of the 8 FLOPs per parameter per token under full checkpointing.
  EXPECT_NEAR(d.forward_seconds_per_layer / d.backward_seconds_per_layer, 2.0 / 6.0, 1e-9);
  EXPECT_DOUBLE_EQ(d.host_to_device_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(d.nvme_read_bytes_per_s, 7e9);
  EXPECT_DOUBLE_EQ(d.cpu_optimizer_params_per_s, 2e9);
  EXPECT_NEAR(g.stages.compute_seconds, job.compute_seconds, job.compute_seconds * 1e-6);
}

// Without --host-ram Strata runs in its automatic pinned budget, sized from the drive as the
// runtime sizes it (staging for the bytes in flight, the optimizer's sub-groups and pieces), not
// from the model: full fine-tuning of 70B on one H100 and one Gen4 drive in a few hundred MiB of
// pinned memory, issue 16's full-scale target being at most 8 GB of host RAM.
TEST(NvmeOffload, WithoutHostRamTheBudgetIsTheAutomaticOneSizedFromTheDrive) {
  const GpuPlan g = nvme_plan(request("llama-2-70b", FinetuneMethod::kFull), "h100-sxm");
  const sched::PinnedSizing sizing = strata_pinned_sizing(
      g.job.nvme_read_gbps, g.job.nvme_write_gbps, kPlanOptimizerThreads, kPlanDriveQueueDepth);
  EXPECT_EQ(g.stages.pinned_budget_bytes, sizing.budget_bytes);
  EXPECT_EQ(g.stages.pinned_derivation, sizing.derivation);
  EXPECT_LE(g.stages.peak_pinned_bytes, g.stages.pinned_budget_bytes);
  EXPECT_LE(g.host_bytes, g.stages.pinned_budget_bytes);
  EXPECT_LT(g.host_bytes, uint64_t{8} << 30);
  // The same drive sizes the same budget for a model a tenth the size.
  const GpuPlan small = nvme_plan(request("llama-2-7b", FinetuneMethod::kFull), "h100-sxm");
  EXPECT_EQ(small.stages.pinned_budget_bytes, sizing.budget_bytes);
}

TEST(NvmeOffload, HostRamIsTheSimulatedPeakAndMoreRamMeansLessNvmeTraffic) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  r.grad_accum = 2;
  const GpuPlan least = nvme_plan(r, "a100-80gb");
  r.host_ram_bytes = 32ull << 30;
  const GpuPlan some = nvme_plan(r, "a100-80gb");
  r.host_ram_bytes = 256ull << 30;
  const GpuPlan roomy = nvme_plan(r, "a100-80gb");
  for (const GpuPlan* g : {&least, &some, &roomy}) {
    EXPECT_EQ(g->host_bytes, g->stages.host_bytes);
    EXPECT_LE(g->stages.peak_pinned_bytes, g->stages.pinned_budget_bytes);
    EXPECT_EQ(g->host_bytes, g->stages.peak_pinned_bytes);  // Strata: no unpinned buffers
    EXPECT_TRUE(g->fits()) << g->why_not;
  }
  // The pool is what the headroom leaves of the RAM: (32 GiB - 8 GiB) / 1.1.
  EXPECT_EQ(some.stages.pinned_budget_bytes, usable_host_bytes(32ull << 30, HostHeadroom{}));
  // RAM the scheduler may keep gradients and weights in spares NVMe reads and writes.
  EXPECT_LT(some.stages.nvme_read_bytes + some.stages.nvme_write_bytes,
            least.stages.nvme_read_bytes + least.stages.nvme_write_bytes);
  EXPECT_LT(roomy.stages.nvme_read_bytes + roomy.stages.nvme_write_bytes,
            some.stages.nvme_read_bytes + some.stages.nvme_write_bytes);
  EXPECT_LE(roomy.step_seconds, least.step_seconds);
  // The 7B model's 108 GB of states fit 256 GiB: nothing but optimizer write-backs... at most one
  // read of each state per step.
  EXPECT_LE(roomy.stages.nvme_read_bytes, 16ull * 6'738'415'616);
  // The NVMe space holds every state (and gradient) whatever the RAM.
  EXPECT_EQ(roomy.nvme_bytes, 16ull * 6'738'415'616);
}

// One warm-up step fills the pools; where they keep tensors from one step to the next, the
// step after it still differs from the steady state (docs/planner.md, "Steady state"). From
// two warm-up steps on, every further one measures the same bytes.
TEST(NvmeOffload, FromTwoWarmUpStepsOnTheMeasuredStepIsTheSteadyOne) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  r.host_ram_bytes = 32ull << 30;
  std::vector<GpuPlan> plans;
  for (uint32_t warmup : {1u, 2u, 3u}) {
    r.simulated_warmup_steps = warmup;
    plans.push_back(nvme_plan(r, "a100-80gb"));
    ASSERT_TRUE(plans.back().fits()) << plans.back().why_not;
  }
  const OffloadEstimate &one = plans[0].stages, &two = plans[1].stages, &three = plans[2].stages;
  EXPECT_NE(one.nvme_write_bytes, two.nvme_write_bytes);  // not settled after one
  EXPECT_EQ(two.nvme_write_bytes, three.nvme_write_bytes);
  EXPECT_EQ(two.nvme_read_bytes, three.nvme_read_bytes);
  for (int kind = 0; kind < kTensorKindCount; ++kind) {
    EXPECT_EQ(two.nvme_write_by_kind[kind], three.nvme_write_by_kind[kind]) << kind;
  }
  // Outside 1..8 the request is refused, not planned.
  for (uint32_t warmup : {0u, kMaxSimulatedWarmupSteps + 1}) {
    r.simulated_warmup_steps = warmup;
    EXPECT_EQ(make_plan(r).status().code(), STRATA_E_INVALID) << warmup;
  }
}

TEST(NvmeOffload, GradientAccumulationReplaysForwardAndBackwardPerMicroBatch) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  const GpuPlan one = nvme_plan(r, "h100-sxm");
  r.grad_accum = 2;
  const GpuPlan two = nvme_plan(r, "h100-sxm");
  EXPECT_NEAR(two.stages.compute_seconds, 2 * one.stages.compute_seconds,
              one.stages.compute_seconds * 1e-6);
  // Backward accumulates into gradients held on the GPU (7B's weights and gradients fit an
  // H100's budget), and the optimizer moves each through its pieces once per step: PCIe moves
  // no less, but not twice as much.
  EXPECT_GE(two.stages.pcie_d2h_bytes, one.stages.pcie_d2h_bytes);
  EXPECT_GE(two.stages.pcie_h2d_bytes, one.stages.pcie_h2d_bytes);
  EXPECT_LT(two.stages.pcie_d2h_bytes, 19 * one.stages.pcie_d2h_bytes / 10);
  EXPECT_GT(two.step_seconds, one.step_seconds);
  EXPECT_DOUBLE_EQ(two.tokens_per_step, 2 * one.tokens_per_step);
  // Past kMaxSimulatedMicroBatches the step grows linearly with the micro-batches.
  r.grad_accum = kMaxSimulatedMicroBatches;
  const GpuPlan at_limit = nvme_plan(r, "h100-sxm");
  r.grad_accum = 2 * kMaxSimulatedMicroBatches;
  const GpuPlan beyond = nvme_plan(r, "h100-sxm");
  EXPECT_NEAR(beyond.stages.compute_seconds, 2 * at_limit.stages.compute_seconds,
              at_limit.stages.compute_seconds * 1e-6);
  EXPECT_GT(beyond.step_seconds, at_limit.step_seconds);
  EXPECT_LE(beyond.step_seconds, 2 * at_limit.step_seconds);
  EXPECT_GT(beyond.stages.pcie_d2h_bytes, at_limit.stages.pcie_d2h_bytes);
}

// Extended past the simulated micro-batches, the step still lasts at least as long as the drive
// is busy in it (one drive, half duplex): qwen2.5-0.5b at --grad-accum 64 had the drive busy
// 16.90 s in a 14.12 s step, and its tokens/s 20% high (an independent client, 2026-12-05).
TEST(NvmeOffload, AnExtendedStepLastsAtLeastAsLongAsItsBusiestResource) {
  PlanRequest r = request("qwen2.5-0.5b", FinetuneMethod::kFull);
  r.seq_len = 512;
  for (const uint32_t accum : {8u, 64u}) {
    r.grad_accum = accum;
    const GpuPlan p = nvme_plan(r, "h100-sxm");
    SCOPED_TRACE(accum);
    EXPECT_GE(p.step_seconds, p.stages.nvme_seconds);
    EXPECT_GE(p.step_seconds, p.stages.pcie_seconds);
    EXPECT_GE(p.step_seconds, p.stages.cpu_optimizer_seconds);
    EXPECT_GE(p.step_seconds, p.stages.compute_seconds + p.stages.activation_copy_seconds);
  }
}

// ---- Host memory: Strata vs ZeRO-Infinity ----------------------------------------------------

TEST(NvmeOffload, DeepSpeedHostIsItsBuffersPeakTheBenchmarksFullScaleFigure) {
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kFull);
  r.offload = Offload::kNvme;
  r.gpus = {gpu("h100-sxm")};
  r.host_ram_bytes = 256ull << 30;
  const Plan p = must_compare(r);
  ASSERT_EQ(p.like_for_like.deepspeed.size(), 3u) << p.like_for_like.deepspeed_why_not;
  // The same records the benchmark's worker allocates, from the same inventory.
  const std::vector<TensorSpec> inventory = build_inventory(r.model, {});
  for (const DeepSpeedComparison& c : p.like_for_like.deepspeed) {
    SCOPED_TRACE(c.deepspeed.name);
    Result<deepspeed::DeepSpeedConfig> config =
        deepspeed::labelled_config(c.deepspeed.name, inventory, 1.0);
    ASSERT_TRUE(config.is_ok());
    Result<deepspeed::DeepSpeedLayout> layout = deepspeed::deepspeed_layout(*config, inventory);
    ASSERT_TRUE(layout.is_ok());
    const deepspeed::BufferPeaks peaks = deepspeed::buffer_peaks(
        deepspeed::deepspeed_buffers(*config, *layout, inventory, deepspeed::Precision::kBf16));
    EXPECT_EQ(c.deepspeed.offload.host_bytes, peaks.run);
    EXPECT_EQ(c.deepspeed.host_bytes_steps, peaks.steps);
    EXPECT_EQ(c.deepspeed.offload.peak_pinned_bytes, peaks.pinned);
  }
  // docs/results.md's full-scale projection (`strata bench finetune ... --project-full-scale`):
  // 170.48, 426.48 and 145.00 GiB.
  EXPECT_NEAR(gib(p.like_for_like.deepspeed[0].deepspeed.offload.host_bytes), 170.48, 0.01);
  EXPECT_NEAR(gib(p.like_for_like.deepspeed[1].deepspeed.offload.host_bytes), 426.48, 0.01);
  EXPECT_NEAR(gib(p.like_for_like.deepspeed[2].deepspeed.offload.host_bytes), 145.00, 0.01);
  // Strata's plan fits the 256 GiB machine; pinned DeepSpeed (its 256 GiB pinned gradient
  // buffer) does not.
  EXPECT_TRUE(p.gpus[0].fits());
  EXPECT_LE(p.strata_nvme.host_bytes, 256ull << 30);
  EXPECT_FALSE(*p.like_for_like.deepspeed[1].fits_host);
  EXPECT_EQ(p.strata_nvme.step_seconds, p.gpus[0].step_seconds);  // the same simulation
}

TEST(NvmeOffload, Fp16AddsDeepSpeedsOverflowTemporariesButNotStratasHost) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  r.offload = Offload::kNvme;
  r.gpus = {gpu("h100-sxm")};
  const Plan bf16 = must_compare(r);
  r.precision = DType::kFloat16;
  const Plan fp16 = must_compare(r);
  ASSERT_EQ(fp16.like_for_like.deepspeed.size(), 3u);
  // fp16 runs isinf then isnan, a one-byte temporary per element at a time (stage3.py:2208).
  const uint64_t params = 6'738'415'616;
  EXPECT_EQ(fp16.like_for_like.deepspeed[0].deepspeed.host_bytes_steps,
            bf16.like_for_like.deepspeed[0].deepspeed.host_bytes_steps + params);
  // Strata fuses the check into the gradient stream: no temporaries, the same budget.
  EXPECT_EQ(fp16.strata_nvme.host_bytes, fp16.strata_nvme.peak_pinned_bytes);
  EXPECT_EQ(fp16.strata_nvme.pinned_budget_bytes, bf16.strata_nvme.pinned_budget_bytes);
}

TEST(NvmeOffload, LoraStreamsFrozenWeightsAndQloraStreamsTheirNf4Bytes) {
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kLora);
  const GpuPlan lora = nvme_plan(r, "rtx-4090");
  EXPECT_FALSE(lora.params_resident);
  EXPECT_EQ(lora.stages.model, "simulated");
  // Only weights move: no CPU optimizer, nothing written back, weights read per pass.
  EXPECT_EQ(lora.stages.cpu_optimizer_seconds, 0);
  EXPECT_EQ(lora.stages.nvme_write_bytes, 0u);
  EXPECT_EQ(lora.nvme_bytes, 2 * 68'976'648'192ull);
  // Weights stream to the GPU for forward and again for backward, but for the last layers of
  // forward, still on the GPU when backward begins with them.
  EXPECT_LE(lora.stages.pcie_h2d_bytes, 2 * lora.nvme_bytes);
  EXPECT_GE(lora.stages.pcie_h2d_bytes, 2 * lora.nvme_bytes / 100 * 95);
  r.method = FinetuneMethod::kQLora;
  const GpuPlan qlora = nvme_plan(r, "rtx-4090");
  EXPECT_EQ(qlora.nvme_bytes, qlora_base_weight_bytes(r.model, DType::kBFloat16));
  EXPECT_LT(qlora.stages.pcie_h2d_bytes, lora.stages.pcie_h2d_bytes / 3);
  EXPECT_LT(qlora.step_seconds, lora.step_seconds);
}

// ---- Fit and cost ----------------------------------------------------------------------------

TEST(Plan, Llama70bFitsWhereExpected) {
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kFull);
  r.gpus = {gpu("h100-sxm"), gpu("a100-80gb"), gpu("rtx-4090")};
  // Full fine-tuning needs 1.1 TB of states: NVMe offload everywhere (no --host-ram given).
  for (const GpuPlan& g : must_plan(r).gpus) {
    EXPECT_EQ(g.offload, Offload::kNvme) << g.choice.gpu.name;
    EXPECT_FALSE(g.params_resident) << g.choice.gpu.name;
    EXPECT_TRUE(g.fits()) << g.choice.gpu.name << ": " << g.why_not;
  }
  // QLoRA's 4-bit 70B base (36 GB) fits an 80 GB GPU as is, not a 24 GB one.
  r.method = FinetuneMethod::kQLora;
  const Plan q = must_plan(r);
  EXPECT_EQ(q.gpus[0].offload, Offload::kNone);
  EXPECT_EQ(q.gpus[1].offload, Offload::kNone);
  EXPECT_NE(q.gpus[2].offload, Offload::kNone);
  EXPECT_TRUE(q.gpus[2].fits());
  // LoRA's bf16 base (138 GB) fits no single GPU here without offload.
  r.method = FinetuneMethod::kLora;
  for (const GpuPlan& g : must_plan(r).gpus) EXPECT_NE(g.offload, Offload::kNone);
  // ... but does across 2 x H100 80 GB with ZeRO-3 partitioning.
  r.gpus = {gpu("h100-sxm", 2)};
  r.seq_len = 1024;
  EXPECT_EQ(must_plan(r).gpus[0].offload, Offload::kNone);
}

TEST(StepTime, CpuOffloadsOptimizerIsAdamAndOneMeasurementOfEachGradient) {
  // The closed form counts the CPU as the simulated step does: Adam over the trainable
  // parameters at --adam-rate, and one pass over each bf16 gradient at the host scan rate.
  PlanRequest r = request("llama-2-13b", FinetuneMethod::kFull);
  r.offload = Offload::kCpu;
  r.gpus = {gpu("h100-sxm")};
  r.host_ram_bytes = 512ull << 30;
  const Plan plan = must_plan(r);
  const GpuPlan& g = plan.gpus[0];
  ASSERT_EQ(g.offload, Offload::kCpu);
  const double p = static_cast<double>(plan.states.trainable_params);
  EXPECT_NEAR(g.stages.cpu_optimizer_seconds, p / 2e9 + p * 2 / 20e9, 1e-9);
  // A faster scan leaves Adam's share alone.
  r.assume.host_scan_gbps = 40;
  EXPECT_NEAR(must_plan(r).gpus[0].stages.cpu_optimizer_seconds, p / 2e9 + p * 2 / 40e9, 1e-9);
}

TEST(Plan, ForcedOffloadThatCannotFitSaysWhy) {
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kFull);
  r.offload = Offload::kNone;
  r.gpus = {gpu("h100-sxm")};
  GpuPlan g = must_plan(r).gpus[0];
  EXPECT_FALSE(g.fits());
  EXPECT_NE(g.why_not.find("GPU needs"), std::string::npos);
  r.offload = Offload::kCpu;
  r.host_ram_bytes = 256ull << 30;
  g = must_plan(r).gpus[0];
  EXPECT_TRUE(g.fits_gpu);
  EXPECT_FALSE(g.fits_host);
  EXPECT_NE(g.why_not.find("host needs"), std::string::npos);
}

TEST(Plan, CostIsHoursTimesPriceAndTheCheapestTierIsPicked) {
  PlanRequest r = request("tinyllama-1.1b", FinetuneMethod::kFull);
  r.seq_len = 2048;
  const Plan p = must_plan(r);
  ASSERT_EQ(p.gpus.size(), gpu_presets().size());
  for (const GpuPlan& g : p.gpus) {
    EXPECT_NEAR(g.hours_per_mtok, 1e6 / g.tokens_per_s / 3600, 1e-12);
    EXPECT_NEAR(g.usd_per_mtok[0], g.hours_per_mtok * g.choice.gpu.price_usd_per_hour.low, 1e-12);
    EXPECT_NEAR(g.usd_per_mtok[2], g.hours_per_mtok * g.choice.gpu.price_usd_per_hour.high, 1e-12);
  }
  for (int tier = 0; tier < 3; ++tier) {
    ASSERT_TRUE(p.cheapest[tier].found);
    for (const GpuPlan& g : p.gpus) {
      if (g.fits()) EXPECT_LE(p.cheapest[tier].usd_per_mtok, g.usd_per_mtok[tier]);
    }
  }
  // Without --gpu the headline plan is the cheapest at typical prices.
  EXPECT_EQ(p.gpus[p.primary].choice.gpu.name, p.cheapest[1].gpu);
  // Two GPUs: twice the tokens per step, twice the price per hour.
  r.gpus = {gpu("a100-80gb", 2)};
  const GpuPlan two = must_plan(r).gpus[0];
  EXPECT_DOUBLE_EQ(two.tokens_per_step, 2.0 * 2048);
  EXPECT_NEAR(two.usd_per_mtok[1], two.hours_per_mtok * 1.49 * 2, 1e-12);
}

TEST(Plan, JsonHasTheDocumentedFields) {
  PlanRequest r = request("llama-2-70b", FinetuneMethod::kQLora);
  r.gpus = {gpu("rtx-4090"), gpu("h100-sxm")};
  const nlohmann::json j = plan_to_json(must_compare(r));
  for (const char* key :
       {"model", "method", "params", "trainable_params", "model_state_bytes", "gpu_bytes",
        "host_bytes", "nvme_bytes", "step_seconds", "tokens_per_s", "bottleneck", "zero_infinity",
        "like_for_like", "gpus", "activation_offload", "activations_offloaded_bytes",
        "with_activation_offload"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["model"], "llama-2-70b");
  EXPECT_EQ(j["activation_offload"], "none");
  EXPECT_EQ(j["activations_offloaded_bytes"], 0);
  EXPECT_EQ(j["method"], "qlora");
  EXPECT_EQ(j["gpu"], "rtx-4090");  // the first --gpu
  // QLoRA: the labelled DeepSpeed configurations train every parameter; the JSON says why.
  EXPECT_TRUE(j["zero_infinity"].is_null());
  EXPECT_TRUE(j["like_for_like"]["deepspeed"].empty());
  EXPECT_TRUE(j["like_for_like"]["deepspeed_why_not"].is_string());
  ASSERT_EQ(j["gpus"].size(), 2u);
  for (const auto& g : j["gpus"]) {
    for (const char* key : {"gpu", "fits", "usd_per_mtok_low", "usd_per_mtok_typical",
                            "usd_per_mtok_high", "activations_offloaded_bytes"}) {
      EXPECT_TRUE(g.contains(key)) << key;
    }
  }
  // The cheapest fitting GPU is named.
  // QLoRA's 36 GB base runs on the H100 as it is, 6x faster than the RTX 4090 streams it from
  // RAM: cheaper per token at typical prices despite the price per hour.
  EXPECT_EQ(j["cheapest"]["typical"]["gpu"], "h100-sxm");
}

// ---- Bad input -------------------------------------------------------------------------------

TEST(PlanInput, ParsersRejectWhatTheyCannotRead) {
  EXPECT_FALSE(parse_nvme("0:gen4").is_ok());
  EXPECT_FALSE(parse_nvme("2:gen3").is_ok());
  EXPECT_FALSE(parse_nvme("fast").is_ok());
  EXPECT_FALSE(parse_nvme("7/-1").is_ok());
  // An array moves what measured arrays move (DeepNVMe's 4 x Gen4), not 4 x one drive.
  Result<NvmeArray> four = parse_nvme("4:gen4");
  ASSERT_TRUE(four.is_ok());
  EXPECT_DOUBLE_EQ(four->read_gbps, 10.0);
  EXPECT_DOUBLE_EQ(four->write_gbps, 5.0);
  Result<NvmeArray> measured = parse_nvme("27/11");
  ASSERT_TRUE(measured.is_ok());
  EXPECT_DOUBLE_EQ(measured->write_gbps, 11.0);
  EXPECT_FALSE(parse_gpu_choice("b200").is_ok());
  EXPECT_FALSE(parse_gpu_choice("h100-sxm:0").is_ok());
  EXPECT_FALSE(parse_gpu_choice("h100-sxm:x").is_ok());
  EXPECT_EQ(parse_gpu_choice("h100-sxm:8")->count, 8u);
  EXPECT_FALSE(parse_method("adapter").is_ok());
  EXPECT_FALSE(parse_checkpointing("some").is_ok());
  EXPECT_FALSE(parse_offload("disk").is_ok());
  EXPECT_FALSE(parse_precision("fp8").is_ok());
}

// fp32 full fine-tuning: torch's AdamW on the GPU updates fp32 weights in place (16 B per
// parameter), while an offload engine keeps an fp32 master of its own beside m and v (12 B of
// states per parameter on NVMe). Until 2026-12-05 every fp32 full plan failed (exit 2) in the
// simulated optimizer step: the inventory had no master, and a parameter split into several
// sub-groups had m and v without one.
TEST(PlanInput, Fp32FullFineTuningIsPlannedWithTheOffloadEnginesMasterCopy) {
  PlanRequest r = request("tinyllama-1.1b", FinetuneMethod::kFull);
  r.precision = DType::kFloat32;
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  const Plan p = must_plan(r);
  ASSERT_EQ(p.gpus.size(), 1u);
  const GpuPlan& g = p.gpus[0];
  const uint64_t params = parameter_count(r.model);
  // Homed on NVMe: the fp32 weights and gradients (4 + 4) and the states (master, m, v: 12).
  EXPECT_EQ(g.nvme_bytes, 20 * params) << g.nvme_bytes;
  // Without offload, torch's AdamW: weights, gradients, m and v, 16 B per parameter.
  r.offload = Offload::kNone;
  r.gpus = {*parse_gpu_choice("h100-sxm")};
  const Plan resident = must_plan(r);
  EXPECT_EQ(resident.gpus[0].memory.optimizer, 8 * params);
  // And the whole plan, the comparison with DeepSpeed included, is made.
  Result<Plan> whole = make_plan(r);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  EXPECT_TRUE(whole->like_for_like.strata_not_simulated.empty())
      << whole->like_for_like.strata_not_simulated;
}

// The plan's NVMe bytes per step are counted as the runtime counts them (a transfer in the step
// it completes in), kind by kind: the total is the sum of its kinds. Until 2026-12-05 the total
// came from the links, which count a transfer when it starts: 69 MB of 95 GB apart here, since
// one warm-up step leaves this job short of its steady state.
TEST(PlanNvme, BytesPerStepAreTheSumOfTheirKinds) {
  PlanRequest r = request("llama-2-7b", FinetuneMethod::kFull);
  r.gpus = {*parse_gpu_choice("a100-80gb")};
  const Plan p = must_plan(r);
  const OffloadEstimate& e = p.gpus.at(0).stages;
  ASSERT_EQ(p.gpus[0].offload, Offload::kNvme);
  const auto sum = [](const auto& kinds) {
    return std::accumulate(kinds.begin(), kinds.end(), uint64_t{0});
  };
  EXPECT_GT(e.nvme_write_bytes, 0u);
  EXPECT_EQ(e.nvme_write_bytes, sum(e.nvme_write_by_kind));
  EXPECT_EQ(e.nvme_read_bytes, sum(e.nvme_read_by_kind));
}

// What rests on NVMe must fit the drives (count x capacity); until 2026-12-05 a 405B full plan's
// 6.49 TB "fit" on the one 2 TB drive assumed.
TEST(PlanNvme, WhatRestsOnNvmeMustFitTheDrives) {
  PlanRequest r = request("tinyllama-1.1b", FinetuneMethod::kFull);
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme_drive = {"small", 4, /*capacity_tb=*/0.01, /*tbw_tb=*/100};  // 10 GB
  const Plan tight = must_plan(r);
  const GpuPlan& g = tight.gpus.at(0);
  ASSERT_GT(g.nvme_bytes, uint64_t{10'000'000'000});  // 16 B per parameter: 17.6 GB
  EXPECT_FALSE(g.fits_nvme);
  EXPECT_FALSE(g.fits());
  EXPECT_NE(g.why_not.find("more than 1 x small hold (0.01 TB): 2 such drives (--nvme 2:gen4)"),
            std::string::npos)
      << g.why_not;
  r.nvme = *parse_nvme("2:gen4");
  const Plan two = must_plan(r);
  EXPECT_TRUE(two.gpus.at(0).fits_nvme) << two.gpus[0].why_not;
  // A drive of unknown capacity (not from the command line) has none to check.
  r.nvme = *parse_nvme("1:gen4");
  r.nvme_drive = {"custom", 0, 0, 100};
  EXPECT_TRUE(must_plan(r).gpus.at(0).fits_nvme);
  // --nvme-tbw alone re-rates the generation's default drive and keeps its capacity (until
  // 2026-12-05 it made a drive of unknown capacity, and nothing was checked).
  r.nvme_drive = {};
  r.nvme_drive.tbw_tb = 5000;
  const Plan rerated = must_plan(r);
  EXPECT_EQ(rerated.request.nvme_drive.name, "samsung-990-pro-2tb");
  EXPECT_EQ(rerated.request.nvme_drive.capacity_tb, 2.0);
  EXPECT_EQ(rerated.request.nvme_drive.tbw_tb, 5000.0);
}

// A device pool replayed from a run must fit the GPU beside what stays there (--device-budget 1T
// on an 80 GiB A100 gave a step no run could have, and fit, until 2026-12-05; 79G too, after).
TEST(PlanNvme, ADeviceBudgetAboveTheGpuDoesNotFit) {
  PlanRequest r = request("tinyllama-1.1b", FinetuneMethod::kFull);
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.strata_device_budget_bytes = uint64_t{1} << 40;
  const Plan p = must_plan(r);
  EXPECT_FALSE(p.gpus.at(0).fits_gpu);
  EXPECT_NE(p.gpus[0].why_not.find("--device-budget 1.00 TiB and the "), std::string::npos)
      << p.gpus[0].why_not;
  EXPECT_NE(p.gpus[0].why_not.find("are more than the GPU's 23.99 GiB"), std::string::npos)
      << p.gpus[0].why_not;
  // Just under the GPU, but not beside the activations, logits and CUDA context.
  const GpuMemory& m = p.gpus[0].memory;
  const uint64_t beside = m.activations + m.logits + m.cuda_context;
  const uint64_t capacity = p.gpus[0].choice.gpu.memory_bytes();
  r.strata_device_budget_bytes = capacity - beside + 1;
  EXPECT_FALSE(must_plan(r).gpus.at(0).fits_gpu);
  r.strata_device_budget_bytes = capacity - beside;
  EXPECT_TRUE(must_plan(r).gpus.at(0).fits_gpu);
  r.strata_device_budget_bytes = uint64_t{1} << 30;
  EXPECT_TRUE(must_plan(r).gpus.at(0).fits_gpu);
}

TEST(PlanNvme, MeasuredRatesMayCountTheirDrives) {
  const NvmeArray counted = *parse_nvme("4:10/5");
  EXPECT_EQ(counted.drives, 4u);
  EXPECT_EQ(counted.read_gbps, 10.0);
  EXPECT_EQ(counted.write_gbps, 5.0);
  EXPECT_EQ(counted.label, "4 drives, 10/5 GB/s");
  EXPECT_EQ(parse_nvme("10/5")->drives, 0u);  // not counted: one assumed for wear and capacity
  for (const char* bad : {"0:10/5", "65:10/5", "x:10/5", "4:10/0", "4:/5"}) {
    EXPECT_EQ(parse_nvme(bad).status().code(), STRATA_E_INVALID) << bad;
  }
}

TEST(PlanInput, InvalidRequestsAreErrorsNotPlans) {
  PlanRequest r = request("tinyllama-1.1b", FinetuneMethod::kFull);
  r.seq_len = 0;
  EXPECT_EQ(make_plan(r).status().code(), STRATA_E_INVALID);
  r.seq_len = 128;
  r.assume.mfu = 0;
  EXPECT_FALSE(make_plan(r).is_ok());
  r.assume.mfu = 0.4;
  r.method = FinetuneMethod::kQLora;
  r.precision = DType::kFloat32;
  EXPECT_FALSE(make_plan(r).is_ok());
  r.precision = DType::kBFloat16;
  r.lora_rank = 0;
  EXPECT_FALSE(make_plan(r).is_ok());
  r.lora_rank = 8;
  EXPECT_TRUE(make_plan(r).is_ok());
}

}  // namespace
}  // namespace strata
