// Quantisation stages: KIVI (2/4-bit, keys per channel, values per token,
// a full-precision window of recent tokens) and INT8 (per-token symmetric).
// The arithmetic lives in the row codecs (common/kv/row_codec.h); a stage
// only chooses the formats.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compress/internal/stages.h"

namespace vc::compress_internal {
namespace {

// KIVI (Liu et al.): keys quantised per channel over groups of `group`
// tokens (keys have outlier channels), values per token over groups of
// `group` channels (capped at head_dim), both asymmetric (scale and zero
// point = group min). The last `residual` rows stay f32, and so do key rows
// that do not fill a whole token group.
class Kivi final : public Quantizer {
 public:
  Kivi(int bits, int group, int residual) : bits_(bits), group_(group), residual_(residual) {}

  RowCodecSpec KeySpec(const ModelConfig& /*config*/) const override {
    return {RowCodecSpec::Kind::kPerChannelAsymmetric, bits_, group_, residual_};
  }
  RowCodecSpec ValueSpec(const ModelConfig& config) const override {
    return {RowCodecSpec::Kind::kPerTokenAsymmetric, bits_, std::min(group_, config.head_dim),
            residual_};
  }
  std::string Describe() const override {
    return absl::StrCat("kivi(bits=", bits_, ",group=", group_, ",residual=", residual_, ")");
  }
  // KIVI's sliding residual: once `residual + group` rows are f32, the oldest
  // group is quantised; folding a group at a time does exactly that.
  int32_t online_interval() const override { return group_; }

 private:
  int bits_, group_, residual_;
};

// Online, INT8 tokens stay exact in the drafter's tail for at most this many
// settled tokens, then are quantised per token (a small window, so the tail
// stays short but a fold does not run every round).
constexpr int32_t kInt8OnlineWindow = 16;

// INT8: every row quantised symmetrically with one scale (absmax / 127).
class Int8 final : public Quantizer {
 public:
  RowCodecSpec KeySpec(const ModelConfig& /*config*/) const override { return Spec(); }
  RowCodecSpec ValueSpec(const ModelConfig& /*config*/) const override { return Spec(); }
  std::string Describe() const override { return "int8(per_token_symmetric)"; }
  int32_t online_interval() const override { return kInt8OnlineWindow; }

 private:
  static RowCodecSpec Spec() { return {RowCodecSpec::Kind::kPerTokenSymmetric, 8, 0, 0}; }
};

constexpr int kKiviDefaultBits = 4;

}  // namespace

const std::vector<std::string>& QuantizerNames() {
  static const auto* names = new std::vector<std::string>{"kivi", "int8"};
  return *names;
}

CompressorInfo QuantizerInfo(const std::string& name) {
  const CompressorOptions d;
  CompressorInfo info;
  info.name = name;
  info.family = "quantization";
  info.takes_bits = true;
  info.online = OnlinePolicy::Kind::kPerGroup;
  if (name == "kivi") {
    info.online_rule =
        "per group: the f32 residual window slides; once --residual + --quant-group tokens are "
        "f32, the oldest --quant-group are quantised (keys per channel within the group, values "
        "per token); codes already quantised never change";
  } else if (name == "int8") {
    info.online_rule = absl::StrCat(
        "per group: a generated token stays f32 in the drafter's tail until ", kInt8OnlineWindow,
        " settled tokens have collected, then they are quantised per token");
  }
  if (name == "kivi") {
    info.description =
        "KIVI: asymmetric quantisation, keys per channel over --quant-group tokens, values per "
        "token over --quant-group channels (at most head_dim); the last --residual tokens and "
        "key rows short of a whole group stay f32; keeps every token";
    info.params = {
        {"--bits", std::to_string(kKiviDefaultBits), "code width: 2 or 4"},
        {"--quant-group", std::to_string(d.quant_group),
         "tokens per key group and channels per value group"},
        {"--residual", std::to_string(d.residual), "most recent tokens kept in f32"},
    };
  } else if (name == "int8") {
    info.description =
        "INT8: per-token symmetric 8-bit (one scale = absmax / 127 per row); keeps every token";
    info.params = {{"--bits", "8", "code width: 8 only"}};
  }
  return info;
}

absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const std::string& name,
                                                         const CompressorOptions& o,
                                                         const std::string& label) {
  if (name == "kivi") {
    const int bits = o.bits == 0 ? kKiviDefaultBits : o.bits;
    if (bits != 2 && bits != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": kivi supports --bits 2 or 4, got ", o.bits));
    }
    if (o.quant_group < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": --quant-group must be >= 1, got ", o.quant_group));
    }
    if (o.residual < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": --residual must be >= 0, got ", o.residual));
    }
    return std::unique_ptr<Quantizer>(new Kivi(bits, o.quant_group, o.residual));
  }
  if (name == "int8") {
    if (o.bits != 0 && o.bits != 8) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": int8 supports only --bits 8, got ", o.bits));
    }
    return std::unique_ptr<Quantizer>(new Int8());
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown quantiser '", name, "'"));
}

}  // namespace vc::compress_internal
