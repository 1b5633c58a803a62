#include "services/coordinator/request_validation.h"

#include <algorithm>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/ingest/prefix_ingest.h"
#include "services/common/sampling_config.h"

namespace vc::coordinator {
namespace {

namespace pb = ::vericache::v1;

// Every id in [0, vocab); `what` names the list in the error.
absl::Status CheckIds(absl::Span<const int32_t> ids, int vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " has id ", ids[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* ModeName(pb::Mode mode) {
  switch (mode) {
    case pb::MODE_FULL_REMOTE:
      return "full_remote";
    case pb::MODE_FULL_LOCAL:
      return "full_local";
    case pb::MODE_LOSSY_REMOTE:
      return "lossy_remote";
    default:
      return "vericache";
  }
}

absl::StatusOr<std::string> ParsePrefixId(const std::string& id) {
  const bool hex = std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
  std::string raw;
  if (id.size() == 64 && hex) raw = absl::HexStringToBytes(id);
  if (raw.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix_id '", id, "' is not a 64-digit hex prefix id"));
  }
  return raw;
}

absl::Status CheckPromptSource(const pb::GenerateRequest& req) {
  if (!req.prefix_id().empty()) {
    if (!req.prompt_ids().empty()) {
      return absl::InvalidArgumentError("give prompt_ids or prefix_id (+ suffix_ids), not both");
    }
  } else if (!req.suffix_ids().empty()) {
    return absl::InvalidArgumentError("suffix_ids need a prefix_id");
  }
  return absl::OkStatus();
}

absl::Status ValidateGenerate(const pb::GenerateRequest& req, absl::Span<const int32_t> prompt,
                              const RequestLimits& limits,
                              const CompressorOptions& default_compressor) {
  if (req.deadline_ms() < 0) return absl::InvalidArgumentError("deadline_ms must be >= 0");
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  VC_RETURN_IF_ERROR(CheckIds(prompt, limits.vocab, "prompt token"));
  if (req.max_new_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 1, got ", req.max_new_tokens()));
  }
  // Compared without adding them: prompt + a max_new_tokens near INT64_MAX
  // would overflow.
  if (req.max_new_tokens() > limits.context - static_cast<int64_t>(prompt.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", prompt.size(), " tokens) + max_new_tokens (", req.max_new_tokens(),
                     ") exceeds the model's context of ", limits.context, " tokens"));
  }
  // The workers' own check, here before any session opens.
  VC_RETURN_IF_ERROR(daemon::ToSessionSampling(req.sampling()).status());
  if (req.draft_len() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft_len must be >= 0, got ", req.draft_len()));
  }
  // The compressed variant the drafter uses.
  CompressorOptions compressor = default_compressor;
  if (!req.compressor().empty()) {
    if (!(req.ratio() >= 0 && req.ratio() <= 1)) {  // NaN too
      return absl::InvalidArgumentError(absl::StrCat("ratio must be in (0, 1], got ", req.ratio()));
    }
    compressor = CompressorOptions();
    compressor.name = req.compressor();
    compressor.ratio = req.ratio();
    compressor.bits = req.bits();
    VC_RETURN_IF_ERROR(CreateCompressor(compressor).status());
  } else if (req.ratio() != 0 || req.bits() != 0) {
    return absl::InvalidArgumentError("ratio/bits need a compressor");
  }
  if (req.online_update()) {
    // Checked before any session opens: the drafter would refuse it only
    // after fetching its variant.
    const pb::Mode mode = req.mode() == pb::MODE_UNSPECIFIED ? pb::MODE_VERICACHE : req.mode();
    if (mode != pb::MODE_VERICACHE && mode != pb::MODE_LOSSY_REMOTE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "online_update folds tokens into the drafter's compressed KV: it needs mode vericache "
          "or lossy_remote, not ",
          ModeName(mode)));
    }
    VC_ASSIGN_OR_RETURN(std::unique_ptr<Compressor> c, CreateCompressor(compressor));
    if (c->online_policy().kind == OnlinePolicy::Kind::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("online_update: compressor ", c->info().name,
                       " has no online rule (its published rule compresses once after prefill; "
                       "'vericache compressors' lists the methods that have one)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRegisterPrefix(const pb::RegisterPrefixRequest& req,
                                    const RequestLimits& limits,
                                    const std::string& default_variants) {
  VC_RETURN_IF_ERROR(CheckIds(req.tokens(), limits.vocab, "token"));
  const int64_t n = req.tokens_size();
  if (n < limits.chunk_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("a prefix needs at least one whole chunk of ",
                                                   limits.chunk_tokens, " tokens, got ", n));
  }
  if (n >= limits.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a prefix of ", n, " tokens leaves no room in the context of ", limits.context));
  }
  const std::string& variants = req.variants().empty() ? default_variants : req.variants();
  return ingest::ParseVariantList(variants).status();
}

}  // namespace vc::coordinator
