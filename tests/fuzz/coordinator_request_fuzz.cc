// The coordinator's request validation (services/coordinator/
// request_validation.h) over arbitrary bytes parsed as its protos: the first
// input byte picks GenerateRequest or RegisterPrefixRequest, the rest is the
// serialised message (bytes that do not parse are dropped, as gRPC drops
// them). Invariants: validation answers OK or InvalidArgument, never anything
// else; a request it accepts has its prompt inside the vocabulary and the
// context.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/compress/compressor.h"
#include "services/coordinator/request_validation.h"
#include "tests/fuzz/fuzz_util.h"
#include "vericache/v1/coordinator.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vc::fuzz;
  namespace pb = ::vericache::v1;
  Input in(data, size);
  const uint8_t which = in.U8();
  const std::string bytes = in.Rest();
  const vc::coordinator::RequestLimits limits{512, 256, 16};
  if (which & 1) {
    pb::RegisterPrefixRequest req;
    if (!req.ParseFromString(bytes)) return 0;
    const absl::Status s = vc::coordinator::ValidateRegisterPrefix(req, limits, "snapkv:0.25");
    VC_FUZZ_CHECK(s.ok() || absl::IsInvalidArgument(s), std::string(s.message()).c_str());
    if (s.ok()) {
      VC_FUZZ_CHECK(req.tokens_size() >= limits.chunk_tokens && req.tokens_size() < limits.context,
                    "accepted prefix length");
    }
    return 0;
  }
  pb::GenerateRequest req;
  if (!req.ParseFromString(bytes)) return 0;
  const absl::Status source = vc::coordinator::CheckPromptSource(req);
  VC_FUZZ_CHECK(source.ok() || absl::IsInvalidArgument(source), "prompt source status");
  if (!req.prefix_id().empty()) {
    auto raw = vc::coordinator::ParsePrefixId(req.prefix_id());
    VC_FUZZ_CHECK(raw.ok() ? raw->size() == 32 : absl::IsInvalidArgument(raw.status()),
                  "prefix id parse");
  }
  // The prompt as the coordinator assembles it (a registered prefix's tokens
  // stand in as ids 1..n of the prefix id's length).
  std::vector<int32_t> prompt;
  if (!req.prefix_id().empty()) {
    for (size_t i = 0; i < req.prefix_id().size() % 40; ++i) prompt.push_back(static_cast<int32_t>(i));
    prompt.insert(prompt.end(), req.suffix_ids().begin(), req.suffix_ids().end());
  } else {
    prompt.assign(req.prompt_ids().begin(), req.prompt_ids().end());
  }
  vc::CompressorOptions fallback;
  fallback.name = "snapkv";
  fallback.ratio = 0.25;
  const absl::Status s = vc::coordinator::ValidateGenerate(req, prompt, limits, fallback);
  VC_FUZZ_CHECK(s.ok() || absl::IsInvalidArgument(s), std::string(s.message()).c_str());
  if (s.ok()) {
    VC_FUZZ_CHECK(!prompt.empty(), "accepted prompt is not empty");
    for (int32_t id : prompt) VC_FUZZ_CHECK(id >= 0 && id < limits.vocab, "accepted id in vocab");
    VC_FUZZ_CHECK(static_cast<int64_t>(prompt.size()) + req.max_new_tokens() <= limits.context,
                  "accepted request fits the context");
  }
  return 0;
}
