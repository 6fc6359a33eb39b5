// Advice: when a stage other than compute bounds the plan, name the knob and what it buys,
// measured by planning again with it.
#include "model/plan_advice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace strata {
namespace {

PlanRequest full_13b_on_h100_with_cpu_offload() {
  PlanRequest r;
  r.model = *load_model("llama-2-13b");
  r.offload = Offload::kCpu;
  r.host_ram_bytes = uint64_t{256} << 30;
  r.gpus = {*parse_gpu_choice("h100-sxm")};
  r.nvme = *parse_nvme("1:gen4");
  return r;
}

TEST(Advice, CpuOptimizerBoundPlansAreToldHowManyMicroBatchesAmortiseIt) {
  Result<Plan> p = make_plan(full_13b_on_h100_with_cpu_offload());
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  const GpuPlan& g = p->gpus[0];
  ASSERT_EQ(g.bottleneck, "cpu-optimizer");
  ASSERT_FALSE(p->advice.empty());
  // Adam over 13B parameters at 2e9/s against about a second of compute: the factor is the
  // ratio rounded up to a power of two.
  const double ratio = std::ceil(g.stages.cpu_optimizer_seconds / g.stages.compute_seconds);
  const uint64_t factor = std::bit_ceil(static_cast<uint64_t>(ratio));
  const auto accum = std::find_if(p->advice.begin(), p->advice.end(), [](const Advice& a) {
    return a.knob.starts_with("--grad-accum");
  });
  ASSERT_NE(accum, p->advice.end());
  EXPECT_EQ(accum->knob, "--grad-accum " + std::to_string(factor));
  // Its figures are the plan made with the knob.
  PlanRequest r = full_13b_on_h100_with_cpu_offload();
  r.grad_accum = factor;
  Result<Plan> with = make_gpu_plans(r);
  ASSERT_TRUE(with.is_ok());
  EXPECT_DOUBLE_EQ(accum->tokens_per_s, with->gpus[0].tokens_per_s);
  EXPECT_DOUBLE_EQ(accum->usd_per_mtok_typical, with->gpus[0].usd_per_mtok[1]);
  EXPECT_NEAR(accum->speedup, with->gpus[0].tokens_per_s / g.tokens_per_s, 1e-12);
  EXPECT_GT(accum->speedup, 2.0);
  // Best first.
  for (size_t k = 1; k < p->advice.size(); ++k) {
    EXPECT_LE(p->advice[k - 1].usd_per_mtok_typical, p->advice[k].usd_per_mtok_typical);
  }
}

// More drives are advised only up to an array someone measured (the next larger one): past the
// largest the rates are an extrapolation. Until 2026-12-05 the advice took 4 x the drives, 16 x
// Gen4 from 4, at rates no measurement backs.
TEST(Advice, MoreDrivesOnlyUpToAMeasuredArray) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  const auto drives_advice = [](const Plan& p) {
    std::vector<std::string> knobs;
    for (const Advice& a : p.advice) {
      if (a.knob.starts_with("--nvme")) knobs.push_back(a.knob + ": " + a.reason);
    }
    return knobs;
  };
  r.nvme = *parse_nvme("1:gen4");
  Result<Plan> one = make_plan(r);
  ASSERT_TRUE(one.is_ok()) << one.status().message();
  ASSERT_TRUE(one->gpus[0].bottleneck.starts_with("nvme")) << one->gpus[0].bottleneck;
  EXPECT_EQ(drives_advice(*one),
            std::vector<std::string>{
                "--nvme 4:gen4: a RAID-0 array of 4 drives moves 10 / 5 GB/s as measured"});
  r.nvme = *parse_nvme("4:gen4");
  Result<Plan> four = make_plan(r);
  ASSERT_TRUE(four.is_ok()) << four.status().message();
  ASSERT_TRUE(four->gpus[0].bottleneck.starts_with("nvme")) << four->gpus[0].bottleneck;
  EXPECT_TRUE(drives_advice(*four).empty());
  r.nvme = *parse_nvme("4:gen5");
  Result<Plan> gen5 = make_plan(r);
  ASSERT_TRUE(gen5.is_ok()) << gen5.status().message();
  if (gen5->gpus[0].bottleneck.starts_with("nvme")) {
    for (const std::string& knob : drives_advice(*gen5)) {
      EXPECT_TRUE(knob.starts_with("--nvme 8:gen5")) << knob;
    }
  }
}

TEST(Advice, ComputeBoundPlansGetNone) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNone;
  r.gpus = {*parse_gpu_choice("h100-sxm")};
  r.nvme = *parse_nvme("1:gen4");
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->gpus[0].bottleneck, "compute");
  EXPECT_TRUE(p->advice.empty());
}

TEST(LikeForLike, EachSidesLeastRamAndStrataAtEachDeepSpeedConfigurationsRam) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNvme;
  r.host_ram_bytes = uint64_t{64} << 30;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  const OffloadComparison& c = p->like_for_like;
  const OffloadJob& job = p->gpus[0].job;
  const uint64_t least = strata_pinned_sizing(job.nvme_read_gbps, job.nvme_write_gbps,
                                              job.optimizer_threads, job.drive_queue_depth)
                             .budget_bytes;
  EXPECT_EQ(c.strata_least.pinned_budget_bytes, least);
  EXPECT_LE(c.strata_least.host_bytes, least);
  // The three labelled configurations, in order, each beside Strata given exactly its RAM.
  ASSERT_EQ(c.deepspeed.size(), 3u) << c.deepspeed_why_not;
  const char* names[] = {"deepspeed-defaults", "deepspeed-pinned", "deepspeed-tuned"};
  for (size_t i = 0; i < 3; ++i) {
    const DeepSpeedComparison& d = c.deepspeed[i];
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(d.deepspeed.name, names[i]);
    EXPECT_EQ(d.deepspeed.offload.model, "analytic");
    EXPECT_EQ(d.strata_equal_ram.pinned_budget_bytes,
              std::max(d.deepspeed.offload.host_bytes / 4096 * 4096, least));
    EXPECT_LE(d.strata_equal_ram.host_bytes, d.deepspeed.offload.host_bytes);
    // More RAM never makes Strata's simulated step longer.
    EXPECT_LE(d.strata_equal_ram.step_seconds, c.strata_least.step_seconds * (1 + 1e-9));
    ASSERT_TRUE(d.fits_host.has_value());
    EXPECT_TRUE(*d.fits_host);  // 1.1B: a few GiB of buffers
  }
  // Pinning the flat gradient buffer (and rounding it up) costs the most host memory.
  EXPECT_GT(c.deepspeed[1].deepspeed.offload.host_bytes,
            c.deepspeed[0].deepspeed.offload.host_bytes);
  // DeepSpeed's own estimator for the same model, offload to CPU: 18 B/param x 1.5.
  ASSERT_TRUE(c.deepspeed_estimate.has_value());
  const Zero3Estimate ds =
      deepspeed_zero3_estimate(p->states.params, deepspeed_largest_layer_params(r.model), 1);
  EXPECT_EQ(c.deepspeed_estimate->cpu_bytes, ds.cpu_bytes);
  EXPECT_EQ(c.deepspeed_estimate->gpu_bytes, ds.gpu_bytes);
  // LoRA: the estimator and the labelled configurations train every parameter: they do not
  // apply, and the plan says why.
  r.method = FinetuneMethod::kLora;
  Result<Plan> lora = make_plan(r);
  ASSERT_TRUE(lora.is_ok());
  EXPECT_FALSE(lora->like_for_like.deepspeed_estimate.has_value());
  EXPECT_TRUE(lora->like_for_like.deepspeed.empty());
  EXPECT_FALSE(lora->like_for_like.deepspeed_why_not.empty());
}

// A pinned budget NVMe offload cannot run in, given to a plan that keeps its states in RAM:
// the comparison's simulation fails, and the comparison (not the plan) is left out, with why.
TEST(LikeForLike, AComparisonThatCannotBeSimulatedIsLeftOutAndThePlanStands) {
  PlanRequest r = full_13b_on_h100_with_cpu_offload();
  r.model = *load_model("tinyllama-1.1b");
  r.strata_pinned_budget_bytes = uint64_t{1} << 20;
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(p->gpus[0].fits());
  EXPECT_EQ(p->gpus[0].offload, Offload::kCpu);
  const OffloadComparison& c = p->like_for_like;
  EXPECT_NE(c.strata_not_simulated.find("--pinned-budget"), std::string::npos)
      << c.strata_not_simulated;
  EXPECT_TRUE(c.deepspeed.empty());
  EXPECT_FALSE(c.deepspeed_why_not.empty());
  EXPECT_FALSE(p->strata_nvme.has_simulation());
  // DeepSpeed's own estimator needs no simulation: it stays.
  EXPECT_TRUE(c.deepspeed_estimate.has_value());
  // A budget it runs in: compared.
  r.strata_pinned_budget_bytes = uint64_t{256} << 20;
  Result<Plan> runs = make_plan(r);
  ASSERT_TRUE(runs.is_ok()) << runs.status().message();
  EXPECT_TRUE(runs->like_for_like.strata_not_simulated.empty());
  EXPECT_EQ(runs->like_for_like.deepspeed.size(), 3u);
  EXPECT_TRUE(runs->strata_nvme.has_simulation());
}

// A --device-budget that cannot fit the GPU beside the activations, logits and CUDA context is
// bad input for that GPU whatever its offload: the row does not fit, and the comparison is left
// out with that reason, none of its steps simulated (until 2026-12-05 a CPU-offload row ignored
// the budget and fit, and the comparison simulated with it).
TEST(LikeForLike, ADeviceBudgetTheGpuCannotHoldIsNotCompared) {
  PlanRequest r = full_13b_on_h100_with_cpu_offload();
  r.model = *load_model("tinyllama-1.1b");
  r.strata_device_budget_bytes = uint64_t{79} << 30;
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->gpus[0].offload, Offload::kCpu);
  EXPECT_FALSE(p->gpus[0].fits());  // though its own row keeps its states in RAM
  EXPECT_NE(p->gpus[0].why_not.find("--device-budget 79.00 GiB and the "), std::string::npos)
      << p->gpus[0].why_not;
  const OffloadComparison& c = p->like_for_like;
  EXPECT_NE(c.strata_not_simulated.find("--device-budget 79.00 GiB and the "), std::string::npos)
      << c.strata_not_simulated;
  EXPECT_TRUE(c.deepspeed.empty());
  EXPECT_FALSE(p->strata_nvme.has_simulation());
  EXPECT_TRUE(c.deepspeed_estimate.has_value());
  // Under NVMe offload the plan's own step, made with that pool, is not the comparison's either.
  r.offload = Offload::kNvme;
  Result<Plan> nvme = make_plan(r);
  ASSERT_TRUE(nvme.is_ok()) << nvme.status().message();
  EXPECT_FALSE(nvme->gpus[0].fits());
  EXPECT_FALSE(nvme->strata_nvme.has_simulation());
  EXPECT_FALSE(nvme->like_for_like.strata_not_simulated.empty());
  r.offload = Offload::kCpu;
  r.strata_device_budget_bytes = uint64_t{8} << 30;  // one it holds: a fit, and compared
  Result<Plan> held = make_plan(r);
  ASSERT_TRUE(held.is_ok()) << held.status().message();
  EXPECT_TRUE(held->gpus[0].fits());
  EXPECT_TRUE(held->like_for_like.strata_not_simulated.empty());
}

TEST(PinnedBudget, ReplaysARunsBudgetEvenBelowTheLeastTheComparisonKeepsTheLeast) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  Result<Plan> plain = make_gpu_plans(r);
  ASSERT_TRUE(plain.is_ok());
  const OffloadJob& job = plain->gpus[0].job;
  const uint64_t least = strata_pinned_sizing(job.nvme_read_gbps, job.nvme_write_gbps,
                                              job.optimizer_threads, job.drive_queue_depth)
                             .budget_bytes;
  // A run's budget below the automatic one (a point of `strata bench finetune --sweep-pinned`).
  r.strata_pinned_budget_bytes = least / 5 * 4 + 1;
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->strata_nvme.pinned_budget_bytes, (least / 5 * 4) / 4096 * 4096);
  EXPECT_EQ(p->gpus[0].stages.pinned_budget_bytes, p->strata_nvme.pinned_budget_bytes);
  EXPECT_LE(p->strata_nvme.peak_pinned_bytes, p->strata_nvme.pinned_budget_bytes);
  EXPECT_EQ(p->like_for_like.strata_least.pinned_budget_bytes, least);
  r.strata_pinned_budget_bytes = 100;
  EXPECT_EQ(make_plan(r).status().code(), STRATA_E_INVALID);
}

TEST(DeviceBudget, ReplaysARunsDevicePoolInTheSimulatedRunOnly) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  Result<Plan> plain = make_plan(r);
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  const uint64_t formula = plain->gpus[0].job.device_budget_bytes;
  EXPECT_EQ(plain->strata_nvme.device_budget_bytes, formula);
  // A run's device budget (strata bench finetune --device-budget), below the formula's.
  r.strata_device_budget_bytes = formula / 2;
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->gpus[0].job.device_budget_bytes, formula / 2);
  EXPECT_EQ(p->strata_nvme.device_budget_bytes, formula / 2);
  EXPECT_LE(p->strata_nvme.peak_device_bytes, formula / 2);
  // Whether the job fits the GPU is the memory formulas', unchanged.
  EXPECT_EQ(p->gpus[0].fits(), plain->gpus[0].fits());
  EXPECT_EQ(p->gpus[0].memory.total(), plain->gpus[0].memory.total());
  // A pool too small for the largest tensor: the message names the option to raise.
  r.strata_device_budget_bytes = 1 << 20;
  const Status small = make_plan(r).status();
  EXPECT_EQ(small.code(), STRATA_E_DEVICE_BUDGET);
  EXPECT_NE(small.message().find("--device-budget gives (1.00 MiB per GPU: raise it)"),
            std::string::npos)
      << small.message();
  r.strata_device_budget_bytes = 100;
  EXPECT_EQ(make_plan(r).status().code(), STRATA_E_INVALID);
}

// An automatic budget is spent by the drive's sizing, not by the rule for a budget set exactly:
// the main job's Strata worker had 159,383,552 bytes as 2 x 2 staging buffers of 4 MiB and
// sub-groups of 8 MiB, where the rule gives 2 x 4 of 4 MiB and a sixteenth of the pool. The plan
// replays what the run reports (strata_stats: pinned_staging_bytes, stream_chunk_bytes,
// stream_buffers, optimizer_sub_group_bytes).
TEST(PinnedBudget, ReplaysHowARunSpentItsBudget) {
  constexpr uint64_t kBudget = 159383552, kMiB = uint64_t{1} << 20;
  const sched::PinnedSplit rule = sched::split_pinned_budget({}, kBudget);
  EXPECT_EQ(rule.staging_bytes, 32 * kMiB);
  EXPECT_EQ(rule.sub_group_bytes, (kBudget - 32 * kMiB) / 16 / 4096 * 4096);
  const sched::PinnedSplit run = sched::split_pinned_budget({}, kBudget, {4 * kMiB, 2, 8 * kMiB});
  EXPECT_EQ(run.staging_bytes, 16 * kMiB);
  EXPECT_EQ(run.chunk_bytes, 4 * kMiB);
  EXPECT_EQ(run.sub_group_bytes, 8 * kMiB);

  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  r.strata_pinned_budget_bytes = 512 * kMiB;
  r.strata_pinned_given = {4 * kMiB, 2, 8 * kMiB};
  Result<Plan> p = make_plan(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  ASSERT_EQ(p->strata_nvme.pinned_derivation.size(), 1u);
  EXPECT_NE(p->strata_nvme.pinned_derivation[0].find("staging 16.00 MiB (as given), sub-groups of "
                                                     "8.00 MiB per state (as given)"),
            std::string::npos)
      << p->strata_nvme.pinned_derivation[0];
  EXPECT_LE(p->strata_nvme.peak_pinned_bytes, 512 * kMiB);
  // Each as the runtime checks the config field it stands for, and only beside a budget.
  const std::vector<std::pair<sched::PinnedSplitGiven, std::string>> refused = {
      {{3 * kMiB, 2, 0}, "power of two"},
      {{4 * kMiB, 65, 0}, "limited to 64"},
      {{0, 0, 4098}, "multiple of 4 bytes"},
      {{64 * kMiB, 4, 0}, "at most half"},
  };
  for (const auto& [given, why] : refused) {
    r.strata_pinned_given = given;
    const Status s = make_plan(r).status();
    EXPECT_EQ(s.code(), STRATA_E_INVALID) << why;
    EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
  }
  r.strata_pinned_given = {4 * kMiB, 2, 8 * kMiB};
  r.strata_pinned_budget_bytes.reset();
  const Status alone = make_plan(r).status();
  EXPECT_EQ(alone.code(), STRATA_E_INVALID);
  EXPECT_NE(alone.message().find("--pinned-budget"), std::string::npos) << alone.message();
}

TEST(AutoGpuCount, FindsTheSmallestCountThatFitsWithoutOffload) {
  PlanRequest r;
  r.model = *load_model("llama-2-7b");
  r.nvme = *parse_nvme("1:gen4");
  r.gpus = {*parse_gpu_choice("a100-80gb:auto")};
  Result<Plan> p = make_gpu_plans(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  const GpuPlan& g = p->gpus[0];
  EXPECT_TRUE(g.fits()) << g.why_not;
  EXPECT_EQ(g.offload, Offload::kNone);
  ASSERT_GT(g.choice.count, 1u);  // 108 GB of states do not fit one 80 GB GPU
  // One fewer does not fit.
  r.offload = Offload::kNone;
  r.gpus = {*parse_gpu_choice("a100-80gb:" + std::to_string(g.choice.count - 1))};
  EXPECT_FALSE(make_gpu_plans(r)->gpus[0].fits());
  // A job no node holds says so.
  r.model = *load_model("llama-3.1-405b");
  r.offload.reset();
  r.gpus = {*parse_gpu_choice("rtx-4090:auto")};
  Result<Plan> huge = make_gpu_plans(r);
  ASSERT_TRUE(huge.is_ok());
  EXPECT_FALSE(huge->gpus[0].fits());
  EXPECT_NE(huge->gpus[0].why_not.find("no count 1..64 fits"), std::string::npos);
  EXPECT_FALSE(huge->any_fits());
}

}  // namespace
}  // namespace strata
