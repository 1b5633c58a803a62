#include "services/common/sampling_config.h"

#include "absl/strings/str_cat.h"

namespace vc::daemon {

namespace pb = ::vericache::v1;

absl::StatusOr<cluster::SessionSampling> ToSessionSampling(const pb::SamplingConfig& s) {
  cluster::SessionSampling out;
  switch (s.mode()) {
    case pb::SamplingConfig::GREEDY:
      out.mode = SamplingMode::kGreedy;
      break;
    case pb::SamplingConfig::SEEDED:
      out.mode = SamplingMode::kSeeded;
      break;
    case pb::SamplingConfig::REJECTION:
      out.mode = SamplingMode::kRejection;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown sampling mode ", s.mode()));
  }
  out.params.temperature = s.temperature();
  out.params.top_k = s.top_k();
  out.params.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  out.params.seed = s.seed();
  if (absl::Status st = out.Validate(); !st.ok()) return st;
  return out;
}

}  // namespace vc::daemon
