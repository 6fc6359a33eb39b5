#include "sched/training_step.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <unordered_map>

namespace strata::sched {

namespace {

struct ParamGroup {
  int param = -1, grad = -1;
  std::vector<int> master, m, v;  // one each, or one per sub-group
  int32_t phase_layer = -1;       // -1 pre, 0..N-1, N post
};

std::string_view base_name(const std::string& name) {
  const size_t hash = name.find('#');
  return std::string_view(name).substr(0, hash == std::string::npos ? name.size() : hash);
}

}  // namespace

std::string runtime_state_name(const std::string& inventory_name, TensorKind kind) {
  const size_t hash = inventory_name.find('#');
  if (optimizer_state_word(kind) == nullptr || hash == std::string::npos) return inventory_name;
  // split_optimizer_states' "@<i>"; a state left whole is the runtime's one sub-group, 0.
  const size_t at = inventory_name.find('@', hash);
  const uint64_t sub_group =
      at == std::string::npos ? 0 : std::strtoull(inventory_name.c_str() + at + 1, nullptr, 10);
  return optimizer_state_name(inventory_name.substr(0, hash), kind, sub_group);
}

Result<TrainingStep> plan_training_step(std::span<const TensorSpec> inventory,
                                        std::span<const TensorHandle> handles,
                                        const TrainingStepOptions& options) {
  if (inventory.size() != handles.size()) {
    return invalid_argument("training step: " + std::to_string(inventory.size()) + " tensors but " +
                            std::to_string(handles.size()) + " handles");
  }
  if (options.optimizer_tier == Tier::kNvme || options.compute_tier == Tier::kNvme) {
    return invalid_argument("training step: compute and optimizer tiers are device or pinned");
  }
  std::vector<ParamGroup> groups;
  std::unordered_map<std::string_view, size_t> by_name;
  int32_t max_layer = -1;
  size_t first_layered = inventory.size();
  for (size_t i = 0; i < inventory.size(); ++i) {
    const TensorSpec& spec = inventory[i];
    if (spec.kind != TensorKind::kParameter) continue;
    if (!by_name.emplace(base_name(spec.name), groups.size()).second) {
      return invalid_argument("training step: parameter '" + spec.name + "' appears twice");
    }
    ParamGroup group;
    group.param = static_cast<int>(i);
    groups.push_back(group);
    if (spec.layer >= 0) {
      max_layer = std::max(max_layer, spec.layer);
      first_layered = std::min(first_layered, i);
    }
  }
  const int32_t layers = max_layer + 1;
  for (ParamGroup& group : groups) {
    const TensorSpec& spec = inventory[group.param];
    if (spec.layer >= 0) {
      group.phase_layer = spec.layer;
    } else {
      group.phase_layer = static_cast<size_t>(group.param) < first_layered ? -1 : layers;
    }
  }
  for (size_t i = 0; i < inventory.size(); ++i) {
    const TensorSpec& spec = inventory[i];
    std::vector<int> ParamGroup::*states = nullptr;
    switch (spec.kind) {
      case TensorKind::kGradient:
        break;
      case TensorKind::kMasterWeight:
        states = &ParamGroup::master;
        break;
      case TensorKind::kAdamM:
        states = &ParamGroup::m;
        break;
      case TensorKind::kAdamV:
        states = &ParamGroup::v;
        break;
      default:
        continue;  // parameters done; other kinds are not part of the step
    }
    auto found = by_name.find(base_name(spec.name));
    if (found == by_name.end()) {
      return invalid_argument("training step: state '" + spec.name + "' has no parameter");
    }
    ParamGroup& group = groups[found->second];
    if (states == nullptr) {
      group.grad = static_cast<int>(i);
    } else {
      (group.*states).push_back(static_cast<int>(i));
    }
  }
  // Sub-grouped states: the three kinds in step, covering the parameter exactly.
  for (const ParamGroup& group : groups) {
    const TensorSpec& param = inventory[group.param];
    const size_t n = std::max({group.master.size(), group.m.size(), group.v.size()});
    if (n > 1 && (group.master.size() != n || group.m.size() != n || group.v.size() != n)) {
      return invalid_argument("training step: '" + param.name +
                              "' has different numbers of master, m and v sub-groups");
    }
    if (n <= 1) continue;
    uint64_t covered = 0;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t e = inventory[group.master[k]].elements();
      if (inventory[group.m[k]].elements() != e || inventory[group.v[k]].elements() != e) {
        return invalid_argument("training step: '" + param.name + "' sub-group " +
                                std::to_string(k) + " differs between master, m and v");
      }
      covered += e;
    }
    if (covered != param.elements()) {
      return invalid_argument("training step: the sub-groups of '" + param.name + "' cover " +
                              std::to_string(covered) + " of its " +
                              std::to_string(param.elements()) + " elements");
    }
  }
  int pieces[4] = {-1, -1, -1, -1};
  for (size_t i = 0; i < inventory.size(); ++i) {
    for (int k = 0; k < 4; ++k) {
      if (inventory[i].name == kOptimizerPieceNames[k]) pieces[k] = static_cast<int>(i);
    }
  }
  const bool have_pieces =
      std::all_of(std::begin(pieces), std::end(pieces), [](int piece) { return piece >= 0; });

  TrainingStep step;
  step.layers = static_cast<uint32_t>(layers);
  uint64_t pieces_bytes = 0;
  if (have_pieces) {
    for (int piece : pieces) pieces_bytes += inventory[piece].bytes();
    for (const ParamGroup& group : groups) {
      for (int state : group.master) {
        step.optimizer_unit_bytes =
            std::max(step.optimizer_unit_bytes, inventory[state].elements() * 4 * 3);
      }
    }
  }
  uint64_t layered_elements = 0;
  for (const ParamGroup& group : groups) {
    const uint64_t elements = inventory[group.param].elements();
    step.parameter_elements += elements;
    if (group.phase_layer >= 0 && group.phase_layer < layers) layered_elements += elements;
    if (group.grad >= 0) step.gradient_elements += inventory[group.grad].elements();
  }
  const double per_layer = layers > 0 ? static_cast<double>(layered_elements) / layers : 1.0;

  // Groups per phase layer, in forward order; index phase_layer + 1.
  std::vector<std::vector<size_t>> by_layer(static_cast<size_t>(layers) + 2);
  for (size_t g = 0; g < groups.size(); ++g) by_layer[groups[g].phase_layer + 1].push_back(g);
  auto units_of = [&](int32_t phase_layer, const std::vector<size_t>& members) {
    if (phase_layer == -1) return 0.0;  // an embedding lookup: no matmul
    if (phase_layer < layers) return 1.0;
    double elements = 0;
    for (size_t g : members) elements += static_cast<double>(inventory[groups[g].param].elements());
    return elements / per_layer;
  };
  auto access = [&](int tensor, Tier tier, AccessMode mode, bool dirty, bool discard) {
    return StepAccess{{handles[tensor], tier, mode}, dirty, discard};
  };

  // One optimizer phase per parameter of a phase layer (per sub-group, when the states are
  // sub-groups), in the order its gradients were made. A run of them is what one
  // strata_optimizer_step (or, with overlap, one layer's updates) does; run_started: a group of
  // the run is pushed already.
  bool run_started = false;
  auto push_optimizer = [&](int32_t pl) {
    const std::vector<size_t>& members = by_layer[pl + 1];
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      const ParamGroup& group = groups[*it];
      if (group.grad < 0) continue;  // frozen: no update
      const Tier tier = options.optimizer_tier;
      const TensorSpec& param = inventory[group.param];
      const TensorSpec& grad = inventory[group.grad];
      const size_t sub_groups = std::max<size_t>(group.master.size(), 1);
      const bool on_device = have_pieces && !group.master.empty() &&
                             options.compute_tier == Tier::kDevice &&
                             param.bytes() + grad.bytes() <= options.optimizer_device_bytes;
      const Tier held = on_device ? Tier::kDevice : tier;
      uint64_t first = 0;  // the sub-group's first element
      for (size_t k = 0; k < sub_groups; ++k) {
        const bool last = k + 1 == sub_groups;
        StepPhase phase;
        phase.key = {PhaseKind::kOptimizer, pl};
        phase.compute = ComputeKind::kOptimizer;
        // The TieredOptimizer's sub-groups run inside the one phase its caller began.
        phase.continues_phase = have_pieces && run_started;
        run_started = true;
        const uint64_t elements =
            group.master.size() > 1 ? inventory[group.master[k]].elements() : param.elements();
        phase.compute_units = static_cast<double>(elements);
        if (have_pieces) {
          phase.held_pinned_bytes = on_device ? pieces_bytes : param.bytes() + grad.bytes();
        }
        phase.accesses.push_back(access(group.grad, held, AccessMode::kRead, false, last));
        for (const std::vector<int>* states : {&group.master, &group.m, &group.v}) {
          if (states->empty()) continue;
          const int state = states->size() > 1 ? (*states)[k] : states->front();
          phase.accesses.push_back(access(state, tier, AccessMode::kRead, true, false));
          phase.accesses.back().done_after = have_pieces;
        }
        // With an fp32 master the new parameter is written fresh (its first sub-group overwrites
        // a pinned copy held whole; on the device the rest of it stays); without one the
        // parameter is the master and is updated in place.
        const bool fresh = !group.master.empty() && k == 0 && !on_device;
        phase.accesses.push_back(access(
            group.param, held, fresh ? AccessMode::kOverwrite : AccessMode::kRead, true, false));
        if (on_device) {
          const size_t grad_at = 0, param_at = phase.accesses.size() - 1;
          const int slot = static_cast<int>(k % 2);
          phase.accesses.push_back(
              access(pieces[slot], Tier::kPinned, AccessMode::kOverwrite, false, false));
          phase.accesses.push_back(
              access(pieces[2 + slot], Tier::kPinned, AccessMode::kOverwrite, false, false));
          const size_t grad_piece = phase.accesses.size() - 2;
          const size_t param_piece = phase.accesses.size() - 1;
          const uint64_t grad_width = dtype_size(grad.dtype);
          const uint64_t param_width = dtype_size(param.dtype);
          phase.copies.push_back(
              {grad_at, grad_piece, first * grad_width, 0, elements * grad_width, false});
          phase.copies.push_back(
              {param_piece, param_at, 0, first * param_width, elements * param_width, true});
        }
        first += elements;
        step.phases.push_back(std::move(phase));
      }
    }
  };

  // After a layer's backward, each of its gradients measured as strata_optimizer_grad_ready
  // measures it (TieredOptimizer::measure_gradient), in the order it announces them (the
  // updates' order), one group per gradient held for the whole pass: on the device, where
  // backward made it, read through the two gradient pieces in turn a sub-group at a time; computed
  // on the host, where it rests on pinned, whole. Groups within the backward phase, as the
  // framework's grad_ready calls come before its strata_layer_end. The runtime scans each piece
  // as it arrives while the next one's copy runs; here the copies come first and the scan after
  // them, so the pass errs slow by up to its shorter half.
  auto push_measure = [&](int32_t pl) {
    const std::vector<size_t>& members = by_layer[pl + 1];
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      const ParamGroup& group = groups[*it];
      if (group.grad < 0 || group.master.empty()) continue;  // frozen, or not the optimizer's
      const TensorSpec& grad = inventory[group.grad];
      StepPhase phase;
      phase.key = {PhaseKind::kBackward, pl};
      phase.compute = ComputeKind::kGradientScan;
      phase.continues_phase = true;
      phase.compute_units = static_cast<double>(grad.elements());
      if (options.compute_tier != Tier::kDevice) {
        phase.accesses.push_back(
            access(group.grad, options.optimizer_tier, AccessMode::kRead, false, false));
        step.phases.push_back(std::move(phase));
        continue;
      }
      phase.accesses.push_back(access(group.grad, Tier::kDevice, AccessMode::kRead, false, false));
      const size_t sub_groups = group.master.size();
      for (size_t slot = 0; slot < std::min<size_t>(sub_groups, 2); ++slot) {
        phase.accesses.push_back(
            access(pieces[slot], Tier::kPinned, AccessMode::kOverwrite, false, false));
      }
      const uint64_t grad_width = dtype_size(grad.dtype);
      uint64_t first = 0;
      for (size_t k = 0; k < sub_groups; ++k) {
        const uint64_t elements = inventory[group.master[k]].elements();
        phase.copies.push_back({0, 1 + k % 2, first * grad_width, 0, elements * grad_width, false});
        first += elements;
      }
      step.phases.push_back(std::move(phase));
    }
  };

  // Offloaded activations: each transformer layer's chunks, in packing order.
  std::vector<std::vector<TensorHandle>> saved(static_cast<size_t>(std::max(layers, 0)));
  for (size_t i = 0; i < inventory.size(); ++i) {
    const TensorSpec& spec = inventory[i];
    if (spec.kind != TensorKind::kActivationCheckpoint) continue;
    if (spec.layer < 0 || spec.layer >= layers) {
      return invalid_argument("training step: activation chunk '" + spec.name + "' has layer " +
                              std::to_string(spec.layer) + ", not a transformer layer's 0.." +
                              std::to_string(layers - 1));
    }
    saved[static_cast<size_t>(spec.layer)].push_back(handles[i]);
  }

  for (int32_t pl = -1; pl <= layers; ++pl) {
    const std::vector<size_t>& members = by_layer[pl + 1];
    if (members.empty()) continue;
    StepPhase phase;
    phase.key = {PhaseKind::kForward, pl};
    phase.compute = ComputeKind::kForward;
    phase.compute_units = units_of(pl, members);
    for (size_t g : members) {
      phase.accesses.push_back(
          access(groups[g].param, options.compute_tier, AccessMode::kRead, false, false));
    }
    if (pl >= 0 && pl < layers) phase.packs = saved[static_cast<size_t>(pl)];
    step.phases.push_back(std::move(phase));
  }
  for (int32_t pl = layers; pl >= -1; --pl) {
    const std::vector<size_t>& members = by_layer[pl + 1];
    if (members.empty()) continue;
    StepPhase phase;
    phase.key = {PhaseKind::kBackward, pl};
    phase.compute = ComputeKind::kBackward;
    phase.compute_units = units_of(pl, members);
    if (pl >= 0 && pl < layers) {
      const std::vector<TensorHandle>& packed = saved[static_cast<size_t>(pl)];
      phase.unpacks.assign(packed.rbegin(), packed.rend());
    }
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      phase.accesses.push_back(
          access(groups[*it].param, options.compute_tier, AccessMode::kRead, false, false));
    }
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      if (groups[*it].grad < 0) continue;
      phase.accesses.push_back(
          access(groups[*it].grad, options.compute_tier, AccessMode::kOverwrite, true, false));
    }
    step.phases.push_back(std::move(phase));
    if (options.optimizer_overlap) {
      run_started = false;
      push_optimizer(pl);
    } else if (options.measure_gradients && have_pieces) {
      push_measure(pl);
    }
  }
  run_started = false;
  for (int32_t pl = layers; pl >= -1 && !options.optimizer_overlap; --pl) push_optimizer(pl);
  if (step.phases.empty())
    return invalid_argument("training step: the inventory has no parameters");
  return step;
}

std::vector<TensorSpec> split_optimizer_states(std::span<const TensorSpec> inventory,
                                               uint64_t sub_group_bytes) {
  std::vector<TensorSpec> out;
  out.reserve(inventory.size());
  const uint64_t per_group = sub_group_bytes / sizeof(float);
  uint64_t widest_piece = 0;
  std::unordered_map<std::string_view, uint32_t> widths;  // a parameter's or gradient's bytes
  for (const TensorSpec& spec : inventory) {              // per element, the wider of the two
    if (spec.kind == TensorKind::kParameter || spec.kind == TensorKind::kGradient) {
      uint32_t& w = widths[base_name(spec.name)];
      w = std::max(w, dtype_size(spec.dtype));
    }
  }
  for (const TensorSpec& spec : inventory) {
    const bool state = spec.kind == TensorKind::kMasterWeight || spec.kind == TensorKind::kAdamM ||
                       spec.kind == TensorKind::kAdamV;
    if (!state || per_group == 0 || spec.elements() <= per_group) {
      if (state) {
        widest_piece = std::max(widest_piece, spec.elements() * widths[base_name(spec.name)]);
      }
      out.push_back(spec);
      continue;
    }
    const uint64_t elements = spec.elements();
    for (uint64_t first = 0, k = 0; first < elements; first += per_group, ++k) {
      TensorSpec part = spec;
      part.name = spec.name + "@" + std::to_string(k);
      part.shape = {std::min(per_group, elements - first)};
      out.push_back(std::move(part));
    }
    widest_piece = std::max(widest_piece, per_group * widths[base_name(spec.name)]);
  }
  if (per_group == 0 || widest_piece == 0) return out;
  for (const char* name : kOptimizerPieceNames) {
    out.push_back({name, {widest_piece}, DType::kUInt8, TensorKind::kOther, -1});
  }
  return out;
}

Result<AccessSchedule> schedule_of(const TrainingStep& step) {
  AccessSchedule::Builder builder;
  for (const StepPhase& phase : step.phases) {
    if (!phase.continues_phase) builder.begin_phase(phase.key);
    for (const StepAccess& a : phase.accesses) STRATA_TRY(builder.add(a.access));
  }
  return std::move(builder).build();
}

}  // namespace strata::sched
