#include "common/ingest/prefix_ingest.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/compress/attention_stats.h"
#include "common/kvstore/chunk_codec.h"
#include "common/kvstore/variant_codec.h"

namespace vc::ingest {
namespace {

// Forwards a pass's attention to several statistics (one per window).
class FanOutObserver final : public AttentionObserver {
 public:
  explicit FanOutObserver(std::vector<AttentionObserver*> targets) : targets_(std::move(targets)) {}
  void Observe(int layer, int head, int kv_head, int32_t query_pos, SequenceKv::KeyRange range,
               const float* probs) override {
    for (AttentionObserver* t : targets_) t->Observe(layer, head, kv_head, query_pos, range, probs);
  }

 private:
  std::vector<AttentionObserver*> targets_;
};

const CompressorInfo* FindInfo(const std::vector<CompressorInfo>& all, const std::string& name) {
  for (const CompressorInfo& info : all) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

absl::Status EntryError(size_t index, const std::string& entry, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("variant list entry ", index + 1, " ('", entry, "'): ", what));
}

}  // namespace

absl::StatusOr<std::vector<VariantSpec>> ParseVariantList(const std::string& text) {
  std::vector<VariantSpec> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  const std::vector<CompressorInfo> all = ListCompressors();
  // (Describe(), ratio bits) of the entries so far: duplicates would be
  // stored under one key.
  std::set<std::pair<std::string, uint64_t>> seen;
  const std::vector<std::string> entries = absl::StrSplit(text, ',');
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry(absl::StripAsciiWhitespace(entries[i]));
    if (entry.empty()) {
      return EntryError(i, entries[i], "empty entry (expected name[:ratio][:bits])");
    }
    std::vector<std::string> parts = absl::StrSplit(entry, ':');
    for (std::string& p : parts) p = std::string(absl::StripAsciiWhitespace(p));
    VariantSpec spec;
    spec.compressor.name = parts[0];
    const CompressorInfo* info = FindInfo(all, parts[0]);
    if (info == nullptr) {
      // CreateCompressor's message lists the known names.
      const auto c = CreateCompressor(spec.compressor);
      return EntryError(i, entry,
                        std::string(c.ok() ? "unknown compressor" : c.status().message()));
    }
    const std::vector<std::string> numbers(parts.begin() + 1, parts.end());
    const bool composite = info->takes_ratio && info->takes_bits;
    const size_t max_numbers = composite ? 2 : 1;
    if (numbers.size() > max_numbers) {
      return EntryError(
          i, entry,
          absl::StrCat(
              parts[0], " takes at most ", max_numbers, " number", max_numbers == 1 ? "" : "s",
              " (", composite ? "ratio then bits" : (info->takes_ratio ? "its ratio" : "its bits"),
              "), got ", numbers.size()));
    }
    for (size_t j = 0; j < numbers.size(); ++j) {
      const bool is_ratio = info->takes_ratio && j == 0;
      if (numbers[j].empty()) {
        return EntryError(i, entry, absl::StrCat("empty ", is_ratio ? "ratio" : "bits"));
      }
      if (is_ratio) {
        double r = 0;
        if (!absl::SimpleAtod(numbers[j], &r) || !std::isfinite(r)) {
          return EntryError(i, entry, absl::StrCat("ratio '", numbers[j], "' is not a number"));
        }
        spec.compressor.ratio = r;
      } else {
        int b = 0;
        if (!absl::SimpleAtoi(numbers[j], &b)) {
          return EntryError(i, entry, absl::StrCat("bits '", numbers[j], "' is not an integer"));
        }
        if (b == 0) {
          // 0 means "the method's default" in CompressorOptions; in a list
          // it can only be a mistake.
          return EntryError(i, entry, "bits must be positive, got 0");
        }
        spec.compressor.bits = b;
      }
    }
    if (info->takes_ratio && numbers.empty()) {
      return EntryError(i, entry,
                        absl::StrCat(parts[0], " needs a ratio, e.g. ", parts[0], ":0.25",
                                     composite ? ":4" : ""));
    }
    const auto compressor = CreateCompressor(spec.compressor);
    if (!compressor.ok()) return EntryError(i, entry, std::string(compressor.status().message()));
    const auto key =
        std::make_pair((*compressor)->Describe(), std::bit_cast<uint64_t>(spec.compressor.ratio));
    if (!seen.insert(key).second) {
      return EntryError(i, entry,
                        absl::StrCat("duplicate variant (", key.first, " is already listed)"));
    }
    out.push_back(std::move(spec));
  }
  return out;
}

absl::StatusOr<kvstore::ChunkKey> VariantKeyFor(const kvstore::ChunkKey& last,
                                                const VariantSpec& spec,
                                                const kvstore::ModelId* draft_model) {
  VC_ASSIGN_OR_RETURN(std::unique_ptr<Compressor> c, CreateCompressor(spec.compressor));
  return kvstore::CompressedVariantKey(last, c->Describe(), spec.compressor.ratio, draft_model);
}

int32_t StoredPrefixTokens(int32_t prompt_len, int chunk_tokens) {
  if (prompt_len < 2 || chunk_tokens < 1) return 0;
  return (prompt_len - 1) / chunk_tokens * chunk_tokens;
}

namespace {

// A prefix's prefill on one engine, with the statistics its variants need.
struct Prefill {
  std::unique_ptr<PagedKvCache> kv;
  // One set per distinct window among the variants that rank by attention:
  // SnapKV/PyramidKV insist on statistics of their own window.
  std::map<int, std::unique_ptr<AttentionStats>> stats;
};

// Prefills `tokens` from an empty cache in pieces of at most
// engine.max_batch_tokens() (batch invariance: the split changes nothing),
// gathering statistics for those of `compressors` that rank by attention.
absl::StatusOr<Prefill> RunPrefill(Engine& engine, std::span<const int32_t> tokens,
                                   const std::vector<VariantSpec>& variants,
                                   const std::vector<std::unique_ptr<Compressor>>& compressors,
                                   const std::function<absl::Status()>& check_cancelled) {
  const ModelConfig& config = engine.config();
  const int32_t prefix_len = static_cast<int32_t>(tokens.size());
  Prefill out;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (!compressors[i]->info().needs_attention_stats) continue;
    const int w = variants[i].compressor.window;
    if (out.stats.count(w) == 0) {
      out.stats[w] = std::make_unique<AttentionStats>(config, prefix_len, w);
    }
  }
  std::vector<AttentionObserver*> targets;
  for (auto& [w, st] : out.stats) targets.push_back(st.get());
  FanOutObserver fan_out(targets);
  AttentionObserver* observer =
      targets.empty() ? nullptr : (targets.size() == 1 ? targets[0] : &fan_out);
  out.kv = std::make_unique<PagedKvCache>(config, PagedKvCache::Options{.max_tokens = prefix_len});
  std::vector<float> logits;
  const int64_t n = prefix_len;
  const int64_t piece = std::max<int64_t>(1, engine.max_batch_tokens());
  for (int64_t start = 0; start < n; start += piece) {
    const std::span<const int32_t> part = tokens.subspan(start, std::min(piece, n - start));
    VC_RETURN_IF_ERROR(check_cancelled());
    const SequenceInput input{out.kv.get(), part, static_cast<int64_t>(part.size()), observer};
    VC_RETURN_IF_ERROR(engine.Forward({&input, 1}, &logits));
  }
  return out;
}

}  // namespace

absl::StatusOr<PrefixEntries> BuildPrefixEntries(Engine& engine, std::span<const int32_t> tokens,
                                                 const kvstore::ChunkKeyOptions& key_options,
                                                 const kvstore::ModelId& model_id,
                                                 const std::vector<VariantSpec>& variants,
                                                 const std::function<bool()>& cancelled,
                                                 const DraftModelIngest* draft) {
  const std::function<absl::Status()> check_cancelled = [&]() -> absl::Status {
    if (cancelled && cancelled()) return absl::CancelledError("ingest cancelled by its caller");
    return absl::OkStatus();
  };
  const ModelConfig& config = engine.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int ct = key_options.chunk_tokens;
  if (ct < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_tokens must be >= 1, got ", ct));
  }
  if (n == 0 || n % ct != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stored prefix must be a whole, non-zero number of ", ct,
                     "-token chunks; got ", n, " tokens"));
  }
  if (n > config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix of ", n, " tokens exceeds the model's context of ", config.max_seq_len));
  }
  if (draft != nullptr &&
      (draft->engine == nullptr || draft->engine->config().vocab_size != config.vocab_size)) {
    return absl::InvalidArgumentError(
        "the draft model's engine is missing or has another vocabulary");
  }
  const int32_t prefix_len = static_cast<int32_t>(n);

  // Every variant is checked before the (expensive) prefill.
  std::vector<std::unique_ptr<Compressor>> compressors;
  for (size_t i = 0; i < variants.size(); ++i) {
    auto c = CreateCompressor(variants[i].compressor);
    if (!c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variant ", i + 1, " (", variants[i].compressor.name, "): ", c.status().message()));
    }
    compressors.push_back(std::move(c).value());
  }
  // With a draft model the target's prefill only makes the chunks.
  VC_ASSIGN_OR_RETURN(
      Prefill target,
      RunPrefill(engine, tokens, draft == nullptr ? variants : std::vector<VariantSpec>{},
                 compressors, check_cancelled));

  PrefixEntries out;
  out.prefix_tokens = prefix_len;
  VC_ASSIGN_OR_RETURN(out.chunk_keys, kvstore::ChunkKeysForTokens(
                                          key_options, model_id,
                                          absl::Span<const int32_t>(tokens.data(), tokens.size())));
  for (size_t c = 0; c < out.chunk_keys.size(); ++c) {
    VC_RETURN_IF_ERROR(check_cancelled());
    VC_ASSIGN_OR_RETURN(std::string bytes,
                        kvstore::EncodeChunk(*target.kv, static_cast<int32_t>(c) * ct, ct));
    out.entries.emplace_back(out.chunk_keys[c].Raw(), std::move(bytes));
  }
  Prefill drafted;
  if (draft != nullptr) {
    target.kv.reset();  // the chunks are encoded: the draft prefill needs the memory
    VC_ASSIGN_OR_RETURN(drafted,
                        RunPrefill(*draft->engine, tokens, variants, compressors, check_cancelled));
  }
  const Prefill& source = draft != nullptr ? drafted : target;
  const ModelConfig& source_config = draft != nullptr ? draft->engine->config() : config;
  const kvstore::ModelId* draft_id = draft != nullptr ? &draft->model_id : nullptr;
  const AttentionStats no_stats(source_config, 0, 0);
  for (size_t i = 0; i < variants.size(); ++i) {
    VC_RETURN_IF_ERROR(check_cancelled());
    const Compressor& c = *compressors[i];
    const AttentionStats& st =
        c.info().needs_attention_stats ? *source.stats.at(variants[i].compressor.window) : no_stats;
    VC_ASSIGN_OR_RETURN(std::shared_ptr<const CompressedPrefix> prefix,
                        c.Compress(source_config, *source.kv, prefix_len, st));
    StoredVariant v;
    v.description = c.Describe();
    v.target_ratio = variants[i].compressor.ratio;
    v.key = kvstore::CompressedVariantKey(out.chunk_keys.back(), v.description, v.target_ratio,
                                          draft_id);
    v.achieved_ratio = prefix->ratio();
    v.kv_bytes = prefix->bytes();
    std::string bytes = kvstore::EncodeCompressedPrefix(*prefix);
    v.bytes = static_cast<int64_t>(bytes.size());
    out.entries.emplace_back(v.key.Raw(), std::move(bytes));
    out.variants.push_back(std::move(v));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PagedKvCache>> LoadFullPrefix(
    const ModelConfig& config, const std::vector<std::string>& chunk_bytes,
    const PagedKvCache::Options& options, kvstore::ChecksumCheck checksum) {
  if (chunk_bytes.empty()) return absl::InvalidArgumentError("LoadFullPrefix: no chunks");
  if (options.first_position != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadFullPrefix: a stored prefix starts at position 0, options ask for ",
                     options.first_position));
  }
  auto cache = std::make_unique<PagedKvCache>(config, options);
  int32_t chunk_tokens = 0;
  for (size_t i = 0; i < chunk_bytes.size(); ++i) {
    const int32_t before = cache->next_position();
    // Checks the checksum (unless done), the shape and that the chunk
    // starts at `before`.
    if (absl::Status s = kvstore::DecodeChunkInto(chunk_bytes[i], *cache, checksum); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("prefix chunk ", i, ": ", s.message()));
    }
    const int32_t tokens = cache->next_position() - before;
    if (i == 0) chunk_tokens = tokens;
    if (tokens != chunk_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("prefix chunk ", i, " holds ", tokens,
                                                     " tokens, chunk 0 holds ", chunk_tokens,
                                                     "; a prefix's chunks are equal"));
    }
  }
  return cache;
}

}  // namespace vc::ingest
