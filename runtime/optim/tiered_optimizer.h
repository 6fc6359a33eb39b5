// TieredOptimizer: Adam / AdamW over optimizer states kept off the GPU, the engine behind the
// strata_optimizer_* calls. It owns, per parameter, the fp32 master weights and the two moments
// as scheduler tensors (kinds MASTER_WEIGHT, ADAM_M, ADAM_V), split into sub-groups of at most
// sub_group_elements() elements so that a few sub-groups fit the pinned budget at once. Their home
// is NVMe when the parameter's is, and pinned memory when the parameter rests in memory (home
// PINNED or DEVICE: small trainable tensors such as LoRA adapters), where they stay whole.
//
// A step streams the sub-groups through pinned memory: prefetch hints keep the reads of the next
// sub-groups in flight while CpuAdam updates the current one, and the updated states are released
// dirty so the scheduler's write-behind writes them back while later ones are read and updated:
// read of i+1, update of i and write-back of i-1 overlap. The new weights go into the parameter
// tensor in its own dtype in the same pass, then the gradient is discarded.
//
// It reaches the tiers only through the scheduler the Runtime hands it (sched/), and computes
// with a CpuAdam of its own; it knows nothing of the C API.
//
// Thread rules: the public members come from one thread at a time (the training thread). With
// overlap_backward a worker thread of the optimizer's own updates parameters announced by
// grad_ready; every other member first waits for that worker to be idle.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "optim/adamw.h"
#include "optim/cpu_adam.h"
#include "sched/scheduler.h"
#include "vocabulary/tensor_spec.h"

namespace strata::optim {

struct GroupSettings {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool decoupled = true;
};
// The ranges torch.optim.AdamW's constructor enforces, and finite values.
Status validate(const GroupSettings& group);

struct TieredOptimizerOptions {
  double max_grad_norm = 0;  // 0: no clipping
  bool check_overflow = true;
  bool overlap_backward = false;  // needs max_grad_norm == 0 and !check_overflow
  uint64_t sub_group_bytes = 0;   // per state tensor; 0: sized from the pinned budget
};

enum class StateKind : uint8_t { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };
inline constexpr int kStateKinds = 3;

struct StepReport {
  bool found_nonfinite = false;
  double grad_norm = 0;
  int64_t step = 0;
  double read_wait_seconds = 0;   // acquires of states, parameters and gradients
  double update_seconds = 0;      // CpuAdam and the weight copy-out
  double write_wait_seconds = 0;  // waiting for write-backs at the end of the step
};

// What one pass over every sub-group does; a step is {read, update, write, overlap}. The other
// combinations exist for `strata bench optimizer`, which measures each stage alone and the step
// without overlap, over the same tensors and the same code path.
struct PassShape {
  bool read = true;     // load the states (false: acquire them to be overwritten, with zeros)
  bool update = true;   // run Adam on them (needs read and write)
  bool write = true;    // release them dirty, so they reach NVMe again
  bool overlap = true;  // prefetch ahead and write behind; false: read, update, write, wait
};

struct TieredOptimizerConfig {
  // The pinned pool's budget (the runtime's pinned budget less its streaming staging buffers):
  // sub-groups and the lookahead are sized from it.
  uint64_t pinned_budget_bytes = 0;
  // The sub-group size when the options leave it at 0 (an automatic pinned budget was sized for
  // it); 0: a sixteenth of the pinned pool.
  uint64_t sub_group_bytes = 0;
  // The device pool's budget, and whether device data streams to NVMe (no pinned memory needed to
  // make device room). With both, a parameter and gradient that fit the device together, whose
  // gradient backward made on the device, are held there during their update and moved through
  // pinned pieces of a sub-group each; otherwise (no streaming: device room is made through
  // pinned memory, which the pass's own held sub-groups may fill; too little device; training on
  // the CPU) they are held whole in pinned memory.
  uint64_t device_budget_bytes = 0;
  bool device_streams = false;
  CpuAdamOptions adam;
  std::chrono::nanoseconds timeout = std::chrono::seconds(300);  // per acquire / flush
};

class TieredOptimizer {
 public:
  static Result<std::unique_ptr<TieredOptimizer>> create(sched::Scheduler& scheduler,
                                                         const TieredOptimizerConfig& config);
  // The sub-group per state tensor an optimizer made with `config` uses until its options set
  // one: the config's, else the rule for a budget given exactly.
  static uint64_t sub_group_bytes_for(const TieredOptimizerConfig& config);
  // Stops the worker. State tensors stay registered: the scheduler frees them when it goes.
  ~TieredOptimizer();
  TieredOptimizer(const TieredOptimizer&) = delete;
  TieredOptimizer& operator=(const TieredOptimizer&) = delete;

  Result<uint32_t> add_group(const GroupSettings& group);
  Status set_group(uint32_t index, const GroupSettings& group);
  Result<GroupSettings> group(uint32_t index);

  Status configure(const TieredOptimizerOptions& options);
  TieredOptimizerOptions options();

  // Registers the parameter's state tensors and fills them (master from the parameter, m = v = 0).
  Status add_param(uint32_t group, sched::TensorHandle param, sched::TensorHandle grad);
  Status grad_ready(sched::TensorHandle param);
  Result<StepReport> step(double loss_scale);

  int64_t step_count();
  Status set_step_count(int64_t step);

  Status read_state(sched::TensorHandle param, StateKind state, void* dst, uint64_t bytes);
  Status write_state(sched::TensorHandle param, StateKind state, const void* src, uint64_t bytes);
  // Whether `tensor` is a parameter or gradient under the optimizer (it updates or reads them at
  // every step, so they must stay registered).
  bool holds(sched::TensorHandle tensor);

  Status export_checkpoint(const std::string& path);
  Status import_checkpoint(const std::string& path);

  // ---- For `strata bench optimizer` and tools ----
  // One pass of the given shape over every sub-group of every parameter, with the hyperparameters
  // of the next step (the step count does not change). An update pass needs gradients, as a step.
  Result<StepReport> run_pass(const PassShape& shape, float grad_scale);
  uint64_t sub_group_elements();
  size_t sub_group_count();
  size_t param_count();
  CpuAdam& adam() { return *adam_; }

 private:
  struct SubGroup {
    uint64_t offset = 0;  // first element within the parameter
    uint64_t elements = 0;
    sched::TensorHandle states[kStateKinds];
  };
  struct Param {
    sched::TensorHandle param;
    sched::TensorHandle grad;
    std::string name;
    uint64_t elements = 0;
    DType param_dtype = DType::kFloat32;
    DType grad_dtype = DType::kFloat32;
    uint32_t group = 0;
    std::vector<SubGroup> sub_groups;
    bool stats_done = false;  // grad_ready measured its gradient this step
    GradStats stats;
    bool queued = false;  // handed to the overlap worker this step
    // When grad_ready announced it this step (1, 2, ...; 0: not announced): the step updates
    // parameters in that order, the last announced (the first layers') last, so they are still
    // resident when the next forward begins with them.
    uint64_t ready_order = 0;
    bool updated = false;  // the overlap worker updated it this step
    // The parameter and its gradient, whole: what holding them in pinned memory takes.
    uint64_t pair_bytes() const {
      return elements * (dtype_size(param_dtype) + dtype_size(grad_dtype));
    }
  };
  // A job of the pipeline: one sub-group of one parameter.
  struct Unit {
    uint32_t param = 0;
    uint32_t sub_group = 0;
  };

  // A parameter's or a gradient's tensor as the update pass holds it, acquired on `tier`: in
  // pinned memory `data` is the whole tensor; on the device it is reached through range copies
  // of one sub-group at a time.
  struct HeldTensor {
    bool held = false;
    Tier tier = Tier::kPinned;
    void* data = nullptr;
  };
  // Two pinned pieces for the gradient and two for the parameter, a sub-group's bytes each:
  // while sub-group i is updated in one pair, i+1's gradient arrives in the other and i-1's new
  // parameter bytes leave it. Allocations of the scheduler's (home pinned), made for a pass that
  // holds a tensor on the device and freed after it; a ticket is a range copy in flight.
  struct Pieces {
    static constexpr int kSlots = 2;
    bool made = false;
    sched::TensorHandle grad[kSlots], param[kSlots];
    void* grad_data[kSlots] = {};
    void* param_data[kSlots] = {};
    uint64_t grad_ticket[kSlots] = {};
    uint64_t param_ticket[kSlots] = {};
    // with_param false: the gradient's two pieces only (measuring a gradient).
    Status make(sched::Scheduler& scheduler, uint64_t bytes, std::chrono::nanoseconds timeout,
                bool with_param = true);
    static Status wait(sched::Scheduler& scheduler, uint64_t* ticket,
                       std::chrono::nanoseconds timeout);
    Status wait_all(sched::Scheduler& scheduler, std::chrono::nanoseconds timeout);
    Status free(sched::Scheduler& scheduler);
  };

  TieredOptimizer(sched::Scheduler& scheduler, const TieredOptimizerConfig& config,
                  std::unique_ptr<CpuAdam> adam);

  Result<uint32_t> find_param(sched::TensorHandle param);  // index, or an error
  Status check_gradient(const Param& p);                   // present, has contents, not acquired
  Result<GradStats> measure_gradient(const Param& p);
  uint64_t effective_sub_group_bytes() const;
  // Sub-groups the loader may read ahead beside `held_pinned` bytes the update holds in pinned
  // memory (a parameter and its gradient, whole or as pieces); lookahead() assumes the most any
  // parameter may need, before the first is held.
  uint32_t lookahead(uint64_t held_pinned) const;
  uint32_t lookahead() const;
  // The most any parameter's update holds in pinned memory (lookahead()'s assumption).
  uint64_t largest_held_pinned() const;
  // The largest sub-group's three states: the unit lookahead() counts in.
  uint64_t largest_sub_group_bytes() const;
  AdamWParams adam_params(uint32_t group, int64_t step, float grad_scale) const;
  // The pipeline over `units`, in order. Parameters and gradients are acquired on their first
  // unit and released after their last; units of one parameter are consecutive.
  Status run_units(const std::vector<Unit>& units, const PassShape& shape, int64_t step,
                   float grad_scale, StepReport* report);
  // grad and param_out: the sub-group's own bytes of the gradient and of the new parameter.
  Status update_unit(const Param& p, const SubGroup& s, void* const states[kStateKinds],
                     const void* grad, void* param_out, int64_t step, float grad_scale);
  // What hold() holds: the gradient is only read; the parameter is written, and the next
  // forward reads it on the device.
  enum class HeldRole : uint8_t { kGradient, kParameter };
  // Holds a parameter's or gradient's tensor for the update pass, on hold_tier().
  Result<HeldTensor> hold(sched::TensorHandle tensor, bool on_device, HeldRole role);
  // Where hold() holds a tensor described by `info`: when on_device, the parameter on the device
  // (range copies) wherever its newest copy is, and the gradient there unless its newest copy is
  // in pinned memory already; otherwise whole in pinned.
  static Tier hold_tier(const sched::TensorInfo& info, bool on_device, HeldRole role);
  // Whether p's gradient and parameter can be held on the device for their update.
  bool holds_on_device(const Param& p) const;
  // Whether they will be: they can, and backward made the gradient there (the training computes
  // on the device). The on_device of hold().
  Result<bool> held_on_device(const Param& p) const;
  // The bytes of one piece: the largest sub-group's gradient or parameter bytes.
  uint64_t max_piece_bytes() const;
  // The pieces in all: a gradient and a parameter piece in each of Pieces::kSlots slots.
  uint64_t pieces_bytes() const { return uint64_t{2} * Pieces::kSlots * max_piece_bytes(); }
  // update_unit for units[i], its gradient and parameter bytes reached in place or through the
  // pieces (and the next unit's gradient range started behind it).
  Status update_held(const Param& p, const Unit& u, const std::vector<Unit>& units, size_t i,
                     const HeldTensor& grad, const HeldTensor& param, Pieces& pieces,
                     void* const states[kStateKinds], int64_t step, float grad_scale);
  // Releases a sub-group's first `acquired` states, dirty or not; `done` when this pass will not
  // touch them again (the scheduler may then write them back and take their room first, and
  // does at once when `write_through`).
  Status release_states(const SubGroup& s, int acquired, bool dirty, bool done, bool write_through);
  // Whether an update pass writes its sub-groups back at once (sched::optimizer_writes_through,
  // for the registered parameters' states and the pinned pool).
  bool writes_through() const;
  // Copies one state of one parameter out of (dst) or into (src) its sub-group tensors.
  Status copy_state(const Param& p, StateKind state, void* dst, const void* src);
  void worker_loop();
  void wait_idle_locked(std::unique_lock<std::mutex>& lock);
  Status take_worker_error_locked();

  sched::Scheduler& scheduler_;
  const TieredOptimizerConfig config_;
  std::unique_ptr<CpuAdam> adam_;

  // Guards everything below; the worker holds it only between jobs.
  std::mutex mu_;
  std::condition_variable cv_;
  TieredOptimizerOptions options_;
  std::vector<GroupSettings> groups_;
  std::vector<Param> params_;
  uint64_t state_bytes_ = 0;  // the three fp32 states of every parameter in params_
  int64_t step_ = 0;
  uint64_t announced_ = 0;        // grad_ready calls this step (Param::ready_order)
  double last_loss_scale_ = 1.0;  // what overlap updates divide by (static loss scale)
  bool overlapped_this_step_ = false;

  std::deque<uint32_t> queue_;  // parameters for the overlap worker
  bool worker_busy_ = false;
  bool stopping_ = false;
  Status worker_error_;  // the first failure of an overlap update, reported by the next call
  std::thread worker_;
};

}  // namespace strata::optim
