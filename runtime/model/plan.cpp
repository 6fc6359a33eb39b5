#include "model/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"
#include "model/inventory.h"
#include "model/plan_advice.h"
#include "model/simulation_pool.h"

namespace strata {
namespace {

constexpr double kGB = 1e9;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Strict decimal parsing: the whole text must be the number.
std::optional<double> parse_double(std::string_view text) {
  const std::string s(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<uint32_t> parse_count(std::string_view text) {
  if (text.empty() || text.size() > 6) return std::nullopt;
  uint32_t value = 0;
  for (char ch : text) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return std::nullopt;
    value = value * 10 + static_cast<uint32_t>(ch - '0');
  }
  return value;
}

uint32_t bytes_of(DType dtype) {
  return dtype_size(dtype);
}

// fp32 master (unless the weights are fp32), Adam m and v.
uint64_t optimizer_bytes_per_param(DType precision) {
  return (precision == DType::kFloat32 ? 0 : 4) + 8;
}

// Module name of a parameter: "layers.3.self_attn.q_proj.weight" -> "q_proj".
std::string_view module_of(std::string_view name) {
  const size_t last = name.rfind('.');
  if (last == std::string_view::npos) return name;
  const size_t prev = name.rfind('.', last - 1);
  return name.substr(prev == std::string_view::npos ? 0 : prev + 1,
                     last - (prev == std::string_view::npos ? 0 : prev + 1));
}

bool is_lora_target(std::string_view module, const LoraTargets& t) {
  if (module == "q_proj") return t.q;
  if (module == "k_proj") return t.k;
  if (module == "v_proj") return t.v;
  if (module == "o_proj") return t.o;
  if (module == "gate_proj" || module == "w1") return t.gate;
  if (module == "up_proj" || module == "w3") return t.up;
  if (module == "down_proj" || module == "w2") return t.down;
  return false;  // norms, the MoE router, embedding, LM head
}

bool is_layer_linear_weight(const TensorSpec& spec) {
  return spec.layer >= 0 && spec.shape.size() == 2 &&
         std::string_view(spec.name).ends_with(".weight");
}

std::vector<TensorSpec> parameters_of(const ModelConfig& model) {
  InventoryOptions options;
  options.include_gradients = false;
  options.include_optimizer = false;
  return build_inventory(model, options);
}

// NF4 storage of one weight matrix with bitsandbytes' double quantization (QLoRA, Dettmers et
// al. 2023, section 3): 4 bits per weight; per 64 weights an absmax quantized to 8 bits; per 256
// absmax values one fp32 scale; one fp32 mean offset per tensor.
uint64_t nf4_bytes(uint64_t elements) {
  const uint64_t blocks = (elements + 63) / 64;
  const uint64_t second_level = (blocks + 255) / 256;
  return (elements + 1) / 2 + blocks + 4 * second_level + 4;
}

uint64_t stored_bytes(const TensorSpec& spec, FinetuneMethod method, DType precision) {
  if (method == FinetuneMethod::kQLora && is_layer_linear_weight(spec)) {
    return nf4_bytes(spec.elements());
  }
  return spec.elements() * bytes_of(precision);
}

std::string format_gib(uint64_t bytes) {
  return format_bytes(bytes);
}

// " (N of M bytes)" where a refusal's figures read alike as printed ("56.18 GiB of 56.18 GiB"),
// so that it is not read as a fit refused; "" otherwise. need_text: the need as the refusal
// prints it (a host need rounded up, as every recommended figure).
std::string exact_where_printed_alike(const std::string& need_text, uint64_t need, uint64_t have) {
  if (need_text != format_gib(have)) return "";
  return " (" + std::to_string(need) + " of " + std::to_string(have) + " bytes)";
}

// The replayed split's values, by the runtime's own limits for the config fields they stand for
// (api/runtime.cpp's normalize_config, the optimizer's configure).
Status validate_pinned_given(const PlanRequest& r) {
  const sched::PinnedSplitGiven& g = r.strata_pinned_given;
  const bool any = g.chunk_bytes != 0 || g.buffers != 0 || g.sub_group_bytes != 0;
  if (!any) return Status::ok();
  if (!r.strata_pinned_budget_bytes) {
    return invalid_argument(
        "--stream-chunk, --stream-buffers and --sub-group-bytes replay how a run spent its "
        "pinned budget: give that budget too (--pinned-budget)");
  }
  if (g.chunk_bytes != 0 && !sched::valid_stream_chunk_bytes(g.chunk_bytes)) {
    return invalid_argument("the stream chunk must be a power of two from 64 KiB to 64 MiB");
  }
  if (g.buffers > sched::kMaxStreamBuffers) {
    return invalid_argument("the stream buffers are limited to " +
                            std::to_string(sched::kMaxStreamBuffers) + " per direction");
  }
  if (g.sub_group_bytes != 0 && !sched::valid_sub_group_bytes(g.sub_group_bytes)) {
    return invalid_argument("the sub-group must be a multiple of 4 bytes from 4096 to 2^40");
  }
  const sched::PinnedSplit split =
      sched::split_pinned_budget(sched::PinnedSizing{}, *r.strata_pinned_budget_bytes, g);
  if (split.staging_bytes > *r.strata_pinned_budget_bytes / 2) {
    return invalid_argument("the streaming staging buffers (" + format_bytes(split.staging_bytes) +
                            ") may take at most half of the pinned budget (" +
                            format_bytes(*r.strata_pinned_budget_bytes) + ")");
  }
  return Status::ok();
}

}  // namespace

// ---- Parsing -------------------------------------------------------------------------------

const char* to_string(FinetuneMethod method) {
  switch (method) {
    case FinetuneMethod::kFull:
      return "full";
    case FinetuneMethod::kLora:
      return "lora";
    case FinetuneMethod::kQLora:
      return "qlora";
  }
  return "?";
}
const char* to_string(Checkpointing checkpointing) {
  switch (checkpointing) {
    case Checkpointing::kNone:
      return "none";
    case Checkpointing::kSelective:
      return "selective";
    case Checkpointing::kFull:
      return "full";
  }
  return "?";
}
const char* to_string(Offload offload) {
  switch (offload) {
    case Offload::kNone:
      return "none";
    case Offload::kCpu:
      return "cpu";
    case Offload::kNvme:
      return "nvme";
  }
  return "?";
}

const char* to_string(Attention attention) {
  return attention == Attention::kFlash ? "flash" : "eager";
}

Result<Attention> parse_attention(std::string_view text) {
  const std::string s = lower(text);
  if (s == "flash") return Attention::kFlash;
  if (s == "eager") return Attention::kEager;
  return invalid_argument("unknown attention \"" + std::string(text) + "\"; use flash or eager");
}

const char* to_string(ActivationOffload offload) {
  switch (offload) {
    case ActivationOffload::kNone:
      return "none";
    case ActivationOffload::kPinned:
      return "pinned";
    case ActivationOffload::kNvme:
      return "nvme";
  }
  return "?";
}

Result<ActivationOffload> parse_activation_offload(std::string_view text) {
  const std::string s = lower(text);
  if (s == "none") return ActivationOffload::kNone;
  if (s == "pinned") return ActivationOffload::kPinned;
  if (s == "nvme") return ActivationOffload::kNvme;
  return invalid_argument("unknown activation offload \"" + std::string(text) +
                          "\"; use none, pinned or nvme");
}

Result<FinetuneMethod> parse_method(std::string_view text) {
  const std::string s = lower(text);
  if (s == "full") return FinetuneMethod::kFull;
  if (s == "lora") return FinetuneMethod::kLora;
  if (s == "qlora") return FinetuneMethod::kQLora;
  return invalid_argument("unknown method \"" + std::string(text) + "\"; use full, lora or qlora");
}
Result<Checkpointing> parse_checkpointing(std::string_view text) {
  const std::string s = lower(text);
  if (s == "none") return Checkpointing::kNone;
  if (s == "selective") return Checkpointing::kSelective;
  if (s == "full") return Checkpointing::kFull;
  return invalid_argument("unknown checkpointing \"" + std::string(text) +
                          "\"; use none, selective or full");
}
Result<Offload> parse_offload(std::string_view text) {
  const std::string s = lower(text);
  if (s == "none") return Offload::kNone;
  if (s == "cpu") return Offload::kCpu;
  if (s == "nvme") return Offload::kNvme;
  return invalid_argument("unknown offload \"" + std::string(text) + "\"; use none, cpu or nvme");
}
Result<DType> parse_precision(std::string_view text) {
  const std::string s = lower(text);
  if (s == "bf16") return DType::kBFloat16;
  if (s == "fp16") return DType::kFloat16;
  if (s == "fp32") return DType::kFloat32;
  return invalid_argument("unknown precision \"" + std::string(text) +
                          "\"; use bf16, fp16 or fp32");
}

Result<LoraTargets> parse_lora_targets(std::string_view text) {
  const std::string s = lower(text);
  if (s == "all-linear" || s == "all") return LoraTargets{};
  LoraTargets t{false, false, false, false, false, false, false};
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string item = s.substr(start, comma - start);
    if (item.size() > 5 && item.ends_with("_proj")) item.resize(item.size() - 5);
    if (item == "q")
      t.q = true;
    else if (item == "k")
      t.k = true;
    else if (item == "v")
      t.v = true;
    else if (item == "o")
      t.o = true;
    else if (item == "gate")
      t.gate = true;
    else if (item == "up")
      t.up = true;
    else if (item == "down")
      t.down = true;
    else {
      return invalid_argument("unknown LoRA target \"" + item +
                              "\"; use all-linear or a list of q,k,v,o,gate,up,down");
    }
    start = comma + 1;
  }
  return t;
}

std::string to_string(const LoraTargets& t) {
  if (t.q && t.k && t.v && t.o && t.gate && t.up && t.down) return "all-linear";
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (on) out += (out.empty() ? "" : ",") + std::string(name);
  };
  add(t.q, "q");
  add(t.k, "k");
  add(t.v, "v");
  add(t.o, "o");
  add(t.gate, "gate");
  add(t.up, "up");
  add(t.down, "down");
  return out;
}

Result<NvmeArray> parse_nvme(std::string_view text) {
  const std::string s = lower(text);
  if (size_t colon = s.find(':'); colon != std::string::npos) {
    const auto drives = parse_count(std::string_view(s).substr(0, colon));
    if (!drives || *drives == 0 || *drives > 64) {
      return invalid_argument("NVMe drive count in \"" + std::string(text) + "\" must be 1..64");
    }
    if (s.find('/') != std::string::npos) {
      // COUNT:READ/WRITE: the measured rates of an array of COUNT drives.
      STRATA_ASSIGN_OR_RETURN(NvmeArray a, parse_nvme(text.substr(colon + 1)));
      a.drives = *drives;
      a.label = std::to_string(*drives) + " drives, " + a.label;
      return a;
    }
    STRATA_ASSIGN_OR_RETURN(NvmePreset preset, find_nvme(std::string_view(s).substr(colon + 1)));
    NvmeArray a;
    a.drives = *drives;
    // RAID-0 across drives, as measured arrays move (NvmePreset::array), not N x one drive.
    const NvmeArrayPoint rates = preset.array(*drives);
    a.read_gbps = rates.read_gbps;
    a.write_gbps = rates.write_gbps;
    a.label = std::to_string(*drives) + " x " + preset.name;
    a.generation = preset.name.substr(0, preset.name.find('-'));
    return a;
  }
  if (size_t slash = s.find('/'); slash != std::string::npos) {
    const auto read = parse_double(std::string_view(s).substr(0, slash));
    const auto write = parse_double(std::string_view(s).substr(slash + 1));
    if (!read || !write || *read <= 0 || *write <= 0 || *read > 10000 || *write > 10000) {
      return invalid_argument("NVMe rates \"" + std::string(text) +
                              "\" must be READ_GBPS/WRITE_GBPS, both positive");
    }
    NvmeArray a;
    a.drives = 0;
    a.read_gbps = *read;
    a.write_gbps = *write;
    a.label = std::string(text) + " GB/s";
    return a;
  }
  return invalid_argument("NVMe \"" + std::string(text) +
                          "\" must be COUNT:gen4, COUNT:gen5, READ_GBPS/WRITE_GBPS or "
                          "COUNT:READ_GBPS/WRITE_GBPS");
}

Result<GpuChoice> parse_gpu_choice(std::string_view text) {
  GpuChoice choice;
  std::string_view name = text;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    name = text.substr(0, colon);
    const std::string_view count_text = text.substr(colon + 1);
    if (lower(count_text) == "auto") {
      choice.auto_count = true;
    } else {
      const auto count = parse_count(count_text);
      if (!count || *count == 0 || *count > kMaxGpusPerNode) {
        return invalid_argument("GPU count in \"" + std::string(text) + "\" must be 1.." +
                                std::to_string(kMaxGpusPerNode) + " or auto");
      }
      choice.count = *count;
    }
  }
  Result<GpuPreset> gpu = find_gpu(name);
  if (!gpu) return std::move(gpu).take_status();
  choice.gpu = *gpu;
  return choice;
}

Status validate(const PlanRequest& r) {
  STRATA_TRY(validate(r.model));
  if (r.seq_len == 0 || r.seq_len > (uint64_t{1} << 24)) {
    return invalid_argument("sequence length must be between 1 and 16M tokens");
  }
  if (r.micro_batch == 0 || r.micro_batch > 65536) {
    return invalid_argument("micro-batch must be between 1 and 65536");
  }
  if (r.grad_accum == 0 || r.grad_accum > 65536) {
    return invalid_argument("gradient accumulation must be between 1 and 65536");
  }
  if (r.simulated_warmup_steps == 0 || r.simulated_warmup_steps > kMaxSimulatedWarmupSteps) {
    return invalid_argument("simulated warm-up steps must be between 1 and " +
                            std::to_string(kMaxSimulatedWarmupSteps));
  }
  if (r.method != FinetuneMethod::kFull && (r.lora_rank == 0 || r.lora_rank > 65536)) {
    return invalid_argument("LoRA rank must be between 1 and 65536");
  }
  if (r.method == FinetuneMethod::kQLora && r.precision == DType::kFloat32) {
    return invalid_argument("QLoRA computes in bf16 or fp16, not fp32");
  }
  if (r.precision != DType::kBFloat16 && r.precision != DType::kFloat16 &&
      r.precision != DType::kFloat32) {
    return invalid_argument("precision must be bf16, fp16 or fp32");
  }
  const PlanAssumptions& a = r.assume;
  if (!(a.mfu > 0 && a.mfu <= 1)) return invalid_argument("MFU must be in (0, 1]");
  if (!(a.adam_params_per_s > 0)) return invalid_argument("CPU Adam rate must be positive");
  if (!(a.pcie_efficiency >= 0 && a.pcie_efficiency <= 1)) {
    return invalid_argument("PCIe efficiency must be in [0, 1] (0: measured preset rate)");
  }
  if (!(a.host_scan_gbps > 0)) return invalid_argument("host scan rate must be positive");
  if (r.strata_pinned_budget_bytes && *r.strata_pinned_budget_bytes < kPageSize) {
    return invalid_argument("the pinned budget must be at least one page");
  }
  if (r.strata_device_budget_bytes && *r.strata_device_budget_bytes < kPageSize) {
    return invalid_argument("the device budget must be at least one page");
  }
  STRATA_TRY(validate_pinned_given(r));
  if (!(r.deepspeed_knob_factor > 0 && r.deepspeed_knob_factor <= 1)) {
    return invalid_argument("DeepSpeed's knob factor must be in (0, 1]");
  }
  if (!(a.host_headroom.fraction >= 0 && a.host_headroom.fraction <= 10)) {
    return invalid_argument("host headroom must be a fraction between 0 and 10");
  }
  if (!(a.nvme_wear_warn_fraction > 0)) {
    return invalid_argument("NVMe wear warning threshold must be positive");
  }
  if (!r.nvme_drive.name.empty() &&
      !(r.nvme_drive.tbw_tb > 0 && std::isfinite(r.nvme_drive.tbw_tb))) {
    return invalid_argument("NVMe drive endurance (TBW) must be positive");
  }
  if (r.job_tokens && !(*r.job_tokens > 0 && std::isfinite(*r.job_tokens))) {
    return invalid_argument("job tokens must be positive");
  }
  if (!(r.nvme.read_gbps > 0 && r.nvme.write_gbps > 0)) {
    return invalid_argument("NVMe read and write rates must be positive");
  }
  if (r.host_ram_bytes && *r.host_ram_bytes == 0) {
    return invalid_argument("host RAM must be positive");
  }
  for (const GpuChoice& g : r.gpus) {
    if (g.count == 0 || g.count > kMaxGpusPerNode) {
      return invalid_argument("GPU count must be 1.." + std::to_string(kMaxGpusPerNode));
    }
  }
  return Status::ok();
}

// ---- Formulas ------------------------------------------------------------------------------

bool lora_adapts(const TensorSpec& parameter, const LoraTargets& targets) {
  return is_layer_linear_weight(parameter) && is_lora_target(module_of(parameter.name), targets);
}

bool qlora_quantizes(const TensorSpec& parameter) {
  return is_layer_linear_weight(parameter);
}

uint64_t lora_trainable_parameters(const ModelConfig& model, uint32_t rank,
                                   const LoraTargets& targets) {
  uint64_t total = 0;
  for (const TensorSpec& spec : parameters_of(model)) {
    if (lora_adapts(spec, targets)) {
      total += uint64_t{rank} * (spec.shape[0] + spec.shape[1]);
    }
  }
  return total;
}

uint64_t qlora_quantized_parameters(const ModelConfig& model) {
  uint64_t total = 0;
  for (const TensorSpec& spec : parameters_of(model)) {
    if (is_layer_linear_weight(spec)) total += spec.elements();
  }
  return total;
}

uint64_t qlora_base_weight_bytes(const ModelConfig& model, DType compute) {
  uint64_t total = 0;
  for (const TensorSpec& spec : parameters_of(model)) {
    total += stored_bytes(spec, FinetuneMethod::kQLora, compute);
  }
  return total;
}

uint64_t matmul_parameters_per_token(const ModelConfig& m) {
  const uint64_t h = m.hidden_size;
  uint64_t expert = 3 * h * m.intermediate_size;
  if (m.mlp_bias) expert += 2 * m.intermediate_size + h;
  const uint64_t all_experts = (m.is_moe() ? m.num_local_experts : 1) * expert;
  const uint64_t routed = uint64_t{m.active_experts()} * expert;
  const uint64_t norms = 2 * h;  // elementwise, not matmuls
  const uint64_t layer = layer_parameter_count(m) - all_experts + routed - norms;
  const uint64_t head = m.vocab_size * h;
  return uint64_t{m.num_hidden_layers} * layer + head;
}

SavedInputs saved_inputs(FinetuneMethod method, const LoraTargets& t, uint32_t lora_rank) {
  if (method == FinetuneMethod::kFull) return SavedInputs{};
  // Adapters: the base (norms and router included) is frozen; a targeted linear's adapter keeps
  // the linear's input, and B keeps A's output.
  const auto count = [](std::initializer_list<bool> flags) {
    return static_cast<uint32_t>(std::count(flags.begin(), flags.end(), true));
  };
  return SavedInputs{.norms = false,
                     .qkv = t.q || t.k || t.v,
                     .o = t.o,
                     .gate_up = t.gate || t.up,
                     .down = t.down,
                     .router = false,
                     .lora_rank = lora_rank,
                     .adapted_attention_linears = count({t.q, t.k, t.v, t.o}),
                     .adapted_mlp_linears = count({t.gate, t.up, t.down})};
}

uint64_t activation_bytes_per_layer(const ModelConfig& m, uint64_t seq, uint64_t batch,
                                    DType precision, Attention attention,
                                    bool keep_attention_scores, const SavedInputs& saved) {
  // Bytes per token; each tensor once, as autograd holds a tensor saved by two nodes once.
  const double p = static_cast<double>(bytes_of(precision));
  const double fp32 = 4;
  const auto h = static_cast<double>(m.hidden_size);
  const auto q = static_cast<double>(m.q_dim());
  const auto kv = static_cast<double>(m.kv_dim());
  const auto inter = static_cast<double>(m.intermediate_size);
  const auto heads = static_cast<double>(m.num_attention_heads);
  // Two RMSNorms (LlamaRMSNorm.forward): the input's fp32 copy, which pow and the product both
  // keep, 1/rms (one fp32 a token), and the normalised input in the compute dtype when the
  // weight trains (under fp32 the product's fp32 result: the same size).
  double per_token = 2 * (fp32 * h + fp32 + (saved.norms ? p * h : 0));
  // Attention: q, k and v's shared input, RoPE's cos and sin (head_dim each: q * cos and
  // rotate_half(q) * sin keep them; k's products keep the same two).
  per_token += (saved.qkv ? p * h : 0) + 2 * p * static_cast<double>(m.head_dim);
  if (attention == Attention::kFlash) {
    // FlashAttention keeps q, k and v as given (k and v at the KV heads), its output (o_proj's
    // input, the same tensor) and the log-sum-exp, one fp32 per head.
    per_token += p * (2 * q + 2 * kv) + fp32 * heads;
  } else {
    // Eager: the two matmuls keep q and k, the attention weights and v, k and v repeated to
    // every head (repeat_kv copies them under grouped-query attention); o_proj's input is a
    // contiguous copy of the output.
    per_token += 3 * p * q + (saved.o ? p * q : 0);
    if (keep_attention_scores) {
      // softmax(dtype=float32) keeps its fp32 output; .to(dtype) makes the copy the product
      // with v keeps (the same tensor under fp32). Dropout at p = 0 keeps nothing.
      per_token += (fp32 + (p == fp32 ? 0 : p)) * heads * static_cast<double>(seq);
    }
  }
  // LoRA: B keeps A's rank outputs, for each adapted linear (the MLP's below, per expert).
  const double rank = saved.lora_rank;
  per_token += p * rank * saved.adapted_attention_linears;
  // The gated MLP: its input, the gate's output (SiLU's input), SiLU's output and up's output
  // (the product's two factors), and the product (down's input).
  const double expert = (saved.gate_up ? p * h : 0) + 3 * p * inter + (saved.down ? p * inter : 0) +
                        p * rank * saved.adapted_mlp_linears;
  if (m.is_moe()) {
    // Mixtral's sparse block: the router's input and its fp32 probabilities (one per expert);
    // per routed expert the token's gathered input (a copy), the MLP's intermediates, its output,
    // which the routing weight's product keeps, and that product, which index_add_ keeps (its
    // derivative expands the gradient as the source). The routing's bookkeeping per routed
    // expert: topk's int64 index, the token and slot indices the gathers keep (int64 each), the
    // top-k probability the renormalisation keeps (fp32) and the weight in the compute dtype;
    // and the renormalisation's sum, one fp32 a token.
    const auto routed = static_cast<double>(m.active_experts());
    per_token += (saved.router ? p * h : 0) + fp32 * static_cast<double>(m.num_local_experts) +
                 routed * (expert + 2 * p * h) + routed * (3 * 8 + fp32 + p) + fp32;
  } else {
    per_token += expert;
  }
  return static_cast<uint64_t>(per_token * static_cast<double>(seq * batch));
}

uint64_t activation_bytes(const ModelConfig& m, uint64_t seq, uint64_t batch,
                          Checkpointing checkpointing, DType precision, Attention attention,
                          const SavedInputs& saved) {
  const uint64_t layers = m.num_hidden_layers;
  const bool eager = attention == Attention::kEager;
  switch (checkpointing) {
    case Checkpointing::kNone:
      return layers * activation_bytes_per_layer(m, seq, batch, precision, attention, eager, saved);
    case Checkpointing::kSelective:
      return layers * activation_bytes_per_layer(m, seq, batch, precision, attention, false, saved);
    case Checkpointing::kFull: {
      // Each layer's input stays; during backward one layer at a time is recomputed in full.
      const uint64_t input = seq * batch * m.hidden_size * bytes_of(precision);
      return layers * input +
             activation_bytes_per_layer(m, seq, batch, precision, attention, eager, saved);
    }
  }
  return 0;
}

uint64_t activation_working_set_bytes(const ModelConfig& m, uint64_t seq, uint64_t batch,
                                      Checkpointing checkpointing, DType precision,
                                      Attention attention, const SavedInputs& saved) {
  // One layer's share of activation_bytes, whatever the checkpointing: its activations, or under
  // full checkpointing its input beside the recomputed layer.
  ModelConfig one_layer = m;
  one_layer.num_hidden_layers = 1;
  return activation_bytes(one_layer, seq, batch, checkpointing, precision, attention, saved);
}

double attention_flops_per_token(const ModelConfig& m, uint64_t seq, Checkpointing checkpointing) {
  // Per layer and token: QK^T and AV are 2 * s * (heads * head_dim) multiply-adds each in
  // forward, 4 * s * q_dim FLOPs; backward twice that. Recomputation repeats the forward.
  const double forward = 4.0 * m.num_hidden_layers * static_cast<double>(m.q_dim()) * seq;
  return (checkpointing == Checkpointing::kFull ? 4.0 : 3.0) * forward;
}

uint64_t logits_bytes(const ModelConfig& m, uint64_t seq, uint64_t batch, DType precision) {
  return seq * batch * m.vocab_size * (bytes_of(precision) + 4 + 4);
}

Zero3Estimate deepspeed_zero3_estimate(uint64_t total_params, uint64_t largest_layer_params,
                                       uint32_t gpus_per_node, uint32_t nodes, bool cpu_offload,
                                       bool cpu_offload_params, bool zero_init,
                                       double additional_buffer_factor) {
  // Line for line stage3.py; Python's int() truncates, so do we.
  const double total_gpus = static_cast<double>(nodes) * gpus_per_node;
  const double gpus_factor = 1.0 / nodes;
  const double total = static_cast<double>(total_params);
  const double largest = static_cast<double>(largest_layer_params);
  const double largest_layer_memory = 4 * largest;
  double gpu_mem = 0;
  double cpu_mem = 0;
  if (cpu_offload) {
    if (cpu_offload_params) {
      gpu_mem = largest_layer_memory;
      cpu_mem = zero_init ? total * 18 * gpus_factor * additional_buffer_factor
                          : total * std::max(4.0 * gpus_per_node, 18 * gpus_factor) *
                                additional_buffer_factor;
    } else {
      gpu_mem = largest_layer_memory + std::trunc(2 * total / total_gpus);
      cpu_mem = zero_init ? total * 16 * gpus_factor * additional_buffer_factor
                          : total * std::max(4.0 * gpus_per_node, 16 * gpus_factor) *
                                additional_buffer_factor;
    }
  } else {
    gpu_mem = largest_layer_memory + std::trunc(18 * total / total_gpus);
    cpu_mem = zero_init ? largest * 4 * gpus_per_node * additional_buffer_factor
                        : total * 4 * gpus_per_node * additional_buffer_factor;
  }
  return {static_cast<uint64_t>(cpu_mem), static_cast<uint64_t>(gpu_mem),
          static_cast<uint64_t>(largest_layer_memory)};
}

uint64_t deepspeed_largest_layer_params(const ModelConfig& model) {
  // Group parameters by owning module ("...q_proj.weight" and "...q_proj.bias" together).
  std::map<std::string, uint64_t> per_module;
  for (const TensorSpec& spec : parameters_of(model)) {
    per_module[spec.name.substr(0, spec.name.rfind('.'))] += spec.elements();
  }
  uint64_t largest = 0;
  for (const auto& [module, n] : per_module) largest = std::max(largest, n);
  return largest;
}

// ---- The plan ------------------------------------------------------------------------------

ModelStates model_states(const PlanRequest& r) {
  ModelStates s;
  const ModelConfig& m = r.model;
  const DType p = r.precision;
  const uint64_t b = bytes_of(p);
  const bool full = r.method == FinetuneMethod::kFull;
  const std::vector<TensorSpec> params = parameters_of(m);

  std::map<int32_t, uint64_t> unit_weight_bytes;  // layer (-1: each non-layer tensor alone)
  std::map<int32_t, uint64_t> unit_trainable;
  for (const TensorSpec& spec : params) {
    const uint64_t stored = stored_bytes(spec, r.method, p);
    s.params += spec.elements();
    s.weight_bytes += stored;
    s.largest_weight_elements = std::max(s.largest_weight_elements, spec.elements());
    if (spec.layer >= 0) {
      unit_weight_bytes[spec.layer] += stored;
    } else {
      // The embedding and the LM head move as units of their own.
      s.largest_unit_weight_bytes = std::max(s.largest_unit_weight_bytes, stored);
    }
    if (full) {
      s.trainable_tensor_elements.push_back(spec.elements());
      if (spec.layer >= 0) {
        unit_trainable[spec.layer] += spec.elements();
      } else {
        s.largest_unit_trainable_params =
            std::max(s.largest_unit_trainable_params, spec.elements());
      }
    } else if (is_layer_linear_weight(spec) &&
               is_lora_target(module_of(spec.name), r.lora_targets)) {
      const uint64_t a = uint64_t{r.lora_rank} * spec.shape[1];   // A: r x in
      const uint64_t bm = spec.shape[0] * uint64_t{r.lora_rank};  // B: out x r
      s.trainable_tensor_elements.push_back(a);
      s.trainable_tensor_elements.push_back(bm);
      unit_trainable[spec.layer] += a + bm;
      // An expert's adapters run for the tokens routed to it: k of the E experts per token.
      const bool expert = spec.name.find(".experts.") != std::string::npos;
      s.adapter_params_per_token +=
          static_cast<double>(a + bm) *
          (expert ? static_cast<double>(m.active_experts()) / m.num_local_experts : 1.0);
    }
  }
  for (const auto& [layer, bytes] : unit_weight_bytes) {
    s.largest_unit_weight_bytes = std::max(s.largest_unit_weight_bytes, bytes);
  }
  for (const auto& [layer, n] : unit_trainable) {
    s.largest_unit_trainable_params = std::max(s.largest_unit_trainable_params, n);
  }
  for (uint64_t n : s.trainable_tensor_elements) s.trainable_params += n;
  s.trainable_state_bytes = s.trainable_params * (2 * b + optimizer_bytes_per_param(p));
  // Full fine-tuning: the trainable states include the weights themselves.
  s.model_state_bytes = full ? s.trainable_state_bytes : s.weight_bytes + s.trainable_state_bytes;
  return s;
}

namespace {

struct Rates {
  double compute_seconds = 0;
  double forward_fraction = 1.0 / 3;  // of compute_seconds, the forward passes
  double pcie_gbps = 0;
};

Rates rates_for(const PlanRequest& r, const ModelStates& s, const GpuChoice& g) {
  const ModelConfig& m = r.model;
  const double tokens = static_cast<double>(r.seq_len) * r.micro_batch * r.grad_accum;
  const double pmm = static_cast<double>(matmul_parameters_per_token(m));
  const double adapters = r.method == FinetuneMethod::kFull ? 0.0 : s.adapter_params_per_token;
  double flops_per_token = 0;
  if (r.method == FinetuneMethod::kFull) {
    flops_per_token = 6 * pmm;  // forward 2N, backward 4N (input and weight gradients)
  } else {
    // Frozen weights need no weight-gradient GEMM: forward 2N + input gradients 2N; adapters
    // are trained in full (6 per adapter parameter).
    flops_per_token = 4 * pmm + 6 * adapters;
  }
  // The forward again, adapters included.
  if (r.checkpointing == Checkpointing::kFull) flops_per_token += 2 * pmm + 2 * adapters;
  // Scores and context: no weights, so LoRA and full fine-tuning alike run them forward and
  // backward (the input gradients).
  const double attention = attention_flops_per_token(m, r.seq_len, r.checkpointing);
  const double attention_forward =
      attention_flops_per_token(m, r.seq_len, Checkpointing::kNone) / 3;
  flops_per_token += attention;
  const double peak_tflops =
      r.precision == DType::kFloat32 ? g.gpu.tf32_dense_tflops : g.gpu.bf16_dense_tflops;
  Rates rates;
  rates.compute_seconds = flops_per_token * tokens / (peak_tflops * 1e12 * r.assume.mfu);
  // The recomputed forward belongs to the backward pass (it runs there).
  rates.forward_fraction = (2 * pmm + 2 * adapters + attention_forward) / flops_per_token;
  if (r.method == FinetuneMethod::kQLora) {
    // Dequantizing the 4-bit weights before each use is memory-bound: read NF4, write bf16.
    const double passes = (r.checkpointing == Checkpointing::kFull ? 3.0 : 2.0) * r.grad_accum;
    const double q = static_cast<double>(qlora_quantized_parameters(m));
    const double bytes_per_pass = q * 0.5 + q * bytes_of(r.precision);
    rates.compute_seconds += passes * bytes_per_pass / (g.gpu.mem_bw_gbps * kGB);
  }
  rates.pcie_gbps = r.assume.pcie_efficiency > 0 ? g.gpu.host_link_gbps * r.assume.pcie_efficiency
                                                 : g.gpu.pinned_copy_gbps;
  return rates;
}

// What leaves the GPU under offload: every parameter as stored, and for full fine-tuning its
// gradient, master and Adam states. QLoRA's quantized layer weights become byte blobs of their
// NF4 size: the scheduler moves bytes, not elements.
std::vector<TensorSpec> offload_inventory(const PlanRequest& r) {
  InventoryOptions options;
  options.param_dtype = r.precision;
  if (r.method != FinetuneMethod::kFull) {
    options.include_gradients = false;
    options.include_optimizer = false;
  }
  std::vector<TensorSpec> inventory = build_inventory(r.model, options);
  if (r.method == FinetuneMethod::kQLora) {
    for (TensorSpec& spec : inventory) {
      if (!is_layer_linear_weight(spec)) continue;
      spec.shape = {nf4_bytes(spec.elements())};
      spec.dtype = DType::kUInt8;
    }
  }
  return inventory;
}

// GPU memory the offloaded states may occupy, per GPU: what gpu_memory() gives the weights
// (resident share, or streamed units) and, for full fine-tuning, the gradients in flight.
uint64_t offload_device_budget(const GpuMemory& mem, const PlanRequest& r, const ModelStates& s,
                               bool params_resident) {
  uint64_t budget = params_resident ? mem.weights : 2 * s.largest_unit_weight_bytes;
  if (r.method != FinetuneMethod::kFull) {
    // Adapters are not in the offload inventory.
    budget -= params_resident ? s.trainable_params * bytes_of(r.precision) : 0;
  } else {
    budget += mem.gradients;
  }
  // The device pool rounds each buffer to 256 bytes; a layer has a few dozen tensors.
  return budget + (uint64_t{1} << 20);
}

OffloadJob offload_job(const PlanRequest& r, const ModelStates& s, const GpuChoice& g,
                       const Rates& rates, const GpuMemory& mem, bool params_resident) {
  OffloadJob job;
  job.params = s.params;
  job.trainable_params = s.trainable_params;
  job.weight_bytes = s.weight_bytes;
  job.trainable_tensor_elements = s.trainable_tensor_elements;
  job.param_bytes = bytes_of(r.precision);
  job.optimizer_on_host = r.method == FinetuneMethod::kFull;
  job.fp16_loss_scaling = r.precision == DType::kFloat16;
  job.params_resident_on_gpu = params_resident;
  job.grad_accum = static_cast<uint32_t>(r.grad_accum);
  job.gpus = g.count;
  job.compute_seconds = rates.compute_seconds;
  job.forward_fraction = rates.forward_fraction;
  job.pcie_gbps = rates.pcie_gbps;
  job.nvme_read_gbps = r.nvme.read_gbps;
  job.nvme_write_gbps = r.nvme.write_gbps;
  job.adam_params_per_s = r.assume.adam_params_per_s;
  job.host_scan_gbps = r.assume.host_scan_gbps;
  job.device_budget_bytes =
      r.strata_device_budget_bytes.value_or(offload_device_budget(mem, r, s, params_resident));
  job.device_budget_given = r.strata_device_budget_bytes.has_value();
  // The pinned pool gets what the headroom leaves of the RAM given (plan_headroom.h).
  if (r.host_ram_bytes) {
    job.host_budget_bytes = usable_host_bytes(*r.host_ram_bytes, r.assume.host_headroom);
  }
  job.strata_pinned_bytes = r.strata_pinned_budget_bytes;
  job.strata_pinned_given = r.strata_pinned_given;
  job.optimizer_threads = r.assume.optimizer_threads;
  job.drive_queue_depth = r.assume.drive_queue_depth;
  job.warmup_steps = r.simulated_warmup_steps;
  return job;
}

// Every layer's activations of one micro-batch of the request.
uint64_t request_activation_bytes(const PlanRequest& r) {
  return activation_bytes(r.model, r.seq_len, r.micro_batch, r.checkpointing, r.precision,
                          r.attention, saved_inputs(r.method, r.lora_targets, r.lora_rank));
}

GpuMemory gpu_memory(const PlanRequest& r, const ModelStates& s, const GpuChoice& g,
                     Offload offload, bool params_resident) {
  const ModelConfig& m = r.model;
  const uint64_t b = bytes_of(r.precision);
  const bool full = r.method == FinetuneMethod::kFull;
  GpuMemory mem;
  mem.activations = r.activation_offload == ActivationOffload::kNone
                        ? request_activation_bytes(r)
                        : activation_working_set_bytes(
                              m, r.seq_len, r.micro_batch, r.checkpointing, r.precision,
                              r.attention, saved_inputs(r.method, r.lora_targets, r.lora_rank));
  mem.logits = logits_bytes(m, r.seq_len, r.micro_batch, r.precision);
  mem.cuda_context = r.assume.cuda_context_bytes;

  // Weights: partitioned across GPUs when resident; two units (the one computing and the one
  // being prefetched) when streamed, or when partitions are gathered from other GPUs.
  const uint64_t two_units = 2 * s.largest_unit_weight_bytes;
  if (params_resident) {
    mem.weights = s.weight_bytes / g.count;
    if (g.count > 1) mem.buffers += two_units;
  } else {
    mem.buffers += two_units;
  }

  if (full) {
    if (offload == Offload::kNone) {
      mem.gradients = s.params * b / g.count;
      mem.optimizer = s.params * optimizer_bytes_per_param(r.precision) / g.count;
    } else {
      // Gradients leave layer by layer: two layers' worth in flight.
      mem.gradients = 2 * s.largest_unit_trainable_params * b;
    }
  } else {
    // Adapters and their Adam states stay on the GPU (a few hundred MB at most).
    mem.weights += s.trainable_params * b;
    mem.gradients = s.trainable_params * b;
    mem.optimizer = s.trainable_params * optimizer_bytes_per_param(r.precision);
  }
  if (r.method == FinetuneMethod::kQLora) {
    // One layer's weight matrix dequantized at a time.
    uint64_t largest_linear = 0;
    for (const TensorSpec& spec : parameters_of(m)) {
      if (is_layer_linear_weight(spec)) largest_linear = std::max(largest_linear, spec.elements());
    }
    mem.buffers += largest_linear * b;
  }
  return mem;
}

// What stays on the GPU beside a device pool given with --device-budget.
uint64_t device_budget_neighbours(const GpuMemory& m) {
  return m.activations + m.logits + m.cuda_context;
}

// A --device-budget given that the GPU cannot hold beside what stays there (m: that GPU's).
bool device_budget_too_large(const PlanRequest& r, const GpuMemory& m, uint64_t capacity) {
  return r.strata_device_budget_bytes &&
         *r.strata_device_budget_bytes + device_budget_neighbours(m) > capacity;
}

// Why such a budget cannot be had ("71.26 GiB and the 8.74 GiB ... of 80.00 GiB" with bytes).
std::string device_budget_refusal(uint64_t budget, const GpuMemory& m, uint64_t capacity) {
  const uint64_t beside = device_budget_neighbours(m);
  return "--device-budget " + format_gib(budget) + " and the " + format_gib(beside) +
         " beside it (activations, logits, CUDA context) are more than the GPU's " +
         format_gib(capacity) +
         exact_where_printed_alike(format_gib(budget + beside), budget + beside, capacity);
}

// Memory and offload choice of one GPU, without the time and host figures of NVMe offload (those
// are simulated: finish_nvme_plan).
GpuPlan plan_with_offload(const PlanRequest& r, const ModelStates& s, const GpuChoice& g,
                          Offload offload) {
  GpuPlan plan;
  plan.choice = g;
  plan.offload = offload;
  const uint64_t gpu_capacity = g.gpu.memory_bytes();
  const Rates rates = rates_for(r, s, g);

  // Offloaded runs keep the weights on the GPU when they fit: fewer bytes over PCIe and NVMe.
  plan.params_resident = true;
  plan.memory = gpu_memory(r, s, g, offload, true);
  if (offload != Offload::kNone && plan.memory.total() > gpu_capacity) {
    plan.params_resident = false;
    plan.memory = gpu_memory(r, s, g, offload, false);
  }
  plan.job = offload_job(r, s, g, rates, plan.memory, plan.params_resident);

  switch (offload) {
    case Offload::kNone:
      plan.stages.policy = "none";
      plan.stages.compute_seconds = rates.compute_seconds;
      plan.stages.step_seconds = rates.compute_seconds;
      plan.stages.bottleneck = "compute";
      break;
    case Offload::kCpu:
      plan.stages = estimate_cpu_offload(plan.job);
      break;
    case Offload::kNvme:
      break;  // simulated later, once per GPU that needs it
  }
  if (r.activation_offload != ActivationOffload::kNone) {
    plan.activations_offloaded_bytes = request_activation_bytes(r) - plan.memory.activations;
    if (offload != Offload::kNvme) {
      add_activation_offload(plan.job, plan.activations_offloaded_bytes,
                             r.activation_offload == ActivationOffload::kNvme, plan.stages);
    } else {
      // The simulated step plays them beside the states (simulate_strata_nvme_offload).
      plan.job.offloaded_activation_bytes = plan.activations_offloaded_bytes;
      plan.job.activations_to_nvme = r.activation_offload == ActivationOffload::kNvme;
    }
  }
  plan.fits_gpu = plan.memory.total() <= gpu_capacity;
  // A device pool replayed from a run (--device-budget) takes the place of the offloaded states'
  // share; with what stays beside it (activations, logits, the CUDA context) it must fit the
  // GPU: the step simulated with more would be one no run on this GPU could have. A budget the
  // GPU cannot hold is bad input for that GPU whatever its offload: a row that keeps its states
  // in RAM or on the GPU does not fit either, rather than fit beside a flag it ignored.
  if (device_budget_too_large(r, plan.memory, gpu_capacity)) plan.fits_gpu = false;
  return plan;
}

// Step time, tokens/s, cost and the host fit, from plan.stages.
void finish_plan(const PlanRequest& r, GpuPlan& plan) {
  const GpuChoice& g = plan.choice;
  plan.host_bytes = plan.stages.host_bytes;
  plan.nvme_bytes = plan.stages.nvme_bytes;
  plan.step_seconds = plan.stages.step_seconds;
  plan.bottleneck = plan.stages.bottleneck;
  plan.tokens_per_step = static_cast<double>(g.count) * r.seq_len * r.micro_batch * r.grad_accum;
  plan.tokens_per_s = plan.tokens_per_step / plan.step_seconds;
  plan.hours_per_mtok = 1e6 / plan.tokens_per_s / 3600.0;
  const PriceRange& price = g.gpu.price_usd_per_hour;
  const double prices[3] = {price.low, price.typical, price.high};
  for (int tier = 0; tier < 3; ++tier) {
    plan.usd_per_mtok[tier] = plan.hours_per_mtok * prices[tier] * g.count;
  }
  plan.why_not.clear();
  if (!plan.fits_gpu) {
    const uint64_t capacity = g.gpu.memory_bytes();
    plan.why_not =
        plan.memory.total() > capacity || !r.strata_device_budget_bytes
            ? "GPU needs " + format_gib(plan.memory.total()) + " of " + format_gib(capacity) +
                  exact_where_printed_alike(format_gib(plan.memory.total()), plan.memory.total(),
                                            capacity)
            : device_budget_refusal(*r.strata_device_budget_bytes, plan.memory, capacity);
  }
  const HostHeadroom& headroom = r.assume.host_headroom;
  plan.host.job_bytes = plan.host_bytes;
  plan.host.recommended_bytes = recommended_host_bytes(plan.host_bytes, headroom);
  plan.fits_host = true;
  if (r.host_ram_bytes) {
    // Only within the recommended figure: the job cannot have the OS's and framework's RAM.
    plan.fits_host = plan.host.recommended_bytes <= *r.host_ram_bytes;
    if (!plan.fits_host) {
      // The need rounded up, as every recommended figure prints: given back, it fits.
      const std::string need = format_bytes_up(plan.host.recommended_bytes);
      plan.why_not +=
          std::string(plan.why_not.empty() ? "" : "; ") + "host needs " + need +
          " with headroom (job " + format_gib(plan.host_bytes) + ") of " +
          format_gib(*r.host_ram_bytes) +
          exact_where_printed_alike(need, plan.host.recommended_bytes, *r.host_ram_bytes);
    }
  }
  plan.fits_nvme = true;
  if (plan.nvme_bytes > 0 && r.nvme_drive.capacity_tb > 0) {
    // Decimal TB, as drives are sold and rated; RAID-0 adds the drives' capacities.
    const double per_drive = r.nvme_drive.capacity_tb * 1e12;
    const uint32_t drives = std::max<uint32_t>(r.nvme.drives, 1);
    const double need = static_cast<double>(plan.nvme_bytes);
    if (need > drives * per_drive) {
      plan.fits_nvme = false;
      const auto enough = static_cast<uint64_t>(std::ceil(need / per_drive));
      char text[320];
      std::snprintf(text, sizeof text,
                    "NVMe needs %.2f TB, more than %u x %s hold (%.2f TB): %llu such drives "
                    "(--nvme %llu:%s), or larger ones (--nvme-drive)",
                    need / 1e12, drives, r.nvme_drive.name.c_str(), drives * per_drive / 1e12,
                    static_cast<unsigned long long>(enough),
                    static_cast<unsigned long long>(enough),
                    r.nvme.generation.empty() ? "READ/WRITE" : r.nvme.generation.c_str());
      plan.why_not += std::string(plan.why_not.empty() ? "" : "; ") + text;
    }
  }
  plan.job_cost.reset();
  if (r.job_tokens && plan.fits()) {
    plan.job_cost = job_cost(*r.job_tokens, plan.tokens_per_step, plan.step_seconds,
                             g.gpu.price_usd_per_hour, g.count);
  }
  plan.nvme_wear = {};
  // Activations sent to NVMe use the drive even where the pool keeps them all (the JSON field
  // was null there, and the text silent, against docs/planner.md's "is then set too").
  const bool activations_to_nvme =
      r.activation_offload == ActivationOffload::kNvme && plan.activations_offloaded_bytes != 0;
  if (plan.offload == Offload::kNvme || activations_to_nvme || plan.stages.nvme_write_bytes != 0) {
    std::optional<uint64_t> steps;
    if (r.job_tokens) {
      steps = static_cast<uint64_t>(std::ceil(*r.job_tokens / plan.tokens_per_step));
    }
    plan.nvme_wear = nvme_wear(plan.stages.nvme_write_bytes, r.nvme.drives, r.nvme_drive, steps,
                               r.assume.nvme_wear_warn_fraction);
    plan.nvme_wear.reported = true;
  }
}

}  // namespace

uint64_t activations_held_bytes(const GpuPlan& plan) {
  return align_up(plan.activations_offloaded_bytes * plan.choice.count, kPageSize);
}

namespace {

// The least host RAM for full speed: every state the GPU does not hold in RAM, nothing on NVMe
// (CPU offload's exact-size copies; offloaded activations in pinned memory, not on NVMe); none
// when nothing is offloaded, states or activations.
void set_full_speed_host(const PlanRequest& r, const ModelStates& s, GpuPlan& plan) {
  // No offload of the states: what the host holds is offloaded activations kept in RAM, if any.
  // Activations to NVMe: without the pool they would pass through (add_activation_offload).
  uint64_t bytes = plan.host_bytes - plan.stages.peak_pinned_bytes;
  if (plan.offload == Offload::kNvme) {
    const OffloadEstimate cpu = plan_with_offload(r, s, plan.choice, Offload::kCpu).stages;
    bytes = cpu.host_bytes - cpu.peak_pinned_bytes;
  }
  if (r.activation_offload == ActivationOffload::kNvme) bytes += activations_held_bytes(plan);
  plan.host.full_speed_bytes = bytes;
  plan.host.full_speed_recommended_bytes = recommended_host_bytes(bytes, r.assume.host_headroom);
}

// A plan with no or CPU offload of the states whose offloaded activations go to NVMe: its closed
// form is checked against a simulated step of the activations alone (activations_alone_job).
bool simulates_activations_alone(const PlanRequest& r, const GpuPlan& plan) {
  return plan.offload != Offload::kNvme && r.activation_offload == ActivationOffload::kNvme &&
         plan.activations_offloaded_bytes != 0;
}

// That job for `plan`: the states the closed form keeps in RAM are its host bytes less the pool
// (add_activation_offload's budget, or once simulated the peak in its place).
OffloadJob activations_alone_job(const GpuPlan& plan, const std::vector<TensorSpec>& inventory) {
  return activations_alone_job(plan.job, inventory, plan.activations_offloaded_bytes,
                               plan.stages.host_bytes - plan.stages.peak_pinned_bytes);
}

// NVMe offload chosen by default (no --offload): what CPU offload, with the RAM it needs, would
// give instead. Unset when CPU offload does not fit the GPU either. With activations to NVMe
// their way is simulated, as for the rows (simulates_activations_alone), here and now.
Result<std::optional<RamUpgrade>> more_ram_option(const PlanRequest& r, const ModelStates& s,
                                                  const std::vector<TensorSpec>& inventory,
                                                  const GpuPlan& plan) {
  if (r.offload || plan.offload != Offload::kNvme) return std::optional<RamUpgrade>{};
  GpuPlan cpu = plan_with_offload(r, s, plan.choice, Offload::kCpu);
  if (!cpu.fits_gpu) return std::optional<RamUpgrade>{};
  if (simulates_activations_alone(r, cpu)) {
    STRATA_ASSIGN_OR_RETURN(
        OffloadEstimate alone,
        simulate_strata_nvme_offload(activations_alone_job(cpu, inventory), nullptr),
        "simulating the activations' way to NVMe under CPU offload");
    add_simulated_activations(cpu.job, alone, cpu.stages);
  }
  PlanRequest with_ram = r;
  with_ram.host_ram_bytes = recommended_host_bytes(cpu.stages.host_bytes, r.assume.host_headroom);
  with_ram.job_tokens.reset();
  finish_plan(with_ram, cpu);
  if (!(cpu.tokens_per_s > plan.tokens_per_s)) return std::optional<RamUpgrade>{};
  return std::optional<RamUpgrade>{
      RamUpgrade{*with_ram.host_ram_bytes, cpu.step_seconds, cpu.tokens_per_s, cpu.usd_per_mtok}};
}

// A plan whose GPU memory does not fit, planned again with the saved activations moved to pinned
// memory: the first of no and CPU offload of the states (or the --offload given, unless nvme,
// which activation offload is not planned with) whose GPU memory then fits; on a NAME:auto row,
// no offload (or the one given) at the smallest count, as that row's own search would.
std::optional<ActivationUpgrade> activation_offload_option(const PlanRequest& r,
                                                           const ModelStates& s,
                                                           const GpuPlan& plan) {
  if (plan.fits_gpu || r.activation_offload != ActivationOffload::kNone) return std::nullopt;
  if (r.offload == Offload::kNvme) return std::nullopt;
  PlanRequest with = r;
  with.activation_offload = ActivationOffload::kPinned;
  with.job_tokens.reset();
  // NAME:auto: the smallest count at which it fits, as the row's own search (not the count the
  // row ended at when none fitted).
  GpuChoice g = plan.choice;
  const uint32_t first = g.auto_count ? 1 : g.count;
  const uint32_t last = g.auto_count ? kMaxGpusPerNode : g.count;
  for (uint32_t n = first; n <= last; ++n) {
    g.count = n;
    for (const Offload offload : {Offload::kNone, Offload::kCpu}) {
      if (r.offload && *r.offload != offload) continue;
      // NAME:auto searches counts with the offload given, else none (choose_count): CPU offload
      // at x1 was named here for 70B on rtx-4090:auto, where the flag itself gives none on x61.
      if (g.auto_count && !r.offload && offload != Offload::kNone) continue;
      GpuPlan moved = plan_with_offload(with, s, g, offload);
      if (!moved.fits_gpu) continue;
      finish_plan(with, moved);
      return ActivationUpgrade{offload,
                               n,
                               moved.memory.total(),
                               moved.host.recommended_bytes,
                               moved.fits_host,
                               moved.step_seconds,
                               moved.tokens_per_s,
                               moved.usd_per_mtok};
    }
  }
  return std::nullopt;
}

// No offload asked for: the first that fits of none and cpu, else nvme (simulated afterwards).
// CPU offload is only chosen when --host-ram says the states fit in RAM; without it, NVMe offload
// is the choice that needs the least RAM.
GpuPlan choose_offload(const PlanRequest& r, const ModelStates& s, const GpuChoice& g) {
  if (r.offload) return plan_with_offload(r, s, g, *r.offload);
  GpuPlan none = plan_with_offload(r, s, g, Offload::kNone);
  finish_plan(r, none);
  if (none.fits()) return none;
  if (r.host_ram_bytes) {
    GpuPlan cpu = plan_with_offload(r, s, g, Offload::kCpu);
    finish_plan(r, cpu);
    if (cpu.fits()) return cpu;
  }
  return plan_with_offload(r, s, g, Offload::kNvme);
}

// NAME:auto: the smallest GPU count at which the job fits with --offload, or with nothing
// offloaded when --offload is not given (NVMe offload fits one GPU almost always, so "fits
// somehow" would answer 1). NVMe offload's host fit is its least pinned pool with headroom, which
// does not depend on the count but for offloaded activations kept there; the step is simulated
// afterwards like any other.
GpuPlan choose_count(const PlanRequest& r, const ModelStates& s, GpuChoice g,
                     uint64_t least_pinned) {
  const Offload offload = r.offload.value_or(Offload::kNone);
  GpuPlan last;
  for (uint32_t n = 1; n <= kMaxGpusPerNode; ++n) {
    g.count = n;
    GpuPlan plan = plan_with_offload(r, s, g, offload);
    bool fits = plan.fits_gpu;
    if (offload == Offload::kNvme) {
      // Offloaded activations kept in pinned memory add one micro-batch's of every GPU.
      const uint64_t least =
          least_pinned +
          (r.activation_offload == ActivationOffload::kPinned ? activations_held_bytes(plan) : 0);
      fits = fits && (!r.host_ram_bytes ||
                      recommended_host_bytes(least, r.assume.host_headroom) <= *r.host_ram_bytes);
    } else {
      finish_plan(r, plan);
      fits = plan.fits();
    }
    if (fits) return plan;
    last = std::move(plan);
  }
  return last;
}

// The job the comparison with DeepSpeed simulates for plan (plan.strata_nvme): NVMe offload of
// the model states only. The plan's own job when it is that; otherwise the same job under NVMe
// offload without activation offload (weights resident if they fit beside every layer's
// activations), like for like with DeepSpeed's configurations, which offload no activations.
OffloadJob states_nvme_job(const PlanRequest& r, const ModelStates& s, const GpuPlan& plan) {
  if (plan.offload == Offload::kNvme && r.activation_offload == ActivationOffload::kNone) {
    return plan.job;
  }
  PlanRequest states_only = r;
  states_only.activation_offload = ActivationOffload::kNone;
  const GpuChoice& g = plan.choice;
  const bool resident =
      gpu_memory(states_only, s, g, Offload::kNvme, true).total() <= g.gpu.memory_bytes();
  const GpuMemory mem = gpu_memory(states_only, s, g, Offload::kNvme, resident);
  return offload_job(states_only, s, g, rates_for(states_only, s, g), mem, resident);
}

// Whether two jobs simulate alike: same inventory (the callers share one), same rates and
// budgets. GPU presets that differ only in what the simulation does not see (memory size,
// price) then share a simulation.
bool same_simulation(const OffloadJob& a, const OffloadJob& b) {
  return a.inventory.size() == b.inventory.size() &&
         a.params_resident_on_gpu == b.params_resident_on_gpu && a.gpus == b.gpus &&
         a.compute_seconds == b.compute_seconds && a.forward_fraction == b.forward_fraction &&
         a.pcie_gbps == b.pcie_gbps && a.device_budget_bytes == b.device_budget_bytes &&
         a.device_budget_given == b.device_budget_given &&
         a.host_budget_bytes == b.host_budget_bytes &&
         a.strata_pinned_bytes == b.strata_pinned_bytes &&
         a.strata_pinned_given.chunk_bytes == b.strata_pinned_given.chunk_bytes &&
         a.strata_pinned_given.buffers == b.strata_pinned_given.buffers &&
         a.strata_pinned_given.sub_group_bytes == b.strata_pinned_given.sub_group_bytes &&
         a.optimizer_on_host == b.optimizer_on_host &&
         a.params_home_on_device == b.params_home_on_device && a.warmup_steps == b.warmup_steps &&
         a.offloaded_activation_bytes == b.offloaded_activation_bytes &&
         a.activations_to_nvme == b.activations_to_nvme;
}

// Strata's NVMe-offload simulations of `jobs`, posted to the pool; jobs that simulate alike run
// once. All jobs come from one request (one inventory, one NVMe array, one CPU rate). The tasks
// read the batch: it stays where it is made and joins them before it goes.
class SimulationBatch {
 public:
  SimulationBatch(SimulationPool& pool, std::vector<OffloadJob> jobs)
      : pool_(pool), jobs_(std::move(jobs)), source_(jobs_.size()) {
    for (size_t k = 0; k < jobs_.size(); ++k) {
      source_[k] = distinct_.size();
      for (size_t d = 0; d < distinct_.size(); ++d) {
        if (same_simulation(jobs_[distinct_[d]], jobs_[k])) source_[k] = d;
      }
      if (source_[k] == distinct_.size()) distinct_.push_back(k);
    }
    simulated_.assign(distinct_.size(), Status::error(STRATA_E_INVALID, "not simulated"));
    for (size_t d = 0; d < distinct_.size(); ++d) {
      tickets_.push_back(pool_.post([this, d] {
        simulated_[d] = simulate_strata_nvme_offload(jobs_[distinct_[d]], &pool_);
      }));
    }
  }
  ~SimulationBatch() { join(); }
  SimulationBatch(const SimulationBatch&) = delete;
  SimulationBatch& operator=(const SimulationBatch&) = delete;

  // The results in the order of the jobs.
  std::vector<Result<OffloadEstimate>> results() {
    join();
    std::vector<Result<OffloadEstimate>> results;
    results.reserve(jobs_.size());
    for (size_t k = 0; k < jobs_.size(); ++k) results.push_back(simulated_[source_[k]]);
    return results;
  }

 private:
  void join() {
    for (const SimulationPool::Ticket& ticket : tickets_) pool_.join(ticket);
    tickets_.clear();
  }

  SimulationPool& pool_;
  std::vector<OffloadJob> jobs_;
  std::vector<size_t> distinct_;  // indices into jobs_ that are simulated
  std::vector<size_t> source_;    // which distinct job answers each job
  std::vector<Result<OffloadEstimate>> simulated_;
  std::vector<SimulationPool::Ticket> tickets_;
};

// make_gpu_plans in two halves, so that make_plan can post the comparison's simulations beside
// these: the GPUs' plans with their NVMe simulations posted, then the plans finished with them.
struct GpuPlansUnderway {
  Plan plan;
  std::vector<size_t> nvme;  // the plan.gpus simulated, in the batch's order
  // Then those with no or CPU offload of the states whose activations go to NVMe: their
  // activations_alone_job, in the batch after the NVMe ones.
  std::vector<size_t> activations_alone;
  std::vector<TensorSpec> inventory;  // offload_inventory(plan.request)
  std::unique_ptr<SimulationBatch> batch;
};

Result<GpuPlansUnderway> start_gpu_plans(const PlanRequest& given, SimulationPool& pool) {
  STRATA_TRY(validate(given));
  PlanRequest request = given;
  // No drive named: the one the NVMe generation's preset assumes (Gen4's for measured rates).
  if (request.nvme_drive.name.empty()) {
    const double rated = request.nvme_drive.tbw_tb;  // --nvme-tbw alone: this drive, re-rated
    request.nvme_drive = default_nvme_drive(request.nvme.generation + "-x4");
    if (rated > 0) request.nvme_drive.tbw_tb = rated;
  }
  Plan plan;
  plan.request = request;
  plan.states = model_states(request);
  std::vector<GpuChoice> gpus = request.gpus;
  if (gpus.empty()) {
    for (const GpuPreset& gpu : gpu_presets()) gpus.push_back({gpu, 1});
  }
  std::vector<TensorSpec> inventory = offload_inventory(request);
  const uint64_t least_pinned =
      strata_pinned_sizing(request.nvme.read_gbps, request.nvme.write_gbps,
                           request.assume.optimizer_threads, request.assume.drive_queue_depth)
          .budget_bytes;
  for (const GpuChoice& g : gpus) {
    plan.gpus.push_back(g.auto_count ? choose_count(request, plan.states, g, least_pinned)
                                     : choose_offload(request, plan.states, g));
  }

  // NVMe offload: every GPU that uses it gets its step simulated (the inventory is shared, the
  // device model is the GPU's).
  GpuPlansUnderway underway;
  std::vector<OffloadJob> jobs;
  for (size_t i = 0; i < plan.gpus.size(); ++i) {
    if (plan.gpus[i].offload != Offload::kNvme) continue;
    plan.gpus[i].job.inventory = inventory;
    underway.nvme.push_back(i);
    jobs.push_back(plan.gpus[i].job);
  }
  for (size_t i = 0; i < plan.gpus.size(); ++i) {
    const GpuPlan& g = plan.gpus[i];
    if (!simulates_activations_alone(request, g)) continue;
    underway.activations_alone.push_back(i);
    jobs.push_back(activations_alone_job(g, inventory));
  }
  underway.plan = std::move(plan);
  underway.inventory = std::move(inventory);
  underway.batch = std::make_unique<SimulationBatch>(pool, std::move(jobs));
  return underway;
}

Result<Plan> finish_gpu_plans(GpuPlansUnderway underway) {
  Plan& plan = underway.plan;
  const PlanRequest& request = plan.request;
  const std::vector<size_t>& nvme = underway.nvme;
  const std::vector<TensorSpec>& inventory = underway.inventory;
  std::vector<Result<OffloadEstimate>> simulated = underway.batch->results();
  for (size_t k = 0; k < nvme.size(); ++k) {
    if (!simulated[k]) {
      return std::move(simulated[k])
          .take_status()
          .with_context("planning " + plan.gpus[nvme[k]].choice.gpu.name);
    }
    plan.gpus[nvme[k]].stages = std::move(*simulated[k]);
  }
  for (size_t k = 0; k < underway.activations_alone.size(); ++k) {
    Result<OffloadEstimate>& alone = simulated[nvme.size() + k];
    GpuPlan& g = plan.gpus[underway.activations_alone[k]];
    if (!alone) {
      return std::move(alone).take_status().with_context(
          "planning " + g.choice.gpu.name + ": simulating the activations' way to NVMe");
    }
    add_simulated_activations(g.job, *alone, g.stages);
  }
  for (GpuPlan& g : plan.gpus) {
    finish_plan(request, g);
    set_full_speed_host(request, plan.states, g);
    STRATA_ASSIGN_OR_RETURN(g.more_ram, more_ram_option(request, plan.states, inventory, g),
                            "planning " + g.choice.gpu.name);
    g.with_activation_offload = activation_offload_option(request, plan.states, g);
    if (g.choice.auto_count && !g.fits()) {
      g.why_not = "no count 1.." + std::to_string(kMaxGpusPerNode) + " fits; at " +
                  std::to_string(g.choice.count) + ": " + g.why_not;
    }
  }

  for (int tier = 0; tier < 3; ++tier) {
    CheapestOption& best = plan.cheapest[tier];
    for (const GpuPlan& g : plan.gpus) {
      if (!g.fits()) continue;
      // With a job, the job's price decides (whole steps); it orders GPUs as USD/Mtok does up
      // to the rounding of the last step.
      const double cost = g.job_cost ? g.job_cost->usd[tier] : g.usd_per_mtok[tier];
      const double best_cost = best.job_usd ? *best.job_usd : best.usd_per_mtok;
      if (!best.found || cost < best_cost) {
        best = {true, g.choice.gpu.name, g.choice.count, g.usd_per_mtok[tier],
                g.job_cost ? std::optional<double>(g.job_cost->usd[tier]) : std::nullopt};
      }
    }
  }
  plan.primary = 0;
  if (request.gpus.empty() && plan.cheapest[1].found) {
    for (size_t i = 0; i < plan.gpus.size(); ++i) {
      if (plan.gpus[i].choice.gpu.name == plan.cheapest[1].gpu) plan.primary = i;
    }
  }
  return std::move(plan);
}

// compare_with_zero_infinity in two halves, like make_gpu_plans: the DeepSpeed estimates and
// Strata's comparison simulations for plan.gpus[headline] posted (they need its job, not its
// simulation), then the comparison filled in from them.
struct ComparisonUnderway {
  enum Side { kGiven, kLeast, kEqual };
  size_t headline = 0;
  OffloadComparison like;  // the DeepSpeed columns; Strata's, once simulated
  bool budget_given = false;
  std::vector<Side> side;  // per simulation of the batch
  std::unique_ptr<SimulationBatch> batch;
};

// The comparison without Strata's side (it cannot be simulated: why), so without DeepSpeed's
// columns, which are compared with it.
void leave_strata_out(OffloadComparison& like, std::string why) {
  like.strata_not_simulated = std::move(why);
  like.deepspeed.clear();
  like.deepspeed_why_not = "Strata's side was not simulated";
}

ComparisonUnderway start_comparison(const Plan& plan, size_t headline, SimulationPool& pool) {
  const PlanRequest& request = plan.request;
  const std::vector<TensorSpec> inventory = offload_inventory(request);

  // Strata against the labelled DeepSpeed configurations, both on NVMe, for the headline GPU:
  // Strata with the RAM given (unless the plan simulated it already) and at its least pool;
  // DeepSpeed's host memory is fixed, so its peak is its least; then Strata given exactly each
  // configuration's peak host bytes.
  const GpuPlan& p = plan.gpus.at(headline);
  OffloadJob job = states_nvme_job(request, plan.states, p);
  job.inventory = inventory;
  ComparisonUnderway underway;
  underway.headline = headline;
  OffloadComparison& like = underway.like;
  if (request.method != FinetuneMethod::kFull) {
    like.deepspeed_why_not = "the labelled configurations are full fine-tuning's";
  } else if (job.gpus != 1) {
    like.deepspeed_why_not = "the labelled configurations are modelled on one GPU";
  } else {
    for (const char* name :
         {deepspeed::kDeepSpeedDefaults, deepspeed::kDeepSpeedPinned, deepspeed::kDeepSpeedTuned}) {
      Result<DeepSpeedEstimate> d =
          estimate_deepspeed_offload(job, name, request.deepspeed_knob_factor);
      if (!d) {
        // A shape DeepSpeed cannot run (every sub-group under its minimum I/O size): no column.
        like.deepspeed.clear();
        like.deepspeed_why_not = name + std::string(": ") + d.status().message();
        break;
      }
      DeepSpeedComparison c;
      c.deepspeed = std::move(*d);
      if (request.host_ram_bytes) {
        c.fits_host =
            recommended_host_bytes(c.deepspeed.offload.host_bytes, request.assume.host_headroom) <=
            *request.host_ram_bytes;
      }
      like.deepspeed.push_back(std::move(c));
    }
  }

  std::vector<OffloadJob> jobs;
  std::vector<ComparisonUnderway::Side>& side = underway.side;
  // A --device-budget that cannot fit this GPU beside what stays there: no step to compare, and
  // none is simulated (the plan's own row already does not fit).
  const uint64_t capacity = p.choice.gpu.memory_bytes();
  if (device_budget_too_large(request, p.memory, capacity)) {
    leave_strata_out(
        like, device_budget_refusal(*request.strata_device_budget_bytes, p.memory, capacity));
    underway.batch = std::make_unique<SimulationBatch>(pool, std::move(jobs));
    return underway;
  }
  // The plan's own simulation serves when it is the states' alone.
  if (p.offload != Offload::kNvme || request.activation_offload != ActivationOffload::kNone) {
    jobs.push_back(job), side.push_back(ComparisonUnderway::kGiven);
  }
  underway.budget_given = job.host_budget_bytes || job.strata_pinned_bytes;
  if (underway.budget_given) {
    OffloadJob least = job;
    least.host_budget_bytes.reset();
    least.strata_pinned_bytes.reset();
    jobs.push_back(least), side.push_back(ComparisonUnderway::kLeast);
  }
  for (const DeepSpeedComparison& c : like.deepspeed) {
    OffloadJob equal = job;
    equal.host_budget_bytes = c.deepspeed.offload.host_bytes;
    equal.strata_pinned_bytes.reset();
    jobs.push_back(equal), side.push_back(ComparisonUnderway::kEqual);
  }
  underway.batch = std::make_unique<SimulationBatch>(pool, std::move(jobs));
  return underway;
}

Status finish_comparison(Plan& plan, ComparisonUnderway underway) {
  STRATA_ASSERT(plan.primary == underway.headline);
  const GpuPlan& p = plan.gpus[plan.primary];
  OffloadComparison& like = underway.like;
  if (plan.request.method == FinetuneMethod::kFull) {
    like.deepspeed_estimate = deepspeed_zero3_estimate(
        plan.states.params, deepspeed_largest_layer_params(plan.request.model), p.choice.count);
  }
  // Refused before any simulation (a --device-budget the GPU cannot hold): no Strata side, not
  // even the plan's own step, which such a budget made.
  if (!like.strata_not_simulated.empty()) {
    plan.like_for_like = std::move(like);
    return Status::ok();
  }
  if (p.offload == Offload::kNvme && plan.request.activation_offload == ActivationOffload::kNone) {
    plan.strata_nvme = p.stages;
  }
  std::vector<Result<OffloadEstimate>> simulated = underway.batch->results();
  // Every simulation here is the comparison's own (a plan that offloads its states alone to
  // NVMe simulated its step already, and failed there if it could not run): one that cannot run
  // (a --pinned-budget or --device-budget too small for NVMe offload of a plan that keeps its
  // states elsewhere) takes the block away with its reason, and the plan stands.
  const auto failed = std::find_if(simulated.begin(), simulated.end(),
                                   [](const Result<OffloadEstimate>& r) { return !r; });
  if (failed != simulated.end()) {
    const int code = failed->status().code();
    if (code != STRATA_E_PINNED_BUDGET && code != STRATA_E_DEVICE_BUDGET &&
        code != STRATA_E_LIMIT) {
      return std::move(*failed).take_status().with_context("comparing with DeepSpeed on " +
                                                           p.choice.gpu.name);
    }
    leave_strata_out(like, failed->status().message());
    plan.like_for_like = std::move(like);
    return Status::ok();
  }
  size_t next_equal = 0;
  for (size_t k = 0; k < simulated.size(); ++k) {
    const ComparisonUnderway::Side side = underway.side[k];
    OffloadEstimate& into = side == ComparisonUnderway::kGiven ? plan.strata_nvme
                            : side == ComparisonUnderway::kLeast
                                ? like.strata_least
                                : like.deepspeed[next_equal++].strata_equal_ram;
    into = std::move(*simulated[k]);
  }
  if (!underway.budget_given) like.strata_least = plan.strata_nvme;
  plan.like_for_like = std::move(like);
  return Status::ok();
}

}  // namespace

Result<Plan> make_gpu_plans(const PlanRequest& given, SimulationPool& pool) {
  STRATA_ASSIGN_OR_RETURN(GpuPlansUnderway underway, start_gpu_plans(given, pool));
  return finish_gpu_plans(std::move(underway));
}

Result<Plan> make_gpu_plans(const PlanRequest& given) {
  SimulationPool pool(SimulationPool::default_threads());
  return make_gpu_plans(given, pool);
}

Status compare_with_zero_infinity(Plan& plan) {
  SimulationPool pool(SimulationPool::default_threads());
  return finish_comparison(plan, start_comparison(plan, plan.primary, pool));
}

Result<telemetry::TraceStats> write_strata_nvme_trace(const Plan& plan, const std::string& path) {
  // The headline's own simulated step when it offloads activations too (under NVMe offload of
  // the states, or alone to NVMe with the states elsewhere), else the job start_comparison
  // simulates for plan.strata_nvme, simulated again with a trace.
  const GpuPlan& p = plan.gpus.at(plan.primary);
  const bool alone = simulates_activations_alone(plan.request, p);
  if (!alone && plan.strata_nvme.model != "simulated") {
    const std::string& why = plan.like_for_like.strata_not_simulated;
    return invalid_argument("the plan of " + p.choice.gpu.name +
                            " has no simulated NVMe-offload step to trace" +
                            (why.empty() ? std::string() : " (" + why + ")"));
  }
  const bool own_step =
      alone || (p.offload == Offload::kNvme && p.job.offloaded_activation_bytes != 0);
  OffloadJob job = own_step ? p.job : states_nvme_job(plan.request, plan.states, p);
  job.inventory = offload_inventory(plan.request);
  if (alone) job = activations_alone_job(p, job.inventory);
  // Room for every event, allocated up front (96 bytes each): the plan's simulation counted
  // its transfers (a streamed one is a span on each of its two links), and each phase adds at
  // most a wait and a compute span, fewer than the transfers that feed it. What did not fit
  // would be counted and reported.
  telemetry::TraceConfig config;
  config.capacity_events =
      std::clamp<uint64_t>(4 * (alone ? p.stages.transfers : plan.strata_nvme.transfers) + 1024,
                           uint64_t{1} << 16, telemetry::kMaxTraceEvents);
  config.start_enabled = true;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<telemetry::TraceRecorder> trace,
                          telemetry::TraceRecorder::create(config));
  job.trace = trace.get();
  STRATA_ASSIGN_OR_RETURN(OffloadEstimate traced, simulate_strata_nvme_offload(job, nullptr),
                          "tracing the simulated step");
  // The simulation is deterministic: a trace of another step than the plan's would be a bug.
  const OffloadEstimate& planned = own_step ? p.stages : plan.strata_nvme;
  const double planned_step = alone ? planned.activations_alone_step_seconds : planned.step_seconds;
  if (traced.nvme_read_bytes != planned.nvme_read_bytes ||
      traced.nvme_write_bytes != planned.nvme_write_bytes || traced.step_seconds != planned_step) {
    return Status::error(STRATA_E_INTERNAL, "tracing the simulated step: it moved " +
                                                std::to_string(traced.nvme_read_bytes) + " / " +
                                                std::to_string(traced.nvme_write_bytes) +
                                                " bytes a step where the plan's moved " +
                                                std::to_string(planned.nvme_read_bytes) + " / " +
                                                std::to_string(planned.nvme_write_bytes));
  }
  STRATA_TRY(trace->export_chrome_trace(path), "writing " + path);
  return trace->stats();
}

bool Plan::any_fits() const {
  return std::any_of(gpus.begin(), gpus.end(), [](const GpuPlan& g) { return g.fits(); });
}

Result<Plan> make_plan(const PlanRequest& request) {
  SimulationPool pool(SimulationPool::default_threads());
  STRATA_ASSIGN_OR_RETURN(GpuPlansUnderway gpu_plans, start_gpu_plans(request, pool));
  // With GPUs named the headline is the first, known before any simulation: the comparison's
  // simulations go beside the GPUs' own. Otherwise it is the cheapest, known after them.
  std::optional<ComparisonUnderway> comparison;
  if (!request.gpus.empty()) comparison = start_comparison(gpu_plans.plan, 0, pool);
  STRATA_ASSIGN_OR_RETURN(Plan plan, finish_gpu_plans(std::move(gpu_plans)));
  if (!comparison) comparison = start_comparison(plan, plan.primary, pool);
  // The advice's re-plans (which need the headline's simulated stages) run beside the
  // comparison's simulations; a failed comparison is reported first, as it would come first.
  Result<std::vector<Advice>> advice = plan_advice(plan, pool);
  STRATA_TRY(finish_comparison(plan, std::move(*comparison)));
  if (!advice) return std::move(advice).take_status();
  plan.advice = std::move(*advice);
  return plan;
}

}  // namespace strata
