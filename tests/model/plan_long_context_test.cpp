// Long context: FlashAttention stores no scores (also under checkpointing), and attention's
// 12 x L x h x s FLOPs per token are in the compute time.
#include <gtest/gtest.h>

#include "model/plan.h"

namespace strata {
namespace {

PlanRequest qlora_8b_on_4090(uint64_t seq, Attention attention) {
  PlanRequest r;
  r.model = *load_model("llama-3.1-8b");
  r.method = FinetuneMethod::kQLora;
  r.seq_len = seq;
  r.attention = attention;
  r.offload = Offload::kNone;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  return r;
}

TEST(LongContext, FlashAttentionUnderCheckpointingStoresNoScores) {
  const ModelConfig m = *load_model("llama-3.1-8b");
  const uint64_t s = 8192;
  const uint64_t eager =
      activation_bytes(m, s, 1, Checkpointing::kFull, DType::kBFloat16, Attention::kEager);
  const uint64_t flash =
      activation_bytes(m, s, 1, Checkpointing::kFull, DType::kBFloat16, Attention::kFlash);
  // The recomputed layer's scores, 6 bytes each (the softmax's fp32 output and its bf16 copy):
  // 12.9 GB for 32 heads at 8K. Beside them eager keeps k and v repeated to 32 heads and
  // o_proj's input, flash the log-sum-exp: per token 2 x (4096 x 4 - (4096 + 2 x 1024 + 4096))
  // - 4 x 32 = 12,160 bytes more.
  const uint64_t scores = 6ull * 32 * s * s;
  EXPECT_EQ(eager - flash, scores + 12'160 * s);
  // Without checkpointing, in every layer; selective recomputation drops the scores either way.
  EXPECT_EQ(
      activation_bytes(m, s, 1, Checkpointing::kNone, DType::kBFloat16, Attention::kEager) -
          activation_bytes(m, s, 1, Checkpointing::kNone, DType::kBFloat16, Attention::kFlash),
      32 * (scores + 12'160 * s));
  EXPECT_EQ(
      activation_bytes(m, s, 1, Checkpointing::kSelective, DType::kBFloat16, Attention::kEager) -
          activation_bytes(m, s, 1, Checkpointing::kSelective, DType::kBFloat16, Attention::kFlash),
      32 * 12'160 * s);
}

TEST(LongContext, An8bQloraAt8kFitsA4090WithFlashAttentionOnly) {
  Result<Plan> eager = make_gpu_plans(qlora_8b_on_4090(8192, Attention::kEager));
  Result<Plan> flash = make_gpu_plans(qlora_8b_on_4090(8192, Attention::kFlash));
  ASSERT_TRUE(eager.is_ok() && flash.is_ok());
  EXPECT_FALSE(eager->gpus[0].fits());
  EXPECT_TRUE(flash->gpus[0].fits()) << flash->gpus[0].why_not;
}

TEST(LongContext, TokensPerSecondFallAsTheSequenceGrows) {
  // Attention's share of the FLOPs grows with s: 12 x L x h x s against 6N (or 4N for QLoRA).
  const ModelConfig m = *load_model("llama-3.1-8b");
  EXPECT_DOUBLE_EQ(attention_flops_per_token(m, 32768, Checkpointing::kNone),
                   12.0 * 32 * 4096 * 32768);
  EXPECT_DOUBLE_EQ(attention_flops_per_token(m, 32768, Checkpointing::kFull),
                   16.0 * 32 * 4096 * 32768);
  PlanRequest r = qlora_8b_on_4090(4096, Attention::kFlash);
  r.gpus = {*parse_gpu_choice("h100-sxm")};
  Result<Plan> short_seq = make_gpu_plans(r);
  r.seq_len = 32768;
  Result<Plan> long_seq = make_gpu_plans(r);
  ASSERT_TRUE(short_seq.is_ok() && long_seq.is_ok());
  const double ratio = short_seq->gpus[0].tokens_per_s / long_seq->gpus[0].tokens_per_s;
  // QLoRA with full checkpointing: 6 x N_mm per token (4 + 2 recomputed) plus attention
  // 16 x L x h x s; at 32K attention is more than the weights' FLOPs.
  const double n = static_cast<double>(matmul_parameters_per_token(m));
  const double expected = (6 * n + 16.0 * 32 * 4096 * 32768) / (6 * n + 16.0 * 32 * 4096 * 4096);
  EXPECT_GT(ratio, 1.8);
  EXPECT_LT(ratio, expected);  // the dequantization term does not grow with s
}

}  // namespace
}  // namespace strata
