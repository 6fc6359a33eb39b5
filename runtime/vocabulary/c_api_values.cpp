// The vocabulary's values are the C API's: a strata_tier, strata_dtype or strata_tensor_kind
// converts to its enum by value. These checks make a change on either side a compile error
// instead of a silently misfiled tensor.
#include "strata/strata.h"
#include "vocabulary/tensor_spec.h"
#include "vocabulary/tier.h"

namespace strata {
namespace {

template <typename Enum>
constexpr int value(Enum e) {
  return static_cast<int>(e);
}

static_assert(value(Tier::kHost) == STRATA_TIER_HOST);
static_assert(value(Tier::kPinned) == STRATA_TIER_PINNED);
static_assert(value(Tier::kDevice) == STRATA_TIER_DEVICE);
static_assert(value(Tier::kNvme) == STRATA_TIER_NVME);
static_assert(kTierCount == STRATA_TIER_NVME + 1);

static_assert(value(DType::kFloat32) == STRATA_DTYPE_F32);
static_assert(value(DType::kBFloat16) == STRATA_DTYPE_BF16);
static_assert(value(DType::kFloat16) == STRATA_DTYPE_F16);
static_assert(value(DType::kInt8) == STRATA_DTYPE_I8);
static_assert(value(DType::kUInt8) == STRATA_DTYPE_U8);
static_assert(kDTypeCount == STRATA_DTYPE_U8 + 1);

static_assert(value(TensorKind::kParameter) == STRATA_KIND_PARAMETER);
static_assert(value(TensorKind::kGradient) == STRATA_KIND_GRADIENT);
static_assert(value(TensorKind::kMasterWeight) == STRATA_KIND_MASTER_WEIGHT);
static_assert(value(TensorKind::kAdamM) == STRATA_KIND_ADAM_M);
static_assert(value(TensorKind::kAdamV) == STRATA_KIND_ADAM_V);
static_assert(value(TensorKind::kActivationCheckpoint) == STRATA_KIND_ACTIVATION_CHECKPOINT);
static_assert(value(TensorKind::kOther) == STRATA_KIND_OTHER);
static_assert(kTensorKindCount == STRATA_KIND_OTHER + 1);

}  // namespace
}  // namespace strata
