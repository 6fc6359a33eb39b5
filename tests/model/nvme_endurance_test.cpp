// SSD wear: bytes written against drives x rated TBW.
#include "model/nvme_endurance.h"

#include <gtest/gtest.h>

#include "model/plan.h"

namespace strata {
namespace {

TEST(NvmeWear, OneTerabytePerStepSpendsA1200TbwDriveIn1200Steps) {
  const NvmeDrive drive = *find_nvme_drive("samsung-990-pro-2tb");
  EXPECT_DOUBLE_EQ(drive.tbw_tb, 1200);
  NvmeWear w = nvme_wear(1'000'000'000'000, 1, drive, std::nullopt, 0.10);
  EXPECT_DOUBLE_EQ(w.steps_to_endurance, 1200);
  EXPECT_FALSE(w.job_share.has_value());
  // 100 steps: 100 TB, 8.3% of the rating; 200 steps: 16.7%, past the 10% warning.
  w = nvme_wear(1'000'000'000'000, 1, drive, 100, 0.10);
  EXPECT_DOUBLE_EQ(*w.job_write_bytes, 100e12);
  EXPECT_NEAR(*w.job_share, 100.0 / 1200, 1e-12);
  EXPECT_FALSE(w.warn);
  EXPECT_TRUE(nvme_wear(1'000'000'000'000, 1, drive, 200, 0.10).warn);
  // RAID-0 over four drives spreads the writes: four times the endurance.
  EXPECT_DOUBLE_EQ(nvme_wear(1'000'000'000'000, 4, drive, 100, 0.10).steps_to_endurance, 4800);
}

TEST(NvmeWear, PresetsCoverGen4AndGen5AndUnknownDrivesAreErrors) {
  EXPECT_EQ(default_nvme_drive("gen4-x4").generation, 4);
  EXPECT_EQ(default_nvme_drive("gen5-x4").generation, 5);
  EXPECT_EQ(default_nvme_drive("-x4").name, default_nvme_drive("gen4-x4").name);
  for (const NvmeDrive& d : nvme_drive_presets()) EXPECT_GT(d.tbw_tb, 0) << d.name;
  Result<NvmeDrive> unknown = find_nvme_drive("floppy");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("crucial-t705-2tb"), std::string::npos);
}

TEST(NvmeWear, PlansReportTheSimulatedWritesPerStepAndPerJob) {
  PlanRequest r;
  r.model = *load_model("tinyllama-1.1b");
  r.offload = Offload::kNvme;
  r.gpus = {*parse_gpu_choice("rtx-4090")};
  r.nvme = *parse_nvme("2:gen5");
  r.job_tokens = 1e8;
  Result<Plan> p = make_gpu_plans(r);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  const GpuPlan& g = p->gpus[0];
  EXPECT_EQ(p->request.nvme_drive.name, default_nvme_drive("gen5-x4").name);
  EXPECT_EQ(g.nvme_wear.write_bytes_per_step, g.stages.nvme_write_bytes);
  EXPECT_GT(g.nvme_wear.write_bytes_per_step, 12 * p->states.params);  // master, m, v at least
  ASSERT_TRUE(g.job_cost.has_value());
  EXPECT_DOUBLE_EQ(*g.nvme_wear.job_write_bytes,
                   static_cast<double>(g.job_cost->steps) * g.stages.nvme_write_bytes);
  EXPECT_DOUBLE_EQ(g.nvme_wear.endurance_bytes, 2 * 1200e12);
}

}  // namespace
}  // namespace strata
