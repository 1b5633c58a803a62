#include "services/coordinator/worker_compat.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vc::coordinator {

WorkerModel WorkerModelOf(const ::vericache::v1::WorkerInfoResponse& info) {
  WorkerModel model;
  model.model_id = info.model_id();
  model.numerics_version = info.numerics_version();
  model.draft_model_id = info.draft_model_id();
  model.vocab_size = info.vocab_size();
  model.context_length = info.context_length();
  model.kv_bytes_per_token = info.kv_bytes_per_token();
  if (info.eos_ids_size() == 0) {
    model.eos_ids = {info.eos_id()};
  } else {
    model.eos_ids.assign(info.eos_ids().begin(), info.eos_ids().end());
  }
  return model;
}

absl::Status CheckSameModel(const WorkerModel& expected, const WorkerModel& worker,
                            const std::string& address) {
  if (worker.vocab_size < 1 || worker.context_length < 1 || worker.kv_bytes_per_token < 1 ||
      worker.kv_bytes_per_token > kMaxWorkerKvBytesPerToken) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " reports a vocabulary of ", worker.vocab_size, ", a context of ",
        worker.context_length, " tokens and ", worker.kv_bytes_per_token,
        " bytes of KV per token (each must be at least 1, the KV at most ",
        kMaxWorkerKvBytesPerToken, ")"));
  }
  if (worker.model_id != expected.model_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " runs another model (id ", absl::BytesToHexString(worker.model_id),
        ", expected ", absl::BytesToHexString(expected.model_id), ")"));
  }
  if (worker.numerics_version != expected.numerics_version) {
    // Same weights, another numerics definition (docs/numerics.md): its KV
    // and logits would differ from the other workers' in the last bits.
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", address, " runs numerics version ", worker.numerics_version,
                     ", the first worker ", expected.numerics_version, " (docs/numerics.md)"));
  }
  if (worker.vocab_size != expected.vocab_size ||
      worker.context_length != expected.context_length ||
      worker.kv_bytes_per_token != expected.kv_bytes_per_token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " reports the same model with a vocabulary of ", worker.vocab_size,
        ", a context of ", worker.context_length, " and ", worker.kv_bytes_per_token,
        " bytes of KV per token, the first worker ", expected.vocab_size, ", ",
        expected.context_length, " and ", expected.kv_bytes_per_token));
  }
  if (worker.eos_ids != expected.eos_ids) {
    // Same weights, different generation_config.json: requests would stop
    // at different tokens depending on placement.
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " stops at end-of-sequence ids {", absl::StrJoin(worker.eos_ids, ","),
        "}, the first worker at {", absl::StrJoin(expected.eos_ids, ","), "}"));
  }
  if (worker.draft_model_id != expected.draft_model_id) {
    auto name = [](const std::string& id) {
      return id.empty() ? std::string("none (drafts with the target)")
                        : absl::BytesToHexString(id).substr(0, 16);
    };
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", address, " has draft model ", name(worker.draft_model_id), ", the first worker ",
        name(expected.draft_model_id),
        " (every verifier and drafter of a coordinator takes the same --draft-model)"));
  }
  return absl::OkStatus();
}

}  // namespace vc::coordinator
