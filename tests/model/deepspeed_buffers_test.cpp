// DeepSpeed's configurations, layout and buffers (runtime/model/deepspeed_*.h), shared by the
// benchmark's baseline worker and `strata plan`, against DeepSpeed 0.16.5's own rules: its
// defaults, its sub-groups, its buffers for llama-2-70b at full size (the figures
// ../shared/reference/offload-baseline.md derives from DeepSpeed's source).
#include "model/deepspeed_buffers.h"

#include <gtest/gtest.h>

#include <string>

#include "model/deepspeed_config.h"
#include "model/inventory.h"
#include "model/model_config.h"

namespace strata::deepspeed {
namespace {

std::vector<TensorSpec> llama70b() {
  Result<ModelConfig> m = load_model("llama-2-70b");
  EXPECT_TRUE(m.is_ok());
  return build_inventory(*m, InventoryOptions{});
}

const BufferSpec* find(const std::vector<BufferSpec>& buffers, const std::string& prefix) {
  for (const BufferSpec& b : buffers) {
    if (b.name.starts_with(prefix)) return &b;
  }
  return nullptr;
}

TEST(DeepSpeedModel, DefaultsAreDeepSpeedsOwnAtFullSize) {
  const auto inventory = llama70b();
  Result<DeepSpeedConfig> c = labelled_config(kDeepSpeedDefaults, inventory, 1.0);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->param_buffer_count, 5u);
  EXPECT_EQ(c->optimizer_buffer_count, 4u);
  EXPECT_EQ(c->sub_group_elements, 1'000'000'000u);
  EXPECT_EQ(c->max_in_cpu, 1'000'000'000u);
  EXPECT_FALSE(c->param_pin_memory);
  EXPECT_FALSE(c->optimizer_pin_memory);
  EXPECT_FALSE(c->pipeline_read);
  EXPECT_EQ(c->aio_block_bytes, 1u << 20);
  EXPECT_EQ(c->aio_queue_depth, 8u);
  EXPECT_EQ(c->aio_intra_op_parallelism, 1u);
  // buffer_size raised to the largest parameter (the embedding, 32000 x 8192), as DeepSpeed's
  // assert requires; 1e8 would be refused.
  EXPECT_EQ(c->param_buffer_elements, 32000u * 8192u);
}

TEST(DeepSpeedModel, SubGroupsCloseOnceTheyReachTheSizeSoTheLargestExceedsIt) {
  const auto inventory = llama70b();
  Result<DeepSpeedConfig> c = labelled_config(kDeepSpeedDefaults, inventory, 1.0);
  ASSERT_TRUE(c.is_ok());
  Result<DeepSpeedLayout> layout = deepspeed_layout(*c, inventory);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  // offload-baseline.md: the 70B sub-group of 1.118e9 elements.
  EXPECT_GT(layout->largest_sub_group, 1'000'000'000u);
  EXPECT_NEAR(static_cast<double>(layout->largest_sub_group), 1.118e9, 0.01e9);
  uint64_t total = 0;
  for (const SubGroup& g : layout->sub_groups) {
    total += g.elements;
    // No sub-group fits max_in_cpu whole only if the first is already larger than it.
    EXPECT_EQ(g.in_cpu, false);
  }
  EXPECT_EQ(total, layout->total_elements);
}

TEST(DeepSpeedModel, BuffersAt70bAreDeepSpeedsPinnedRoundedAndPageableOnes) {
  const auto inventory = llama70b();
  for (const char* name : {kDeepSpeedDefaults, kDeepSpeedPinned}) {
    SCOPED_TRACE(name);
    Result<DeepSpeedConfig> c = labelled_config(name, inventory, 1.0);
    ASSERT_TRUE(c.is_ok());
    Result<DeepSpeedLayout> layout = deepspeed_layout(*c, inventory);
    ASSERT_TRUE(layout.is_ok());
    const auto buffers = deepspeed_buffers(*c, *layout, inventory, Precision::kBf16);
    const BufferSpec* grad = find(buffers, "flat gradient");
    ASSERT_NE(grad, nullptr);
    // 2 bytes per parameter: 138 GB at 70B, pinned (and rounded to 256 GiB) only with pin_memory.
    EXPECT_EQ(grad->each_bytes, 2 * layout->total_elements);
    EXPECT_NEAR(static_cast<double>(grad->each_bytes), 138e9, 1e9);
    EXPECT_EQ(grad->pinned, c->optimizer_pin_memory);
    EXPECT_EQ(grad->each_held, c->optimizer_pin_memory ? uint64_t{256} << 30 : grad->each_bytes);
    // Four fp32 swap buffers of the largest sub-group: 4.47 GB each, held as 8 GiB pinned blocks.
    const BufferSpec* opt = find(buffers, "optimizer swap");
    ASSERT_NE(opt, nullptr);
    EXPECT_EQ(opt->count, 4u);
    EXPECT_TRUE(opt->pinned);
    EXPECT_EQ(opt->each_held, uint64_t{8} << 30);
    EXPECT_TRUE(opt->zero_source);
    // The write-back buffer is in the model dtype, 2 bytes per element.
    const BufferSpec* wb = find(buffers, "parameter write-back");
    ASSERT_NE(wb, nullptr);
    EXPECT_NEAR(static_cast<double>(wb->each_bytes), 2.0 * 1.118e9, 0.02e9);
    // bf16: no overflow check, so no temporaries.
    EXPECT_EQ(find(buffers, "overflow"), nullptr);
    const BufferPeaks peaks = buffer_peaks(buffers);
    EXPECT_GE(peaks.run, peaks.steps);
    EXPECT_FALSE(peaks.run_moment.empty());
  }
}

TEST(DeepSpeedModel, Fp16AddsTheOverflowTemporariesInsideEachStep) {
  const auto inventory = llama70b();
  Result<DeepSpeedConfig> c = labelled_config(kDeepSpeedDefaults, inventory, 1.0);
  ASSERT_TRUE(c.is_ok());
  Result<DeepSpeedLayout> layout = deepspeed_layout(*c, inventory);
  ASSERT_TRUE(layout.is_ok());
  const auto bf16 = buffer_peaks(deepspeed_buffers(*c, *layout, inventory, Precision::kBf16));
  const auto buffers = deepspeed_buffers(*c, *layout, inventory, Precision::kFp16);
  const BufferSpec* temp = find(buffers, "overflow");
  ASSERT_NE(temp, nullptr);
  EXPECT_EQ(temp->each_bytes, layout->total_elements);  // one byte per element, one at a time
  EXPECT_EQ(temp->life, BufferLife::kStep);
  const auto fp16 = buffer_peaks(buffers);
  EXPECT_EQ(fp16.steps, bf16.steps + layout->total_elements);
}

TEST(DeepSpeedModel, TunedHasOneParameterPerSubGroupNoCpuCopiesAndPipelinedBuffers) {
  const auto inventory = llama70b();
  Result<DeepSpeedConfig> c = labelled_config(kDeepSpeedTuned, inventory, 1.0);
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(c->pipeline_read);
  EXPECT_TRUE(c->pipeline_write);
  EXPECT_EQ(c->optimizer_buffer_count, 12u);
  EXPECT_EQ(c->max_in_cpu, 0u);
  Result<DeepSpeedLayout> layout = deepspeed_layout(*c, inventory);
  ASSERT_TRUE(layout.is_ok());
  for (const SubGroup& g : layout->sub_groups) EXPECT_EQ(g.params.size(), 1u);
  EXPECT_EQ(layout->largest_sub_group, layout->largest_param);
  const auto buffers = deepspeed_buffers(*c, *layout, inventory, Precision::kBf16);
  EXPECT_EQ(find(buffers, "max_in_cpu"), nullptr);
  // The norm weights' sub-groups are under the minimum I/O size: kept in CPU memory.
  EXPECT_NE(find(buffers, "unswapped sub-groups"), nullptr);
  auto defaults = labelled_config(kDeepSpeedDefaults, inventory, 1.0);
  auto defaults_layout = deepspeed_layout(*defaults, inventory);
  EXPECT_LT(
      buffer_peaks(buffers).steps,
      buffer_peaks(deepspeed_buffers(*defaults, *defaults_layout, inventory, Precision::kBf16))
          .steps);
}

TEST(DeepSpeedModel, ScalingShrinksEveryElementCountKnobByTheParameterFactor) {
  const auto inventory = llama70b();
  Result<DeepSpeedConfig> c = labelled_config(kDeepSpeedDefaults, inventory, 0.01);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->sub_group_elements, 10'000'000u);
  EXPECT_EQ(c->max_in_cpu, 10'000'000u);
  EXPECT_EQ(c->prefetch_bucket_elements, 500'000u);
  EXPECT_EQ(c->param_persistence_threshold, 1'000u);
  EXPECT_EQ(c->max_reuse_distance, 10'000'000u);
  EXPECT_FALSE(labelled_config("deepspeed-magic", inventory, 0.01).is_ok());
  EXPECT_FALSE(parse_baselines("deepspeed-defaults,nope").is_ok());
  EXPECT_FALSE(parse_baselines("").is_ok());
  EXPECT_EQ(parse_baselines(kAllBaselines)->size(), 3u);
}

}  // namespace
}  // namespace strata::deepspeed
