#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/internal/simd_ops.h"
#include "kernels/internal/registry.h"

namespace vc::kernels {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};

Registry& GetRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed
    reg->factories["cpu"] = CreateCpuBackend;
#if defined(VC_HAVE_CUDA) && VC_HAVE_CUDA
    reg->factories["cuda"] = CreateCudaBackend;
#endif
    return reg;
  }();
  return *r;
}

}  // namespace

void KernelBackend::MatmulTyped(const float* x, int64_t tokens, const void* w, Dtype w_dtype,
                                const float* bias, int64_t in, int64_t out, float* y) {
  if (w_dtype == Dtype::kF32) {
    Matmul(x, tokens, static_cast<const float*>(w), bias, in, out, y);
    return;
  }
  // Tiles of rows of at most ~256 KiB widened; each output element is still
  // one Matmul element over its whole (widened) row.
  const int64_t tile = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, in));
  std::vector<float> wide, part;
  const auto* h = static_cast<const uint16_t*>(w);
  for (int64_t o0 = 0; o0 < out; o0 += tile) {
    const int64_t n = std::min(tile, out - o0);
    wide.resize(static_cast<size_t>(n * in));
    for (int64_t i = 0; i < n * in; ++i) wide[i] = WidenBits(h[o0 * in + i], w_dtype);
    part.resize(static_cast<size_t>(tokens * n));
    Matmul(x, tokens, wide.data(), bias != nullptr ? bias + o0 : nullptr, in, n, part.data());
    for (int64_t t = 0; t < tokens; ++t) std::copy_n(&part[t * n], n, y + t * out + o0);
  }
}

void KernelBackend::MatmulBlocks(const float* x, int64_t tokens, const void* w, Dtype w_dtype,
                                 int64_t blocks, int64_t in, int64_t out, float* y) {
  const auto* bytes = static_cast<const uint8_t*>(w);
  for (int64_t b = 0; b < blocks; ++b) {
    MatmulTyped(x + b * tokens * in, tokens, bytes + b * out * in * DtypeBytes(w_dtype), w_dtype,
                nullptr, in, out, y + b * tokens * out);
  }
}

void KernelBackend::AttentionScoresMulti(const float* q, int64_t nq, const float* k, int64_t n,
                                         int64_t head_dim, float scale, float* scores, int64_t ld,
                                         RowsAhead /*ahead*/) const {
  for (int64_t t = 0; t < nq; ++t)
    AttentionScores(q + t * head_dim, k, n, head_dim, scale, scores + t * ld);
}

void KernelBackend::AccumulateValuesMulti(const float* p, int64_t ldp, int64_t nq, const float* v,
                                          int64_t n, int64_t head_dim, float* out,
                                          RowsAhead /*ahead*/) const {
  for (int64_t t = 0; t < nq; ++t)
    AccumulateValues(p + t * ldp, v, n, head_dim, out + t * head_dim);
}

bool RegisterBackend(const std::string& name, BackendFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
  return true;
}

std::vector<std::string> RegisteredBackends() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

namespace {

absl::Status UnknownBackend(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat("unknown kernel backend '", name, "' (available: ",
                                                 absl::StrJoin(RegisteredBackends(), ", "), ")"));
}

}  // namespace

absl::Status CheckBackendName(const std::string& name) {
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.factories.count(name) != 0) return absl::OkStatus();
  }
  return UnknownBackend(name);  // takes the lock again (RegisteredBackends)
}

absl::StatusOr<std::unique_ptr<KernelBackend>> CreateBackend(const BackendOptions& options) {
  BackendFactory factory;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(options.name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) return UnknownBackend(options.name);
  return factory(options);
}

SimdLevel DetectSimdLevel() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (cpu::Avx512Ops() != nullptr && __builtin_cpu_supports("avx512f")) return SimdLevel::kAvx512;
  if (cpu::Avx2Ops() != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return SimdLevel::kAvx2;
  }
#endif
  return SimdLevel::kScalar;
}

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<SimdLevel> ParseSimdLevel(std::string_view name) {
  const SimdLevel best = DetectSimdLevel();
  SimdLevel want;
  if (name == "auto") return best;
  if (name == "scalar") {
    want = SimdLevel::kScalar;
  } else if (name == "avx2") {
    want = SimdLevel::kAvx2;
  } else if (name == "avx512") {
    want = SimdLevel::kAvx512;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown SIMD level '", std::string(name), "' (expected scalar, avx2, avx512 or auto)"));
  }
  if (static_cast<int>(want) > static_cast<int>(best)) {
    return absl::InvalidArgumentError(absl::StrCat("SIMD level '", std::string(name),
                                                   "' is not supported by this CPU (best: ",
                                                   std::string(SimdLevelName(best)), ")"));
  }
  return want;
}

namespace {
// 2^e for e in [-126, 127], built from its bit pattern.
inline float PowerOfTwo(int e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace

float Exp(float x) {
  // Cephes expf: x = n*ln2 + r with |r| <= ln2/2, exp(r) by a degree-6
  // polynomial, times 2^n. Plain * and + only (no FMA, no libm), so every
  // path and machine computes the same bits; the SIMD tables implement the
  // very same operations (cpu::SimdOps::exp_inplace).
  using namespace cpu;
  if (std::isnan(x)) return x;
  if (x > kExpHi) return INFINITY;
  if (x < kExpLo) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kExpP0;
  p = p * r + kExpP1;
  p = p * r + kExpP2;
  p = p * r + kExpP3;
  p = p * r + kExpP4;
  p = p * r + kExpP5;
  const float y = p * (r * r) + r + 1.0f;
  // y * 2^n without a libm call. Every step is exact except the last
  // multiply, which rounds once, exactly as ldexp would (also into the
  // subnormal range and to infinity).
  const int e = static_cast<int>(n);
  if (e >= -126 && e <= 127) return y * PowerOfTwo(e);
  if (e > 127) return (y * PowerOfTwo(e - 1)) * 2.0f;
  return (y * PowerOfTwo(e + 64)) * 0x1p-64f;
}

float Silu(float x) { return x / (1.0f + Exp(-x)); }

void RmsNorm(const KernelBackend& backend, const float* x, const float* g, int64_t n, float eps,
             float* out) {
  const float ss = backend.Dot(x, x, n);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] * (x[i] * r);
}

namespace {

// A row's max. Any order of the comparisons gives the same value except for
// the sign of a zero max, and the sign does not change a result: s_j - m is
// the same for m = +0 and -0 unless s_j is a zero, whose Exp is 1 either
// way. NaNs are another matter (std::max keeps the first operand when
// either is NaN, so the chain's result depends on where they are), hence
// the sequential chain whenever the vector max saw one.
float RowMax(const float* s, int64_t n, const SoftmaxParts& parts) {
  float m;
  if (parts.max_no_nan != nullptr && parts.max_no_nan(s, n, &m)) return m;
  m = s[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// e_j = Exp(s_j - m), in place, for j in [0, n).
void ShiftExp(float* s, int64_t n, float m, const SoftmaxParts& parts) {
  if (n <= 0) return;
  if (parts.shift_exp != nullptr) {
    parts.shift_exp(s, n, m);
    return;
  }
  for (int64_t j = 0; j < n; ++j) s[j] = s[j] - m;
  parts.exp_inplace(s, n);
}

void Normalise(float* s, int64_t n, float sum, const SoftmaxParts& parts) {
  const float inv = 1.0f / sum;
  if (parts.scale_inplace != nullptr) {
    parts.scale_inplace(s, n, inv);
    return;
  }
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

// Continues the sums of G rows over keys [begin, end), each its own
// sequential chain in key order; the G chains side by side keep the adder
// busy where one chain waits on its latency.
template <int G>
void SumRows(float* const* s, int64_t begin, int64_t end, float* acc) {
  float a[G];
  for (int i = 0; i < G; ++i) a[i] = acc[i];
  for (int64_t j = begin; j < end; ++j) {
#pragma GCC unroll 16
    for (int i = 0; i < G; ++i) a[i] += s[i][j];
  }
  for (int i = 0; i < G; ++i) acc[i] = a[i];
}

constexpr int kSumRows = 16;
using SumRowsFn = void (*)(float* const*, int64_t, int64_t, float*);
constexpr SumRowsFn kSumRowsFns[kSumRows + 1] = {
    nullptr,     SumRows<1>,  SumRows<2>,  SumRows<3>,  SumRows<4>,  SumRows<5>,
    SumRows<6>,  SumRows<7>,  SumRows<8>,  SumRows<9>,  SumRows<10>, SumRows<11>,
    SumRows<12>, SumRows<13>, SumRows<14>, SumRows<15>, SumRows<16>};

// Keys per block of a group's exp-and-sum pass: the group's rows' blocks
// (16 rows x 2 KiB) are summed while they are still in L1, instead of every
// row being exponentiated whole and read back from L2 for its sum.
constexpr int64_t kExpSumBlock = 512;

// The softmax of g <= kSumRows non-empty rows: each row's max, then its
// e_j block by block with the g sums advanced over each block while it is
// in cache (every row's e_j and its additions in key order, as alone), then
// the division.
void SoftmaxGroup(float* const* live, const int64_t* len, int g, const SoftmaxParts& parts) {
  float m[kSumRows], sum[kSumRows];
  int64_t common = len[0];
  for (int i = 0; i < g; ++i) {
    m[i] = RowMax(live[i], len[i], parts);
    sum[i] = 0.0f;
    common = std::min(common, len[i]);
  }
  for (int64_t b = 0; b < common; b += kExpSumBlock) {
    const int64_t e = std::min(common, b + kExpSumBlock);
    for (int i = 0; i < g; ++i) ShiftExp(live[i] + b, e - b, m[i], parts);
    kSumRowsFns[g](live, b, e, sum);
  }
  for (int i = 0; i < g; ++i) {
    ShiftExp(live[i] + common, len[i] - common, m[i], parts);
    SumRows<1>(&live[i], common, len[i], &sum[i]);
    Normalise(live[i], len[i], sum[i], parts);
  }
}

}  // namespace

void SoftmaxWith(float* s, int64_t n, const SoftmaxParts& parts) {
  if (n <= 0) return;
  SoftmaxGroup(&s, &n, 1, parts);
}

void SoftmaxRowsWith(float* const* rows, const int64_t* n, int64_t count,
                     const SoftmaxParts& parts) {
  // Empty rows are left alone, as by SoftmaxWith; the others go in
  // near-equal groups of at most kSumRows rows (9 rows: one group).
  float* live[kSumRows];
  int64_t len[kSumRows];
  int64_t remaining = 0;  // non-empty rows from r on
  for (int64_t i = 0; i < count; ++i) remaining += n[i] > 0 ? 1 : 0;
  int64_t r = 0;
  while (remaining > 0) {
    const int64_t groups = (remaining + kSumRows - 1) / kSumRows;
    const int64_t want = (remaining + groups - 1) / groups;
    int g = 0;
    for (; r < count && g < want; ++r) {
      if (n[r] <= 0) continue;
      live[g] = rows[r];
      len[g] = n[r];
      ++g;
    }
    remaining -= g;
    SoftmaxGroup(live, len, g, parts);
  }
}

void Softmax(float* s, int64_t n) {
  SoftmaxWith(s, n, {.exp_inplace = cpu::ScalarOps().exp_inplace, .max_no_nan = nullptr});
}

void KernelBackend::SwiGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = Silu(gate[i]) * up[i];
}

void KernelBackend::Softmax(float* s, int64_t n) const { kernels::Softmax(s, n); }

void KernelBackend::SoftmaxRows(float* const* rows, const int64_t* n, int64_t count) const {
  for (int64_t i = 0; i < count; ++i) Softmax(rows[i], n[i]);
}

}  // namespace vc::kernels
