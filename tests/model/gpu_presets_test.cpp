#include "model/gpu_presets.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(GpuPresets, ShipsDatasheetFiguresAndPrices) {
  const std::vector<std::string> expected = {"a100-40gb", "a100-80gb", "h100-pcie", "h100-sxm",
                                             "h200",      "l40s",      "rtx-4090"};
  std::vector<std::string> names;
  for (const auto& gpu : gpu_presets()) names.push_back(gpu.name);
  EXPECT_EQ(names, expected);

  Result<GpuPreset> h100 = find_gpu("h100-sxm");
  ASSERT_TRUE(h100.is_ok());
  // The memory the driver reports, not the datasheet's "80 GB" (until 2026-12-05 taken as 80 GiB,
  // and an L40S's "48 GB" as 48 GiB, 3 GiB more than it has).
  EXPECT_EQ(h100->memory_mib, 81559);
  EXPECT_EQ(h100->memory_bytes(), 81559ull << 20);
  EXPECT_EQ(find_gpu("l40s")->memory_bytes(), 46068ull << 20);
  EXPECT_EQ(find_gpu("h200")->memory_bytes(), 143771ull << 20);
  EXPECT_EQ(h100->bf16_dense_tflops, 989);
  EXPECT_EQ(h100->pcie_gen, 5);
  EXPECT_EQ(h100->host_link_gbps, 63.0);
  EXPECT_EQ(h100->pinned_copy_gbps, 55.0);
  EXPECT_EQ(h100->price_usd_per_hour.low, 1.38);
  EXPECT_EQ(h100->price_usd_per_hour.typical, 2.95);
  EXPECT_EQ(h100->price_usd_per_hour.high, 8.00);
  for (const auto& gpu : gpu_presets()) {
    EXPECT_GT(gpu.tf32_dense_tflops, 0) << gpu.name;
    EXPECT_LT(gpu.tf32_dense_tflops, gpu.bf16_dense_tflops) << gpu.name;
    EXPECT_LT(gpu.pinned_copy_gbps, gpu.host_link_gbps) << gpu.name;
    EXPECT_LE(gpu.price_usd_per_hour.low, gpu.price_usd_per_hour.typical) << gpu.name;
    EXPECT_LE(gpu.price_usd_per_hour.typical, gpu.price_usd_per_hour.high) << gpu.name;
  }
}

TEST(GpuPresets, LookupIgnoresCaseAndNamesTheChoicesOnError) {
  EXPECT_TRUE(find_gpu("RTX-4090").is_ok());
  Result<GpuPreset> r = find_gpu("b200");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), STRATA_E_INVALID);
  EXPECT_NE(r.status().message().find("b200"), std::string::npos);
  EXPECT_NE(r.status().message().find("a100-80gb"), std::string::npos);
}

TEST(NvmePresets, GenerationsResolveToPerDriveRates) {
  Result<NvmePreset> gen4 = find_nvme("gen4");
  ASSERT_TRUE(gen4.is_ok());
  EXPECT_EQ(gen4->read_gbps, 7.0);
  EXPECT_EQ(gen4->write_gbps, 4.3);
  Result<NvmePreset> gen5 = find_nvme("gen5-x4");
  ASSERT_TRUE(gen5.is_ok());
  EXPECT_EQ(gen5->read_gbps, 13.0);
  EXPECT_FALSE(find_nvme("gen3").is_ok());
}

}  // namespace
}  // namespace strata
