#include "common/engine/engine.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/cache_line_allocator.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/collective/collective.h"

namespace vc {
namespace {

// Inverse frequencies of the rotary pairs, with the config's scaling rule.
std::vector<double> RopeInverseFrequencies(const RopeConfig& rope, int head_dim) {
  const int pairs = head_dim / 2;
  std::vector<double> inv(pairs);
  constexpr double kPi = 3.14159265358979323846;
  for (int i = 0; i < pairs; ++i) {
    double f = std::pow(rope.theta, -2.0 * i / head_dim);
    switch (rope.scaling) {
      case RopeConfig::Scaling::kNone:
        break;
      case RopeConfig::Scaling::kLinear:
        f /= rope.factor;
        break;
      case RopeConfig::Scaling::kLlama3: {
        const double low_wavelen = rope.original_max_position / rope.low_freq_factor;
        const double high_wavelen = rope.original_max_position / rope.high_freq_factor;
        const double wavelen = 2 * kPi / f;
        if (wavelen > low_wavelen) {
          f /= rope.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) /
                                (rope.high_freq_factor - rope.low_freq_factor);
          f = (1 - smooth) * f / rope.factor + smooth * f;
        }
        break;
      }
    }
    inv[i] = f;
  }
  return inv;
}

// Keeps the memory that passes and KV caches free inside the process, once
// per process. By default glibc serves each block of >= 128 KiB (a KV block
// of a 1024-wide model, a verify pass's logits) with its own mmap and
// returns it to the OS on free, and trims the heap's free top: every new
// request's KV and every larger pass then faults its memory in again, which
// on a VM costs ~17 us per 4 KiB page (docs/results.md section 8). With a
// fixed mmap threshold of 32 MiB and a trim threshold of 1 GiB, freed memory
// is reused instead; the process keeps at most its peak heap.
void RetainFreedMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}

}  // namespace

// Per-row inputs of a pass, shared read-only by the ranks.
struct Engine::Scratch {
  std::vector<float> cos_sin;
  std::vector<int32_t> row_pos, row_token, row_entry;
  std::vector<double> inv_freq;
  // The pass's rows cut into attention chunks: rows [begin, end) of one
  // batch entry, at most kChunkQueries queries per KV head.
  struct Chunk {
    int32_t entry;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
};

// One tensor-parallel rank: its kernels, its collective handle and its
// activations (grown on demand, reused across calls).
struct Engine::Rank {
  std::unique_ptr<kernels::KernelBackend> backend;
  std::unique_ptr<collective::Communicator> comm;
  std::vector<float> x, xb, q, k, v, att, proj, gate, up, final_norm, local, gathered, kv_row;
  // x's column blocks for the row-parallel products, each row on a cache
  // line when the block width is a multiple of 16 (so the kernels need not
  // copy them to aligned rows).
  CacheLineVector<float> xblk;
  std::vector<float> partials;
  // This rank's blocks of o_proj and down_proj per layer, packed
  // [block][out][len/B] in the weights' dtype (raw bytes) so that each block
  // is one plain Matmul (the register-tiled kernel) rather than a strided Dot
  // per element. On a cache line, as the model's own weights are (see
  // common/base/cache_line_allocator.h).
  std::vector<CacheLineVector<uint8_t>> wo_blocks, w2_blocks;
};

struct Engine::Pass {
  std::span<const SequenceInput> batch;
  int64_t n_rows = 0, n_logit_rows = 0;
  std::vector<float>* logits = nullptr;
};

const char* StageTimes::Name(int stage) {
  static constexpr const char* kNames[kCount] = {
      "embedding", "norms",   "q/k/v",  "rope, kv write", "attention",
      "o_proj",    "gate/up", "swiglu", "down_proj",      "classifier"};
  return stage >= 0 && stage < kCount ? kNames[stage] : "?";
}

uint32_t NumericsVersionFor(const ModelConfig& c) {
  return kNumericsVersion + 256 * static_cast<uint32_t>(c.dtype);
}

int ReductionBlocks(const ModelConfig& c) {
  for (int b : {8, 4, 2}) {
    if (c.q_dim() % b == 0 && c.hidden_dim % b == 0) return b;
  }
  return 1;
}

absl::Status CheckTensorParallel(const ModelConfig& c, int degree) {
  const int blocks = ReductionBlocks(c);
  if (degree < 1 || blocks % degree != 0 || c.n_kv_heads % degree != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel degree ", degree, " must be >= 1 and divide both the reduction block count B = ",
        blocks, " (the largest of 8, 4, 2, 1 dividing q_dim ", c.q_dim(), " and hidden_dim ",
        c.hidden_dim, ") and n_kv_heads ", c.n_kv_heads));
  }
  return absl::OkStatus();
}

namespace {

// The fixed pairwise tree over n (a power of two) partials: the sum of the
// first half's tree and the second half's tree. A rank's aligned run of
// blocks is a subtree, so summing subtrees per rank and then combining the
// ranks' roots by the same rule gives the same value for every degree.
float TreeSum(const float* p, int n, int64_t stride) {
  if (n == 1) return p[0];
  const int half = n / 2;
  return TreeSum(p, half, stride) + TreeSum(p + half * stride, half, stride);
}

// out[i] = TreeSum(p + i, n, stride) for i < count. The trees of the counts
// that occur (B and T are 1, 2, 4 or 8) are written out so that the loop over
// i vectorises: one recursive TreeSum per output, on the caller's thread
// while the other threads wait, took 35 us per row-parallel product of a
// 9-token pass (9216 outputs over 8 blocks) against 2.6 us.
void TreeSumRows(const float* p, int n, int64_t stride, int64_t count, float* out) {
  const int64_t s = stride;
  switch (n) {
    case 1:
      std::copy_n(p, count, out);
      return;
    case 2:
      for (int64_t i = 0; i < count; ++i) out[i] = p[i] + p[s + i];
      return;
    case 4:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = (p[i] + p[s + i]) + (p[2 * s + i] + p[3 * s + i]);
      }
      return;
    case 8:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = ((p[i] + p[s + i]) + (p[2 * s + i] + p[3 * s + i])) +
                 ((p[4 * s + i] + p[5 * s + i]) + (p[6 * s + i] + p[7 * s + i]));
      }
      return;
    default:
      for (int64_t i = 0; i < count; ++i) out[i] = TreeSum(p + i, n, stride);
  }
}

// Adds the wall time since the previous mark to a stage of `times`;
// nothing when times is null.
class StageClock {
 public:
  explicit StageClock(StageTimes* times) : times_(times) {
    if (times_ == nullptr) return;
    ++times_->passes;
    last_ = std::chrono::steady_clock::now();
  }
  void Mark(StageTimes::Stage stage) {
    if (times_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    times_->seconds[stage] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  StageTimes* times_;
  std::chrono::steady_clock::time_point last_;
};

// Row `token` of the embedding, widened to f32 (exact).
void EmbeddingRow(const WeightMatrix& e, int64_t token, int64_t dim, float* out) {
  for (int64_t i = 0; i < dim; ++i) out[i] = e.At(token * dim + i);
}

// First vocabulary id of rank r's slice (slices differ in size by at most 1).
int64_t VocabBegin(int64_t vocab, int r, int ranks) { return vocab * r / ranks; }

}  // namespace

Engine::Engine(const Model& model, const EngineOptions& options)
    : model_(model), options_(options), scratch_(std::make_unique<Scratch>()) {
  scratch_->inv_freq = RopeInverseFrequencies(model.config().rope, model.config().head_dim);
}

Engine::~Engine() = default;

kernels::KernelBackend& Engine::backend() { return *ranks_[0].backend; }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Model& model,
                                                       const EngineOptions& options) {
  VC_RETURN_IF_ERROR(model.config().Validate());
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError("max_batch_tokens must be >= 1");
  }
  if (options.warmup_tokens < 0) {
    return absl::InvalidArgumentError("warmup_tokens must be >= 0");
  }
  const int tp = options.tensor_parallel;
  VC_RETURN_IF_ERROR(CheckTensorParallel(model.config(), tp));
  // The engine keeps activations in host memory; a device collective (nccl)
  // needs the CUDA engine path, which does not exist yet.
  if (options.collective != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective backend '", options.collective,
        "': the engine exchanges host buffers and supports only 'cpu' for now"));
  }
  if (options.quantized != nullptr) {
    const ModelConfig& qc = options.quantized->config();
    const ModelConfig& mc = model.config();
    if (tp != 1 || options.backend.name != "cpu") {
      return absl::InvalidArgumentError(
          "quantised drafter weights need the cpu backend and tensor-parallel degree 1");
    }
    if (qc.dim != mc.dim || qc.hidden_dim != mc.hidden_dim || qc.n_layers != mc.n_layers ||
        qc.n_heads != mc.n_heads || qc.n_kv_heads != mc.n_kv_heads ||
        qc.head_dim != mc.head_dim || qc.vocab_size != mc.vocab_size) {
      return absl::InvalidArgumentError("quantised weights were made from a model of another shape");
    }
  }
  RetainFreedMemory();
  collective::CollectiveOptions co;
  co.backend = options.collective;
  co.size = tp;
  VC_ASSIGN_OR_RETURN(auto comms, collective::CreateGroup(co));
  auto engine = std::unique_ptr<Engine>(new Engine(model, options));
  if (options.quantized != nullptr) {
    VC_ASSIGN_OR_RETURN(engine->quant_level_, kernels::ParseSimdLevel(options.backend.simd));
  }
  // The ranks share the thread budget: each gets its share, at least one.
  kernels::BackendOptions bo = options.backend;
  if (tp > 1) {
    const int total = bo.threads > 0 ? bo.threads
                                     : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    bo.threads = std::max(1, total / tp);
  }
  engine->ranks_.resize(tp);
  const ModelConfig& c = model.config();
  const int blocks = ReductionBlocks(c), my_blocks = blocks / tp;
  // Packs rank r's blocks of a [n_out, len] row-parallel weight.
  auto pack = [&](const WeightMatrix& w, int64_t len, int64_t n_out, int r) {
    const int64_t blk = len / blocks, eb = DtypeBytes(w.dtype);
    const auto* src = static_cast<const uint8_t*>(w.data);
    CacheLineVector<uint8_t> out(static_cast<size_t>(my_blocks * n_out * blk * eb));
    for (int b = 0; b < my_blocks; ++b) {
      const int64_t col = (int64_t{r} * my_blocks + b) * blk;
      for (int64_t o = 0; o < n_out; ++o) {
        std::copy_n(src + (o * len + col) * eb, blk * eb, &out[((b * n_out + o) * blk) * eb]);
      }
    }
    return out;
  };
  for (int r = 0; r < tp; ++r) {
    Rank& rank = engine->ranks_[r];
    VC_ASSIGN_OR_RETURN(rank.backend, kernels::CreateBackend(bo));
    rank.comm = std::move(comms[r]);
    // (A quantised engine runs o_proj/down_proj on its own copies.)
    for (int l = 0; l < c.n_layers && options.quantized == nullptr; ++l) {
      const LayerWeights& lw = model.weights().layers[l];
      rank.wo_blocks.push_back(pack(lw.wo, c.q_dim(), c.dim, r));
      rank.w2_blocks.push_back(pack(lw.w2, c.hidden_dim, c.dim, r));
    }
  }
  const int64_t warm = std::min<int64_t>({options.warmup_tokens, options.max_batch_tokens,
                                          int64_t{c.max_seq_len}});
  if (warm > 0) {
    PagedKvCache kv(c);
    const std::vector<int32_t> tokens(static_cast<size_t>(warm), 0);
    const SequenceInput in{&kv, tokens, warm - 1};
    std::vector<float> logits;
    VC_RETURN_IF_ERROR(engine->Forward({&in, 1}, &logits));
  }
  return engine;
}

absl::Status Engine::Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) {
  const ModelConfig& c = model_.config();
  // ---- Validate everything before touching any KV. ----
  int64_t n_rows = 0, n_logit_rows = 0;
  std::unordered_set<const SequenceKv*> seen;
  for (size_t e = 0; e < batch.size(); ++e) {
    const SequenceInput& in = batch[e];
    if (in.kv == nullptr) return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, ": no KV"));
    if (!seen.insert(in.kv).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch entry ", e, ": the same sequence appears twice in one batch"));
    }
    if (in.first_logit < 0 || in.first_logit > static_cast<int64_t>(in.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, ": first_logit ",
                                                     in.first_logit, " outside [0, ",
                                                     in.tokens.size(), "]"));
    }
    for (int32_t t : in.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("batch entry ", e, ": token id ", t,
                                                       " outside the vocabulary [0, ",
                                                       c.vocab_size, ")"));
      }
    }
    n_rows += static_cast<int64_t>(in.tokens.size());
    n_logit_rows += static_cast<int64_t>(in.tokens.size()) - in.first_logit;
  }
  if (n_rows > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", n_rows,
                                                   " tokens exceeds max_batch_tokens ",
                                                   options_.max_batch_tokens));
  }
  logits->assign(static_cast<size_t>(n_logit_rows * c.vocab_size), 0.0f);
  if (n_rows == 0) return absl::OkStatus();

  // Reserve the positions; undo the ones already made if one fails.
  std::vector<int32_t> old_len(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    old_len[e] = batch[e].kv->next_position();
    absl::Status s = batch[e].kv->Append(static_cast<int32_t>(batch[e].tokens.size()));
    if (!s.ok()) {
      for (size_t u = 0; u < e; ++u) batch[u].kv->Truncate(old_len[u]);
      return s;
    }
  }

  Scratch& s = *scratch_;
  const int pairs = c.head_dim / 2;
  s.row_pos.resize(n_rows);
  s.row_token.resize(n_rows);
  s.row_entry.resize(n_rows);
  {
    int64_t r = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      for (size_t i = 0; i < batch[e].tokens.size(); ++i, ++r) {
        s.row_pos[r] = old_len[e] + static_cast<int32_t>(i);
        s.row_token[r] = batch[e].tokens[i];
        s.row_entry[r] = static_cast<int32_t>(e);
      }
    }
  }
  {
    // Bounds a unit's scores to kChunkQueries rows of the context.
    constexpr int64_t kChunkQueries = 64;
    const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkQueries / (c.n_heads / c.n_kv_heads));
    s.chunks.clear();
    int64_t begin = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      const int64_t end = begin + static_cast<int64_t>(batch[e].tokens.size());
      for (int64_t r = begin; r < end; r += rows_per_chunk) {
        s.chunks.push_back({static_cast<int32_t>(e), r, std::min(end, r + rows_per_chunk)});
      }
      begin = end;
    }
  }
  s.cos_sin.resize(n_rows * pairs * 2);
  // RoPE angles per row: computed in double, rounded once to float.
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int i = 0; i < pairs; ++i) {
      const double angle = static_cast<double>(s.row_pos[r]) * s.inv_freq[i];
      s.cos_sin[(r * pairs + i) * 2] = static_cast<float>(std::cos(angle));
      s.cos_sin[(r * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }

  Pass pass;
  pass.batch = batch;
  pass.n_rows = n_rows;
  pass.n_logit_rows = n_logit_rows;
  pass.logits = logits;
  const int tp = static_cast<int>(ranks_.size());
  if (tp == 1) return RankForward(0, pass);
  // Ranks 1..T-1 on their own threads, rank 0 on the caller's; the
  // collectives block (no spinning), so any T runs on any core count.
  std::vector<absl::Status> status(tp);
  std::vector<std::thread> threads;
  threads.reserve(tp - 1);
  for (int r = 1; r < tp; ++r) {
    threads.emplace_back([this, r, &pass, &status] { status[r] = RankForward(r, pass); });
  }
  status[0] = RankForward(0, pass);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : status) VC_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

// One rank's share of a pass (all ranks run it concurrently; rank 0 writes
// the KV rows and the logits). Rank r of T holds query heads
// [r*H/T, (r+1)*H/T), KV heads [r*KV/T, (r+1)*KV/T), hidden units
// [r*hid/T, (r+1)*hid/T) and vocabulary ids [r*V/T, (r+1)*V/T).
absl::Status Engine::RankForward(int rank, const Pass& pass) {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  const Scratch& s = *scratch_;
  Rank& me = ranks_[rank];
  kernels::KernelBackend& be = *me.backend;
  collective::Communicator& comm = *me.comm;
  ThreadPool& pool = be.pool();
  const std::span<const SequenceInput> batch = pass.batch;
  const int tp = static_cast<int>(ranks_.size());
  const int64_t n_rows = pass.n_rows, n_logit_rows = pass.n_logit_rows;
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  const int hd = c.head_dim, pairs = c.head_dim / 2;
  const int heads = c.n_heads / tp, kv_heads = c.n_kv_heads / tp;
  const int h0 = rank * heads, kvh0 = rank * kv_heads;
  const int64_t qd_r = int64_t{heads} * hd, kvd_r = int64_t{kv_heads} * hd, hid_r = hid / tp;
  const int blocks = ReductionBlocks(c), my_blocks = blocks / tp;
  StageClock clock(rank == 0 ? stage_times_ : nullptr);

  me.x.resize(n_rows * dim);
  me.xb.resize(n_rows * dim);
  me.q.resize(n_rows * qd_r);
  me.k.resize(n_rows * kvd_r);
  me.v.resize(n_rows * kvd_r);
  me.att.resize(n_rows * qd_r);
  me.proj.resize(n_rows * dim);
  me.gate.resize(n_rows * hid_r);
  me.up.resize(n_rows * hid_r);

  auto rope = [&](float* vec, int64_t r, int n_heads) {
    const float* cs = &s.cos_sin[r * pairs * 2];
    for (int h = 0; h < n_heads; ++h) {
      float* head = vec + int64_t{h} * hd;
      for (int i = 0; i < pairs; ++i) {
        const int a = c.rope.layout == RopeLayout::kInterleaved ? 2 * i : i;
        const int b = c.rope.layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + pairs;
        const float x0 = head[a], x1 = head[b], cs0 = cs[2 * i], sn = cs[2 * i + 1];
        head[a] = x0 * cs0 - x1 * sn;
        head[b] = x0 * sn + x1 * cs0;
      }
    }
  };

  // Row-parallel product: out[t*n_out + o] = the fixed tree over the B
  // blocks of Dot(block of x[t], block of w[o]), where w is [n_out, len] and
  // this rank holds columns [col0, col0 + len/T) of x (as `x_local`, rows of
  // len/T). Each rank sums its aligned run of blocks; the T roots are
  // gathered and combined by the same tree, in rank order.
  auto row_parallel = [&](const float* x_local, const CacheLineVector<uint8_t>& packed, Dtype dtype,
                          int64_t len, int64_t n_out, float* out) -> absl::Status {
    const int64_t blk = len / blocks, local_len = len / tp, n = n_rows * n_out;
    me.xblk.resize(my_blocks * n_rows * blk);
    me.partials.resize(my_blocks * n);
    for (int b = 0; b < my_blocks; ++b) {
      for (int64_t t = 0; t < n_rows; ++t) {
        std::copy_n(x_local + t * local_len + b * blk, blk, &me.xblk[(b * n_rows + t) * blk]);
      }
    }
    // Element (t, o) of block b is exactly Dot(block b of x[t], block b of
    // w[o]); the blocks go to the backend as one call.
    be.MatmulBlocks(me.xblk.data(), n_rows, packed.data(), dtype, my_blocks, blk, n_out,
                    me.partials.data());
    if (tp == 1) {
      TreeSumRows(me.partials.data(), my_blocks, n, n, out);
      return absl::OkStatus();
    }
    me.local.resize(n);
    TreeSumRows(me.partials.data(), my_blocks, n, n, me.local.data());
    me.gathered.resize(tp * n);
    VC_RETURN_IF_ERROR(comm.AllGather(me.local.data(), n, me.gathered.data()));
    TreeSumRows(me.gathered.data(), tp, n, n, out);
    return absl::OkStatus();
  };

  // Embedding, vocabulary-parallel: each rank looks up the rows whose token
  // it holds; the owner's copy is taken (a copy, not a sum, so -0 stays -0).
  {
    const int64_t v0 = VocabBegin(c.vocab_size, rank, tp), v1 = VocabBegin(c.vocab_size, rank + 1, tp);
    if (tp == 1) {
      for (int64_t r = 0; r < n_rows; ++r) {
        EmbeddingRow(w.token_embedding, s.row_token[r], dim, &me.x[r * dim]);
      }
    } else {
      me.local.assign(n_rows * dim, 0.0f);
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t tok = s.row_token[r];
        if (tok >= v0 && tok < v1) EmbeddingRow(w.token_embedding, tok, dim, &me.local[r * dim]);
      }
      me.gathered.resize(tp * n_rows * dim);
      VC_RETURN_IF_ERROR(comm.AllGather(me.local.data(), n_rows * dim, me.gathered.data()));
      for (int64_t r = 0; r < n_rows; ++r) {
        int owner = 0;
        while (s.row_token[r] >= VocabBegin(c.vocab_size, owner + 1, tp)) ++owner;
        std::copy_n(&me.gathered[(owner * n_rows + r) * dim], dim, &me.x[r * dim]);
      }
    }
  }

  const int group = c.n_heads / c.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const QuantizedWeights* quant = options_.quantized;  // tp == 1 when set
  auto qmatmul = [&](const float* x, int64_t rows, const kernels::QuantizedMatrix& m,
                     const float* bias, float* y) {
    kernels::QuantizedMatmul(quant_level_, &pool, x, rows, m, bias, y);
  };

  clock.Mark(StageTimes::kEmbedding);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    for (int64_t r = 0; r < n_rows; ++r) {
      kernels::RmsNorm(be, &me.x[r * dim], lw.rms_att, dim, c.rms_norm_eps, &me.xb[r * dim]);
    }
    clock.Mark(StageTimes::kNorms);
    const QuantizedLayerWeights* ql = quant ? &quant->layers()[l] : nullptr;
    if (ql != nullptr) {
      qmatmul(me.xb.data(), n_rows, ql->wq, lw.bq, me.q.data());
      qmatmul(me.xb.data(), n_rows, ql->wk, lw.bk, me.k.data());
      qmatmul(me.xb.data(), n_rows, ql->wv, lw.bv, me.v.data());
    } else {
      // Column-parallel Q/K/V: this rank's heads are a contiguous run of rows.
      be.MatmulTyped(me.xb.data(), n_rows, lw.wq.Row(int64_t{h0} * hd, dim), lw.wq.dtype,
                     lw.bq ? lw.bq + int64_t{h0} * hd : nullptr, dim, qd_r, me.q.data());
      be.MatmulTyped(me.xb.data(), n_rows, lw.wk.Row(int64_t{kvh0} * hd, dim), lw.wk.dtype,
                     lw.bk ? lw.bk + int64_t{kvh0} * hd : nullptr, dim, kvd_r, me.k.data());
      be.MatmulTyped(me.xb.data(), n_rows, lw.wv.Row(int64_t{kvh0} * hd, dim), lw.wv.dtype,
                     lw.bv ? lw.bv + int64_t{kvh0} * hd : nullptr, dim, kvd_r, me.v.data());
    }
    clock.Mark(StageTimes::kQkv);
    for (int64_t r = 0; r < n_rows; ++r) {
      rope(&me.q[r * qd_r], r, heads);
      rope(&me.k[r * kvd_r], r, kv_heads);
    }
    // KV in the model's dtype (docs/numerics.md, "Model dtype"): K after
    // RoPE and V as projected are rounded before anything reads them, so a
    // token attends to the same rounded rows that later tokens, the store
    // and the links see.
    if (c.dtype != Dtype::kF32) {
      for (float& f : me.k) f = RoundToDtype(f, c.dtype);
      for (float& f : me.v) f = RoundToDtype(f, c.dtype);
    }
    if (tp == 1) {
      for (int64_t r = 0; r < n_rows; ++r) {
        batch[s.row_entry[r]].kv->Write(l, s.row_pos[r], &me.k[r * kvd], &me.v[r * kvd]);
      }
    } else {
      // The sequence's KV rows are whole (the store keeps full rows): gather
      // the heads, rank 0 writes, and every rank waits before reading them.
      // (Rank 0 writes layer l+1 only after every rank has passed this
      // layer's later collectives, i.e. finished reading layer l.)
      me.local.resize(2 * n_rows * kvd_r);
      std::copy(me.k.begin(), me.k.end(), me.local.begin());
      std::copy(me.v.begin(), me.v.end(), me.local.begin() + n_rows * kvd_r);
      me.gathered.resize(tp * 2 * n_rows * kvd_r);
      VC_RETURN_IF_ERROR(comm.AllGather(me.local.data(), 2 * n_rows * kvd_r, me.gathered.data()));
      if (rank == 0) {
        me.kv_row.resize(2 * kvd);
        for (int64_t r = 0; r < n_rows; ++r) {
          for (int q = 0; q < tp; ++q) {
            const float* src = &me.gathered[q * 2 * n_rows * kvd_r];
            std::copy_n(src + r * kvd_r, kvd_r, &me.kv_row[q * kvd_r]);
            std::copy_n(src + (n_rows + r) * kvd_r, kvd_r, &me.kv_row[kvd + q * kvd_r]);
          }
          batch[s.row_entry[r]].kv->Write(l, s.row_pos[r], me.kv_row.data(), me.kv_row.data() + kvd);
        }
      }
      VC_RETURN_IF_ERROR(comm.Barrier());
    }
    clock.Mark(StageTimes::kRopeKvWrite);
    // Attention over this rank's heads, head-major: a unit is one KV head
    // of one sequence with a chunk of that sequence's rows, and all its
    // queries (the chunk's rows x the query heads sharing the KV head) go to
    // the KV together, so a multi-token pass reads each key and value once
    // per chunk instead of once per (row, head). Every query's arithmetic is
    // still that of its own (row, head): its scores are independent Dots, its
    // softmax is its own and its values are added in key order.
    const int64_t n_units = static_cast<int64_t>(s.chunks.size()) * kv_heads;
    const int64_t work_per_unit =
        std::max<int64_t>(1, int64_t{s.row_pos[n_rows - 1] + 1} * hd * 2 * group);
    pool.ParallelFor(
        n_units, std::max<int64_t>(1, 32768 / work_per_unit), [&](int64_t u0, int64_t u1) {
          thread_local std::vector<float> qs, scores, outs;
          thread_local std::vector<SequenceKv::KeyRange> ranges;
          thread_local std::vector<float*> rows;
          thread_local std::vector<int64_t> counts;
          for (int64_t u = u0; u < u1; ++u) {
            const Scratch::Chunk& ch = s.chunks[u / kv_heads];
            const int kl = static_cast<int>(u % kv_heads);
            const int kvh = kvh0 + kl;
            const SequenceKv& kv = *batch[ch.entry].kv;
            const int64_t nq = (ch.end - ch.begin) * group;
            qs.resize(nq * hd);
            ranges.resize(nq);
            int64_t base = std::numeric_limits<int64_t>::max(), end = 0;
            // Query t = (row ch.begin + t / group, local head kl*group + t % group).
            for (int64_t t = 0; t < nq; ++t) {
              const int64_t r = ch.begin + t / group;
              const int hl = kl * group + static_cast<int>(t % group);
              const int32_t pos = s.row_pos[r];
              const int32_t min_pos = c.sliding_window > 0 ? pos - c.sliding_window + 1 : 0;
              ranges[t] = kv.Keys(l, kvh, min_pos, pos);
              if (ranges[t].count > 0) {
                base = std::min(base, ranges[t].first);
                end = std::max(end, ranges[t].first + ranges[t].count);
              }
              std::copy_n(&me.q[r * qd_r + int64_t{hl} * hd], hd, &qs[t * hd]);
            }
            if (end == 0) base = 0;  // every range empty
            SequenceKv::QueryBatch qb;
            qb.q = qs.data();
            qb.ranges = ranges.data();
            qb.count = nq;
            qb.head_dim = hd;
            qb.base = base;
            qb.ld = std::max<int64_t>(1, end - base);
            scores.resize(nq * qb.ld);
            qb.scores = scores.data();
            kv.ScoresBatch(be, l, kvh, qb, scale);
            rows.resize(nq);
            counts.resize(nq);
            for (int64_t t = 0; t < nq; ++t) {
              rows[t] = &scores[t * qb.ld + (ranges[t].count > 0 ? ranges[t].first - base : 0)];
              counts[t] = ranges[t].count;
            }
            be.SoftmaxRows(rows.data(), counts.data(), nq);
            if (AttentionObserver* obs = batch[ch.entry].observer) {
              for (int64_t t = 0; t < nq; ++t) {
                obs->Observe(l, h0 + kl * group + static_cast<int>(t % group), kvh,
                             s.row_pos[ch.begin + t / group], ranges[t], rows[t]);
              }
            }
            outs.assign(nq * hd, 0.0f);
            kv.MixValuesBatch(be, l, kvh, qb, outs.data());
            for (int64_t t = 0; t < nq; ++t) {
              const int64_t r = ch.begin + t / group;
              const int hl = kl * group + static_cast<int>(t % group);
              std::copy_n(&outs[t * hd], hd, &me.att[r * qd_r + int64_t{hl} * hd]);
            }
          }
        });
    clock.Mark(StageTimes::kAttention);
    // o_proj, row-parallel over q_dim.
    if (ql != nullptr) {
      qmatmul(me.att.data(), n_rows, ql->wo, nullptr, me.proj.data());
    } else {
      VC_RETURN_IF_ERROR(
          row_parallel(me.att.data(), me.wo_blocks[l], lw.wo.dtype, qd, dim, me.proj.data()));
    }
    for (int64_t i = 0; i < n_rows * dim; ++i) me.x[i] = me.x[i] + me.proj[i];
    clock.Mark(StageTimes::kOutProj);

    for (int64_t r = 0; r < n_rows; ++r) {
      kernels::RmsNorm(be, &me.x[r * dim], lw.rms_ffn, dim, c.rms_norm_eps, &me.xb[r * dim]);
    }
    clock.Mark(StageTimes::kNorms);
    // gate/up column-parallel over hidden units, down_proj row-parallel.
    const int64_t j0 = rank * hid_r;
    if (ql != nullptr) {
      qmatmul(me.xb.data(), n_rows, ql->w1, nullptr, me.gate.data());
      qmatmul(me.xb.data(), n_rows, ql->w3, nullptr, me.up.data());
    } else {
      be.MatmulTyped(me.xb.data(), n_rows, lw.w1.Row(j0, dim), lw.w1.dtype, nullptr, dim, hid_r,
                     me.gate.data());
      be.MatmulTyped(me.xb.data(), n_rows, lw.w3.Row(j0, dim), lw.w3.dtype, nullptr, dim, hid_r,
                     me.up.data());
    }
    clock.Mark(StageTimes::kGateUp);
    be.SwiGlu(me.gate.data(), me.up.data(), n_rows * hid_r);
    clock.Mark(StageTimes::kSwiGlu);
    if (ql != nullptr) {
      qmatmul(me.gate.data(), n_rows, ql->w2, nullptr, me.proj.data());
    } else {
      VC_RETURN_IF_ERROR(
          row_parallel(me.gate.data(), me.w2_blocks[l], lw.w2.dtype, hid, dim, me.proj.data()));
    }
    for (int64_t i = 0; i < n_rows * dim; ++i) me.x[i] = me.x[i] + me.proj[i];
    clock.Mark(StageTimes::kDownProj);
  }

  // Final norm (replicated) and the vocabulary-parallel classifier for the
  // requested rows only; the logits are gathered in rank (= vocabulary) order.
  if (n_logit_rows == 0) return absl::OkStatus();
  me.final_norm.resize(n_logit_rows * dim);
  {
    int64_t out_row = 0, r = 0;
    for (size_t e = 0; e < batch.size(); ++e) {
      const int64_t len = static_cast<int64_t>(batch[e].tokens.size());
      for (int64_t i = 0; i < len; ++i, ++r) {
        if (i < batch[e].first_logit) continue;
        kernels::RmsNorm(be, &me.x[r * dim], w.rms_final, dim, c.rms_norm_eps,
                         &me.final_norm[out_row * dim]);
        ++out_row;
      }
    }
  }
  const int64_t vocab = c.vocab_size;
  if (quant != nullptr) {
    qmatmul(me.final_norm.data(), n_logit_rows, quant->classifier(), nullptr, pass.logits->data());
    clock.Mark(StageTimes::kClassifier);
    return absl::OkStatus();
  }
  if (tp == 1) {
    be.MatmulTyped(me.final_norm.data(), n_logit_rows, w.classifier.data, w.classifier.dtype,
                   nullptr, dim, vocab, pass.logits->data());
    clock.Mark(StageTimes::kClassifier);
    return absl::OkStatus();
  }
  const int64_t v0 = VocabBegin(vocab, rank, tp), v1 = VocabBegin(vocab, rank + 1, tp);
  const int64_t slice = (vocab + tp - 1) / tp;  // padded so every rank sends the same size
  me.local.assign(n_logit_rows * slice, 0.0f);
  be.MatmulTyped(me.final_norm.data(), n_logit_rows, w.classifier.Row(v0, dim), w.classifier.dtype,
                 nullptr, dim, v1 - v0, me.local.data());
  me.gathered.resize(tp * n_logit_rows * slice);
  VC_RETURN_IF_ERROR(comm.AllGather(me.local.data(), n_logit_rows * slice, me.gathered.data()));
  if (rank == 0) {
    float* out = pass.logits->data();
    for (int q = 0; q < tp; ++q) {
      const int64_t q0 = VocabBegin(vocab, q, tp), q1 = VocabBegin(vocab, q + 1, tp);
      for (int64_t row = 0; row < n_logit_rows; ++row) {
        std::copy_n(&me.gathered[q * n_logit_rows * slice + row * (q1 - q0)], q1 - q0,
                    out + row * vocab + q0);
      }
    }
  }
  clock.Mark(StageTimes::kClassifier);
  return absl::OkStatus();
}

}  // namespace vc
