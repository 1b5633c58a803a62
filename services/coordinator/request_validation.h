// The checks a coordinator request must pass before anything is booked or
// any worker is called: pure functions of the message and the served model's
// limits. CoordinatorService's handlers call them; they are unit-tested
// (tests/services/coordinator/request_validation_test.cc) and fuzzed over
// arbitrary bytes parsed as the protos (tests/fuzz/).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compress/compressor.h"
#include "vericache/v1/coordinator.pb.h"

namespace vc::coordinator {

struct RequestLimits {
  int vocab = 0;          // token ids must be in [0, vocab)
  int context = 0;        // the model's context, tokens
  int chunk_tokens = 64;  // tokens per stored chunk
};

// The raw 32-byte manifest key named by a 64-digit hex prefix id;
// InvalidArgument otherwise.
absl::StatusOr<std::string> ParsePrefixId(const std::string& id);

// A mode's name as flags, messages and metric labels spell it.
const char* ModeName(vericache::v1::Mode mode);

// Where a GenerateRequest's prompt comes from: prompt_ids, or prefix_id (+
// suffix_ids). InvalidArgument for both, or suffix_ids without a prefix_id.
absl::Status CheckPromptSource(const vericache::v1::GenerateRequest& req);

// The rest of a GenerateRequest whose whole prompt (the registered prefix's
// tokens + suffix_ids, or prompt_ids) is `prompt`: deadline_ms >= 0; a
// non-empty prompt of ids in the vocabulary; max_new_tokens >= 1 and, with
// the prompt, inside the context; a sampling config the workers accept;
// draft_len >= 0; a compressor that exists with its ratio in [0, 1] and bits
// (or no ratio and bits without one); online_update only in modes vericache /
// lossy_remote and with a compressor that has an online rule (`default_
// compressor`, the coordinator's first ingest variant, when the request
// names none). InvalidArgument otherwise.
absl::Status ValidateGenerate(const vericache::v1::GenerateRequest& req,
                              absl::Span<const int32_t> prompt, const RequestLimits& limits,
                              const CompressorOptions& default_compressor);

// A RegisterPrefixRequest: ids in the vocabulary, at least one whole chunk,
// room left in the context, and a variant list that parses (`default_
// variants` when the request names none). InvalidArgument otherwise.
absl::Status ValidateRegisterPrefix(const vericache::v1::RegisterPrefixRequest& req,
                                    const RequestLimits& limits,
                                    const std::string& default_variants);

}  // namespace vc::coordinator
