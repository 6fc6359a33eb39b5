// CpuAdam::grad_stats: the fused overflow check and sum of squares, on every SIMD path.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "adam_test_util.h"
#include "optim/cpu_adam.h"

namespace strata::optim {
namespace {

using testing::Gradients;
using testing::make_gradients;
using testing::Rng;

const DType kGradTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

std::unique_ptr<CpuAdam> make_adam(SimdLevel level, int threads) {
  auto adam = CpuAdam::create({.threads = threads, .simd = level});
  EXPECT_TRUE(adam.is_ok()) << adam.status().message();
  return adam.is_ok() ? std::move(*adam) : nullptr;
}

GradSlice slice_of(const Gradients& g, size_t begin = 0, size_t n = SIZE_MAX) {
  if (n == SIZE_MAX) n = g.size() - begin;
  return {static_cast<const unsigned char*>(g.data()) + begin * dtype_size(g.dtype), g.dtype, n};
}

long double exact_sum_squares(const Gradients& g) {
  long double sum = 0;  // 64-bit mantissa; fp32 squares are exact in it
  for (size_t i = 0; i < g.size(); ++i) {
    const long double x = g.value(i);
    sum += x * x;
  }
  return sum;
}

class GradStatsPath : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!cpu_supports(GetParam()))
      GTEST_SKIP() << "this CPU does not support " << to_string(GetParam());
    adam_ = make_adam(GetParam(), 2);
    ASSERT_NE(adam_, nullptr);
  }
  std::unique_ptr<CpuAdam> adam_;
};

TEST_P(GradStatsPath, SumOfSquaresMatchesExtendedPrecisionReference) {
  const size_t lengths[] = {0, 1, 5, 15, 16, 17, 31, 32, 33, 1000, 16384, 16385, 100003, 2000001};
  for (DType dtype : kGradTypes) {
    for (size_t n : lengths) {
      Rng rng(n + 11);
      // Magnitudes spread over many binades, as real gradients are.
      Gradients g = make_gradients(n, dtype, rng, 1.0f);
      for (size_t i = 0; i < n; i += 3) g.set(i, g.value(i) * 1e-3f);
      const GradSlice slice = slice_of(g);
      auto stats = adam_->grad_stats({&slice, 1});
      ASSERT_TRUE(stats.is_ok()) << stats.status().message();
      EXPECT_FALSE(stats->found_nonfinite);
      const long double want = exact_sum_squares(g);
      if (n == 0) {
        EXPECT_EQ(stats->sum_squares, 0.0);
        continue;
      }
      const double relative = std::fabs(static_cast<double>((stats->sum_squares - want) / want));
      EXPECT_LE(relative, 1e-12) << to_string(dtype) << " n=" << n;
    }
  }
}

// One bad element anywhere, in the vector body or in any tail lane, of any kind.
TEST_P(GradStatsPath, FindsASingleInfOrNanAnywhere) {
  const float bad_values[] = {INFINITY, -INFINITY, NAN};
  for (DType dtype : kGradTypes) {
    for (size_t n : {1, 7, 16, 33, 1000, 70001}) {
      Rng rng(n);
      Gradients g = make_gradients(n, dtype, rng, 1.0f);
      const GradSlice slice = slice_of(g);
      auto clean = adam_->grad_stats({&slice, 1});
      ASSERT_TRUE(clean.is_ok());
      ASSERT_FALSE(clean->found_nonfinite);
      std::vector<size_t> positions = {0, n / 2};
      for (size_t k = 0; k < 40 && k < n; ++k) positions.push_back(n - 1 - k);  // every tail lane
      for (size_t pos : positions) {
        for (float bad : bad_values) {
          const float saved = g.value(pos);
          g.set(pos, bad);
          auto stats = adam_->grad_stats({&slice, 1});
          ASSERT_TRUE(stats.is_ok());
          ASSERT_TRUE(stats->found_nonfinite)
              << to_string(dtype) << " n=" << n << " at " << pos << " value " << bad;
          EXPECT_FALSE(std::isfinite(stats->sum_squares));
          g.set(pos, saved);
        }
      }
    }
  }
}

// The largest finite values square to finite doubles: no false alarm at the edge of the range.
TEST_P(GradStatsPath, LargestFiniteValuesAreNotOverflow) {
  const size_t n = 4099;
  for (DType dtype : kGradTypes) {
    Rng rng(1);
    Gradients g = make_gradients(n, dtype, rng, 1.0f);
    const float largest = dtype == DType::kFloat32   ? 3.4028234e38f
                          : dtype == DType::kFloat16 ? 65504.0f
                                                     : 3.3895314e38f;
    for (size_t i = 0; i < n; ++i) g.set(i, (i % 2) ? largest : -largest);
    const GradSlice slice = slice_of(g);
    auto stats = adam_->grad_stats({&slice, 1});
    ASSERT_TRUE(stats.is_ok());
    EXPECT_FALSE(stats->found_nonfinite) << to_string(dtype);
    const double want = static_cast<double>(largest) * largest * n;
    EXPECT_NEAR(stats->sum_squares / want, 1.0, 1e-12);
  }
}

// Block boundaries depend on the total length only: any thread count, the same bits.
TEST_P(GradStatsPath, ThreadCountDoesNotChangeAnyBit) {
  Rng rng(2);
  const Gradients a = make_gradients(5'000'017, DType::kFloat32, rng, 1.0f);
  const Gradients b = make_gradients(77'777, DType::kFloat16, rng, 1.0f);
  const GradSlice slices[] = {slice_of(a, 0, 1'000'001), slice_of(b), slice_of(a, 1'000'001)};
  double expected = 0;
  for (int threads : {1, 2, 3, 7}) {
    auto adam = make_adam(GetParam(), threads);
    auto stats = adam->grad_stats(slices);
    ASSERT_TRUE(stats.is_ok());
    if (threads == 1) expected = stats->sum_squares;
    EXPECT_EQ(stats->sum_squares, expected) << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Simd, GradStatsPath,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(GradStats, RejectsBadSlices) {
  auto adam = make_adam(best_simd_level(), 1);
  const GradSlice null_data{nullptr, DType::kFloat32, 10};
  EXPECT_EQ(adam->grad_stats({&null_data, 1}).status().code(), STRATA_E_INVALID);
  std::vector<uint8_t> bytes(64);
  const GradSlice int8{bytes.data(), DType::kInt8, 10};
  EXPECT_EQ(adam->grad_stats({&int8, 1}).status().code(), STRATA_E_INVALID);
  const GradSlice misaligned{bytes.data() + 1, DType::kBFloat16, 10};
  EXPECT_EQ(adam->grad_stats({&misaligned, 1}).status().code(), STRATA_E_INVALID);
  auto none = adam->grad_stats({});
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->sum_squares, 0.0);
  EXPECT_FALSE(none->found_nonfinite);
}

// torch.nn.utils.clip_grad_norm_ semantics on unscaled gradients, times 1/loss_scale.
TEST(UnscaleAndClip, FoldsLossScaleAndClipCoefficient) {
  const double loss_scale = 1024;
  GradStats stats;
  stats.sum_squares = 9.0 * loss_scale * loss_scale;  // unscaled norm 3
  EXPECT_FLOAT_EQ(unscale_and_clip(stats, loss_scale, 0.0), 1.0f / 1024);
  EXPECT_FLOAT_EQ(unscale_and_clip(stats, loss_scale, 10.0), 1.0f / 1024);
  EXPECT_FLOAT_EQ(unscale_and_clip(stats, loss_scale, 1.5),
                  static_cast<float>(1.0 / 1024 * 1.5 / (3.0 + 1e-6)));
  EXPECT_FLOAT_EQ(unscale_and_clip(stats, 1.0, 1.5),
                  static_cast<float>(1.5 / (std::sqrt(9.0 * 1024 * 1024) + 1e-6)));
  stats.sum_squares = INFINITY;
  EXPECT_FLOAT_EQ(unscale_and_clip(stats, loss_scale, 1.0), 1.0f / 1024);
}

}  // namespace
}  // namespace strata::optim
