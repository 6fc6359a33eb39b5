// What the buffer pool has to hold: the tensors a training step stages through pinned memory and,
// for a given lookahead, which of them are in flight together.
//
// The step's staging order is a sequence of visits to units: unit 0 holds what comes before the
// transformer layers (the embedding), units 1..L the layers, unit L+1 what comes after (final
// norm, LM head). Forward visits units 0..L+1 for parameters; backward visits them in reverse for
// parameters and gradients; the optimizer visits them in order for gradients, fp32 masters and
// Adam moments. Only the kinds a caller selects are staged (the parameter stream alone by
// default). A prefetcher with lookahead W keeps the tensors of W consecutive visits in flight:
// window i is the union of visits i .. i+W-1. Every policy is measured against these same
// windows, which is what makes their reserved bytes comparable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "vocabulary/tensor_spec.h"

namespace strata::memory {

using KindMask = uint32_t;
constexpr KindMask kind_bit(TensorKind kind) {
  return KindMask{1} << static_cast<int>(kind);
}
inline constexpr KindMask kParameterStream = kind_bit(TensorKind::kParameter);

// "parameter,gradient", "all"; names as to_string(TensorKind). STRATA_E_INVALID on unknown names.
Result<KindMask> parse_kind_mask(std::string_view text);
std::string kind_mask_string(KindMask kinds);

// A tensor reduced to what pool sizing needs.
struct StagedTensor {
  uint64_t bytes = 0;
  uint32_t element_size = 2;
  TensorKind kind = TensorKind::kParameter;
  uint32_t unit = 0;
};

// The tensors of the selected kinds, in inventory order, with units from their layers (layer -1
// before the first layer tensor goes to unit 0, after it to the last unit).
std::vector<StagedTensor> staged_tensors(std::span<const TensorSpec> inventory, KindMask kinds);
// Bare sizes without layer structure: each tensor is its own unit, in the given order.
std::vector<StagedTensor> staged_tensors_from_sizes(std::span<const uint64_t> sizes,
                                                    TensorKind kind, uint32_t element_size = 2);

// One window of a step: indices into the tensors, each at most once, the first visit's first (the
// tensors computed on while the rest are being fetched).
struct Window {
  std::vector<uint32_t> tensors;
  uint32_t first_visit_tensors = 0;
};
std::vector<Window> staging_windows(std::span<const StagedTensor> tensors, uint32_t lookahead);

// The largest bytes in flight over the windows: what any policy must hold at once ("requested").
uint64_t peak_window_bytes(std::span<const StagedTensor> tensors, std::span<const Window> windows);
// The most tensors in flight at once.
uint32_t peak_window_tensors(std::span<const Window> windows);

}  // namespace strata::memory
