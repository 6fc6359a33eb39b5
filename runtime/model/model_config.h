// A transformer's shape as Hugging Face config.json files describe it, and the presets Strata
// ships. Everything that sizes tensors (inventories, the planner, the simulator) starts here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

// Decoder-only Llama-family models: Llama 2/3, TinyLlama, Mistral/Mixtral (MoE), Qwen2.
struct ModelConfig {
  std::string name;          // preset name, or the config file's stem
  std::string architecture;  // HF "architectures"[0], e.g. "LlamaForCausalLM"
  uint64_t hidden_size = 0;
  uint64_t intermediate_size = 0;  // per expert for MoE
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;  // < num_attention_heads: grouped-query attention
  uint64_t head_dim = 0;             // HF "head_dim", else hidden_size / num_attention_heads
  uint64_t vocab_size = 0;
  uint64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;  // LM head shares the embedding matrix
  // Biases on the q/k/v projections (Qwen2 always has them; Llama when "attention_bias") and on
  // the output projection (Llama's "attention_bias" covers o_proj too; Qwen2's o_proj has none).
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;             // Llama "mlp_bias": gate/up/down biases
  uint32_t num_local_experts = 0;    // 0 or 1: dense MLP
  uint32_t num_experts_per_tok = 0;  // experts each token is routed to (MoE only)

  bool is_moe() const { return num_local_experts > 1; }
  uint64_t q_dim() const { return uint64_t{num_attention_heads} * head_dim; }
  uint64_t kv_dim() const { return uint64_t{num_key_value_heads} * head_dim; }
  // Experts a token's MLP actually runs through (1 for a dense model).
  uint32_t active_experts() const { return is_moe() ? num_experts_per_tok : 1; }
};

// Checks that the numbers describe a buildable model (non-zero sizes, heads divisible by KV
// heads, experts_per_tok <= experts). load_model / parse_model_config call it.
Status validate(const ModelConfig& config);

// Parses a HF config.json text. `name` becomes ModelConfig::name. Missing required keys,
// wrong types and malformed JSON are STRATA_E_INVALID with the key named.
Result<ModelConfig> parse_model_config(std::string_view json_text, std::string_view name);

// A shipped preset name ("llama-2-70b") or a path to a HF config.json. Anything containing '/'
// or ending in ".json" is a path. An unknown name is STRATA_E_INVALID listing the presets.
Result<ModelConfig> load_model(std::string_view name_or_path);

// Names of the shipped model presets, sorted.
std::vector<std::string> model_preset_names();

// Exact number of parameters (weights and biases), counting a tied embedding once.
uint64_t parameter_count(const ModelConfig& config);

// Parameters of one transformer layer (all layers are alike), and of the parts outside layers.
uint64_t layer_parameter_count(const ModelConfig& config);
uint64_t embedding_parameter_count(const ModelConfig& config);  // embedding (+ head if untied)

// The model narrowed by `scale` and cut to `layers` (-1 keeps the depth): hidden size, head
// counts, intermediate size and vocabulary shrink by `scale` while head_dim, the GQA ratio, the
// expert count and the tying stay, so the scaled model has the same mix of tensor shapes. Heads
// stay integral (at least one KV head). Requires scale > 0 and layers >= -1 (see
// check_scale_options); out-of-range values are an invariant violation.
ModelConfig scale_model(const ModelConfig& config, double scale, int layers);
Status check_scale_options(double scale, int layers);

}  // namespace strata
