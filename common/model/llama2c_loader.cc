// llama2.c checkpoint format (see ../shared/models/README.md): seven int32
// header fields, then f32 tensors in a fixed order. A negative vocab_size
// means the classifier is stored separately (not tied).
#include <cstring>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/model/internal/storage.h"
#include "common/model/model.h"

namespace vc {
namespace {

// Product and sum of element counts, saturating at kTooMany: a header of
// (individually bounded) sizes can still multiply past int64, and such a
// file is simply too short for what it claims.
constexpr int64_t kTooMany = std::numeric_limits<int64_t>::max() / 8;
int64_t Product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(p, f, &p) || p > kTooMany) return kTooMany;
  }
  return p;
}
int64_t Sum(int64_t a, int64_t b) { return a > kTooMany - b ? kTooMany : a + b; }

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::LoadLlama2c(const std::string& path) {
  auto file_or = MappedFile::Open(path);
  if (!file_or.ok()) return file_or.status();
  MappedFile file = std::move(file_or).value();
  constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
  if (file.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated llama2.c checkpoint: ",
                                                   file.size(), " bytes, header needs 28"));
  }
  int32_t hdr[7];
  std::memcpy(hdr, file.data(), kHeaderBytes);
  // Guard against absurd headers before any arithmetic on them (negating
  // INT32_MIN or dividing it by -1 would overflow).
  for (int i = 0; i < 7; ++i) {
    if (hdr[i] == 0 || std::abs(static_cast<int64_t>(hdr[i])) > (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": not a llama2.c checkpoint (header field ", i, " = ", hdr[i], ")"));
    }
  }
  ModelConfig c;
  c.architecture = "llama2c";
  c.dim = hdr[0];
  c.hidden_dim = hdr[1];
  c.n_layers = hdr[2];
  c.n_heads = hdr[3];
  c.n_kv_heads = hdr[4];
  c.tied_embeddings = hdr[5] > 0;
  c.vocab_size = hdr[5] < 0 ? -hdr[5] : hdr[5];
  c.max_seq_len = hdr[6];
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  c.rms_norm_eps = 1e-5f;
  c.rope.theta = 10000.0;
  c.rope.layout = RopeLayout::kInterleaved;
  c.bos_id = 1;
  c.eos_id = 2;
  if (c.n_heads > 0 && c.dim % c.n_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": dim ", c.dim,
                                                   " not divisible by n_heads ", c.n_heads));
  }
  if (auto s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }

  const int64_t d = c.dim, h = c.hidden_dim, L = c.n_layers, q = c.q_dim(), kv = c.kv_dim();
  const int64_t head = c.head_dim;
  // Element counts of every tensor in file order (saturating: see Product).
  struct Entry {
    const char* name;
    int64_t count;
  };
  const int64_t V = c.vocab_size;
  const Entry entries[] = {
      {"token_embedding", Product({V, d})}, {"rms_att", Product({L, d})},
      {"wq", Product({L, q, d})},           {"wk", Product({L, kv, d})},
      {"wv", Product({L, kv, d})},          {"wo", Product({L, d, q})},
      {"rms_ffn", Product({L, d})},         {"w1", Product({L, h, d})},
      {"w2", Product({L, d, h})},           {"w3", Product({L, h, d})},
      {"rms_final", d},
      {"freq_cis", Product({c.max_seq_len, head})},  // legacy RoPE table, skipped
  };
  int64_t offset = 0;
  for (const Entry& e : entries) offset = Sum(offset, e.count);
  int64_t need = offset;
  if (!c.tied_embeddings) need = Sum(need, Product({V, d}));
  const int64_t have = static_cast<int64_t>((file.size() - kHeaderBytes) / sizeof(float));
  if (have < need) {
    // Name the first tensor that does not fit.
    int64_t end = 0;
    const char* first_missing = "classifier";
    for (const auto& e : entries) {
      end = Sum(end, e.count);
      if (end > have) {
        first_missing = e.name;
        break;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated llama2.c checkpoint: tensor '", first_missing, "' runs past the end (file has ",
        have, " floats after the header, the header's shapes need ", need, ")"));
  }
  if (have > need + 16) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": llama2.c checkpoint has ", have - need,
                                                   " unexpected trailing floats; header/shape mismatch"));
  }
  // Every count fits the file now, so the arithmetic below cannot overflow.
  const float* base = reinterpret_cast<const float*>(file.data() + kHeaderBytes);
  const float* ptr[12];
  int64_t at = 0;
  for (int i = 0; i < 12; ++i) {
    ptr[i] = base + at;
    at += entries[i].count;
  }
  ModelWeights w;
  w.token_embedding = ptr[0];
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights lw;
    lw.rms_att = ptr[1] + l * d;
    lw.wq = ptr[2] + l * q * d;
    lw.wk = ptr[3] + l * kv * d;
    lw.wv = ptr[4] + l * kv * d;
    lw.wo = ptr[5] + l * d * q;
    lw.rms_ffn = ptr[6] + l * d;
    lw.w1 = ptr[7] + l * h * d;
    lw.w2 = ptr[8] + l * d * h;
    lw.w3 = ptr[9] + l * h * d;
    w.layers.push_back(lw);
  }
  w.rms_final = ptr[10];
  w.classifier = c.tied_embeddings ? w.token_embedding : base + offset;
  auto storage = std::make_unique<Model::Storage>();
  storage->files.push_back(std::move(file));
  return ModelBuilder::Make(std::move(c), std::move(w), path, std::move(storage));
}

}  // namespace vc
