// Hugging Face checkpoint directories: config.json plus model.safetensors, or
// shards listed in model.safetensors.index.json. Supported architectures are
// the Llama-shaped decoders LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM.
//
// Every config.json field that changes the model's math is either honoured or
// rejected; nothing that matters is silently dropped. Fields the transformers
// implementation of these architectures does not read (or that only affect
// training, like dropout) are ignored, as transformers ignores them. Absent
// optional fields take transformers' defaults for the architecture.
//
// Weights stay in the Hugging Face layout: RoPE uses the rotate_half
// convention (RopeLayout::kHalfSplit), so q/k projections are not permuted.
#include <sys/stat.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/generation_config.h"
#include "common/model/internal/json_file.h"
#include "common/model/internal/safetensors.h"
#include "common/model/internal/storage.h"
#include "common/model/model.h"
#include "nlohmann/json.hpp"

namespace vc {
namespace {

using Json = nlohmann::json;

enum class Arch { kLlama, kMistral, kQwen2 };
constexpr const char* kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";
// Bounds that keep all size arithmetic far from overflow; real models are
// orders of magnitude below them.
constexpr int64_t kMaxSize = int64_t{1} << 24;
constexpr int64_t kMaxProjection = int64_t{1} << 30;

std::string Dump(const Json& j) { return model_internal::DumpShort(j); }
using model_internal::JoinPath;

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<Json> ReadJson(const std::string& path) { return model_internal::ReadJsonFile(path); }

// Typed access to one JSON object's fields, with errors that name the file
// and the field ("rope_scaling.factor"). A field set to null counts as absent,
// which is how transformers treats it for every optional field used here.
class Fields {
 public:
  Fields(const Json& obj, std::string path, std::string prefix = "")
      : obj_(obj), path_(std::move(path)), prefix_(std::move(prefix)) {}

  const Json* Get(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Get(key) != nullptr; }
  bool Present(const char* key) const { return obj_.contains(key); }  // even if null

  absl::Status Error(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": field '", prefix_, key, "' ", what));
  }
  absl::Status Missing(const char* key) const { return Error(key, "is required but missing"); }

  absl::StatusOr<int64_t> Int(const char* key, int64_t min, int64_t max) const {
    const Json* j = Get(key);
    if (j == nullptr) return Missing(key);
    return IntValue(key, *j, min, max);
  }
  absl::StatusOr<int64_t> IntOr(const char* key, int64_t def, int64_t min, int64_t max) const {
    return Has(key) ? Int(key, min, max) : def;
  }
  absl::StatusOr<int64_t> IntValue(const char* key, const Json& j, int64_t min, int64_t max) const {
    bool in_range = false;
    if (j.is_number_unsigned()) {
      const uint64_t v = j.get<uint64_t>();
      in_range = v <= static_cast<uint64_t>(max) && static_cast<int64_t>(v) >= min;
    } else if (j.is_number_integer()) {
      const int64_t v = j.get<int64_t>();
      in_range = v >= min && v <= max;
    } else {
      return Error(key, absl::StrCat("must be an integer, found ", Dump(j)));
    }
    if (!in_range) {
      return Error(key, absl::StrCat("must be in [", min, ", ", max, "], found ", Dump(j)));
    }
    return j.get<int64_t>();
  }

  // A finite number > 0.
  absl::StatusOr<double> Positive(const char* key) const {
    const Json* j = Get(key);
    if (j == nullptr) return Missing(key);
    if (!j->is_number() || !std::isfinite(j->get<double>()) || !(j->get<double>() > 0)) {
      return Error(key, absl::StrCat("must be a positive number, found ", Dump(*j)));
    }
    return j->get<double>();
  }
  absl::StatusOr<double> PositiveOr(const char* key, double def) const {
    return Has(key) ? Positive(key) : def;
  }

  absl::StatusOr<bool> BoolOr(const char* key, bool def) const {
    const Json* j = Get(key);
    if (j == nullptr) return def;
    if (!j->is_boolean())
      return Error(key, absl::StrCat("must be true or false, found ", Dump(*j)));
    return j->get<bool>();
  }

  absl::StatusOr<std::string> StringOr(const char* key, const std::string& def) const {
    const Json* j = Get(key);
    if (j == nullptr) return def;
    if (!j->is_string()) return Error(key, absl::StrCat("must be a string, found ", Dump(*j)));
    return j->get<std::string>();
  }

 private:
  const Json& obj_;
  std::string path_;
  std::string prefix_;
};

// --- RoPE ------------------------------------------------------------------

// Parses a rope_scaling (or rope_parameters) object's scaling part into
// `rope`. `type_optional`: rope_parameters may omit the type ("default").
absl::Status ParseRopeScaling(const Json& obj, const std::string& path, const std::string& field,
                              bool type_optional, RopeConfig* rope) {
  Fields f(obj, path, field + ".");
  // Older configs say "type", newer ones "rope_type"; transformers accepts both.
  VC_ASSIGN_OR_RETURN(std::string type, f.StringOr("rope_type", ""));
  VC_ASSIGN_OR_RETURN(std::string legacy_type, f.StringOr("type", ""));
  if (!type.empty() && !legacy_type.empty() && type != legacy_type) {
    return f.Error("type", absl::StrCat("is '", legacy_type, "' but rope_type is '", type, "'"));
  }
  if (type.empty()) type = legacy_type;
  if (type.empty()) {
    if (!type_optional) return f.Missing("rope_type");
    type = "default";
  }
  // A partial rotary dimension would rotate only part of each head.
  VC_ASSIGN_OR_RETURN(double partial, f.PositiveOr("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return f.Error(
        "partial_rotary_factor",
        absl::StrCat("is ", partial, "; only full rotary embeddings (1.0) are supported"));
  }
  if (type == "default") {
    rope->scaling = RopeConfig::Scaling::kNone;
    return absl::OkStatus();
  }
  if (type == "linear") {
    rope->scaling = RopeConfig::Scaling::kLinear;
    VC_ASSIGN_OR_RETURN(rope->factor, f.Positive("factor"));
    return absl::OkStatus();
  }
  if (type == "llama3") {
    rope->scaling = RopeConfig::Scaling::kLlama3;
    VC_ASSIGN_OR_RETURN(rope->factor, f.Positive("factor"));
    VC_ASSIGN_OR_RETURN(rope->low_freq_factor, f.Positive("low_freq_factor"));
    VC_ASSIGN_OR_RETURN(rope->high_freq_factor, f.Positive("high_freq_factor"));
    VC_ASSIGN_OR_RETURN(int64_t original, f.Int("original_max_position_embeddings", 1, INT_MAX));
    rope->original_max_position = static_cast<int>(original);
    // The llama3 rule interpolates between the two wavelength bounds,
    // dividing by (high - low).
    if (!(rope->high_freq_factor > rope->low_freq_factor)) {
      return f.Error("high_freq_factor",
                     absl::StrCat("(", rope->high_freq_factor, ") must exceed low_freq_factor (",
                                  rope->low_freq_factor, ")"));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": ", field, " type '", type,
      "' is not supported (supported: default, linear, llama3); loading it without that "
      "scaling would compute different positions"));
}

bool SameScaling(const RopeConfig& a, const RopeConfig& b) {
  return a.scaling == b.scaling && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position == b.original_max_position;
}

// rope_theta + rope_scaling (transformers 4.x), or rope_parameters (5.x,
// which folds both into one object). When both spellings are present they
// must agree: picking one silently could pick the wrong base frequency.
absl::Status ParseRope(const Json& root, const std::string& path, RopeConfig* rope) {
  Fields f(root, path);
  VC_ASSIGN_OR_RETURN(double partial, f.PositiveOr("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return f.Error(
        "partial_rotary_factor",
        absl::StrCat("is ", partial, "; only full rotary embeddings (1.0) are supported"));
  }
  const Json* theta_json = f.Get("rope_theta");
  double theta = 10000.0;  // transformers' default for all three architectures
  if (theta_json != nullptr) {
    VC_ASSIGN_OR_RETURN(theta, f.Positive("rope_theta"));
  }

  bool have_scaling = false;
  RopeConfig scaling;
  if (const Json* rs = f.Get("rope_scaling")) {
    if (!rs->is_object()) return f.Error("rope_scaling", "must be an object or null");
    VC_RETURN_IF_ERROR(ParseRopeScaling(*rs, path, "rope_scaling", false, &scaling));
    have_scaling = true;
  }
  if (const Json* rp = f.Get("rope_parameters")) {
    if (!rp->is_object()) return f.Error("rope_parameters", "must be an object or null");
    for (const auto& [key, value] : rp->items()) {
      if (value.is_object()) {
        return f.Error("rope_parameters", absl::StrCat("has per-layer-type entries ('", key,
                                                       "'); one RoPE for all layers is required"));
      }
    }
    RopeConfig params;
    VC_RETURN_IF_ERROR(ParseRopeScaling(*rp, path, "rope_parameters", true, &params));
    if (have_scaling && !SameScaling(scaling, params)) {
      return f.Error("rope_parameters", "disagrees with rope_scaling");
    }
    scaling = params;
    have_scaling = true;
    Fields pf(*rp, path, "rope_parameters.");
    if (pf.Has("rope_theta")) {
      VC_ASSIGN_OR_RETURN(double p_theta, pf.Positive("rope_theta"));
      if (theta_json != nullptr && p_theta != theta) {
        return pf.Error("rope_theta",
                        absl::StrCat("(", p_theta, ") disagrees with rope_theta (", theta, ")"));
      }
      theta = p_theta;
    }
  }
  if (have_scaling) *rope = scaling;
  rope->theta = theta;
  rope->layout = RopeLayout::kHalfSplit;
  return absl::OkStatus();
}

// --- Sliding window --------------------------------------------------------

// The "sliding_window" value: absent means transformers' default of 4096 (for
// both Mistral and Qwen2), null means no window.
absl::StatusOr<int> WindowValue(const Fields& f) {
  if (!f.Present("sliding_window")) return 4096;
  if (!f.Has("sliding_window")) return 0;
  VC_ASSIGN_OR_RETURN(int64_t w, f.Int("sliding_window", 1, INT_MAX));
  return static_cast<int>(w);
}

absl::StatusOr<int> ParseSlidingWindow(const Json& root, const std::string& path, Arch arch,
                                       int n_layers) {
  Fields f(root, path);
  switch (arch) {
    case Arch::kLlama:
      return 0;  // LlamaAttention has no sliding window; the field is not read
    case Arch::kMistral:
      // Mistral applies its window (when not null) to every layer.
      return WindowValue(f);
    case Arch::kQwen2:
      break;
  }
  // Qwen2: the window exists only with use_sliding_window, and then only on
  // layers >= max_window_layers (or per layer_types, when given); the layers
  // below use full attention.
  VC_ASSIGN_OR_RETURN(bool use, f.BoolOr("use_sliding_window", false));
  if (!use) return 0;
  VC_ASSIGN_OR_RETURN(int window, WindowValue(f));
  if (window == 0) return 0;
  std::vector<bool> sliding(n_layers);
  std::string which;  // what decided the per-layer split, for the error
  if (const Json* types = f.Get("layer_types")) {
    if (!types->is_array() || static_cast<int>(types->size()) != n_layers) {
      return f.Error("layer_types", absl::StrCat("must list one type per layer (", n_layers, ")"));
    }
    for (int i = 0; i < n_layers; ++i) {
      const Json& t = (*types)[i];
      if (t == "sliding_attention") {
        sliding[i] = true;
      } else if (t != "full_attention") {
        return f.Error("layer_types", absl::StrCat("entry ", i, " is ", Dump(t),
                                                   "; expected full_attention or "
                                                   "sliding_attention"));
      }
    }
    which = "layer_types";
  } else {
    VC_ASSIGN_OR_RETURN(int64_t full_layers, f.IntOr("max_window_layers", 28, 0, INT_MAX));
    for (int i = 0; i < n_layers; ++i) sliding[i] = i >= full_layers;
    which =
        absl::StrCat("max_window_layers=", full_layers, ": the layers below it use full attention");
  }
  int n_sliding = 0;
  for (bool s : sliding) n_sliding += s;
  if (n_sliding == 0) return 0;
  if (n_sliding == n_layers) return window;
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": use_sliding_window is true but only ", n_sliding, " of ", n_layers,
                   " layers use the ", window, "-token window (", which,
                   "); a window on only some layers is not supported"));
}

// --- config.json -----------------------------------------------------------

struct HfConfig {
  ModelConfig model;
  Arch arch = Arch::kLlama;
  bool o_proj_bias = false;  // Llama with attention_bias
};

absl::StatusOr<HfConfig> ParseConfig(const Json& root, const std::string& path) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  Fields f(root, path);
  HfConfig out;
  ModelConfig& c = out.model;

  const Json* archs = f.Get("architectures");
  if (archs == nullptr) return f.Missing("architectures");
  if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
    return f.Error("architectures",
                   absl::StrCat("must list exactly one architecture name, found ", Dump(*archs)));
  }
  c.architecture = (*archs)[0].get<std::string>();
  if (c.architecture == "LlamaForCausalLM") {
    out.arch = Arch::kLlama;
  } else if (c.architecture == "MistralForCausalLM") {
    out.arch = Arch::kMistral;
  } else if (c.architecture == "Qwen2ForCausalLM") {
    out.arch = Arch::kQwen2;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": architecture '", c.architecture,
                     "' is not supported (supported: ", kSupportedArchitectures, ")"));
  }

  if (const Json* q = f.Get("quantization_config")) {
    std::string method = "unknown";
    if (q->is_object() && q->contains("quant_method") && (*q)["quant_method"].is_string()) {
      method = (*q)["quant_method"].get<std::string>();
    }
    return f.Error("quantization_config",
                   absl::StrCat("is present (quant_method '", method,
                                "'); quantized checkpoints are not supported, only F32, F16 and "
                                "BF16 weights"));
  }
  VC_ASSIGN_OR_RETURN(std::string act, f.StringOr("hidden_act", "silu"));
  // transformers maps "swish" to the same SiLU function.
  if (act != "silu" && act != "swish") {
    return f.Error("hidden_act", absl::StrCat("is '", act, "'; only 'silu' (SwiGLU) is supported"));
  }
  VC_ASSIGN_OR_RETURN(bool mlp_bias, f.BoolOr("mlp_bias", false));
  if (mlp_bias) return f.Error("mlp_bias", "is true; MLP biases are not supported");

  VC_ASSIGN_OR_RETURN(int64_t dim, f.Int("hidden_size", 1, kMaxSize));
  VC_ASSIGN_OR_RETURN(int64_t hidden, f.Int("intermediate_size", 1, kMaxSize));
  VC_ASSIGN_OR_RETURN(int64_t layers, f.Int("num_hidden_layers", 1, kMaxSize));
  VC_ASSIGN_OR_RETURN(int64_t heads, f.Int("num_attention_heads", 1, kMaxSize));
  // transformers reads a null num_key_value_heads as plain multi-head
  // attention, and so does LlamaConfig an absent one; MistralConfig and
  // Qwen2Config instead default an absent one to a model-specific count (8,
  // 32), which is too arbitrary to assume.
  if (!f.Present("num_key_value_heads") && out.arch != Arch::kLlama) {
    return f.Missing("num_key_value_heads");
  }
  VC_ASSIGN_OR_RETURN(int64_t kv_heads, f.IntOr("num_key_value_heads", heads, 1, kMaxSize));
  int64_t head_dim = 0;
  if (f.Has("head_dim")) {
    VC_ASSIGN_OR_RETURN(head_dim, f.Int("head_dim", 1, kMaxSize));
  } else {
    if (dim % heads != 0) {
      return f.Error("hidden_size", absl::StrCat("(", dim,
                                                 ") is not divisible by "
                                                 "num_attention_heads (",
                                                 heads, ") and there is no head_dim"));
    }
    head_dim = dim / heads;
  }
  if (heads * head_dim > kMaxProjection) {
    return f.Error("num_attention_heads", "* head_dim is implausibly large");
  }
  VC_ASSIGN_OR_RETURN(int64_t vocab, f.Int("vocab_size", 1, kMaxSize));
  VC_ASSIGN_OR_RETURN(int64_t max_pos, f.Int("max_position_embeddings", 1, INT_MAX));
  VC_ASSIGN_OR_RETURN(double eps, f.Positive("rms_norm_eps"));
  c.dim = static_cast<int>(dim);
  c.hidden_dim = static_cast<int>(hidden);
  c.n_layers = static_cast<int>(layers);
  c.n_heads = static_cast<int>(heads);
  c.n_kv_heads = static_cast<int>(kv_heads);
  c.head_dim = static_cast<int>(head_dim);
  c.vocab_size = static_cast<int>(vocab);
  c.max_seq_len = static_cast<int>(max_pos);
  c.rms_norm_eps = static_cast<float>(eps);

  VC_RETURN_IF_ERROR(ParseRope(root, path, &c.rope));

  switch (out.arch) {
    case Arch::kQwen2:
      c.qkv_bias = true;  // Qwen2Attention always has q/k/v biases, never an o bias
      break;
    case Arch::kLlama: {
      // LlamaAttention's attention_bias puts a bias on o_proj as well.
      VC_ASSIGN_OR_RETURN(bool bias, f.BoolOr("attention_bias", false));
      c.qkv_bias = bias;
      out.o_proj_bias = bias;
      break;
    }
    case Arch::kMistral:
      c.qkv_bias = false;  // MistralAttention has no biases
      break;
  }
  VC_ASSIGN_OR_RETURN(c.tied_embeddings, f.BoolOr("tie_word_embeddings", false));

  VC_ASSIGN_OR_RETURN(int64_t bos, f.Int("bos_token_id", 0, INT_MAX));
  c.bos_id = static_cast<int>(bos);
  // eos_token_id may list several stop tokens (Llama 3.1); the first is the
  // model's end-of-sequence token, the others are extra stop tokens.
  const Json* eos = f.Get("eos_token_id");
  if (eos == nullptr) return f.Missing("eos_token_id");
  if (eos->is_array()) {
    if (eos->empty()) return f.Error("eos_token_id", "is an empty list");
    if (eos->size() > ModelConfig::kMaxEosIds) {
      return f.Error("eos_token_id", absl::StrCat("lists ", eos->size(), " ids (at most ",
                                                  ModelConfig::kMaxEosIds, ")"));
    }
    for (const Json& e : *eos) {
      VC_ASSIGN_OR_RETURN(int64_t id, f.IntValue("eos_token_id", e, 0, INT_MAX));
      c.eos_ids.push_back(static_cast<int32_t>(id));
    }
    c.eos_id = c.eos_ids.front();
  } else {
    VC_ASSIGN_OR_RETURN(int64_t e, f.IntValue("eos_token_id", *eos, 0, INT_MAX));
    c.eos_id = static_cast<int>(e);
    c.eos_ids = {c.eos_id};
  }

  VC_ASSIGN_OR_RETURN(c.sliding_window, ParseSlidingWindow(root, path, out.arch, c.n_layers));

  if (auto s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  if (c.q_dim() > kMaxProjection || c.kv_dim() > kMaxProjection) {
    return f.Error("head_dim", "gives implausibly large projections");
  }
  return out;
}

// --- Tensors ---------------------------------------------------------------

class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);

  // The tensor as f32, checked against `shape`: in place when it is
  // 4-byte-aligned f32, otherwise converted into storage->owned.
  absl::StatusOr<const float*> Take(const std::string& name, const std::vector<int64_t>& shape,
                                    Model::Storage* storage);
  // A weight matrix: f32 as Take gives it; bf16/f16 kept in its dtype (in
  // place when 2-byte-aligned, else copied into storage->owned16), or
  // widened to f32 when `widen`.
  absl::StatusOr<WeightMatrix> TakeMatrix(const std::string& name,
                                          const std::vector<int64_t>& shape,
                                          Model::Storage* storage, bool widen);
  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The stored tensor that `name` was saved as a duplicate of (safetensors'
  // save_model drops shared tensors and names them in __metadata__), or ""
  // when `name` is not such an alias.
  std::string AliasOf(const std::string& name) const {
    auto it = aliases_.find(name);
    return it == aliases_.end() ? "" : it->second;
  }
  // Names of tensors never taken, except those `ignorable` accepts.
  template <typename Pred>
  std::vector<std::string> Unused(Pred ignorable) const {
    std::vector<std::string> names;
    for (const auto& [name, e] : tensors_) {
      if (!e.used && !ignorable(name)) names.push_back(name);
    }
    return names;
  }
  // Moves the mappings that in-place tensors point into to `storage` and
  // unmaps the others.
  void KeepMappings(Model::Storage* storage) &&;
  const std::string& FilesDescription() const { return files_description_; }
  // The model's dtype: bf16 or f16 when every matrix taken so far is stored
  // in it, else f32.
  Dtype MatrixDtype() const {
    if (matrix_dtypes_.size() != 1) return Dtype::kF32;
    if (*matrix_dtypes_.begin() == "BF16") return Dtype::kBf16;
    if (*matrix_dtypes_.begin() == "F16") return Dtype::kF16;
    return Dtype::kF32;
  }

 private:
  // The entry of `name` (or its alias), checked against `shape`, marked used.
  absl::StatusOr<const safetensors::TensorInfo*> Find(const std::string& name,
                                                      const std::vector<int64_t>& shape,
                                                      size_t* file);

  struct Entry {
    size_t file = 0;
    const safetensors::TensorInfo* info = nullptr;
    bool used = false;
  };
  std::string dir_;
  std::string files_description_;
  std::vector<safetensors::File> files_;
  std::vector<bool> in_place_;
  std::map<std::string, Entry> tensors_;  // ordered: error listings are stable
  std::map<std::string, std::string> aliases_;  // dropped duplicate -> stored tensor
  std::set<std::string> matrix_dtypes_;
};

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  const std::string single = JoinPath(dir, "model.safetensors");
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  // Which shard the index says holds each tensor, to cross-check.
  std::map<std::string, std::string> weight_map;
  if (IsRegularFile(single)) {
    // transformers also prefers the single file when both exist.
    VC_ASSIGN_OR_RETURN(safetensors::File file, safetensors::File::Open(single));
    ck.files_.push_back(std::move(file));
    ck.files_description_ = "model.safetensors";
  } else if (IsRegularFile(index_path)) {
    VC_ASSIGN_OR_RETURN(Json index, ReadJson(index_path));
    const Json* map = nullptr;
    if (index.is_object()) {
      auto it = index.find("weight_map");
      if (it != index.end() && it->is_object()) map = &*it;
    }
    if (map == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": no \"weight_map\" object mapping tensor names to shards"));
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : map->items()) {
      if (!shard.is_string() || shard.get<std::string>().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for '", name,
                                                       "' is not a file name: ", Dump(shard)));
      }
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": shard '", s, "' (for '", name,
                                                       "') must be a file in the same directory"));
      }
      weight_map.emplace(name, s);
      shards.insert(s);
    }
    if (shards.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
    }
    for (const std::string& s : shards) {
      auto file = safetensors::File::Open(JoinPath(dir, s));
      if (!file.ok()) {
        return absl::Status(file.status().code(),
                            absl::StrCat(index_path, " lists shard '", s,
                                         "', which cannot be loaded: ", file.status().message()));
      }
      ck.files_.push_back(std::move(file).value());
    }
    ck.files_description_ = absl::StrCat(shards.size(), " shards of model.safetensors.index.json");
  } else {
    std::string hint;
    if (IsRegularFile(JoinPath(dir, "pytorch_model.bin")) ||
        IsRegularFile(JoinPath(dir, "pytorch_model.bin.index.json"))) {
      hint = " (only PyTorch .bin weights are present; convert them to safetensors)";
    }
    return absl::NotFoundError(
        absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json", hint));
  }

  ck.in_place_.assign(ck.files_.size(), false);
  for (size_t i = 0; i < ck.files_.size(); ++i) {
    for (const safetensors::TensorInfo& t : ck.files_[i].tensors()) {
      auto [it, inserted] = ck.tensors_.emplace(t.name, Entry{i, &t, false});
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": tensor '", t.name, "' appears in both ",
                         ck.files_[it->second.file].path(), " and ", ck.files_[i].path()));
      }
    }
  }
  // __metadata__ entries whose value names a stored tensor are aliases
  // (key: the dropped duplicate). Other entries ("format": "pt") are free-form.
  for (const safetensors::File& file : ck.files_) {
    for (const auto& [key, value] : file.metadata()) {
      if (ck.tensors_.count(value) == 0) continue;
      if (ck.tensors_.count(key) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            file.path(), ": __metadata__ names tensor '", key, "' a duplicate of '", value,
            "', but '", key, "' is also stored; a checkpoint must say one or the other"));
      }
      auto [it, inserted] = ck.aliases_.emplace(key, value);
      if (!inserted && it->second != value) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": __metadata__ names tensor '", key, "' a duplicate of both '",
                         it->second, "' and '", value, "'"));
      }
    }
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = ck.tensors_.find(name);
    if (it == ck.tensors_.end() || ck.files_[it->second.file].path() != JoinPath(dir, shard)) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, " maps tensor '", name,
                                                     "' to shard '", shard,
                                                     "', which does not contain it"));
    }
  }
  return ck;
}

absl::StatusOr<const safetensors::TensorInfo*> Checkpoint::Find(
    const std::string& name, const std::vector<int64_t>& shape, size_t* file) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    if (auto alias = aliases_.find(name); alias != aliases_.end()) {
      it = tensors_.find(alias->second);  // Open() checked that it is stored
    }
  }
  if (it == tensors_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, ": missing tensor '", name, "' (expected shape ", safetensors::ShapeString(shape),
        "); it is in none of the checkpoint's files (", files_description_, ")"));
  }
  Entry& e = it->second;
  const safetensors::TensorInfo& t = *e.info;
  const std::string& path = files_[e.file].path();
  if (t.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor '", name, "' has shape ", safetensors::ShapeString(t.shape),
                     ", but config.json implies ", safetensors::ShapeString(shape)));
  }
  e.used = true;
  *file = e.file;
  return &t;
}

absl::StatusOr<WeightMatrix> Checkpoint::TakeMatrix(const std::string& name,
                                                    const std::vector<int64_t>& shape,
                                                    Model::Storage* storage, bool widen) {
  size_t file = 0;
  VC_ASSIGN_OR_RETURN(const safetensors::TensorInfo* t, Find(name, shape, &file));
  const bool bf16 = t->dtype == "BF16";
  matrix_dtypes_.insert(t->dtype);
  if (widen || (!bf16 && t->dtype != "F16")) {
    return Take(name, shape, storage);
  }
  const Dtype dtype = bf16 ? Dtype::kBf16 : Dtype::kF16;
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(uint16_t) == 0) {
    in_place_[file] = true;
    return WeightMatrix(reinterpret_cast<const uint16_t*>(t->data), dtype);
  }
  const size_t n = static_cast<size_t>(t->num_elements);
  auto& v = storage->owned16.emplace_back(n);
  std::memcpy(v.data(), t->data, n * sizeof(uint16_t));
  return WeightMatrix(v.data(), dtype);
}

absl::StatusOr<const float*> Checkpoint::Take(const std::string& name,
                                              const std::vector<int64_t>& shape,
                                              Model::Storage* storage) {
  size_t file = 0;
  VC_ASSIGN_OR_RETURN(const safetensors::TensorInfo* info, Find(name, shape, &file));
  const safetensors::TensorInfo& t = *info;
  const std::string& path = files_[file].path();
  const size_t n = static_cast<size_t>(t.num_elements);
  if (t.dtype == "F32") {
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
      in_place_[file] = true;
      return reinterpret_cast<const float*>(t.data);
    }
    // A header length that is not a multiple of 4 misaligns the data.
    auto& v = storage->owned.emplace_back(n);
    std::memcpy(v.data(), t.data, n * sizeof(float));
    return v.data();
  }
  const bool bf16 = t.dtype == "BF16";
  if (!bf16 && t.dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor '", name, "' has dtype ", t.dtype,
                     "; supported weight dtypes are F32, F16 and BF16"));
  }
  auto& v = storage->owned.emplace_back(n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, t.data + 2 * i, 2);  // 2-byte data may sit at any address
    v[i] = bf16 ? Bf16BitsToF32(h) : F16BitsToF32(h);
  }
  return v.data();
}

void Checkpoint::KeepMappings(Model::Storage* storage) && {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (in_place_[i]) storage->files.push_back(std::move(files_[i]).ReleaseMapping());
  }
  files_.clear();
  tensors_.clear();
}

// --- The loader ------------------------------------------------------------

// generation_config.json's eos_token_id, when present, is the stop set
// generation uses (transformers' generate() reads it, not config.json's: an
// instruct model often adds its end-of-turn token there). Its ids must lie in
// the vocabulary. bos/pad ids there are not used by the engine.
absl::Status ApplyGenerationConfig(const std::string& dir, ModelConfig* c) {
  auto gen = LoadGenerationConfig(dir);
  if (absl::IsNotFound(gen.status())) return absl::OkStatus();
  if (!gen.ok()) return gen.status();
  if (gen->eos_token_ids.empty()) return absl::OkStatus();
  for (const int32_t id : gen->eos_token_ids) {
    if (id >= c->vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(JoinPath(dir, "generation_config.json"), ": field 'eos_token_id' has id ",
                       id, ", outside the vocabulary of ", c->vocab_size, " tokens"));
    }
  }
  c->eos_ids = gen->eos_token_ids;
  return absl::OkStatus();
}

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";

// The token embedding and the classifier. A tied checkpoint may store the
// one matrix under either name: transformers' save_pretrained keeps the
// embedding, while safetensors' save_model may keep lm_head.weight and record
// the embedding as its duplicate in __metadata__ (tinystories656K does). An
// untied checkpoint needs both, unless __metadata__ says one is the other
// (then the two are one matrix, whatever config.json says).
absl::Status TakeEmbeddings(Checkpoint& ck, ModelConfig* config, const std::string& dir,
                            Model::Storage* storage, bool widen, ModelWeights* w) {
  const ModelConfig& c = *config;
  const std::vector<int64_t> shape = {c.vocab_size, c.dim};
  const bool has_embed = ck.Has(kEmbed) || !ck.AliasOf(kEmbed).empty();
  const bool has_head = ck.Has(kLmHead) || !ck.AliasOf(kLmHead).empty();
  if (c.tied_embeddings) {
    // With both present transformers overwrites lm_head with the embedding
    // (the loader ignores the stored lm_head; see ignorable below).
    const char* name = has_embed || !has_head ? kEmbed : kLmHead;
    auto t = ck.TakeMatrix(name, shape, storage, widen);
    if (!t.ok() && !has_embed && !has_head) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": config.json sets tie_word_embeddings, but the checkpoint stores neither '",
          kEmbed, "' nor '", kLmHead, "' (", ck.FilesDescription(), ")"));
    }
    VC_ASSIGN_OR_RETURN(w->token_embedding, std::move(t));
    w->classifier = w->token_embedding;
    return absl::OkStatus();
  }
  if (!has_embed || !has_head) {
    const char* missing = has_embed ? kLmHead : kEmbed;
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": missing tensor '", missing, "' (expected shape ", safetensors::ShapeString(shape),
        "): config.json says tie_word_embeddings is false (or leaves it at false), so the "
        "checkpoint must store both '", kEmbed, "' and '", kLmHead,
        "', or name one as the other's duplicate in its safetensors __metadata__ (",
        ck.FilesDescription(), ")"));
  }
  VC_ASSIGN_OR_RETURN(w->token_embedding, ck.TakeMatrix(kEmbed, shape, storage, widen));
  VC_ASSIGN_OR_RETURN(w->classifier, ck.TakeMatrix(kLmHead, shape, storage, widen));
  // An alias made them one matrix: the model is tied in fact.
  if (w->classifier == w->token_embedding) config->tied_embeddings = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> LoadDir(const std::string& dir, const LoadOptions& options) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such file or directory"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": not a directory (a Hugging Face checkpoint is a directory)"));
  }
  const std::string config_path = JoinPath(dir, "config.json");
  auto root = ReadJson(config_path);
  if (!root.ok()) {
    return absl::Status(root.status().code(),
                        absl::StrCat(root.status().message(),
                                     " (a Hugging Face checkpoint directory needs config.json)"));
  }
  VC_ASSIGN_OR_RETURN(HfConfig hf, ParseConfig(*root, config_path));
  VC_RETURN_IF_ERROR(ApplyGenerationConfig(dir, &hf.model));
  const ModelConfig& c = hf.model;
  VC_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));

  auto storage = std::make_unique<Model::Storage>();
  auto take = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return ck.Take(name, shape, storage.get());
  };
  auto matrix = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return ck.TakeMatrix(name, shape, storage.get(), options.widen_weights);
  };
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  ModelWeights w;
  VC_RETURN_IF_ERROR(TakeEmbeddings(ck, &hf.model, dir, storage.get(), options.widen_weights, &w));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights lw;
    VC_ASSIGN_OR_RETURN(lw.rms_att, take(p + "input_layernorm.weight", {d}));
    VC_ASSIGN_OR_RETURN(lw.wq, matrix(p + "self_attn.q_proj.weight", {q, d}));
    VC_ASSIGN_OR_RETURN(lw.wk, matrix(p + "self_attn.k_proj.weight", {kv, d}));
    VC_ASSIGN_OR_RETURN(lw.wv, matrix(p + "self_attn.v_proj.weight", {kv, d}));
    if (c.qkv_bias) {
      VC_ASSIGN_OR_RETURN(lw.bq, take(p + "self_attn.q_proj.bias", {q}));
      VC_ASSIGN_OR_RETURN(lw.bk, take(p + "self_attn.k_proj.bias", {kv}));
      VC_ASSIGN_OR_RETURN(lw.bv, take(p + "self_attn.v_proj.bias", {kv}));
    }
    VC_ASSIGN_OR_RETURN(lw.wo, matrix(p + "self_attn.o_proj.weight", {d, q}));
    if (hf.o_proj_bias) {
      // The engine has no output-projection bias; an all-zero one (common in
      // converted checkpoints) changes nothing, any other value would be lost.
      const std::string name = p + "self_attn.o_proj.bias";
      VC_ASSIGN_OR_RETURN(const float* bo, take(name, {d}));
      for (int64_t i = 0; i < d; ++i) {
        if (bo[i] != 0.0f) {
          return absl::InvalidArgumentError(
              absl::StrCat(dir, ": tensor '", name, "' has a non-zero value at index ", i,
                           "; attention_bias with a non-zero o_proj bias is not supported"));
        }
      }
    }
    VC_ASSIGN_OR_RETURN(lw.rms_ffn, take(p + "post_attention_layernorm.weight", {d}));
    VC_ASSIGN_OR_RETURN(lw.w1, matrix(p + "mlp.gate_proj.weight", {h, d}));
    VC_ASSIGN_OR_RETURN(lw.w2, matrix(p + "mlp.down_proj.weight", {d, h}));
    VC_ASSIGN_OR_RETURN(lw.w3, matrix(p + "mlp.up_proj.weight", {h, d}));
    w.layers.push_back(lw);
  }
  VC_ASSIGN_OR_RETURN(w.rms_final, take("model.norm.weight", {d}));

  // A tensor the config does not account for (say q_proj.bias in a config
  // without attention_bias) means config and weights disagree; refusing beats
  // computing with a different model than the checkpoint's author trained.
  const bool tied = c.tied_embeddings;
  auto ignorable = [tied](const std::string& name) {
    const std::string inv_freq = ".rotary_emb.inv_freq";  // a cached RoPE table
    if (name.size() >= inv_freq.size() &&
        name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0) {
      return true;
    }
    return tied && name == "lm_head.weight";  // transformers overwrites it with the embedding
  };
  std::vector<std::string> unused = ck.Unused(ignorable);
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) {
      absl::StrAppend(&list, i ? ", " : "", "'", unused[i], "'");
    }
    if (unused.size() > 5) absl::StrAppend(&list, ", ... (", unused.size(), " in all)");
    return absl::InvalidArgumentError(absl::StrCat(dir, ": unexpected tensors that ",
                                                   c.architecture,
                                                   " with this config.json does not use: ", list));
  }
  hf.model.dtype = ck.MatrixDtype();
  std::move(ck).KeepMappings(storage.get());
  return ModelBuilder::Make(c, std::move(w), dir, std::move(storage));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::LoadHuggingFace(const std::string& dir,
                                                              const LoadOptions& options) {
  // Every JSON access above is type-checked first; this only keeps a missed
  // case from escaping as an exception.
  try {
    return LoadDir(dir, options);
  } catch (const Json::exception& e) {
    return absl::InternalError(absl::StrCat(dir, ": unexpected JSON error: ", e.what()));
  }
}

}  // namespace vc
