// Job cost: whole optimizer steps x step time, priced per tier; no price when nothing fits.
#include "model/plan_job_cost.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/plan.h"

namespace strata {
namespace {

TEST(JobCost, IsWholeStepsTimesStepTimeTimesPrice) {
  const PriceRange price{1.0, 2.0, 4.0};
  // 1e6 tokens at 4096 a step: 244.14 -> 245 steps; 10 s each on 2 GPUs.
  const JobCost c = job_cost(1e6, 4096, 10, price, 2);
  EXPECT_EQ(c.steps, 245u);
  EXPECT_DOUBLE_EQ(c.hours, 2450.0 / 3600);
  EXPECT_DOUBLE_EQ(c.usd[0], 2450.0 / 3600 * 1.0 * 2);
  EXPECT_DOUBLE_EQ(c.usd[1], 2450.0 / 3600 * 2.0 * 2);
  EXPECT_DOUBLE_EQ(c.usd[2], 2450.0 / 3600 * 4.0 * 2);
}

TEST(JobCost, TokensComeFromTokensOrEpochsTimesDatasetButNotBoth) {
  EXPECT_EQ(**job_tokens(5e6, std::nullopt, std::nullopt), 5e6);
  EXPECT_EQ(**job_tokens(std::nullopt, 3.0, 2e6), 6e6);
  EXPECT_FALSE(job_tokens(std::nullopt, std::nullopt, std::nullopt)->has_value());
  EXPECT_FALSE(job_tokens(5e6, 3.0, 2e6).is_ok());
  EXPECT_FALSE(job_tokens(std::nullopt, 3.0, std::nullopt).is_ok());
  EXPECT_FALSE(job_tokens(-1.0, std::nullopt, std::nullopt).is_ok());
  EXPECT_FALSE(job_tokens(std::nullopt, 0.0, 1e6).is_ok());
}

TEST(JobCost, PlansThatDoNotFitAreNotPricedAndTheCheapestJobIsNamed) {
  PlanRequest r;
  r.model = *load_model("llama-2-13b");
  r.method = FinetuneMethod::kLora;
  r.offload = Offload::kNone;
  r.nvme = *parse_nvme("1:gen4");
  r.gpus = {*parse_gpu_choice("a100-80gb"), *parse_gpu_choice("rtx-4090"),
            *parse_gpu_choice("h100-sxm")};
  r.job_tokens = 68e6;
  Result<Plan> p = make_gpu_plans(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(p->gpus[0].fits());
  EXPECT_FALSE(p->gpus[1].fits());  // 26 GB of bf16 weights: not 24 GB
  EXPECT_FALSE(p->gpus[1].job_cost.has_value());
  ASSERT_TRUE(p->gpus[0].job_cost.has_value());
  const JobCost& a100 = *p->gpus[0].job_cost;
  EXPECT_EQ(a100.steps, static_cast<uint64_t>(std::ceil(68e6 / 4096)));
  EXPECT_NEAR(a100.hours, a100.steps * p->gpus[0].step_seconds / 3600, 1e-9);
  for (int tier = 0; tier < 3; ++tier) {
    ASSERT_TRUE(p->cheapest[tier].job_usd.has_value());
    for (const GpuPlan& g : p->gpus) {
      if (g.job_cost) EXPECT_LE(*p->cheapest[tier].job_usd, g.job_cost->usd[tier]);
    }
  }
}

}  // namespace
}  // namespace strata
