// The planner's DeepSpeed estimate (model/plan_deepspeed.h) on a model small enough to count by
// hand: which partitions DeepSpeed reads and writes per step, the step time its phases give, and
// the knobs scaled as `strata bench finetune` scales them.
#include "model/plan_deepspeed.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace strata {
namespace {

constexpr uint64_t kMi = uint64_t{1} << 20;

TensorSpec param(const char* name, uint64_t elements, int32_t layer) {
  TensorSpec t;
  t.name = name;
  t.shape = {elements};
  t.layer = layer;
  return t;
}

// An embedding, two layers, a final norm and a head: four 2 MiB bf16 partitions (swapped: at
// least DeepSpeed's 1 MiB minimum I/O) and a 2 KiB norm (kept in CPU memory).
std::vector<TensorSpec> small_model() {
  return {param("embed", kMi, -1), param("layers.0.w", kMi, 0), param("layers.1.w", kMi, 1),
          param("norm", 1024, -1), param("head", kMi, -1)};
}

// Knobs at 0.0015 of DeepSpeed's: sub_group_size and max_reuse_distance 1.5e6 elements.
constexpr double kFactor = 0.0015;

TEST(DeepSpeedLayout, KeepsOnlyTheLastUnitsParametersReusedWithinTheReuseDistance) {
  const auto inventory = small_model();
  auto config = deepspeed::labelled_config(deepspeed::kDeepSpeedDefaults, inventory, kFactor);
  ASSERT_TRUE(config.is_ok());
  EXPECT_EQ(config->max_reuse_distance, 1'500'000u);
  auto layout = deepspeed::deepspeed_layout(*config, inventory);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  // The head is fetched last in forward and first in backward: nothing in between. The norm has
  // the head's 2 x 2^20 elements in between, beyond 1.5e6. Layers are never kept.
  EXPECT_EQ(layout->kept_for_backward, (std::vector<bool>{false, false, false, false, true}));
  // Sub-groups close once they reach 1.5e6: {embed, layer 0} and {layer 1, norm, head}.
  ASSERT_EQ(layout->sub_groups.size(), 2u);
  EXPECT_EQ(layout->sub_groups[0].elements, 2 * kMi);
  EXPECT_EQ(layout->sub_groups[1].elements, 2 * kMi + 1024);
}

TEST(DeepSpeedStepIo, CountsEveryRequestTheWorkerIssues) {
  const auto inventory = small_model();
  auto config = deepspeed::labelled_config(deepspeed::kDeepSpeedDefaults, inventory, kFactor);
  auto layout = deepspeed::deepspeed_layout(*config, inventory);
  ASSERT_TRUE(layout.is_ok());
  const DeepSpeedStepIo io = deepspeed_step_io(*config, *layout, inventory, 1);
  // Embed and both layers fetched twice, the head once (kept): 7 x 2 MiB; the norm has no file.
  EXPECT_EQ(io.parameter_reads, 7 * 2 * kMi);
  EXPECT_EQ(io.parameter_writes, 4 * 2 * kMi);
  // master, exp_avg, exp_avg_sq of each sub-group, fp32, 4 KiB-aligned: 8 MiB and 2049 pages.
  EXPECT_EQ(io.state_reads, 3 * (8 * kMi + 2049 * 4096));
  EXPECT_EQ(io.state_writes, io.state_reads);
  // A 4 MiB fp32 slice per big parameter and one page for the norm's, out and back.
  EXPECT_EQ(io.gradient_writes, 4 * 4 * kMi + 4096);
  EXPECT_EQ(io.gradient_reads, io.gradient_writes);
  EXPECT_EQ(io.read(), io.parameter_reads + io.state_reads + io.gradient_reads);
  EXPECT_EQ(io.written(), io.gradient_writes + io.state_writes + io.parameter_writes);
  // Four micro-batches fetch four times; gradients go out once, at the accumulation boundary.
  const DeepSpeedStepIo four = deepspeed_step_io(*config, *layout, inventory, 4);
  EXPECT_EQ(four.parameter_reads, 4 * io.parameter_reads);
  EXPECT_EQ(four.gradient_writes, io.gradient_writes);
  EXPECT_EQ(four.state_reads, io.state_reads);
}

OffloadJob small_job() {
  OffloadJob job;
  job.inventory = small_model();
  for (const TensorSpec& t : job.inventory) job.params += t.elements();
  job.trainable_params = job.params;
  job.compute_seconds = 0.001;
  job.pcie_gbps = 25;
  job.nvme_read_gbps = 1.0;
  job.nvme_write_gbps = 0.5;
  job.adam_params_per_s = 1e9;
  job.host_scan_gbps = 20;
  return job;
}

TEST(DeepSpeedEstimate, StepIsItsPhasesSerialOrPipelined) {
  const OffloadJob job = small_job();
  const double total = static_cast<double>(job.params);
  // Adam, then two passes at the scan rate: the clipping pass and the 16-bit weight copy.
  const double cpu = total / 1e9 + total * (8 + 8) / 20e9;
  for (const char* name : {deepspeed::kDeepSpeedDefaults, deepspeed::kDeepSpeedTuned}) {
    SCOPED_TRACE(name);
    Result<DeepSpeedEstimate> d = estimate_deepspeed_offload(job, name, kFactor);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    const DeepSpeedStepIo& io = d->io;
    const double passes =
        std::max(job.compute_seconds, io.parameter_reads / 1e9 + io.gradient_writes / 0.5e9);
    const double disk = (io.state_reads + io.gradient_reads) / 1e9 +
                        (io.state_writes + io.parameter_writes) / 0.5e9;
    const bool pipelined = std::string(name) == deepspeed::kDeepSpeedTuned;
    const double expected = passes + (pipelined ? std::max(disk, cpu) : disk + cpu);
    EXPECT_NEAR(d->offload.step_seconds, expected, 1e-12);
    EXPECT_EQ(d->offload.model, "analytic");
    EXPECT_EQ(d->offload.nvme_read_bytes, io.read());
    EXPECT_EQ(d->offload.nvme_write_bytes, io.written());
    // Host: the buffers' peak over the run; the steps alone never exceed it.
    const deepspeed::BufferPeaks peaks = deepspeed::buffer_peaks(d->buffers);
    EXPECT_EQ(d->offload.host_bytes, peaks.run);
    EXPECT_EQ(d->host_bytes_steps, peaks.steps);
    EXPECT_LE(d->host_bytes_steps, d->offload.host_bytes);
    EXPECT_EQ(d->offload.bottleneck, "nvme-write");
  }
}

TEST(DeepSpeedEstimate, RefusesWhatTheLabelledConfigurationsDoNotModel) {
  OffloadJob job = small_job();
  EXPECT_EQ(estimate_deepspeed_offload(job, "deepspeed-magic", kFactor).status().code(),
            STRATA_E_INVALID);
  EXPECT_EQ(estimate_deepspeed_offload(job, deepspeed::kDeepSpeedDefaults, 0).status().code(),
            STRATA_E_INVALID);
  job.optimizer_on_host = false;  // (Q)LoRA: adapters on the GPU
  EXPECT_EQ(estimate_deepspeed_offload(job, deepspeed::kDeepSpeedDefaults, kFactor).status().code(),
            STRATA_E_UNSUPPORTED);
  job = small_job();
  job.param_bytes = 4;  // fp32 weights
  EXPECT_EQ(estimate_deepspeed_offload(job, deepspeed::kDeepSpeedDefaults, kFactor).status().code(),
            STRATA_E_UNSUPPORTED);
}

}  // namespace
}  // namespace strata
