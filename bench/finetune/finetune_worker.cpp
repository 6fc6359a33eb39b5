#include "finetune/finetune_worker.h"

#include <fcntl.h>
#include <signal.h>
#include <strata/strata.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "finetune/deepspeed_host.h"
#include "finetune/layer_compute.h"
#include "finetune/memory_sampler.h"
#include "memory/accounting.h"
#include "optim/cpu_adam.h"
#include "optim/half_convert.h"

namespace strata::bench::finetune {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

// Explicit limits.
constexpr size_t kMaxSpans = size_t{1} << 20;  // this worker's own trace spans
constexpr size_t kSeriesPoints = 2000;         // memory samples sent for the plot
constexpr auto kSampleInterval = std::chrono::milliseconds(5);
constexpr uint32_t kSeriesEvery = 4;  // one series point per 20 ms
constexpr auto kMetricsInterval = std::chrono::milliseconds(250);
// A wait inside acquire shorter than this is bookkeeping, not a stall worth a trace span.
constexpr uint64_t kMinWaitSpanUs = 50;

// One JSON object per line on the pipe to the parent. Lines come from the training thread and
// the sampler thread, so writes are serialized; a parent that went away is ignored (SIGPIPE is
// ignored in the worker).
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  void send(const json& message) {
    const std::string line = message.dump() + "\n";
    std::lock_guard lock(mutex_);
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  std::mutex mutex_;
};

// Bytes this process read from and wrote to storage (/proc/self/io: read_bytes / write_bytes,
// what reached the block layer; O_DIRECT I/O counts, the page cache does not hide any).
struct ProcIo {
  uint64_t read = 0;
  uint64_t written = 0;
};

ProcIo read_proc_io() {
  ProcIo io;
  UniqueFd fd(::open("/proc/self/io", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return io;
  char text[1024];
  const ssize_t n = ::read(fd.get(), text, sizeof text - 1);
  if (n <= 0) return io;
  text[n] = '\0';
  if (const char* r = std::strstr(text, "\nread_bytes:"))
    io.read = std::strtoull(r + 12, nullptr, 10);
  if (const char* w = std::strstr(text, "\nwrite_bytes:")) {
    io.written = std::strtoull(w + 13, nullptr, 10);
  }
  return io;
}

// The 1-minute load average: this benchmark's figures depend on the CPUs being free, so each
// result says how busy the machine was.
double load_average() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

struct Span {
  const char* track;
  std::string name;
  uint64_t begin_us;
  uint64_t end_us;
  int64_t bytes;
};

// A parameter and the indices (into the inventory) of its states.
struct ParamEntry {
  size_t param = 0, grad = SIZE_MAX, master = SIZE_MAX, adam_m = SIZE_MAX, adam_v = SIZE_MAX;
};

// A unit of the loop: the embedding ("pre", layer -1), a transformer layer, or the final norm
// and LM head ("post", layer L), as sched/training_step.h numbers them.
struct Unit {
  int32_t layer = 0;
  std::vector<ParamEntry> params;
};

std::vector<Unit> build_units(const std::vector<TensorSpec>& inventory, uint32_t layers) {
  std::vector<Unit> units;
  Unit pre{-1, {}}, post{static_cast<int32_t>(layers), {}};
  std::vector<Unit> body(layers);
  for (uint32_t l = 0; l < layers; ++l) body[l].layer = static_cast<int32_t>(l);
  bool seen_layer = false;
  for (size_t i = 0; i < inventory.size(); ++i) {
    const TensorSpec& t = inventory[i];
    if (t.layer >= 0) seen_layer = true;
    if (t.kind != TensorKind::kParameter) continue;
    ParamEntry e;
    e.param = i;
    for (size_t j = i + 1; j < inventory.size() && inventory[j].kind != TensorKind::kParameter;
         ++j) {
      switch (inventory[j].kind) {
        case TensorKind::kGradient:
          e.grad = j;
          break;
        case TensorKind::kMasterWeight:
          e.master = j;
          break;
        case TensorKind::kAdamM:
          e.adam_m = j;
          break;
        case TensorKind::kAdamV:
          e.adam_v = j;
          break;
        default:
          break;
      }
    }
    if (t.layer >= 0) {
      body[static_cast<size_t>(t.layer)].params.push_back(e);
    } else {
      (seen_layer ? post : pre).params.push_back(e);
    }
  }
  if (!pre.params.empty()) units.push_back(std::move(pre));
  for (Unit& u : body) units.push_back(std::move(u));
  if (!post.params.empty()) units.push_back(std::move(post));
  return units;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The runtime takes DeepSpeed's sub_group_size and buffer_size for its ZERO_INFINITY plan from
// the config when its header has the fields; a header without them leaves the runtime on
// DeepSpeed's unscaled defaults, which the result then reports.
template <typename Config>
bool set_zero_infinity_sizes(Config& config, const sched::ZeroInfinityOptions& z) {
  if constexpr (requires {
                  config.zero_sub_group_elements;
                  config.zero_param_buffer_elements;
                }) {
    config.zero_sub_group_elements = z.sub_group_elements;
    config.zero_param_buffer_elements = z.param_buffer_elements;
    return true;
  } else {
    return false;
  }
}

class Worker {
 public:
  // The runtime's own accounting (strata_get_stats), zeroed when it cannot be had.
  strata_stats runtime_stats() const {
    strata_stats st{};
    st.struct_size = sizeof st;
    if (rt_ == nullptr || strata_get_stats(rt_, &st) != STRATA_OK) {
      st = strata_stats{};
      st.struct_size = sizeof st;
    }
    return st;
  }

  Worker(const FinetunePlan& plan, Strategy strategy, int fd, std::string trace_path)
      : plan_(plan),
        strategy_(strategy),
        channel_(fd),
        trace_path_(std::move(trace_path)),
        units_(build_units(plan.inventory, plan.model.num_hidden_layers)) {
    spans_.reserve(trace_path_.empty() ? 0 : 16384);
  }
  ~Worker() {
    if (sampler_) sampler_->stop();
    deepspeed_.reset();
    if (rt_ != nullptr) (void)strata_runtime_destroy(rt_);
  }

  Status run();
  void send_error(const Status& status) {
    channel_.send({{"event", "error"},
                   {"strategy", to_string(strategy_)},
                   {"message", status.message()},
                   {"code", strata_strerror(status.code())}});
  }

 private:
  uint64_t now_us() const {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - epoch_).count());
  }
  Status check(int rc, const char* what) {
    if (rc == STRATA_OK) return Status::ok();
    return Status::error(rc, std::string(what) + ": " + strata_last_error(rt_));
  }
  void span(const char* track, std::string name, uint64_t begin, uint64_t end, int64_t bytes = -1) {
    if (trace_path_.empty() || spans_.size() >= kMaxSpans) return;
    spans_.push_back({track, std::move(name), begin, end, bytes});
  }

  Status create_runtime();
  Status register_tensors();
  Status initialize_tensors();
  Status step(uint32_t index);
  Status forward(const Unit& unit);
  Status backward(const Unit& unit);
  Status optimizer(const Unit& unit, bool first_unit);
  Status deepspeed_check();
  Result<strata_acquired> acquire(size_t tensor, strata_tier tier, uint32_t flags);
  Status release(size_t tensor, bool dirty, void* stream = nullptr);
  void progress(const char* phase, uint32_t step, int32_t layer);
  Status write_trace(const std::string& runtime_trace);
  void send_result();

  const FinetunePlan& plan_;
  const Strategy strategy_;
  Channel channel_;
  const std::string trace_path_;
  const std::vector<Unit> units_;
  const Clock::time_point epoch_ = Clock::now();

  std::unique_ptr<MemorySampler> sampler_;
  strata_runtime* rt_ = nullptr;
  bool zero_sizes_applied_ = false;
  std::vector<strata_tensor_desc> descs_;
  std::vector<strata_tensor> handles_;
  std::unique_ptr<LayerCompute> compute_;
  std::unique_ptr<optim::CpuAdam> adam_;
  std::unique_ptr<DeepSpeedHostBuffers> deepspeed_;
  std::vector<Span> spans_;
  uint64_t runtime_epoch_lo_us_ = 0, runtime_epoch_hi_us_ = 0;

  // Per step.
  double stall_seconds_ = 0;  // inside strata_acquire
  std::atomic<uint64_t> stall_us_total_{0};
  optim::GradStats grad_stats_;
  double overflow_seconds_ = 0;
  double optimizer_seconds_ = 0;
  double compute_seconds_ = 0;
  struct StepRecord {
    double seconds = 0, stall = 0, overflow_check = 0, optimizer = 0, compute = 0;
    uint64_t read = 0, written = 0;                  // /proc/self/io
    uint64_t runtime_read = 0, runtime_written = 0;  // the runtime's own count
    bool skipped = false;
  };
  std::vector<StepRecord> steps_;
  double startup_seconds_ = 0;
  double final_sync_seconds_ = 0;
  uint64_t startup_written_ = 0;
  double load_start_ = -1;
  OverflowCheckResult last_check_;
  double done_units_ = 0;
};

Status Worker::create_runtime() {
  strata_config c{};
  STRATA_TRY(check(strata_config_init(&c), "strata_config_init"));
  c.nvme_path = plan_.options.nvme_dir.c_str();
  c.nvme_capacity_bytes = plan_.nvme_capacity;
  c.device_budget_bytes = plan_.device_budget;
  // Host code touches the acquired "device" buffers in modeled and cpu mode, so those run on
  // the emulated device even where a GPU exists; gpu mode needs the real one.
  c.device_backend =
      plan_.compute == ComputeMode::kGpu ? STRATA_DEVICE_CUDA : STRATA_DEVICE_EMULATED;
  if (!trace_path_.empty()) {
    // Roughly a dozen transfers per parameter per step, with room to spare; 96 bytes each.
    const uint64_t params = units_.empty() ? 0 : plan_.totals.tensors / 5 + 1;
    c.trace_events = static_cast<uint32_t>(
        std::min<uint64_t>(uint64_t{1} << 22, 32 * params * (plan_.options.steps + 2) + 65536));
  }
  if (strategy_ == Strategy::kStrata) {
    c.policy = STRATA_POLICY_STRATA;
    c.pinned_budget_bytes = plan_.strata_pinned_budget;
  } else {
    c.policy = STRATA_POLICY_ZERO_INFINITY;
    // DeepSpeed's aio defaults: 1 MiB blocks, queue depth 8, one thread. No checksums: DeepSpeed
    // verifies nothing it reads back.
    c.block_size = kDeepSpeedAioBlockBytes;
    c.queue_depth = kDeepSpeedAioQueueDepth;
    c.worker_threads = kDeepSpeedAioThreads;
    c.verify_checksums = 0;
    // Its swapper keeps a file per tensor and opens, stats and closes it around every request.
    c.nvme_layout = STRATA_NVME_FILE_PER_TENSOR;
    c.planned_tensors = descs_.data();
    c.planned_tensor_count = descs_.size();
    zero_sizes_applied_ = set_zero_infinity_sizes(c, plan_.zero_options);
    // The arena's budget covers the pools of the plan the runtime will build (its budgets, not
    // what DeepSpeed reserves: the runtime maps staged tensors exactly).
    Result<sched::MemoryPlan> runtime_plan = sched::zero_infinity_memory_plan(
        plan_.inventory, zero_sizes_applied_ ? plan_.zero_options : sched::ZeroInfinityOptions{},
        plan_.device_budget);
    if (!runtime_plan) return std::move(runtime_plan).take_status();
    uint64_t pinned = 0;
    for (const sched::PoolSpec& pool : runtime_plan->pools) {
      if (pool.tier == sched::Tier::kPinned) pinned += pool.budget_bytes;
    }
    c.pinned_budget_bytes = pinned + (uint64_t{64} << 20);
    if (!zero_sizes_applied_) {
      std::fprintf(stderr,
                   "strata bench finetune: warning: this runtime's config has no "
                   "zero_sub_group_elements / zero_param_buffer_elements, so its ZERO_INFINITY "
                   "plan uses DeepSpeed's unscaled defaults (sub_group_size 1e9 = the whole "
                   "scaled model): its step time is flattered, see docs/results.md\n");
    }
  }
  const uint64_t before = now_us();
  const int rc = strata_runtime_create(&c, &rt_);
  const uint64_t after = now_us();
  if (rc != STRATA_OK) {
    return Status::error(rc, std::string("strata_runtime_create: ") + strata_last_error(nullptr));
  }
  // The runtime's trace clock starts while it is being created; its spans are placed on this
  // worker's clock with the creation's end as their zero (the recorder is among the last things
  // built, so the error is the creation's tail, well under a millisecond).
  runtime_epoch_lo_us_ = before;
  runtime_epoch_hi_us_ = after;
  sampler_->set_device_fd(find_emulated_device_fd());
  return Status::ok();
}

Status Worker::register_tensors() {
  handles_.assign(plan_.inventory.size(), STRATA_TENSOR_NONE);
  for (size_t i = 0; i < plan_.inventory.size(); ++i) {
    STRATA_TRY(
        check(strata_tensor_register(rt_, &descs_[i], &handles_[i]), "strata_tensor_register"));
  }
  return Status::ok();
}

Result<strata_acquired> Worker::acquire(size_t tensor, strata_tier tier, uint32_t flags) {
  strata_acquired a{};
  a.struct_size = sizeof a;
  const uint64_t begin = now_us();
  const int rc = strata_acquire(rt_, handles_[tensor], tier, flags, &a);
  const uint64_t end = now_us();
  stall_seconds_ += static_cast<double>(end - begin) / 1e6;
  stall_us_total_.fetch_add(end - begin, std::memory_order_relaxed);
  if (end - begin >= kMinWaitSpanUs) {
    span("acquire wait", plan_.inventory[tensor].name, begin, end);
  }
  if (rc != STRATA_OK) {
    return Status::error(
        rc, "strata_acquire '" + plan_.inventory[tensor].name + "': " + strata_last_error(rt_));
  }
  return a;
}

Status Worker::release(size_t tensor, bool dirty, void* stream) {
  return check(strata_release(rt_, handles_[tensor], dirty ? STRATA_RELEASE_DIRTY : 0, stream),
               "strata_release");
}

// The initial model: small bf16 weights and their fp32 masters (the same values), zero Adam
// moments. Written in place through pinned acquires with DISCARD, as a framework loading a
// checkpoint shard by shard would, so no copy of the model ever sits in host memory.
Status Worker::initialize_tensors() {
  auto weight = [](uint64_t seed, uint64_t i) {
    const uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
    return static_cast<float>((x >> 40) & 0xFFFF) * (0.02f / 65535.0f) - 0.01f;
  };
  for (const Unit& unit : units_) {
    for (const ParamEntry& e : unit.params) {
      const uint64_t n = plan_.inventory[e.param].elements();
      Result<strata_acquired> p = acquire(e.param, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD);
      if (!p) return std::move(p).take_status();
      auto* bf = static_cast<uint16_t*>(p->data);
      for (uint64_t i = 0; i < n; ++i) bf[i] = optim::float_to_bf16(weight(e.param, i));
      STRATA_TRY(release(e.param, true));
      for (size_t state : {e.master, e.adam_m, e.adam_v}) {
        if (state == SIZE_MAX) continue;
        Result<strata_acquired> s = acquire(state, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD);
        if (!s) return std::move(s).take_status();
        auto* f = static_cast<float*>(s->data);
        if (state == e.master) {
          for (uint64_t i = 0; i < n; ++i) f[i] = weight(e.param, i);
        } else {
          std::memset(f, 0, n * sizeof(float));
        }
        STRATA_TRY(release(state, true));
      }
      done_units_ += 1.0 / static_cast<double>(unit.params.size());
      progress("startup", 0, unit.layer);
    }
  }
  return check(strata_sync(rt_), "strata_sync");
}

Status Worker::forward(const Unit& unit) {
  STRATA_TRY(
      check(strata_layer_begin(rt_, STRATA_PHASE_FORWARD, unit.layer), "strata_layer_begin"));
  std::vector<ComputeTensor> tensors;
  for (const ParamEntry& e : unit.params) {
    Result<strata_acquired> a = acquire(e.param, STRATA_TIER_DEVICE, 0);
    if (!a) return std::move(a).take_status();
    tensors.push_back({&plan_.inventory[e.param], a->data, nullptr, a->ready_event});
  }
  const uint64_t begin = now_us();
  Status computed = compute_->forward(tensors);
  const uint64_t end = now_us();
  compute_seconds_ += static_cast<double>(end - begin) / 1e6;
  span("compute", "forward " + std::to_string(unit.layer), begin, end);
  for (const ParamEntry& e : unit.params) {
    Status released = release(e.param, false, compute_->stream());
    if (computed) computed = std::move(released);
  }
  STRATA_TRY(std::move(computed));
  return check(strata_layer_end(rt_, STRATA_PHASE_FORWARD, unit.layer), "strata_layer_end");
}

Status Worker::backward(const Unit& unit) {
  STRATA_TRY(
      check(strata_layer_begin(rt_, STRATA_PHASE_BACKWARD, unit.layer), "strata_layer_begin"));
  std::vector<ComputeTensor> tensors;
  for (const ParamEntry& e : unit.params) {
    Result<strata_acquired> a = acquire(e.param, STRATA_TIER_DEVICE, 0);
    if (!a) return std::move(a).take_status();
    // Gradients are produced, not read: DISCARD skips loading stale contents.
    Result<strata_acquired> g = acquire(e.grad, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD);
    if (!g) return std::move(g).take_status();
    tensors.push_back({&plan_.inventory[e.param], a->data, g->data, a->ready_event});
  }
  const uint64_t begin = now_us();
  Status computed = compute_->backward(tensors);
  const uint64_t end = now_us();
  compute_seconds_ += static_cast<double>(end - begin) / 1e6;
  span("compute", "backward " + std::to_string(unit.layer), begin, end);
  if (computed && strategy_ == Strategy::kStrata && plan_.compute != ComputeMode::kGpu) {
    // Strata's fused overflow check: one read-only pass over each gradient where it was just
    // produced, accumulating non-finite flags and the squared norm; no temporaries. (On a GPU
    // this is a reduction kernel; here it runs on the CPU, inside the measured loop.)
    std::vector<optim::GradSlice> slices;
    for (const ComputeTensor& t : tensors) {
      slices.push_back({t.grad, DType::kBFloat16, static_cast<size_t>(t.spec->elements())});
    }
    const uint64_t check_begin = now_us();
    Result<optim::GradStats> stats = adam_->grad_stats(slices);
    const uint64_t check_end = now_us();
    overflow_seconds_ += static_cast<double>(check_end - check_begin) / 1e6;
    span("overflow check", "fused " + std::to_string(unit.layer), check_begin, check_end);
    if (!stats) {
      computed = std::move(stats).take_status();
    } else {
      grad_stats_.found_nonfinite = grad_stats_.found_nonfinite || stats->found_nonfinite;
      grad_stats_.sum_squares += stats->sum_squares;
    }
  }
  for (const ParamEntry& e : unit.params) {
    Status released = release(e.param, false, compute_->stream());
    if (computed) computed = std::move(released);
    released = release(e.grad, true, compute_->stream());
    if (computed) computed = std::move(released);
  }
  STRATA_TRY(std::move(computed));
  return check(strata_layer_end(rt_, STRATA_PHASE_BACKWARD, unit.layer), "strata_layer_end");
}

// DeepSpeed checks every gradient before the first sub-group steps: the gradients rest in its
// flat host buffer (home tier pinned under this policy), so acquiring them moves nothing.
Status Worker::deepspeed_check() {
  std::vector<GradientView> views;
  std::vector<size_t> held;
  Status status;
  for (const Unit& unit : units_) {
    for (const ParamEntry& e : unit.params) {
      Result<strata_acquired> g = acquire(e.grad, STRATA_TIER_PINNED, 0);
      if (!g) {
        status = std::move(g).take_status();
        break;
      }
      held.push_back(e.grad);
      views.push_back({static_cast<const uint16_t*>(g->data), plan_.inventory[e.grad].elements()});
    }
    if (!status) break;
  }
  if (status) {
    const uint64_t begin = now_us();
    Result<OverflowCheckResult> checked = deepspeed_overflow_check(views, adam_->pool(), *sampler_);
    const uint64_t end = now_us();
    overflow_seconds_ += static_cast<double>(end - begin) / 1e6;
    span("overflow check", "isinf + isnan passes", begin, end,
         static_cast<int64_t>(checked ? checked->temporary_bytes : 0));
    if (checked) {
      last_check_ = *checked;
      grad_stats_.found_nonfinite = checked->found;
    } else {
      status = std::move(checked).take_status();
    }
  }
  for (size_t g : held) {
    Status released = release(g, false);
    if (status) status = std::move(released);
  }
  return status;
}

Status Worker::optimizer(const Unit& unit, bool first_unit) {
  STRATA_TRY(
      check(strata_layer_begin(rt_, STRATA_PHASE_OPTIMIZER, unit.layer), "strata_layer_begin"));
  if (first_unit && strategy_ == Strategy::kZeroInfinity) STRATA_TRY(deepspeed_check());
  optim::AdamWParams hp;
  hp.lr = 1e-5;
  hp.weight_decay = 0.01;
  hp.step = static_cast<int64_t>(steps_.size()) + 1;
  const bool skip = grad_stats_.found_nonfinite;  // loss scaling: an overflow skips the step
  for (const ParamEntry& e : unit.params) {
    if (e.master == SIZE_MAX || e.adam_m == SIZE_MAX || e.adam_v == SIZE_MAX) {
      return invalid_argument("parameter '" + plan_.inventory[e.param].name +
                              "' lacks optimizer states in the inventory");
    }
    Result<strata_acquired> g = acquire(e.grad, STRATA_TIER_PINNED, 0);
    if (!g) return std::move(g).take_status();
    Result<strata_acquired> master = acquire(e.master, STRATA_TIER_PINNED, 0);
    if (!master) return std::move(master).take_status();
    Result<strata_acquired> m = acquire(e.adam_m, STRATA_TIER_PINNED, 0);
    if (!m) return std::move(m).take_status();
    Result<strata_acquired> v = acquire(e.adam_v, STRATA_TIER_PINNED, 0);
    if (!v) return std::move(v).take_status();
    // The new bf16 weights are written whole: DISCARD, then DIRTY.
    Result<strata_acquired> p = acquire(e.param, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD);
    if (!p) return std::move(p).take_status();
    const size_t n = static_cast<size_t>(plan_.inventory[e.param].elements());
    Status stepped;
    const uint64_t begin = now_us();
    if (skip) {
      // Skipped step: the weights stay as they were (the bf16 copy is rewritten from the master).
      const auto* f = static_cast<const float*>(master->data);
      auto* bf = static_cast<uint16_t*>(p->data);
      for (size_t i = 0; i < n; ++i) bf[i] = optim::float_to_bf16(f[i]);
    } else {
      optim::AdamWSlice slice;
      slice.param = static_cast<float*>(master->data);
      slice.m = static_cast<float*>(m->data);
      slice.v = static_cast<float*>(v->data);
      slice.grad = g->data;
      slice.grad_dtype = DType::kBFloat16;
      slice.param_out = p->data;
      slice.param_out_dtype = DType::kBFloat16;
      slice.n = n;
      stepped = adam_->step(hp, std::span<const optim::AdamWSlice>(&slice, 1));
    }
    const uint64_t end = now_us();
    optimizer_seconds_ += static_cast<double>(end - begin) / 1e6;
    span("optimizer", "adamw " + plan_.inventory[e.param].name, begin, end,
         static_cast<int64_t>(n));
    for (size_t state : {e.master, e.adam_m, e.adam_v}) {
      Status released = release(state, stepped.is_ok());
      if (stepped) stepped = std::move(released);
    }
    Status released = release(e.param, true);
    if (stepped) stepped = std::move(released);
    released = release(e.grad, false);
    if (stepped) stepped = std::move(released);
    // The gradient is dead once applied: without this its dirty copy would be written to NVMe
    // when its room is needed, a write nobody reads (the next backward overwrites it).
    if (stepped) {
      stepped = check(strata_tensor_discard(rt_, handles_[e.grad]), "strata_tensor_discard");
    }
    STRATA_TRY(std::move(stepped));
  }
  return check(strata_layer_end(rt_, STRATA_PHASE_OPTIMIZER, unit.layer), "strata_layer_end");
}

void Worker::progress(const char* phase, uint32_t step, int32_t layer) {
  const double per_step = 3.0 * static_cast<double>(units_.size());
  const double total = static_cast<double>(units_.size()) + per_step * plan_.options.steps;
  channel_.send({{"event", "progress"},
                 {"strategy", to_string(strategy_)},
                 {"phase", phase},
                 {"step", step},
                 {"steps", plan_.options.steps},
                 {"layer", layer},
                 {"fraction", std::min(1.0, done_units_ / total)}});
}

Status Worker::step(uint32_t index) {
  stall_seconds_ = 0;
  overflow_seconds_ = 0;
  optimizer_seconds_ = 0;
  compute_seconds_ = 0;
  grad_stats_ = {};
  const ProcIo io_before = read_proc_io();
  const strata_stats stats_before = runtime_stats();
  const auto start = Clock::now();
  const uint64_t begin_us = now_us();
  STRATA_TRY(check(strata_step_begin(rt_), "strata_step_begin"));
  for (const Unit& unit : units_) {
    STRATA_TRY(forward(unit));
    done_units_ += 1;
    progress("forward", index, unit.layer);
  }
  // Overlapped (Strata's default): each unit's update follows its backward at once, so its
  // gradients are consumed while still resident and never wait in pinned memory or spill to
  // NVMe. The overflow check is fused into backward either way; overlapped, a non-finite
  // gradient skips the update of its unit and of every unit after it (bf16 training, no loss
  // scale to lower), where ZeRO-Infinity's global check skips the whole step.
  const bool overlap = strategy_ == Strategy::kStrata && plan_.options.optimizer_overlap == "on";
  bool first = true;
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
    STRATA_TRY(backward(*it));
    done_units_ += 1;
    progress("backward", index, it->layer);
    if (overlap) {
      STRATA_TRY(optimizer(*it, first));
      first = false;
      done_units_ += 1;
      progress("optimizer", index, it->layer);
    }
  }
  // Otherwise the optimizer takes the units in the order their gradients became ready (as the
  // simulator's TrainingStep does): the weights updated last are the first the next forward needs.
  if (!overlap) {
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
      STRATA_TRY(optimizer(*it, first));
      first = false;
      done_units_ += 1;
      progress("optimizer", index, it->layer);
    }
  }
  STRATA_TRY(check(strata_step_end(rt_), "strata_step_end"));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  span("step", "step " + std::to_string(index), begin_us, now_us());
  const ProcIo io_after = read_proc_io();
  const strata_stats stats_after = runtime_stats();
  StepRecord r;
  r.runtime_read = stats_after.nvme_bytes_read - stats_before.nvme_bytes_read;
  r.runtime_written = stats_after.nvme_bytes_written - stats_before.nvme_bytes_written;
  r.seconds = seconds;
  r.stall = stall_seconds_;
  r.overflow_check = overflow_seconds_;
  r.optimizer = optimizer_seconds_;
  r.compute = compute_seconds_;
  r.read = io_after.read - io_before.read;
  r.written = io_after.written - io_before.written;
  r.skipped = grad_stats_.found_nonfinite;
  steps_.push_back(r);
  return Status::ok();
}

Status Worker::write_trace(const std::string& runtime_trace) {
  json spans = json::array();
  for (const Span& s : spans_) {
    json e = {
        {"track", s.track}, {"name", s.name}, {"ts", s.begin_us}, {"dur", s.end_us - s.begin_us}};
    if (s.bytes >= 0) e["bytes"] = s.bytes;
    spans.push_back(std::move(e));
  }
  const json out = {{"strategy", to_string(strategy_)},
                    {"runtime_trace", runtime_trace},
                    {"runtime_epoch_us", runtime_epoch_hi_us_},
                    {"runtime_epoch_lo_us", runtime_epoch_lo_us_},
                    {"spans", std::move(spans)}};
  FILE* f = std::fopen(trace_path_.c_str(), "w");
  if (f == nullptr) return errno_status(STRATA_E_IO, "writing " + trace_path_, errno);
  const std::string text = out.dump();
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return errno_status(STRATA_E_IO, "writing " + trace_path_, errno);
  return Status::ok();
}

void Worker::send_result() {
  const MemoryPeaks peaks = sampler_->peaks();
  const MemoryPeaks during_steps = sampler_->window_peaks();
  std::vector<double> measured;
  uint64_t read = 0, written = 0;
  double seconds = 0, stall = 0;
  json steps = json::array();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const StepRecord& r = steps_[i];
    steps.push_back({{"seconds", r.seconds},
                     {"stall_seconds", r.stall},
                     {"compute_seconds", r.compute},
                     {"optimizer_seconds", r.optimizer},
                     {"overflow_check_seconds", r.overflow_check},
                     {"nvme_read_bytes", r.read},
                     {"nvme_write_bytes", r.written},
                     {"runtime_nvme_read_bytes", r.runtime_read},
                     {"runtime_nvme_write_bytes", r.runtime_written},
                     {"skipped", r.skipped}});
    // The first step records the schedule and fills the pipeline: it is reported, not measured.
    if (i == 0 && steps_.size() > 1) continue;
    measured.push_back(r.seconds);
    read += r.read;
    written += r.written;
    seconds += r.seconds;
    stall += r.stall;
  }
  json series = json::array();
  for (const MemoryReading& m : sampler_->series(kSeriesPoints)) {
    series.push_back({m.seconds, m.host, m.pinned, m.device});
  }
  Result<memory::ProcMemory> proc = memory::read_proc_memory();
  const strata_stats st = runtime_stats();
  // Strata's own accounting beside the OS figures: what the runtime itself held (its pinned
  // arena, its device arena, its unpinned scratch) and what its sampler saw.
  const json accounting = {{"pinned_peak_reserved_bytes", st.pinned.peak_reserved_bytes},
                           {"pinned_peak_in_use_bytes", st.pinned.peak_in_use_bytes},
                           {"device_peak_reserved_bytes", st.device.peak_reserved_bytes},
                           {"host_peak_reserved_bytes", st.host.peak_reserved_bytes},
                           {"nvme_bytes_read", st.nvme_bytes_read},
                           {"nvme_bytes_written", st.nvme_bytes_written},
                           {"os_peak_host_bytes_excluding_emulated_device",
                            st.os_peak_host_bytes_excluding_emulated_device},
                           {"os_peak_rss_bytes", st.os_peak_rss_bytes}};
  json result = {
      {"event", "result"},
      {"name", to_string(strategy_)},
      {"pid", static_cast<int64_t>(::getpid())},
      {"peak_host_bytes", peaks.host},
      {"peak_pinned_bytes", peaks.pinned},
      {"peak_device_bytes", peaks.device},
      {"step_seconds", median(measured)},
      {"nvme_read_gbps", seconds > 0 ? static_cast<double>(read) / seconds / 1e9 : 0.0},
      {"nvme_write_gbps", seconds > 0 ? static_cast<double>(written) / seconds / 1e9 : 0.0},
      {"stall_fraction", seconds > 0 ? stall / seconds : 0.0},
      {"peak_host_bytes_during_steps", during_steps.host},
      {"peak_pinned_bytes_during_steps", during_steps.pinned},
      {"os_vmhwm_bytes", proc ? proc->vm_hwm : 0},
      {"os_peak_host_bytes_unadjusted", peaks.raw_host},
      {"runtime_pinned_peak_bytes", peaks.runtime_pinned},
      {"strata_accounting", accounting},
      {"deepspeed_blocks_bytes", deepspeed_ ? deepspeed_->bytes() : 0},
      {"deepspeed_overflow_temporary_bytes", last_check_.temporary_bytes},
      {"runtime_zero_infinity_sizes", strategy_ == Strategy::kStrata ? "n/a"
                                      : zero_sizes_applied_          ? "scaled"
                                                            : "deepspeed-unscaled-defaults"},
      {"startup_seconds", startup_seconds_},
      {"startup_nvme_write_bytes", startup_written_},
      {"load_average_start", load_start_},
      {"load_average_end", load_average()},
      {"cpus", static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN))},
      {"final_sync_seconds", final_sync_seconds_},
      {"measured_steps", measured.size()},
      {"nvme_read_bytes", read},
      {"nvme_write_bytes", written},
      {"steps", std::move(steps)},
      {"memory_series", std::move(series)}};
  channel_.send(result);
}

Status Worker::run() {
  sampler_ = std::make_unique<MemorySampler>(
      std::chrono::duration_cast<std::chrono::microseconds>(kSampleInterval), kSeriesEvery,
      kMetricsInterval, [this](const MemoryReading& m) {
        const ProcIo io = read_proc_io();
        channel_.send({{"event", "metrics"},
                       {"strategy", to_string(strategy_)},
                       {"host_bytes", m.host},
                       {"pinned_bytes", m.pinned},
                       {"device_bytes", m.device},
                       {"nvme_read_bytes", io.read},
                       {"nvme_write_bytes", io.written},
                       {"stall_seconds",
                        static_cast<double>(stall_us_total_.load(std::memory_order_relaxed)) / 1e6},
                       {"seconds", m.seconds}});
      });
  // Descriptors (the planned tensors of ZERO_INFINITY, and what gets registered).
  const bool gradients_pinned =
      strategy_ == Strategy::kZeroInfinity &&
      (plan_.zero_plan.pinned_home_kinds & sched::kind_bit(TensorKind::kGradient)) != 0;
  for (const TensorSpec& t : plan_.inventory) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = t.name.c_str();
    d.bytes = t.bytes();
    d.dtype = static_cast<strata_dtype>(t.dtype);
    d.kind = static_cast<strata_tensor_kind>(t.kind);
    d.layer = t.layer;
    // ZeRO-Infinity keeps every gradient in its flat host buffer; everything else lives on NVMe.
    d.home_tier =
        t.kind == TensorKind::kGradient && gradients_pinned ? STRATA_TIER_PINNED : STRATA_TIER_NVME;
    descs_.push_back(d);
  }
  Result<std::unique_ptr<LayerCompute>> compute = make_layer_compute(plan_);
  if (!compute) return std::move(compute).take_status();
  compute_ = std::move(*compute);
  Result<std::unique_ptr<optim::CpuAdam>> adam = optim::CpuAdam::create();
  if (!adam) return std::move(adam).take_status();
  adam_ = std::move(*adam);

  load_start_ = load_average();
  const auto startup = Clock::now();
  const ProcIo io_start = read_proc_io();
  STRATA_TRY(create_runtime());
  if (strategy_ == Strategy::kZeroInfinity) {
    const uint64_t begin = now_us();
    Result<std::unique_ptr<DeepSpeedHostBuffers>> ds = DeepSpeedHostBuffers::create(
        plan_.zero_plan, plan_.zero_options.optimizer_buffer_count + 1, *sampler_);
    if (!ds) return std::move(ds).take_status().with_context("DeepSpeed host buffers");
    deepspeed_ = std::move(*ds);
    span("startup", "deepspeed buffers (unpinned, then pinned copy)", begin, now_us(),
         static_cast<int64_t>(deepspeed_->bytes()));
  }
  STRATA_TRY(register_tensors());
  const uint64_t init_begin = now_us();
  STRATA_TRY(initialize_tensors());
  span("startup", "initial weights and states", init_begin, now_us());
  startup_seconds_ = std::chrono::duration<double>(Clock::now() - startup).count();
  startup_written_ = read_proc_io().written - io_start.written;

  // Peaks over the training steps alone, beside the whole run's: start-up (DeepSpeed's double
  // copy of its buffers, loading the weights) has its own spike.
  sampler_->start_window();
  for (uint32_t s = 0; s < plan_.options.steps; ++s) STRATA_TRY(step(s));
  const auto sync_start = Clock::now();
  STRATA_TRY(check(strata_sync(rt_), "strata_sync"));
  final_sync_seconds_ = std::chrono::duration<double>(Clock::now() - sync_start).count();
  sampler_->sample_now();
  sampler_->stop();

  if (!trace_path_.empty()) {
    const std::string runtime_trace = trace_path_ + ".runtime.json";
    STRATA_TRY(check(strata_export_trace(rt_, runtime_trace.c_str()), "strata_export_trace"));
    STRATA_TRY(write_trace(runtime_trace));
  }
  send_result();
  return Status::ok();
}

}  // namespace

int run_worker(const FinetunePlan& plan, Strategy strategy, int fd, const std::string& trace_path) {
  ::signal(SIGPIPE, SIG_IGN);
  Worker worker(plan, strategy, fd, trace_path);
  Status status;
  try {
    status = worker.run();
  } catch (const std::bad_alloc&) {
    status = Status::error(STRATA_E_NOMEM, "out of host memory");
  } catch (const std::exception& e) {
    status = Status::error(STRATA_E_INTERNAL, std::string("unexpected exception: ") + e.what());
  }
  if (!status) {
    worker.send_error(status);
    return 1;
  }
  return 0;
}

}  // namespace strata::bench::finetune
