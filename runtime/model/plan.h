// `strata plan`: will a fine-tuning job fit, how fast will it run, what will it cost - per GPU
// preset, before anyone rents a machine. Every formula and its source is in docs/planner.md.
//
// GPU memory, compute time and CPU offload come from closed-form formulas over the model
// inventory. Host RAM, NVMe traffic and step time under NVMe offload come from a simulated step
// of the scheduler (plan_offload.h), for Strata's memory plan and for ZeRO-Infinity's.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/gpu_presets.h"
#include "model/model_config.h"
#include "model/nvme_endurance.h"
#include "model/plan_deepspeed.h"
#include "model/plan_headroom.h"
#include "model/plan_job_cost.h"
#include "model/plan_offload.h"
#include "vocabulary/tensor_spec.h"

namespace strata {

class SimulationPool;  // model/simulation_pool.h

enum class FinetuneMethod : uint8_t { kFull, kLora, kQLora };
enum class Checkpointing : uint8_t { kNone, kSelective, kFull };
enum class Offload : uint8_t { kNone, kCpu, kNvme };
// How attention is computed. Flash (FlashAttention-style kernels, the default of current
// frameworks) never stores the s x s scores, with or without checkpointing; eager stores them.
enum class Attention : uint8_t { kFlash, kEager };
// Where the tensors autograd saves for backward go during forward (strata.torch.offload's
// `activations=`, docs/pytorch.md): they stay on the GPU, or move to pinned memory, or to
// pinned memory spilling to NVMe, and come back as backward unpacks them.
enum class ActivationOffload : uint8_t { kNone, kPinned, kNvme };

const char* to_string(FinetuneMethod method);
const char* to_string(Checkpointing checkpointing);
const char* to_string(Offload offload);
const char* to_string(Attention attention);
const char* to_string(ActivationOffload offload);
Result<FinetuneMethod> parse_method(std::string_view text);        // full | lora | qlora
Result<Checkpointing> parse_checkpointing(std::string_view text);  // none | selective | full
Result<Offload> parse_offload(std::string_view text);              // none | cpu | nvme
Result<DType> parse_precision(std::string_view text);              // bf16 | fp16 | fp32
Result<Attention> parse_attention(std::string_view text);          // flash | eager
Result<ActivationOffload> parse_activation_offload(std::string_view text);  // none|pinned|nvme

// Which linear layers get LoRA adapters. For MoE experts gate/up/down mean w1/w3/w2.
struct LoraTargets {
  bool q = true, k = true, v = true, o = true, gate = true, up = true, down = true;
};
// "all-linear" (the default, as in QLoRA), or a comma list of q,k,v,o,gate,up,down (the
// "_proj" suffix is accepted: "q_proj,v_proj" is PEFT's Llama default).
Result<LoraTargets> parse_lora_targets(std::string_view text);
std::string to_string(const LoraTargets& targets);

// Aggregate NVMe rates (decimal GB/s).
struct NvmeArray {
  uint32_t drives = 1;  // 0: measured rates of an array whose drives were not counted
  double read_gbps = 0;
  double write_gbps = 0;
  std::string label;       // "1 x gen4-x4", "28/11 GB/s"
  std::string generation;  // "gen4" / "gen5" for COUNT:genN; empty for measured rates
};
// "COUNT:gen4" / "COUNT:gen5" (per-drive rates from the shipped presets, times COUNT), or
// "READ/WRITE" in GB/s for an array someone measured, "COUNT:READ/WRITE" when it has COUNT
// drives (wear and capacity are per drive; without a count, one drive is assumed).
Result<NvmeArray> parse_nvme(std::string_view text);

// A GPU and how many of it (one node, data parallel, ZeRO-3-style partitioning of states).
struct GpuChoice {
  GpuPreset gpu;
  uint32_t count = 1;
  bool auto_count = false;  // "NAME:auto": the plan finds the smallest count that fits
};
// "h100-sxm", "h100-sxm:8" or "h100-sxm:auto".
Result<GpuChoice> parse_gpu_choice(std::string_view text);
inline constexpr uint32_t kMaxGpusPerNode = 64;  // the largest count --gpu accepts

// Rates the plan assumes, all printed in its JSON `assumptions`. Flags of `strata plan` set the
// MFU, the Adam rate, the PCIe efficiency, the headroom, the optimizer threads and the drive's
// queue depth; the host scan rate, the CUDA context and the wear warning are fixed here.
struct PlanAssumptions {
  double mfu = 0.4;                // achieved fraction of the GPU's dense peak
  double adam_params_per_s = 2e9;  // CPU Adam throughput, parameters per second
  double pcie_efficiency = 0;      // 0: the preset's measured pinned-copy rate; else x link rate
  double host_scan_gbps = 20;      // host single-pass scan (ZeRO-Infinity's overflow check)
  uint64_t cuda_context_bytes = uint64_t{1} << 30;  // context, cuBLAS workspace, fragmentation
  HostHeadroom host_headroom;             // RAM kept free beside the job's states (plan_headroom.h)
  double nvme_wear_warn_fraction = 0.10;  // warn when a job spends more of the drives' TBW
  // Strata's automatic pinned budget is sized from these and the drives' rates (plan_offload.h).
  uint32_t optimizer_threads = kPlanOptimizerThreads;
  uint32_t drive_queue_depth = kPlanDriveQueueDepth;
};

struct PlanRequest {
  ModelConfig model;
  FinetuneMethod method = FinetuneMethod::kFull;
  uint32_t lora_rank = 16;
  LoraTargets lora_targets;
  DType precision = DType::kBFloat16;
  uint64_t seq_len = 4096;
  uint64_t micro_batch = 1;  // sequences per GPU per micro-batch
  uint64_t grad_accum = 1;   // micro-batches per optimizer step
  Checkpointing checkpointing = Checkpointing::kFull;
  std::optional<Offload> offload;  // unset: per GPU, the first of none/cpu/nvme that fits
  std::optional<uint64_t> host_ram_bytes;
  NvmeArray nvme;        // used by nvme offload; default 1 x gen4
  NvmeDrive nvme_drive;  // endurance per drive; no name: the NVMe generation's default drive
  Attention attention = Attention::kFlash;
  ActivationOffload activation_offload = ActivationOffload::kNone;
  std::optional<double> job_tokens;  // --tokens, or --epochs x --dataset-tokens
  std::vector<GpuChoice> gpus;       // empty: every shipped preset, one of each
  PlanAssumptions assume;
  // DeepSpeed's element-count knobs are multiplied by this (deepspeed::labelled_config): 1 at
  // full size; for a model scaled as `strata bench finetune` scales it, the scaled model's
  // parameters over the full model's, so that the knobs mean what they mean at full size, as
  // the benchmark sets them (`strata plan --scale`, docs/planner.md).
  double deepspeed_knob_factor = 1.0;
  // Strata's pinned pool exactly (`--pinned-budget`), below the automatic budget if asked: a
  // run's budget replayed. Unset: the automatic budget, or what the headroom leaves of
  // host_ram_bytes when that is more.
  std::optional<uint64_t> strata_pinned_budget_bytes;
  // How the run spent that budget, when it did not follow the rules for a budget set exactly
  // (an automatic budget replayed: its stream chunk and buffers and its optimizer sub-group;
  // `--stream-chunk`, `--stream-buffers`, `--sub-group-bytes`). Only with
  // strata_pinned_budget_bytes.
  sched::PinnedSplitGiven strata_pinned_given;
  // The simulated NVMe offload's device pool per GPU exactly (`--device-budget`), as `strata
  // bench finetune --device-budget` sets the run's: a run's budget replayed. Unset: what the GPU
  // memory formulas give the offloaded states (offload_device_budget). It changes the simulated
  // run only, not whether the job fits the GPU.
  std::optional<uint64_t> strata_device_budget_bytes;
  // Steps each NVMe-offload simulation plays before the one it measures (`--warmup-steps`). One
  // fills the pools; a job whose pools keep tensors from one step to the next (the optimizer's
  // last sub-groups, weights the device keeps) settles in the step after, so its per-step bytes
  // are those of its steady state from 2 on (docs/planner.md, "Steady state"). Each step more
  // costs as much plan time as the measured one.
  uint32_t simulated_warmup_steps = 1;
};
inline constexpr uint32_t kMaxSimulatedWarmupSteps = 8;
Status validate(const PlanRequest& request);

// ---- Formulas (public so that tests check them one by one) ----------------------------------

// Whether LoRA adapts this parameter (a transformer layer's linear weight of a targeted module),
// and whether QLoRA stores it in 4 bits (every transformer layer's linear weight): the rules the
// formulas below and `strata bench finetune --method lora|qlora` share.
bool lora_adapts(const TensorSpec& parameter, const LoraTargets& targets);
bool qlora_quantizes(const TensorSpec& parameter);

// LoRA adapters: r * (in + out) per adapted matrix (A: r x in, B: out x r).
uint64_t lora_trainable_parameters(const ModelConfig& model, uint32_t rank,
                                   const LoraTargets& targets);

// QLoRA base weights: the transformer layers' linear weights in NF4 (0.5 B/parameter) with
// double-quantized constants (an 8-bit absmax per 64 weights, an fp32 scale per 256 of those,
// one fp32 offset per tensor); embedding, LM head, norms and biases stay in `compute`.
uint64_t qlora_base_weight_bytes(const ModelConfig& model, DType compute);
// The part of the parameters that is quantized (layer linear weights).
uint64_t qlora_quantized_parameters(const ModelConfig& model);

// Parameters one token's forward pass multiplies by: every layer's attention projections, the
// routed experts only (MoE) and the router, and the LM head; not the embedding (a lookup) nor
// the norms (elementwise).
uint64_t matmul_parameters_per_token(const ModelConfig& model);

// What autograd keeps of a layer depends on what trains. A linear layer keeps its input only for
// its weight's gradient: in full fine-tuning, or through its LoRA adapter (A's input is the same
// tensor); a frozen one keeps its weight, which is no activation. A norm keeps its normalised
// input only for its own weight (full fine-tuning). q, k and v share one input, as do gate and up.
struct SavedInputs {
  bool norms = true;    // the norms' weights train
  bool qkv = true;      // q, k or v trains or is adapted
  bool o = true;        // o_proj (eager attention only: flash keeps its output, o's input, anyway)
  bool gate_up = true;  // gate or up (per routed expert in MoE)
  bool down = true;     // down_proj (its input, the gated product)
  bool router = true;   // MoE: the router trains (it keeps the MLP's input)
  // Adapters: each adapted linear's A output (rank values a token), which B keeps. LoRA dropout
  // is taken as PEFT's default, 0 (an identity: no mask, no dropped copy of the input).
  uint32_t lora_rank = 0;
  uint32_t adapted_attention_linears = 0;  // of q, k, v, o
  uint32_t adapted_mlp_linears = 0;        // of gate, up, down (per routed expert in MoE)
};
SavedInputs saved_inputs(FinetuneMethod method, const LoraTargets& targets, uint32_t lora_rank);

// The tensors one Llama-family decoder layer (transformers' Llama, Mistral, Qwen2 and Mixtral
// layers, whose presets the planner ships) saves for backward under torch 2.x autograd, per
// token, counted tensor by tensor (docs/planner.md, "Activations"): the norms' fp32 copies, RoPE's
// cos and sin, the attention's inputs and outputs (flash: q, k, v, output and log-sum-exp; eager:
// q with k and v repeated to every head, the softmax's fp32 output and its copy in the compute
// dtype, s per head each), the gated MLP's four intermediates (per routed expert in MoE, with
// its output twice and the router's fp32 probabilities). keep_attention_scores adds eager
// attention's scores (selective recomputation drops them; flash never has them). Measured
// against a run in `lora_offload.py saved-bytes` (docs/planner.md, "Activations measured").
uint64_t activation_bytes_per_layer(const ModelConfig& model, uint64_t seq, uint64_t batch,
                                    DType precision, Attention attention,
                                    bool keep_attention_scores, const SavedInputs& saved = {});
// Every layer's, by checkpointing: none keeps all (eager scores included), selective all
// without the scores, full each layer's input (s*b*h in the compute dtype) plus one layer's while
// it is recomputed in backward.
uint64_t activation_bytes(const ModelConfig& model, uint64_t seq, uint64_t batch,
                          Checkpointing checkpointing, DType precision, Attention attention,
                          const SavedInputs& saved = {});
// With activation offload, what stays on the GPU: one layer's saved activations while it
// computes (its forward before they leave, its backward once they are back), and under full
// checkpointing the layer's input beside the layer recomputed in backward (the recomputation
// runs outside forward, where the offload hooks are not). What moves per micro-batch is
// activation_bytes less this (docs/planner.md, "Activation offload").
uint64_t activation_working_set_bytes(const ModelConfig& model, uint64_t seq, uint64_t batch,
                                      Checkpointing checkpointing, DType precision,
                                      Attention attention, const SavedInputs& saved = {});

// Attention's score and context matmuls (QK^T and AV), which the 6N convention leaves out:
// 12 * L * (heads * head_dim) * s FLOPs per token for forward and backward (PaLM, Chowdhery et
// al. 2022, appendix B: 6N + 12LHQT), plus the forward's 4 * L * (heads * head_dim) * s again
// under full checkpointing. Causal masking is not subtracted, as in PaLM's MFU.
double attention_flops_per_token(const ModelConfig& model, uint64_t seq,
                                 Checkpointing checkpointing);
// Logits in the compute dtype, their fp32 copy for the loss, and its fp32 gradient.
uint64_t logits_bytes(const ModelConfig& model, uint64_t seq, uint64_t batch, DType precision);

// DeepSpeed's estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/stage3.py),
// reproduced: per-GPU and per-CPU bytes for params, gradients and optimizer states.
struct Zero3Estimate {
  uint64_t cpu_bytes = 0;
  uint64_t gpu_bytes = 0;
  uint64_t largest_layer_memory = 0;
};
Zero3Estimate deepspeed_zero3_estimate(uint64_t total_params, uint64_t largest_layer_params,
                                       uint32_t gpus_per_node = 1, uint32_t nodes = 1,
                                       bool cpu_offload = true, bool cpu_offload_params = true,
                                       bool zero_init = true,
                                       double additional_buffer_factor = 1.5);
// DeepSpeed's model_to_params "largest layer": the most parameters one module owns directly
// (a Linear's weight and bias; the embedding). Tied embeddings count once.
uint64_t deepspeed_largest_layer_params(const ModelConfig& model);

// ---- The plan ------------------------------------------------------------------------------

// What the method keeps, independent of the GPU.
struct ModelStates {
  uint64_t params = 0;
  uint64_t trainable_params = 0;
  uint64_t weight_bytes = 0;           // stored weights (4-bit base for QLoRA)
  uint64_t trainable_state_bytes = 0;  // trainable weights + grads + master + Adam m, v
  uint64_t model_state_bytes = 0;      // everything above (frozen weights + trainable states)
  uint64_t largest_unit_weight_bytes = 0;
  uint64_t largest_unit_trainable_params = 0;
  uint64_t largest_weight_elements = 0;
  std::vector<uint64_t> trainable_tensor_elements;
  // LoRA / QLoRA: the adapter parameters a token multiplies, an expert's adapters only where
  // the router sends the token (active experts / experts of them). 0 for full fine-tuning.
  double adapter_params_per_token = 0;
};
ModelStates model_states(const PlanRequest& request);

struct GpuMemory {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer = 0;
  uint64_t activations = 0;
  uint64_t logits = 0;
  uint64_t buffers = 0;  // streamed layers in flight, QLoRA dequantization scratch
  uint64_t cuda_context = 0;
  uint64_t total() const {
    return weights + gradients + optimizer + activations + logits + buffers + cuda_context;
  }
};

// The CPU-offload plan of a job that NVMe offload was chosen for, and the RAM it needs.
struct RamUpgrade {
  uint64_t host_ram_bytes = 0;  // recommended RAM (with headroom) for CPU offload
  double step_seconds = 0;
  double tokens_per_s = 0;
  std::array<double, 3> usd_per_mtok{};  // low, typical, high
};

// What moving the saved activations off the GPU (`--activation-offload pinned`) gives a plan that
// does not fit the GPU: the first of no and CPU offload of the states (or the --offload given)
// whose GPU memory then fits.
struct ActivationUpgrade {
  Offload offload = Offload::kNone;
  uint32_t gpu_count = 1;  // with NAME:auto, the smallest count whose GPU memory then fits
  uint64_t gpu_bytes = 0;  // per GPU
  uint64_t host_recommended_bytes = 0;  // with headroom, the activations included
  bool fits_host = true;                // within --host-ram (true when it was not given)
  double step_seconds = 0;
  double tokens_per_s = 0;
  std::array<double, 3> usd_per_mtok{};  // low, typical, high
};

struct GpuPlan {
  GpuChoice choice;
  Offload offload = Offload::kNone;
  bool params_resident = true;  // weights stay on the GPU (else streamed per layer)
  GpuMemory memory;             // per GPU
  // Activation offload: the saved activations one micro-batch moves off each GPU and back.
  uint64_t activations_offloaded_bytes = 0;
  uint64_t host_bytes = 0;
  uint64_t nvme_bytes = 0;
  OffloadEstimate stages;  // traffic and stage times of this plan
  double step_seconds = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  std::string bottleneck;
  bool fits_gpu = false;
  bool fits_host = true;  // true when --host-ram was not given
  // What rests on NVMe (nvme_bytes) fits the drives: count x the drive's capacity (true when
  // nothing does, or the drive's capacity is unknown: --nvme-tbw alone).
  bool fits_nvme = true;
  // false where the plan cannot model what was asked (why_not says what): it does not fit.
  bool modelled = true;
  bool fits() const { return fits_gpu && fits_host && fits_nvme && modelled; }
  std::string why_not;  // empty when it fits
  double hours_per_mtok = 0;
  std::array<double, 3> usd_per_mtok{};  // low, typical, high
  OffloadJob job;  // what the offload estimate was computed from (inventory: NVMe only)

  // Host RAM (plan_headroom.h): what this plan's states take, what to have with headroom (the
  // fit test), and the least RAM for full speed (every state in RAM, nothing on NVMe).
  HostRam host;
  // What more RAM would buy when NVMe offload was chosen: the CPU-offload plan, if it fits the
  // GPU (unset otherwise).
  std::optional<RamUpgrade> more_ram;
  // When the GPU does not fit without activation offload: what it would give (unset otherwise).
  std::optional<ActivationUpgrade> with_activation_offload;
  // The job (--tokens): optimizer steps, hours and USD per tier; unset without --tokens or when
  // the plan does not fit (a job that cannot run has no price).
  std::optional<JobCost> job_cost;
  NvmeWear nvme_wear;  // NVMe offload, or activations offloaded to NVMe (bytes 0 otherwise)
};

// One micro-batch's offloaded activations of every GPU of the plan, in whole pages: what host
// memory holds of them when they are kept there (or would, at full speed).
uint64_t activations_held_bytes(const GpuPlan& plan);

struct CheapestOption {
  bool found = false;
  std::string gpu;
  uint32_t count = 1;
  double usd_per_mtok = 0;
  std::optional<double> job_usd;  // with --tokens
};

// A knob that would make the headline plan cheaper per token when a stage other than compute
// bounds it, with the plan re-made under it (plan_advice.h).
struct Advice {
  std::string knob;    // "--grad-accum 16"
  std::string reason;  // why it helps
  double tokens_per_s = 0;
  double usd_per_mtok_typical = 0;
  double speedup = 0;  // tokens/s with the knob over tokens/s without
};

// One labelled DeepSpeed configuration against Strata: DeepSpeed's host memory does not adapt to
// the RAM, so Strata is also planned given exactly DeepSpeed's peak.
struct DeepSpeedComparison {
  DeepSpeedEstimate deepspeed;
  OffloadEstimate strata_equal_ram;  // Strata's pool = this configuration's peak host bytes
  std::optional<bool> fits_host;     // set when --host-ram was given
};

// Strata against ZeRO-Infinity like for like (docs/planner.md, "Strata vs DeepSpeed"): each side
// at the least host RAM it runs in, and Strata given exactly each DeepSpeed configuration's RAM.
struct OffloadComparison {
  OffloadEstimate strata_least;  // Strata at its automatic pinned budget (strata_pinned_sizing)
  // deepspeed-defaults, -pinned, -tuned, in that order; empty when they do not apply (the
  // reason in deepspeed_why_not).
  std::vector<DeepSpeedComparison> deepspeed;
  std::string deepspeed_why_not;
  // Why Strata's side could not be simulated (empty when it was): a budget given for the plan
  // that NVMe offload cannot run in, where the plan itself does not offload to NVMe. The block
  // is then left out (no DeepSpeed column either: nothing to set it beside), not the plan.
  std::string strata_not_simulated;
  // DeepSpeed's own estimate_zero3_model_states_mem_needs for offload_param and
  // offload_optimizer to the CPU (full fine-tuning only: the estimator trains every parameter).
  std::optional<Zero3Estimate> deepspeed_estimate;
};

struct Plan {
  PlanRequest request;
  ModelStates states;
  std::vector<GpuPlan> gpus;
  size_t primary = 0;                      // the --gpu given first, else the cheapest that fits
  std::array<CheapestOption, 3> cheapest;  // per price tier: low, typical, high
  // The job on gpus[primary] under NVMe offload, simulated with Strata's memory plan (the same
  // as gpus[primary].stages when that plan offloads to NVMe).
  OffloadEstimate strata_nvme;
  OffloadComparison like_for_like;
  std::vector<Advice> advice;  // best first; empty when compute bounds the headline plan
  bool any_fits() const;
};

// Plans the job on request.gpus (or every preset). Invalid requests are STRATA_E_INVALID; a
// simulation of the plan's own that cannot run (a budget that cannot hold one phase) is its
// error, with the GPU; one the comparison with DeepSpeed alone needed leaves the comparison out
// (OffloadComparison::strata_not_simulated), not the plan.
Result<Plan> make_plan(const PlanRequest& request);

// The plan of request.gpus alone, without the comparison with ZeRO-Infinity and without
// advice: what the advice re-plans each knob with. make_plan = make_gpu_plans, then
// compare_with_zero_infinity, then plan_advice (plan_advice.h), their simulations run side by
// side on one SimulationPool (model/simulation_pool.h).
Result<Plan> make_gpu_plans(const PlanRequest& given);
Result<Plan> make_gpu_plans(const PlanRequest& given, SimulationPool& pool);
// Fills plan.strata_nvme and plan.like_for_like for the headline GPU.
Status compare_with_zero_infinity(Plan& plan);

// Simulates plan.strata_nvme's step again (its warm-up steps and the measured one) recording
// every transfer, named by its tensor, and each phase's wait and compute on the virtual clock,
// and writes them to `path` as a Chrome trace: `strata plan --trace FILE`, to set beside a run's
// `strata bench finetune --trace`. STRATA_E_INVALID when the plan has no simulated NVMe step,
// STRATA_E_INTERNAL if the traced step's bytes or time are not the plan's, the export's error
// when the file cannot be written.
Result<telemetry::TraceStats> write_strata_nvme_trace(const Plan& plan, const std::string& path);

inline constexpr const char* kPriceTierNames[3] = {"low", "typical", "high"};

}  // namespace strata
