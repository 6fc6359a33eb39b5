#include "memory/staging.h"

#include <algorithm>

namespace strata::memory {
namespace {

struct Phase {
  bool reverse;
  KindMask kinds;
};

// The order of one training step (see staging.h).
constexpr Phase kPhases[] = {
    {false, kind_bit(TensorKind::kParameter)},
    {true, kind_bit(TensorKind::kParameter) | kind_bit(TensorKind::kGradient)},
    {false, kind_bit(TensorKind::kGradient) | kind_bit(TensorKind::kMasterWeight) |
                kind_bit(TensorKind::kAdamM) | kind_bit(TensorKind::kAdamV)},
};

}  // namespace

Result<KindMask> parse_kind_mask(std::string_view text) {
  if (text == "all") {
    KindMask all = 0;
    for (int k = 0; k < kTensorKindCount; ++k) all |= kind_bit(static_cast<TensorKind>(k));
    return all;
  }
  KindMask mask = 0;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view name = text.substr(0, comma);
    bool known = false;
    for (int k = 0; k < kTensorKindCount; ++k) {
      if (name == to_string(static_cast<TensorKind>(k))) {
        mask |= kind_bit(static_cast<TensorKind>(k));
        known = true;
      }
    }
    if (!known) {
      std::string names;
      for (int k = 0; k < kTensorKindCount; ++k) {
        names += std::string(k ? ", " : "") + to_string(static_cast<TensorKind>(k));
      }
      return invalid_argument("unknown tensor kind \"" + std::string(name) + "\" (known: " + names +
                              ", all)");
    }
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  if (mask == 0) return invalid_argument("no tensor kinds selected");
  return mask;
}

std::string kind_mask_string(KindMask kinds) {
  std::string out;
  for (int k = 0; k < kTensorKindCount; ++k) {
    if (kinds & kind_bit(static_cast<TensorKind>(k))) {
      out += std::string(out.empty() ? "" : ",") + to_string(static_cast<TensorKind>(k));
    }
  }
  return out;
}

std::vector<StagedTensor> staged_tensors(std::span<const TensorSpec> inventory, KindMask kinds) {
  int32_t last_layer = -1;
  for (const TensorSpec& spec : inventory) last_layer = std::max(last_layer, spec.layer);
  const auto after_layers = static_cast<uint32_t>(last_layer + 2);

  std::vector<StagedTensor> out;
  bool seen_layer = false;
  for (const TensorSpec& spec : inventory) {
    if (spec.layer >= 0) seen_layer = true;
    if ((kinds & kind_bit(spec.kind)) == 0 || spec.bytes() == 0) continue;
    StagedTensor t;
    t.bytes = spec.bytes();
    t.element_size = dtype_size(spec.dtype);
    t.kind = spec.kind;
    t.unit =
        spec.layer >= 0 ? static_cast<uint32_t>(spec.layer) + 1 : (seen_layer ? after_layers : 0);
    out.push_back(t);
  }
  return out;
}

std::vector<StagedTensor> staged_tensors_from_sizes(std::span<const uint64_t> sizes,
                                                    TensorKind kind, uint32_t element_size) {
  std::vector<StagedTensor> out;
  out.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    out.push_back({sizes[i], element_size, kind, static_cast<uint32_t>(out.size())});
  }
  return out;
}

std::vector<Window> staging_windows(std::span<const StagedTensor> tensors, uint32_t lookahead) {
  if (tensors.empty()) return {};
  lookahead = std::max<uint32_t>(lookahead, 1);
  uint32_t units = 0;
  for (const StagedTensor& t : tensors) units = std::max(units, t.unit + 1);
  std::vector<std::vector<uint32_t>> by_unit(units);
  for (uint32_t i = 0; i < tensors.size(); ++i) by_unit[tensors[i].unit].push_back(i);

  // The visits of one step that stage anything, each as its tensor list.
  std::vector<std::vector<uint32_t>> visits;
  for (const Phase& phase : kPhases) {
    for (uint32_t n = 0; n < units; ++n) {
      const uint32_t unit = phase.reverse ? units - 1 - n : n;
      std::vector<uint32_t> visit;
      for (uint32_t i : by_unit[unit]) {
        if (phase.kinds & kind_bit(tensors[i].kind)) visit.push_back(i);
      }
      if (!visit.empty()) visits.push_back(std::move(visit));
    }
  }
  // Selected kinds that no phase stages (activation checkpoints, other) form one last visit each,
  // so that nothing selected is left out of the sizing.
  for (uint32_t unit = 0; unit < units; ++unit) {
    std::vector<uint32_t> visit;
    for (uint32_t i : by_unit[unit]) {
      bool staged = false;
      for (const Phase& phase : kPhases) staged |= (phase.kinds & kind_bit(tensors[i].kind)) != 0;
      if (!staged) visit.push_back(i);
    }
    if (!visit.empty()) visits.push_back(std::move(visit));
  }

  const size_t count = visits.size() >= lookahead ? visits.size() - lookahead + 1 : 1;
  std::vector<Window> windows(count);
  std::vector<uint32_t> stamp(tensors.size(), UINT32_MAX);
  for (size_t w = 0; w < count; ++w) {
    for (size_t v = w; v < std::min(visits.size(), w + lookahead); ++v) {
      for (uint32_t i : visits[v]) {
        // The same tensor in two visits of a window (e.g. the head's parameters at the end of
        // forward and the start of backward) is one buffer, not two.
        if (stamp[i] == w) continue;
        stamp[i] = static_cast<uint32_t>(w);
        windows[w].tensors.push_back(i);
      }
      if (v == w) windows[w].first_visit_tensors = static_cast<uint32_t>(windows[w].tensors.size());
    }
  }
  return windows;
}

uint64_t peak_window_bytes(std::span<const StagedTensor> tensors, std::span<const Window> windows) {
  uint64_t peak = 0;
  for (const Window& w : windows) {
    uint64_t bytes = 0;
    for (uint32_t i : w.tensors) bytes += tensors[i].bytes;
    peak = std::max(peak, bytes);
  }
  return peak;
}

uint32_t peak_window_tensors(std::span<const Window> windows) {
  size_t peak = 0;
  for (const Window& w : windows) peak = std::max(peak, w.tensors.size());
  return static_cast<uint32_t>(peak);
}

}  // namespace strata::memory
