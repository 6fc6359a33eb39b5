#include "sched/training_step.h"

#include <string_view>
#include <unordered_map>

namespace strata::sched {

namespace {

struct ParamGroup {
  int param = -1, grad = -1, master = -1, m = -1, v = -1;
  int32_t phase_layer = -1;  // -1 pre, 0..N-1, N post
};

std::string_view base_name(const std::string& name) {
  const size_t hash = name.find('#');
  return std::string_view(name).substr(0, hash == std::string::npos ? name.size() : hash);
}

}  // namespace

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
    int ParamGroup::*slot = nullptr;
    switch (spec.kind) {
      case TensorKind::kGradient:
        slot = &ParamGroup::grad;
        break;
      case TensorKind::kMasterWeight:
        slot = &ParamGroup::master;
        break;
      case TensorKind::kAdamM:
        slot = &ParamGroup::m;
        break;
      case TensorKind::kAdamV:
        slot = &ParamGroup::v;
        break;
      default:
        continue;  // parameters done; other kinds are not part of the step
    }
    auto found = by_name.find(base_name(spec.name));
    if (found == by_name.end()) {
      return invalid_argument("training step: state '" + spec.name + "' has no parameter");
    }
    groups[found->second].*slot = static_cast<int>(i);
  }

  TrainingStep step;
  step.layers = static_cast<uint32_t>(layers);
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

  // One optimizer phase per parameter of a phase layer, in the order its gradients were made.
  auto push_optimizer = [&](int32_t pl) {
    const std::vector<size_t>& members = by_layer[pl + 1];
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      const ParamGroup& group = groups[*it];
      if (group.grad < 0) continue;  // frozen: no update
      const Tier tier = options.optimizer_tier;
      StepPhase phase;
      phase.key = {PhaseKind::kOptimizer, pl};
      phase.compute = ComputeKind::kOptimizer;
      phase.compute_units = static_cast<double>(inventory[group.param].elements());
      phase.accesses.push_back(access(group.grad, tier, AccessMode::kRead, false, true));
      for (int state : {group.master, group.m, group.v}) {
        if (state >= 0)
          phase.accesses.push_back(access(state, tier, AccessMode::kRead, true, false));
      }
      // With an fp32 master the new parameter is written fresh; without one the parameter is the
      // master and is updated in place.
      phase.accesses.push_back(
          access(group.param, tier, group.master >= 0 ? AccessMode::kOverwrite : AccessMode::kRead,
                 true, false));
      step.phases.push_back(std::move(phase));
    }
  };

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
    step.phases.push_back(std::move(phase));
  }
  for (int32_t pl = layers; pl >= -1; --pl) {
    const std::vector<size_t>& members = by_layer[pl + 1];
    if (members.empty()) continue;
    StepPhase phase;
    phase.key = {PhaseKind::kBackward, pl};
    phase.compute = ComputeKind::kBackward;
    phase.compute_units = units_of(pl, members);
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
    if (options.optimizer_overlap) push_optimizer(pl);
  }
  for (int32_t pl = layers; pl >= -1 && !options.optimizer_overlap; --pl) push_optimizer(pl);
  if (step.phases.empty())
    return invalid_argument("training step: the inventory has no parameters");
  return step;
}

Result<AccessSchedule> schedule_of(const TrainingStep& step) {
  AccessSchedule::Builder builder;
  for (const StepPhase& phase : step.phases) {
    builder.begin_phase(phase.key);
    for (const StepAccess& a : phase.accesses) STRATA_TRY(builder.add(a.access));
  }
  return std::move(builder).build();
}

}  // namespace strata::sched
