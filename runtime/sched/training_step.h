// The access pattern of one mixed-precision training step, derived from a tensor inventory: what
// a framework calling the C API once per layer does, written down so the simulator can play it
// and a framework can declare it (strata_declare_schedule) instead of recording it.
//
//   forward   pre (embedding), layers 0..N-1, post (final norm, LM head): parameters on device
//   backward  post, layers N-1..0, pre: parameters on device again; gradients produced on device
//             (acquired with DISCARD, released dirty); with measure_gradients, then each of the
//             layer's gradients measured as strata_optimizer_grad_ready measures it: read once
//             (from the device through the two gradient pieces, a sub-group at a time, or where
//             it is on pinned) and scanned on the host, in acquire groups within the layer's phase
//   optimizer one phase per parameter, in the order gradients became ready (post, N-1..0, pre),
//             after the whole backward, or each right after its layer's backward (overlap):
//             gradient read on pinned (then discarded), fp32 master / Adam m / v read and written
//             on pinned, the new low-precision parameter written on pinned (DISCARD)
//             -- or, when the inventory's states are sub-groups (split_optimizer_states, the
//             TieredOptimizer's layout), one acquire group per sub-group: its master / m / v on
//             pinned (released dirty and done with for now, Scheduler::write_behind), and the
//             gradient and parameter either held on the device and reached through two pinned
//             pieces of a sub-group each (a range copy of the gradient's bytes in before the
//             update, of the new parameter's bytes out after it), or held whole on pinned. The
//             groups of one optimizer run (the whole step, or one layer's with overlap) are one
//             scheduler phase, as the framework's strata_layer_begin(OPTIMIZER) spans them all
//   saved     with activation offload, the inventory's ACTIVATION_CHECKPOINT chunks of layer l
//             (what strata.torch's activations.py registers as autograd saves the layer's
//             tensors): packed by forward l as it computes, unpacked by backward l as it
//             computes, in reverse order, each discarded once its part has run (StepPhase::packs
//             / unpacks; the simulator spreads the layer's compute evenly between its chunks)
//
// "pre" and "post" are the layer -1 tensors before and after the transformer layers in the
// inventory's forward order; their phases use layers -1 and N.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "sched/access_schedule.h"
#include "sched/tensor_handle.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

// kGradientScan: the host's pass over a gradient that the TieredOptimizer makes as backward
// finishes it (the overflow check and the norm global clipping needs).
enum class ComputeKind : uint8_t {
  kNone = 0,
  kForward = 1,
  kBackward = 2,
  kOptimizer = 3,
  kGradientScan = 4
};

struct StepAccess {
  Access access;
  bool release_dirty = false;  // the phase modifies it
  bool discard_after = false;  // its contents are dead after the phase (consumed gradients)
  bool done_after = false;     // released with Scheduler::write_behind (updated optimizer states)
};

// A byte range copied between two tensors the phase holds (Scheduler::start_copy_range): a
// sub-group's piece of a gradient or parameter held on the device.
struct StepCopy {
  size_t from = 0;  // indices into the phase's accesses
  size_t to = 0;
  uint64_t from_offset = 0;
  uint64_t to_offset = 0;
  uint64_t bytes = 0;
  bool after_compute = false;  // false: before the phase computes
};

struct StepPhase {
  PhaseKey key;
  std::vector<StepAccess> accesses;  // in acquire order
  std::vector<StepCopy> copies;      // in order, each waited for before the next
  ComputeKind compute = ComputeKind::kNone;
  // Forward / backward: transformer-layer equivalents (1 per layer; the head by its parameters
  // relative to a layer's, the embedding lookup 0). Optimizer: parameter elements updated.
  // Gradient scan: gradient elements measured.
  double compute_units = 0;
  // An acquire group within the scheduler phase the group before it began (the sub-grouped
  // optimizer's): no begin_phase / end_phase between the two, and one phase in the schedule.
  bool continues_phase = false;
  // The sub-grouped optimizer's: the pinned bytes the TieredOptimizer holds beside the states
  // while it updates this group's parameter (its gradient and parameter held whole there, or the
  // four pieces when they are held on the device), from which its read-ahead window follows
  // (optimizer_lookahead).
  uint64_t held_pinned_bytes = 0;
  // Offloaded activations, which the framework moves itself, one chunk after the other, with a
  // copy the compute stream waits for (activations.py's copy_), between the layer's operations
  // as autograd's hooks move them: forward packs each chunk after a part of its compute
  // (acquired on pinned with DISCARD, filled from the device, released dirty); backward unpacks
  // each before a part (acquired on pinned, copied to the device, released; discarded after the
  // part), first hinting the chunk it unpacks next toward pinned, as activations.py's
  // _prefetch_before hints the tensor packed before. Outside the declared schedule:
  // strata.torch registers fresh chunks every step, so no recorded schedule names them.
  std::vector<TensorHandle> packs;
  std::vector<TensorHandle> unpacks;
};

struct TrainingStep {
  std::vector<StepPhase> phases;
  uint32_t layers = 0;
  uint64_t parameter_elements = 0;
  uint64_t gradient_elements = 0;
  // The sub-grouped optimizer's largest sub-group, its three fp32 states (the unit of
  // optimizer_lookahead); 0 when the states are not sub-grouped.
  uint64_t optimizer_unit_bytes = 0;
};

struct TrainingStepOptions {
  // Where the optimizer reads and writes its states (the CPU optimizer: pinned).
  Tier optimizer_tier = Tier::kPinned;
  // Where forward and backward run.
  Tier compute_tier = Tier::kDevice;
  // Each layer's optimizer phases right after its backward phase (LoHan / Fuyou; what Strata's
  // frameworks do without a global overflow check or clipping), instead of after the whole
  // backward pass (ZeRO-Infinity).
  bool optimizer_overlap = false;
  // Sub-grouped states only: a parameter and its gradient of at most this many bytes together,
  // computed on the device, are held there for their update and reached through the pinned
  // pieces (the TieredOptimizer with streaming on and room on the device); 0 or larger: held
  // whole on pinned.
  uint64_t optimizer_device_bytes = 0;
  // Sub-grouped states without overlap: measure every gradient as its layer's backward ends, as
  // the TieredOptimizer does for the step's overflow check and norm (kGradientScan groups after
  // the backward phase, in the last micro-batch only). Off: the step has no such pass.
  bool measure_gradients = false;
};

// The pinned pieces of the sub-grouped optimizer, in the inventory split_optimizer_states makes:
// two for gradients and two for parameters, each of the largest sub-group's 16-bit bytes.
inline constexpr const char* kOptimizerPieceNames[4] = {
    "optimizer#grad_piece0", "optimizer#grad_piece1", "optimizer#param_piece0",
    "optimizer#param_piece1"};

// The inventory as the TieredOptimizer registers it: each fp32 master, m and v split into
// sub-groups of at most sub_group_bytes (named "<state>@<i>", in order), and the four pieces
// appended (kind OTHER, layer -1; register them with home pinned). sub_group_bytes 0 or a
// multiple of 4 bytes.
std::vector<TensorSpec> split_optimizer_states(std::span<const TensorSpec> inventory,
                                               uint64_t sub_group_bytes);

// The name the TieredOptimizer gives the tensor that `inventory_name`, a state of `kind` in the
// inventory's convention ("w#master", "w#adam_m@3"), is in the runtime: "w.master[0]",
// "w.exp_avg[3]" (optimizer_state_name). Any other name is returned as it is.
std::string runtime_state_name(const std::string& inventory_name, TensorKind kind);

// `handles[i]` is the registered handle of `inventory[i]`. States are matched to their parameter
// by name prefix up to '#' ("w#grad", "w#master", "w#adam_m", "w#adam_v") and by kind; several
// states of one kind are sub-groups, in inventory order, covering the parameter's elements.
// STRATA_E_INVALID when the sizes differ or a state has no parameter.
Result<TrainingStep> plan_training_step(std::span<const TensorSpec> inventory,
                                        std::span<const TensorHandle> handles,
                                        const TrainingStepOptions& options = {});

// The schedule a framework following `step` would record.
Result<AccessSchedule> schedule_of(const TrainingStep& step);

}  // namespace strata::sched
