#include "model/model_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/assert.h"
#include "model/embedded_presets.h"

namespace strata {
namespace {

using nlohmann::json;

// Architectures whose tensor layout the inventory models exactly. Anything else would be counted
// wrongly (Gemma's norms, Qwen2-MoE's shared experts, ...), so it is refused rather than guessed.
struct KnownArchitecture {
  const char* architecture;
  const char* model_type;
};
constexpr KnownArchitecture kKnownArchitectures[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"MixtralForCausalLM", "mixtral"},
    {"Qwen2ForCausalLM", "qwen2"},
};

std::string known_architecture_list() {
  std::string out;
  for (const auto& known : kKnownArchitectures) {
    if (!out.empty()) out += ", ";
    out += known.architecture;
  }
  return out;
}

// Reads an optional non-negative integer; a present key of the wrong type is an error rather
// than a silent default.
Status read_uint(const json& j, const char* key, bool required, uint64_t& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return invalid_argument(std::string("missing required key \"") + key + "\"");
    return Status::ok();
  }
  if (it->is_number_unsigned()) {
    out = it->get<uint64_t>();
    return Status::ok();
  }
  if (it->is_number_integer() && it->get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(it->get<int64_t>());
    return Status::ok();
  }
  return invalid_argument(std::string("key \"") + key + "\" must be a non-negative integer, got " +
                          it->dump());
}

Status read_uint32(const json& j, const char* key, bool required, uint32_t& out) {
  uint64_t value = out;
  STRATA_TRY(read_uint(j, key, required, value));
  if (value > UINT32_MAX) {
    return invalid_argument(std::string("key \"") + key +
                            "\" is out of range: " + std::to_string(value));
  }
  out = static_cast<uint32_t>(value);
  return Status::ok();
}

Status read_bool(const json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) {
    return invalid_argument(std::string("key \"") + key + "\" must be true or false, got " +
                            it->dump());
  }
  out = it->get<bool>();
  return Status::ok();
}

Status parse_into(const json& j, ModelConfig& config) {
  if (!j.is_object()) return invalid_argument("a model config must be a JSON object");

  std::string model_type;
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
    model_type = it->get<std::string>();
  }
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return invalid_argument("key \"architectures\" must be a non-empty list of names");
    }
    config.architecture = (*it)[0].get<std::string>();
  }
  // Without either key we assume the Llama layout, which is what "architectures"-less configs
  // in the wild (hand-written test configs) almost always describe.
  bool known = config.architecture.empty() && model_type.empty();
  for (const auto& k : kKnownArchitectures) {
    if (config.architecture == k.architecture ||
        (config.architecture.empty() && model_type == k.model_type)) {
      known = true;
      if (config.architecture.empty()) config.architecture = k.architecture;
    }
  }
  if (!known) {
    return unsupported("architecture \"" +
                       (config.architecture.empty() ? model_type : config.architecture) +
                       "\" is not modelled; supported: " + known_architecture_list());
  }
  if (config.architecture.empty()) config.architecture = "LlamaForCausalLM";

  STRATA_TRY(read_uint(j, "hidden_size", true, config.hidden_size));
  STRATA_TRY(read_uint(j, "intermediate_size", true, config.intermediate_size));
  STRATA_TRY(read_uint32(j, "num_hidden_layers", true, config.num_hidden_layers));
  STRATA_TRY(read_uint32(j, "num_attention_heads", true, config.num_attention_heads));
  STRATA_TRY(read_uint(j, "vocab_size", true, config.vocab_size));
  config.num_key_value_heads = config.num_attention_heads;  // HF: absent means multi-head
  STRATA_TRY(read_uint32(j, "num_key_value_heads", false, config.num_key_value_heads));
  STRATA_TRY(read_uint(j, "max_position_embeddings", false, config.max_position_embeddings));
  if (config.num_attention_heads > 0)
    config.head_dim = config.hidden_size / config.num_attention_heads;
  const bool head_dim_given = j.contains("head_dim") && !j["head_dim"].is_null();
  // Without head_dim, transformers' attention takes hidden_size / heads and refuses a remainder
  // ("hidden_size must be divisible by num_heads"); the floor here planned a narrower model.
  if (!head_dim_given && config.num_attention_heads > 0 &&
      config.hidden_size % config.num_attention_heads != 0) {
    return invalid_argument("hidden_size (" + std::to_string(config.hidden_size) +
                            ") must be a multiple of num_attention_heads (" +
                            std::to_string(config.num_attention_heads) +
                            ") where no head_dim is given, as transformers requires");
  }
  STRATA_TRY(read_uint(j, "head_dim", false, config.head_dim));
  STRATA_TRY(read_bool(j, "tie_word_embeddings", config.tie_word_embeddings));

  bool attention_bias = false;
  STRATA_TRY(read_bool(j, "attention_bias", attention_bias));
  STRATA_TRY(read_bool(j, "mlp_bias", config.mlp_bias));
  if (config.architecture == "Qwen2ForCausalLM") {
    // Qwen2Attention hard-codes bias=True on q/k/v and bias=False on o_proj.
    config.qkv_bias = true;
    config.o_bias = false;
  } else {
    // LlamaAttention applies attention_bias to all four projections.
    config.qkv_bias = attention_bias;
    config.o_bias = attention_bias;
  }

  if (config.architecture == "MixtralForCausalLM") {
    STRATA_TRY(read_uint32(j, "num_local_experts", true, config.num_local_experts));
    STRATA_TRY(read_uint32(j, "num_experts_per_tok", true, config.num_experts_per_tok));
  }
  return validate(config);
}

bool looks_like_path(std::string_view s) {
  return s.find('/') != std::string_view::npos ||
         (s.size() >= 5 && s.substr(s.size() - 5) == ".json");
}

// "…/Llama-2-7b-hf/config.json" is named after its folder; "my-model.json" after its stem.
std::string name_from_path(const std::filesystem::path& path) {
  std::string stem = path.stem().string();
  if (stem == "config" && path.has_parent_path()) {
    std::string parent = path.parent_path().filename().string();
    if (!parent.empty() && parent != "." && parent != "..") return parent;
  }
  return stem;
}

}  // namespace

Status validate(const ModelConfig& c) {
  auto bad = [&](const std::string& why) {
    return invalid_argument("model \"" + c.name + "\": " + why);
  };
  if (c.hidden_size == 0) return bad("hidden_size must be positive");
  if (c.intermediate_size == 0) return bad("intermediate_size must be positive");
  if (c.num_hidden_layers == 0) return bad("num_hidden_layers must be positive");
  if (c.num_attention_heads == 0) return bad("num_attention_heads must be positive");
  if (c.num_key_value_heads == 0) return bad("num_key_value_heads must be positive");
  if (c.vocab_size == 0) return bad("vocab_size must be positive");
  if (c.head_dim == 0) return bad("head_dim must be positive");
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad("num_attention_heads (" + std::to_string(c.num_attention_heads) +
               ") must be a multiple of num_key_value_heads (" +
               std::to_string(c.num_key_value_heads) + ")");
  }
  if (c.is_moe() && (c.num_experts_per_tok == 0 || c.num_experts_per_tok > c.num_local_experts)) {
    return bad("num_experts_per_tok must be between 1 and num_local_experts (" +
               std::to_string(c.num_local_experts) + ")");
  }
  // Keeps every element count below 2^53 (exact in a double) and byte counts far from overflow.
  constexpr uint64_t kMaxDim = uint64_t{1} << 24;
  if (c.hidden_size > kMaxDim || c.intermediate_size > kMaxDim || c.vocab_size > kMaxDim ||
      c.head_dim > kMaxDim || c.num_hidden_layers > 100000 || c.num_attention_heads > 100000 ||
      c.num_local_experts > 100000) {
    return bad("dimensions are implausibly large");
  }
  return Status::ok();
}

Result<ModelConfig> parse_model_config(std::string_view json_text, std::string_view name) {
  ModelConfig config;
  config.name = std::string(name);
  json j;
  try {
    j = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return invalid_argument("model config \"" + config.name + "\" is not valid JSON: " + e.what());
  }
  Status status = parse_into(j, config);
  if (!status) return std::move(status).with_context("model config \"" + config.name + "\"");
  return config;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  names.reserve(presets::kModelPresetCount);
  for (size_t i = 0; i < presets::kModelPresetCount; ++i) {
    names.emplace_back(presets::kModelPresets[i].name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<ModelConfig> load_model(std::string_view name_or_path) {
  if (name_or_path.empty()) return invalid_argument("model name is empty");
  if (!looks_like_path(name_or_path)) {
    for (size_t i = 0; i < presets::kModelPresetCount; ++i) {
      if (name_or_path == presets::kModelPresets[i].name) {
        return parse_model_config(presets::kModelPresets[i].text, name_or_path);
      }
    }
    std::string list;
    for (const auto& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
    return invalid_argument("unknown model \"" + std::string(name_or_path) +
                            "\"; presets: " + list + " (or give a path to a HF config.json)");
  }

  std::filesystem::path path{std::string(name_or_path)};
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path /= "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return errno_status(STRATA_E_INVALID, "cannot open model config " + path.string(), errno);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return errno_status(STRATA_E_IO, "reading model config " + path.string(), errno);
  return parse_model_config(text.str(), name_from_path(path));
}

uint64_t layer_parameter_count(const ModelConfig& c) {
  const uint64_t h = c.hidden_size;
  uint64_t attention = h * c.q_dim() + 2 * h * c.kv_dim() + c.q_dim() * h;
  if (c.qkv_bias) attention += c.q_dim() + 2 * c.kv_dim();
  if (c.o_bias) attention += h;
  uint64_t expert = 3 * h * c.intermediate_size;
  if (c.mlp_bias) expert += 2 * c.intermediate_size + h;
  const uint64_t experts = c.is_moe() ? c.num_local_experts : 1;
  const uint64_t router = c.is_moe() ? h * c.num_local_experts : 0;
  const uint64_t norms = 2 * h;
  return attention + experts * expert + router + norms;
}

uint64_t embedding_parameter_count(const ModelConfig& c) {
  const uint64_t embedding = c.vocab_size * c.hidden_size;
  return c.tie_word_embeddings ? embedding : 2 * embedding;
}

uint64_t parameter_count(const ModelConfig& c) {
  const uint64_t final_norm = c.hidden_size;
  return uint64_t{c.num_hidden_layers} * layer_parameter_count(c) + embedding_parameter_count(c) +
         final_norm;
}

Status check_scale_options(double scale, int layers) {
  if (!std::isfinite(scale) || scale <= 0.0 || scale > 64.0) {
    return invalid_argument("scale must be in (0, 64], got " + std::to_string(scale));
  }
  if (layers != -1 && (layers < 1 || layers > 100000)) {
    return invalid_argument("layers must be -1 (all) or between 1 and 100000, got " +
                            std::to_string(layers));
  }
  return Status::ok();
}

ModelConfig scale_model(const ModelConfig& c, double scale, int layers) {
  STRATA_ASSERT(check_scale_options(scale, layers).is_ok());
  ModelConfig out = c;
  if (layers != -1) out.num_hidden_layers = static_cast<uint32_t>(layers);
  if (scale == 1.0) return out;

  // Heads move in whole GQA groups so the query/KV ratio (and so the q vs k/v shapes) survives;
  // every other width follows the head count's actual ratio, which is the nearest integral
  // approximation of `scale`.
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  const auto kv = static_cast<uint32_t>(
      std::max<long long>(1, std::llround(static_cast<double>(c.num_key_value_heads) * scale)));
  out.num_key_value_heads = kv;
  out.num_attention_heads = kv * group;
  const double ratio = static_cast<double>(out.num_attention_heads) / c.num_attention_heads;
  auto narrow = [ratio](uint64_t dim) {
    return static_cast<uint64_t>(
        std::max<long long>(1, std::llround(static_cast<double>(dim) * ratio)));
  };
  out.hidden_size = narrow(c.hidden_size);
  out.intermediate_size = narrow(c.intermediate_size);
  out.vocab_size = narrow(c.vocab_size);
  return out;
}

}  // namespace strata
