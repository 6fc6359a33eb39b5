#include "model/gpu_presets.h"

#include <gtest/gtest.h>

#include <utility>

namespace strata {
namespace {

// RAID-0 arrays as DeepNVMe measured them (4 x Gen4 10 / 5 GB/s, 4 x Gen5 27 / 11, 8 x Gen5
// 48 / 26): 29-52% of their drives' summed rates. Until 2026-12-05 an array was N x one drive, so
// "--nvme 4:gen4" promised 28 / 17.2 GB/s and the advice to add drives 2.6x too much.
TEST(GpuPresets, ArraysMoveWhatMeasuredArraysMove) {
  const NvmePreset gen4 = *find_nvme("gen4-x4");
  const NvmePreset gen5 = *find_nvme("gen5-x4");
  const auto rates = [](const NvmeArrayPoint& p) { return std::pair(p.read_gbps, p.write_gbps); };
  EXPECT_EQ(rates(gen4.array(1)), std::pair(7.0, 4.3));    // one drive: the preset
  EXPECT_EQ(rates(gen4.array(4)), std::pair(10.0, 5.0));   // measured
  EXPECT_EQ(rates(gen5.array(8)), std::pair(48.0, 26.0));  // measured
  // Between: linear in the count; past the largest: the last measured stretch's gain per drive
  // (gen4 1 -> 4: +1.0 / +0.233 a drive; gen5 4 -> 8: +5.25 / +3.75), not a jump to the
  // largest array's per-drive rate times the count (5 x Gen4 had 12.5 / 6.25 GB/s).
  EXPECT_DOUBLE_EQ(gen4.array(2).read_gbps, 8.0);
  EXPECT_DOUBLE_EQ(gen5.array(6).write_gbps, 18.5);
  EXPECT_DOUBLE_EQ(gen4.array(8).read_gbps, 14.0);
  EXPECT_NEAR(gen4.array(8).write_gbps, 5.0 + 4 * 0.7 / 3, 1e-12);
  EXPECT_EQ(rates(gen5.array(16)), std::pair(90.0, 56.0));
  for (uint32_t n = 1; n < 64; ++n) {  // more drives never slower, and never more per drive
    for (const NvmePreset* g : {&gen4, &gen5}) {
      EXPECT_LE(g->array(n).read_gbps, g->array(n + 1).read_gbps) << g->name << n;
      EXPECT_LE(g->array(n).write_gbps, g->array(n + 1).write_gbps) << g->name << n;
      EXPECT_LE(g->array(n + 1).read_gbps - g->array(n).read_gbps, g->read_gbps) << g->name << n;
    }
  }
}

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
