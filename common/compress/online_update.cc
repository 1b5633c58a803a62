// Online compression: the staged compressors' Update and the fold of a
// drafter's view (compressor.h). The dropper's online rule chooses which
// positions stay; RowStore::Rebuild carries kept rows over in their stored
// format and encodes the newly folded rows the way the quantiser would.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compress/compressor.h"
#include "common/compress/internal/stages.h"

namespace vc {

const char* OnlinePolicyKindName(OnlinePolicy::Kind kind) {
  switch (kind) {
    case OnlinePolicy::Kind::kNone:
      return "none";
    case OnlinePolicy::Kind::kEveryToken:
      return "every-token";
    case OnlinePolicy::Kind::kPerGroup:
      return "per-group";
  }
  return "?";
}

bool ShouldFold(const OnlinePolicy& policy, const CompressedSequenceKv& view) {
  if (policy.kind == OnlinePolicy::Kind::kNone) return false;
  const int32_t outside = view.settled_length() - view.prefix().prefix_len();
  return outside >= std::max<int32_t>(1, policy.interval);
}

absl::Status FoldIntoView(const Compressor& compressor, const ModelConfig& config,
                          int32_t fold_upto, const DecodeAttentionStats* decode_stats,
                          CompressedSequenceKv* view, KvArena* arena,
                          KvArena::Reservation* prefix_reservation) {
  // Checked before any work: a fold past the settled length would freeze rows
  // that a rollback or a KV refresh must still be able to change.
  VC_RETURN_IF_ERROR(view->CheckFold(fold_upto));
  VC_ASSIGN_OR_RETURN(
      std::shared_ptr<const CompressedPrefix> next,
      compressor.Update(config, view->prefix(), view->tail(), fold_upto, decode_stats));
  KvArena::Reservation reservation;
  if (arena != nullptr) {
    VC_ASSIGN_OR_RETURN(reservation, arena->Reserve(next->bytes()));
  }
  VC_RETURN_IF_ERROR(view->Rebase(std::move(next)));
  // The old prefix's bytes are released here (its reservation is replaced).
  if (prefix_reservation != nullptr) *prefix_reservation = std::move(reservation);
  return absl::OkStatus();
}

namespace compress_internal {

absl::StatusOr<std::shared_ptr<const CompressedPrefix>> UpdateStaged(
    const std::string& label, const Dropper* dropper, const Quantizer* quantizer,
    const ModelConfig& config, const CompressedPrefix& current, const PagedKvCache& tail,
    int32_t fold_upto, const DecodeAttentionStats* stats) {
  const int32_t n0 = current.prefix_len();
  if (current.n_layers() != config.n_layers || config.n_kv_heads < 1 || config.head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the compressed prefix does not match the model's shape"));
  }
  if (tail.first_position() != n0 || tail.n_layers() != config.n_layers ||
      tail.kv_heads() != config.n_kv_heads || tail.head_dim() != config.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the tail must be the view's exact rows from position ", n0,
                     " (starts at ", tail.first_position(), ")"));
  }
  if (fold_upto < n0 || fold_upto > tail.next_position()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": fold_upto ", fold_upto, " outside [",
                                                   n0, ", ", tail.next_position(),
                                                   "] (prefix length, end of the tail)"));
  }
  const bool drops = dropper != nullptr && dropper->has_online_rule();
  const RowCodecSpec key_spec =
      quantizer != nullptr ? quantizer->KeySpec(config) : RowCodecSpec::F32();
  const RowCodecSpec value_spec =
      quantizer != nullptr ? quantizer->ValueSpec(config) : RowCodecSpec::F32();
  const int hd = config.head_dim;
  std::vector<CompressedPrefix::Layer> layers(config.n_layers);
  std::vector<int32_t> candidates;
  std::vector<int64_t> keep_rows;
  std::vector<float> new_k, new_v;
  for (int l = 0; l < config.n_layers; ++l) {
    for (int h = 0; h < config.n_kv_heads; ++h) {
      const CompressedPrefix::Head& head = current.layer(l).heads[h];
      candidates = head.positions;
      for (int32_t pos = n0; pos < fold_upto; ++pos) candidates.push_back(pos);
      std::vector<int32_t> kept;
      if (drops) {
        VC_ASSIGN_OR_RETURN(kept,
                            dropper->SelectOnline(config, l, h, candidates, fold_upto, stats));
      } else {
        kept = candidates;
      }
      // Kept positions of the old prefix map to its stored rows (both sorted);
      // the rest come from the exact tail.
      keep_rows.clear();
      new_k.clear();
      new_v.clear();
      size_t row = 0;
      for (const int32_t pos : kept) {
        if (pos < n0) {
          while (row < head.positions.size() && head.positions[row] < pos) ++row;
          if (row == head.positions.size() || head.positions[row] != pos) {
            return absl::InternalError(absl::StrCat(label, ": online rule kept position ", pos,
                                                    " that the prefix had dropped"));
          }
          keep_rows.push_back(static_cast<int64_t>(row));
        } else {
          new_k.insert(new_k.end(), tail.KeyAt(l, h, pos), tail.KeyAt(l, h, pos) + hd);
          new_v.insert(new_v.end(), tail.ValueAt(l, h, pos), tail.ValueAt(l, h, pos) + hd);
        }
      }
      const int64_t m = static_cast<int64_t>(new_k.size()) / hd;
      CompressedPrefix::Head out;
      out.positions = std::move(kept);
      VC_ASSIGN_OR_RETURN(out.keys,
                          RowStore::Rebuild(*head.keys, keep_rows, new_k.data(), m, key_spec));
      VC_ASSIGN_OR_RETURN(out.values,
                          RowStore::Rebuild(*head.values, keep_rows, new_v.data(), m, value_spec));
      layers[l].heads.push_back(std::move(out));
    }
  }
  return CompressedPrefix::FromParts(config, fold_upto, std::move(layers), current.description());
}

}  // namespace compress_internal
}  // namespace vc
