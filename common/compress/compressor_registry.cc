// The compressor registry: pure token droppers, pure quantisers and every
// "<dropper>+<quantiser>" composite, all one class (StagedCompressor) made of
// an optional dropping stage and an optional quantisation stage.
#include <algorithm>
#include <charconv>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/compress/compressor.h"
#include "common/compress/internal/stages.h"

namespace vc {
namespace compress_internal {

std::string FormatDouble(double value) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

namespace {

template <typename Stage>
const StageEntry<Stage>* FindRow(const std::vector<StageEntry<Stage>>& table,
                                 const std::string& name) {
  for (const StageEntry<Stage>& row : table) {
    if (row.info.name == name) return &row;
  }
  return nullptr;
}

CompressorInfo CompositeInfo(const CompressorInfo& d, const CompressorInfo& q) {
  CompressorInfo info;
  info.name = absl::StrCat(d.name, "+", q.name);
  info.family = "composite";
  info.description = absl::StrCat(
      "drop then quantise: ", d.name, " keeps the tokens that --ratio allows when sized as f32, ",
      "then ", q.name, " quantises the kept rows (achieved ratio below --ratio). ", d.name, ": ",
      d.description, ". ", q.name, ": ", q.description);
  info.takes_ratio = true;
  info.takes_bits = true;
  info.needs_attention_stats = d.needs_attention_stats;
  info.params = d.params;
  info.params.insert(info.params.end(), q.params.begin(), q.params.end());
  // Drop's update, then the quantiser's: with an online dropper every
  // settled token is folded (its eviction needs it); otherwise the
  // quantiser's group sets the pace and the dropper keeps every new token.
  info.online = d.online != OnlinePolicy::Kind::kNone ? d.online : q.online;
  info.online_rule = absl::StrCat(d.name, " then ", q.name, ". ", d.name, ": ", d.online_rule,
                                  ". ", q.name, ": ", q.online_rule);
  return info;
}

std::string KnownNames() {
  std::vector<std::string> names;
  for (const auto& row : DropperTable()) names.push_back(row.info.name);
  for (const auto& row : QuantizerTable()) names.push_back(row.info.name);
  return absl::StrCat(absl::StrJoin(names, ", "),
                      ", and composites <dropper>+<quantiser> (e.g. snapkv+kivi, h2o+int8)");
}

class StagedCompressor final : public Compressor {
 public:
  StagedCompressor(CompressorInfo info, std::unique_ptr<Dropper> dropper,
                   std::unique_ptr<Quantizer> quantizer)
      : info_(std::move(info)), dropper_(std::move(dropper)), quantizer_(std::move(quantizer)) {
    if (dropper_ != nullptr) description_ = dropper_->Describe();
    if (quantizer_ != nullptr) {
      description_ = description_.empty() ? quantizer_->Describe()
                                          : absl::StrCat(description_, "+", quantizer_->Describe());
    }
  }

  const CompressorInfo& info() const override { return info_; }
  std::string Describe() const override { return description_; }

  using Compressor::Compress;
  absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Compress(
      const ModelConfig& config, const PagedKvCache& full, int32_t prefix_len,
      const AttentionStats& stats, ThreadPool* pool) const override {
    if (prefix_len < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(info_.name, ": prefix to compress must hold >= 1 token, got ", prefix_len));
    }
    if (config.n_layers < 1 || config.n_kv_heads < 1 || config.head_dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(info_.name, ": bad model shape"));
    }
    KeptPositions kept;
    if (dropper_ != nullptr) {
      VC_ASSIGN_OR_RETURN(kept, dropper_->Select(config, prefix_len, stats));
    } else {
      std::vector<int32_t> all(prefix_len);
      for (int32_t i = 0; i < prefix_len; ++i) all[i] = i;
      kept.assign(config.n_layers, std::vector<std::vector<int32_t>>(config.n_kv_heads, all));
    }
    const RowCodecSpec key_spec =
        quantizer_ != nullptr ? quantizer_->KeySpec(config) : RowCodecSpec::F32();
    const RowCodecSpec value_spec =
        quantizer_ != nullptr ? quantizer_->ValueSpec(config) : RowCodecSpec::F32();
    return CompressedPrefix::Build(config, full, prefix_len, kept, key_spec, value_spec,
                                   description_, pool);
  }

  absl::StatusOr<std::shared_ptr<const CompressedPrefix>> Update(
      const ModelConfig& config, const CompressedPrefix& current, const PagedKvCache& tail,
      int32_t fold_upto, const DecodeAttentionStats* decode_stats) const override {
    if (online_policy().kind == OnlinePolicy::Kind::kNone) {
      return absl::FailedPreconditionError(absl::StrCat(
          info_.name, " has no online rule (", info_.online_rule, "); nothing to update"));
    }
    return UpdateStaged(info_.name, dropper_.get(), quantizer_.get(), config, current, tail,
                        fold_upto, decode_stats);
  }

  OnlinePolicy online_policy() const override {
    OnlinePolicy p;
    if (dropper_ != nullptr && dropper_->has_online_rule()) {
      p.kind = OnlinePolicy::Kind::kEveryToken;
      p.interval = 1;
      p.needs_decode_stats = dropper_->online_needs_stats();
    } else if (quantizer_ != nullptr) {
      p.kind = OnlinePolicy::Kind::kPerGroup;
      p.interval = std::max<int32_t>(1, quantizer_->online_interval());
    }
    return p;
  }

 private:
  CompressorInfo info_;
  std::unique_ptr<Dropper> dropper_;
  std::unique_ptr<Quantizer> quantizer_;
  std::string description_;
};

}  // namespace
}  // namespace compress_internal

using compress_internal::CompositeInfo;
using compress_internal::Dropper;
using compress_internal::DropperTable;
using compress_internal::FindRow;
using compress_internal::FormatDouble;
using compress_internal::KnownNames;
using compress_internal::Quantizer;
using compress_internal::QuantizerTable;
using compress_internal::StagedCompressor;
using compress_internal::StageEntry;

absl::StatusOr<std::unique_ptr<Compressor>> CreateCompressor(const CompressorOptions& options) {
  const std::string& name = options.name;
  const size_t plus = name.find('+');
  if (plus == std::string::npos) {
    if (const StageEntry<Dropper>* row = FindRow(DropperTable(), name); row != nullptr) {
      if (options.bits != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " drops tokens and takes no --bits (got ", options.bits,
                         "); to quantise what it keeps use a composite such as ", name, "+kivi"));
      }
      VC_ASSIGN_OR_RETURN(std::unique_ptr<Dropper> dropper, row->make(options, name));
      return std::unique_ptr<Compressor>(
          new StagedCompressor(row->info, std::move(dropper), nullptr));
    }
    if (const StageEntry<Quantizer>* row = FindRow(QuantizerTable(), name); row != nullptr) {
      if (options.ratio != 0.0) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " is a pure quantiser and takes no --ratio (got ", FormatDouble(options.ratio),
            "); its size follows from --bits. To drop tokens too use a composite such as snapkv+",
            name));
      }
      VC_ASSIGN_OR_RETURN(std::unique_ptr<Quantizer> quantizer, row->make(options, name));
      return std::unique_ptr<Compressor>(
          new StagedCompressor(row->info, nullptr, std::move(quantizer)));
    }
  } else {
    const StageEntry<Dropper>* d = FindRow(DropperTable(), name.substr(0, plus));
    const StageEntry<Quantizer>* q = FindRow(QuantizerTable(), name.substr(plus + 1));
    if (d != nullptr && q != nullptr) {
      VC_ASSIGN_OR_RETURN(std::unique_ptr<Dropper> dropper, d->make(options, name));
      VC_ASSIGN_OR_RETURN(std::unique_ptr<Quantizer> quantizer, q->make(options, name));
      return std::unique_ptr<Compressor>(new StagedCompressor(
          CompositeInfo(d->info, q->info), std::move(dropper), std::move(quantizer)));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compressor '", name, "'; known: ", KnownNames()));
}

std::vector<CompressorInfo> ListCompressors() {
  std::vector<CompressorInfo> out;
  for (const auto& d : DropperTable()) out.push_back(d.info);
  for (const auto& q : QuantizerTable()) out.push_back(q.info);
  for (const auto& d : DropperTable()) {
    for (const auto& q : QuantizerTable()) out.push_back(CompositeInfo(d.info, q.info));
  }
  return out;
}

}  // namespace vc
