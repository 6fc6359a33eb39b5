#include "memory/staging.h"

#include <gtest/gtest.h>

#include "model/inventory.h"
#include "model/model_config.h"

namespace strata::memory {
namespace {

std::vector<TensorSpec> tiny_inventory() {
  Result<ModelConfig> config = load_model("tinyllama-1.1b");
  EXPECT_TRUE(config.is_ok());
  InventoryOptions o;
  o.layers = 2;
  return build_inventory(*config, o);
}

TEST(Staging, UnitsFollowLayersWithTheEmbeddingFirstAndTheHeadLast) {
  const std::vector<TensorSpec> inventory = tiny_inventory();
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  ASSERT_EQ(params.size(), 2u * 9 + 3);
  EXPECT_EQ(params.front().unit, 0u);  // embed_tokens
  EXPECT_EQ(params[1].unit, 1u);       // layers.0.input_layernorm
  EXPECT_EQ(params[10].unit, 2u);      // layers.1.input_layernorm
  EXPECT_EQ(params[19].unit, 3u);      // norm
  EXPECT_EQ(params[20].unit, 3u);      // lm_head
  for (const StagedTensor& t : params) EXPECT_EQ(t.kind, TensorKind::kParameter);

  const std::vector<StagedTensor> all = staged_tensors(inventory, *parse_kind_mask("all"));
  EXPECT_EQ(all.size(), inventory.size());
}

TEST(Staging, AStepVisitsForwardThenBackwardThenTheOptimizer) {
  const std::vector<TensorSpec> inventory = tiny_inventory();
  const KindMask kinds =
      kParameterStream | kind_bit(TensorKind::kGradient) | kind_bit(TensorKind::kAdamM);
  const std::vector<StagedTensor> tensors = staged_tensors(inventory, kinds);
  const std::vector<Window> windows = staging_windows(tensors, 1);
  // 4 units forward (params), 4 backward (params + grads), 4 optimizer (grads + m).
  ASSERT_EQ(windows.size(), 12u);
  auto kinds_of = [&](const Window& w) {
    KindMask m = 0;
    for (uint32_t i : w.tensors) m |= kind_bit(tensors[i].kind);
    return m;
  };
  auto unit_of = [&](const Window& w) { return tensors[w.tensors.front()].unit; };
  EXPECT_EQ(unit_of(windows[0]), 0u);
  EXPECT_EQ(unit_of(windows[3]), 3u);
  EXPECT_EQ(kinds_of(windows[3]), kParameterStream);
  EXPECT_EQ(unit_of(windows[4]), 3u);  // backward starts at the head
  EXPECT_EQ(kinds_of(windows[4]), kParameterStream | kind_bit(TensorKind::kGradient));
  EXPECT_EQ(unit_of(windows[7]), 0u);
  EXPECT_EQ(kinds_of(windows[8]), kind_bit(TensorKind::kGradient) | kind_bit(TensorKind::kAdamM));
  for (const Window& w : windows) EXPECT_EQ(w.first_visit_tensors, w.tensors.size());
}

TEST(Staging, WindowsCountATensorInTwoOfTheirVisitsOnce) {
  const std::vector<TensorSpec> inventory = tiny_inventory();
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  const std::vector<Window> windows = staging_windows(params, 2);
  // Visits: forward 0..3, backward 3..0. Window 3 holds the head unit's forward and backward
  // visits: the same two tensors (final norm, head), once.
  ASSERT_EQ(windows.size(), 7u);
  EXPECT_EQ(windows[3].tensors.size(), 2u);
  EXPECT_EQ(windows[3].first_visit_tensors, 2u);
  EXPECT_EQ(windows[2].tensors.size(), 9u + 2u);
  EXPECT_EQ(windows[2].first_visit_tensors, 9u);
  EXPECT_EQ(peak_window_tensors(windows), 18u);
  uint64_t layer = 0;
  for (const StagedTensor& t : params) {
    if (t.unit == 1) layer += t.bytes;
  }
  // TinyLlama's embedding (32000 x 2048) outweighs a layer: the windows holding the embedding or
  // the head (with the final norm) are the largest.
  EXPECT_EQ(peak_window_bytes(params, windows), params.back().bytes + params[19].bytes + layer);
}

TEST(Staging, KindNamesParseAndBadOnesAreErrors) {
  Result<KindMask> m = parse_kind_mask("parameter,gradient");
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(*m, kParameterStream | kind_bit(TensorKind::kGradient));
  EXPECT_EQ(kind_mask_string(*m), "parameter,gradient");
  EXPECT_EQ(parse_kind_mask("parameter,weights").status().code(), STRATA_E_INVALID);
  EXPECT_EQ(parse_kind_mask("").status().code(), STRATA_E_INVALID);
}

TEST(Staging, BareSizesAreOneUnitEach) {
  const std::vector<uint64_t> sizes = {10, 0, 30};
  const std::vector<StagedTensor> t = staged_tensors_from_sizes(sizes, TensorKind::kOther);
  ASSERT_EQ(t.size(), 2u);  // empty tensors stage nothing
  EXPECT_EQ(t[1].unit, 1u);
  const std::vector<Window> windows = staging_windows(t, 2);
  ASSERT_EQ(windows.size(), 1u);
  EXPECT_EQ(windows[0].tensors.size(), 2u);
}

}  // namespace
}  // namespace strata::memory
