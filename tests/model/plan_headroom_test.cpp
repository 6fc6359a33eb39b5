// Host RAM headroom: recommended = job x 1.1 + 8 GiB, and a plan fits only within it.
#include "model/plan_headroom.h"

#include <gtest/gtest.h>

#include "model/plan.h"

namespace strata {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(HostHeadroom, RecommendedIsTenPercentMorePlusEightGib) {
  EXPECT_EQ(recommended_host_bytes(100 * kGiB, HostHeadroom{}), 118 * kGiB);
  EXPECT_EQ(recommended_host_bytes(0, HostHeadroom{}), 8 * kGiB);
  EXPECT_EQ(recommended_host_bytes(100 * kGiB, HostHeadroom{0.25, 0}), 125 * kGiB);
}

TEST(HostHeadroom, UsableIsTheInverseOfRecommended) {
  // 64 GiB leaves (64 - 8) / 1.1 = 50.9 GiB for the job, not 64 of 64.
  const uint64_t usable = usable_host_bytes(64 * kGiB, HostHeadroom{});
  EXPECT_NEAR(static_cast<double>(usable) / kGiB, 56.0 / 1.1, 1e-5);
  EXPECT_LE(recommended_host_bytes(usable, HostHeadroom{}), 64 * kGiB);
  EXPECT_GT(recommended_host_bytes(usable + 2 * (uint64_t{1} << 20), HostHeadroom{}), 64 * kGiB);
  EXPECT_EQ(usable_host_bytes(8 * kGiB, HostHeadroom{}), 0u);
}

// A RAM of no whole MiB (113.1 GB): the recommended figure, whole MiB, still fits it. Before,
// a pool filled to what was usable came to a recommendation a fraction of a MiB over the RAM,
// and the plan said it did not fit "105.33 GiB of 105.33 GiB".
TEST(HostHeadroom, UsableFitsARamOfNoWholeMib) {
  for (uint64_t ram = 113'000'000'000; ram <= 113'700'000'000; ram += 50'000'000 + 4097) {
    const uint64_t usable = usable_host_bytes(ram, HostHeadroom{});
    EXPECT_LE(recommended_host_bytes(usable, HostHeadroom{}), ram) << ram;
    EXPECT_GT(recommended_host_bytes(usable + (uint64_t{2} << 20), HostHeadroom{}), ram) << ram;
  }
}

PlanRequest tinyllama_cpu_offload(uint64_t host_ram) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kCpu;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("1:gen4");
  r.host_ram_bytes = host_ram;
  return r;
}

// A RAM short of the recommendation by less than the GiB figures show says so in bytes: "56.18
// GiB of 56.18 GiB" alone reads as a fit refused.
TEST(HostHeadroom, AShortfallTheFiguresRoundAwayIsGivenInBytes) {
  Result<Plan> exact = make_gpu_plans(tinyllama_cpu_offload(64 * kGiB));
  ASSERT_TRUE(exact.is_ok()) << exact.status().message();
  const uint64_t needed = exact->gpus[0].host.recommended_bytes;
  Result<Plan> short_by_a_byte = make_gpu_plans(tinyllama_cpu_offload(needed - 1));
  ASSERT_TRUE(short_by_a_byte.is_ok()) << short_by_a_byte.status().message();
  const GpuPlan& g = short_by_a_byte->gpus[0];
  ASSERT_FALSE(g.fits_host);
  EXPECT_NE(g.why_not.find(" (" + std::to_string(needed) + " of " + std::to_string(needed - 1) +
                           " bytes)"),
            std::string::npos)
      << g.why_not;
}

TEST(HostHeadroom, APlanFitsOnlyWithinTheRecommendedRam) {
  // TinyLlama's gradients and optimizer states in RAM: 14 B x 1.1e9 = 15.4 GB.
  Result<Plan> exact = make_gpu_plans(tinyllama_cpu_offload(64 * kGiB));
  ASSERT_TRUE(exact.is_ok()) << exact.status().message();
  const GpuPlan& g = exact->gpus[0];
  const uint64_t job = g.host_bytes;
  EXPECT_EQ(g.host.job_bytes, job);
  EXPECT_EQ(g.host.recommended_bytes, recommended_host_bytes(job, HostHeadroom{}));
  EXPECT_EQ(g.host.full_speed_bytes, job);  // CPU offload is full speed already
  // Exactly the job's bytes of RAM is not enough; the recommended figure is.
  Result<Plan> tight = make_gpu_plans(tinyllama_cpu_offload(job));
  ASSERT_TRUE(tight.is_ok());
  EXPECT_FALSE(tight->gpus[0].fits_host);
  EXPECT_NE(tight->gpus[0].why_not.find("with headroom"), std::string::npos);
  Result<Plan> enough = make_gpu_plans(tinyllama_cpu_offload(g.host.recommended_bytes));
  ASSERT_TRUE(enough.is_ok());
  EXPECT_TRUE(enough->gpus[0].fits_host);
}

TEST(HostHeadroom, NvmeOffloadPinsWhatTheHeadroomLeaves) {
  PlanRequest r = tinyllama_cpu_offload(32 * kGiB);
  r.offload = Offload::kNvme;
  Result<Plan> p = make_gpu_plans(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  const GpuPlan& g = p->gpus[0];
  EXPECT_EQ(g.stages.pinned_budget_bytes, usable_host_bytes(32 * kGiB, HostHeadroom{}));
  EXPECT_LE(g.host.recommended_bytes, 32 * kGiB);
  EXPECT_TRUE(g.fits()) << g.why_not;
  // Full speed: every state in RAM (CPU offload's 14 B/param of gradients and optimizer).
  Result<Plan> cpu = make_gpu_plans(tinyllama_cpu_offload(64 * kGiB));
  EXPECT_EQ(g.host.full_speed_bytes, cpu->gpus[0].host_bytes);
}

TEST(HostHeadroom, WithoutHostRamThePlanSaysWhatMoreRamWouldBuy) {
  // The case: 7B full on an A100 without --host-ram is NVMe offload at its least pool;
  // CPU offload with the recommended RAM is about ten times faster.
  PlanRequest r;
  r.model = *load_model("llama-2-7b");
  r.gpus = {*parse_gpu_choice("a100-80gb")};
  r.nvme = *parse_nvme("1:gen4");
  Result<Plan> p = make_gpu_plans(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  const GpuPlan& g = p->gpus[0];
  EXPECT_EQ(g.offload, Offload::kNvme);
  ASSERT_TRUE(g.more_ram.has_value());
  EXPECT_EQ(g.more_ram->host_ram_bytes, g.host.full_speed_recommended_bytes);
  EXPECT_GT(g.more_ram->tokens_per_s, 5 * g.tokens_per_s);
  // And with that RAM given, the planner picks CPU offload at that speed.
  r.host_ram_bytes = g.more_ram->host_ram_bytes;
  Result<Plan> roomy = make_gpu_plans(r);
  ASSERT_TRUE(roomy.is_ok());
  EXPECT_EQ(roomy->gpus[0].offload, Offload::kCpu);
  EXPECT_DOUBLE_EQ(roomy->gpus[0].tokens_per_s, g.more_ram->tokens_per_s);
  EXPECT_FALSE(roomy->gpus[0].more_ram.has_value());
}

}  // namespace
}  // namespace strata
