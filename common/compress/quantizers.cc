// Quantisation stages: KIVI (2/4-bit, keys per channel, values per token,
// a full-precision window of recent tokens) and INT8 (per-token symmetric).
// The arithmetic lives in the row codecs (common/kv/row_codec.h); a stage
// only chooses the formats.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
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

// A table row's CompressorInfo for a quantiser: every quantiser keeps every
// token, takes --bits and folds online a group at a time.
CompressorInfo QuantizerRowInfo(const char* name, const char* description,
                                std::string online_rule, std::vector<CompressorParamInfo> params) {
  CompressorInfo info;
  info.name = name;
  info.family = "quantization";
  info.description = description;
  info.takes_bits = true;
  info.params = std::move(params);
  info.online = OnlinePolicy::Kind::kPerGroup;
  info.online_rule = std::move(online_rule);
  return info;
}

constexpr int kKiviDefaultBits = 4;

}  // namespace

const std::vector<StageEntry<Quantizer>>& QuantizerTable() {
  using Made = absl::StatusOr<std::unique_ptr<Quantizer>>;
  const CompressorOptions d;
  static const auto* table = new std::vector<StageEntry<Quantizer>>{
      {QuantizerRowInfo(
           "kivi",
           "KIVI: asymmetric quantisation, keys per channel over --quant-group tokens, values per "
           "token over --quant-group channels (at most head_dim); the last --residual tokens and "
           "key rows short of a whole group stay f32; keeps every token",
           "per group: the f32 residual window slides; once --residual + --quant-group tokens are "
           "f32, the oldest --quant-group are quantised (keys per channel within the group, values "
           "per token); codes already quantised never change",
           {{"--bits", std::to_string(kKiviDefaultBits), "code width: 2 or 4"},
            {"--quant-group", std::to_string(d.quant_group),
             "tokens per key group and channels per value group"},
            {"--residual", std::to_string(d.residual), "most recent tokens kept in f32"}}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
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
         return std::make_unique<Kivi>(bits, o.quant_group, o.residual);
       }},
      {QuantizerRowInfo(
           "int8",
           "INT8: per-token symmetric 8-bit (one scale = absmax / 127 per row); keeps every token",
           absl::StrCat("per group: a generated token stays f32 in the drafter's tail until ",
                        kInt8OnlineWindow, " settled tokens have collected, then they are "
                        "quantised per token"),
           {{"--bits", "8", "code width: 8 only"}}),
       [](const CompressorOptions& o, const std::string& label) -> Made {
         if (o.bits != 0 && o.bits != 8) {
           return absl::InvalidArgumentError(
               absl::StrCat(label, ": int8 supports only --bits 8, got ", o.bits));
         }
         return std::make_unique<Int8>();
       }},
  };
  return *table;
}

}  // namespace vc::compress_internal
