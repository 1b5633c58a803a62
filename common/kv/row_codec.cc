#include "common/kv/row_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "common/kv/internal/int8_encoder.h"

namespace vc {
namespace {

using Kind = RowCodecSpec::Kind;

// nearbyint(v) clamped to [lo, hi], as a float, and 0 for a NaN v (casting
// NaN is undefined), for integers lo < hi far inside +-2^22, in a form the
// compiler vectorises (no libm call per element; the encoders of every
// quantised prompt KV run it, inside VeriCache's decode time): v is clamped
// to [lo - 1, hi + 1] first, which leaves every clamped result unchanged and
// bounds |v| far below 2^22, so adding and subtracting 1.5 * 2^23 rounds it
// to the nearest integer, ties to even, exactly as nearbyint does in the
// default rounding mode.
[[gnu::always_inline]] inline float NearestInRange(float v, float lo, float hi) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  v = v == v ? v : 0.0f;
  v = std::min(std::max(v, lo - 1.0f), hi + 1.0f);
  v = (v + kRound) - kRound;
  return std::min(std::max(v, lo), hi);
}

// 8-bit symmetric codes of one group, as the codec defines them (QuantiseInto:
// nearbyint(x / scale), NaN to 0, clamped to [-half, half], stored + half).
[[gnu::always_inline]] inline void EncodeSymmetric8Body(const float* x, int n, float scale,
                                                        int half, uint8_t* out) {
  if (!(scale > 0.0f)) {
    std::memset(out, half, static_cast<size_t>(n));
    return;
  }
  const float hi = static_cast<float>(half);
  for (int c = 0; c < n; ++c) {
    out[c] = static_cast<uint8_t>(static_cast<int>(NearestInRange(x[c] / scale, -hi, hi)) + half);
  }
}

// The largest |x[c]|, NaNs left out, from +0: exactly what the sequential
// amax = std::max(amax, std::fabs(x[c])) from 0.0f computes (std::max keeps
// amax when |x[c]| is a NaN). The bit patterns of non-negative floats are
// ordered as their values, so this is a max over the patterns without the
// sign bit, with NaNs' (those above +inf's) counted as +0's: an integer
// reduction the compiler vectorises, where the float chain (whose NaN rule
// depends on the order) ran one element per max latency.
[[gnu::always_inline]] inline float AbsMaxIgnoringNanBody(const float* x, int n) {
  constexpr int32_t kInfBits = 0x7F800000;
  int32_t m = 0;  // int32: SSE2 has signed compares only
  for (int c = 0; c < n; ++c) {
    const int32_t a = std::bit_cast<int32_t>(x[c]) & 0x7FFFFFFF;
    m = std::max(m, a > kInfBits ? 0 : a);
  }
  return std::bit_cast<float>(m);
}

// Asymmetric codes (KIVI), as the codec defines them: nearbyint((x - zero)
// / scale) clamped to [0, max_code], 0 for a NaN quotient or a scale that is
// not > 0 (NearestInRange; out of line so that the compiler vectorises each
// loop on its own). Value c takes scale[c] and zero[c] (a key row: one per
// channel) ...
[[gnu::noinline]] void EncodeAsymmetricPerValue(const float* x, const float* scale,
                                                const float* zero, int n, uint32_t max_code,
                                                uint8_t* out) {
  const float top = static_cast<float>(max_code);
  for (int c = 0; c < n; ++c) {
    const float v = NearestInRange((x[c] - zero[c]) / scale[c], 0.0f, top);
    out[c] = scale[c] > 0.0f ? static_cast<uint8_t>(static_cast<int>(v)) : uint8_t{0};
  }
}

// ... or one scale and zero for all n (a value group).
constexpr int kMaxGroupCodes = 256;  // codes per call from QuantiseInto
[[gnu::noinline]] void EncodeAsymmetricGroup(const float* x, float scale, float zero, int n,
                                             uint32_t max_code, uint8_t* out) {
  if (!(scale > 0.0f)) {
    std::memset(out, 0, static_cast<size_t>(n));
    return;
  }
  const float top = static_cast<float>(max_code);
  for (int c = 0; c < n; ++c) {
    out[c] =
        static_cast<uint8_t>(static_cast<int>(NearestInRange((x[c] - zero) / scale, 0.0f, top)));
  }
}

float AbsMaxBaseline(const float* x, int n) { return AbsMaxIgnoringNanBody(x, n); }
void EncodeBaseline(const float* x, int n, float scale, int half, uint8_t* out) {
  EncodeSymmetric8Body(x, n, scale, half, out);
}
#if defined(__x86_64__)
[[gnu::target("avx2")]] float AbsMaxAvx2(const float* x, int n) {
  return AbsMaxIgnoringNanBody(x, n);
}
[[gnu::target("avx2")]] void EncodeAvx2(const float* x, int n, float scale, int half,
                                        uint8_t* out) {
  EncodeSymmetric8Body(x, n, scale, half, out);
}
[[gnu::target("avx512f")]] float AbsMaxAvx512(const float* x, int n) {
  return AbsMaxIgnoringNanBody(x, n);
}
[[gnu::target("avx512f")]] void EncodeAvx512(const float* x, int n, float scale, int half,
                                             uint8_t* out) {
  EncodeSymmetric8Body(x, n, scale, half, out);
}
#endif

// The encoder for this CPU's widest level: encoding a 3000-token prompt's KV
// of the 110M synthetic shape took 75 ms on one thread with the baseline's
// 4-lane loops and 42 ms with AVX-512's. (Chosen through a pointer, not
// target_clones: the ifunc resolver target_clones makes crashes
// ThreadSanitizer binaries at load.)
const kv_internal::Int8Encoder& Int8EncoderForThisCpu() {
  static const kv_internal::Int8Encoder* encoder =
      kv_internal::Int8EncoderFor(kernels::DetectSimdLevel());
  return *encoder;
}

// Packed unsigned codes of `bits` (2, 4 or 8) each.
class PackedCodes {
 public:
  PackedCodes(int bits, int64_t count)
      : bits_(bits), bytes_((count * bits + 7) / 8, 0) {}
  void Set(int64_t i, uint32_t code) {
    const int64_t bit = i * bits_;
    bytes_[bit / 8] |= static_cast<uint8_t>(code << (bit % 8));
  }
  uint32_t Get(int64_t i) const {
    const int64_t bit = i * bits_;
    return (bytes_[bit / 8] >> (bit % 8)) & ((1u << bits_) - 1u);
  }
  // Codes [first, first + n) from in[n] (each < 2^bits), into codes not set
  // before: a run that starts on a byte boundary is packed a byte at a time,
  // any other start goes code by code.
  void SetRun(int64_t first, const uint8_t* in, int64_t n) {
    const int64_t bit = first * bits_;
    if (bit % 8 != 0) {
      for (int64_t c = 0; c < n; ++c) Set(first + c, in[c]);
      return;
    }
    uint8_t* out = &bytes_[bit / 8];
    if (bits_ == 8) {
      std::memcpy(out, in, static_cast<size_t>(n));
      return;
    }
    int64_t c = 0;
    if (bits_ == 4) {
      for (; c + 2 <= n; c += 2) out[c / 2] = static_cast<uint8_t>(in[c] | (in[c + 1] << 4));
    } else {  // 2 bits
      for (; c + 4 <= n; c += 4) {
        out[c / 4] =
            static_cast<uint8_t>(in[c] | (in[c + 1] << 2) | (in[c + 2] << 4) | (in[c + 3] << 6));
      }
    }
    for (; c < n; ++c) Set(first + c, in[c]);
  }
  // Codes [first, first + n) into out[n]. Bits are 2, 4 or 8, so no code
  // straddles a byte: a run that starts on a byte boundary unpacks a byte at
  // a time (the decode hot path); any other start goes code by code.
  void Unpack(int64_t first, int64_t n, uint8_t* out) const {
    const int64_t bit = first * bits_;
    if (bit % 8 != 0) {
      for (int64_t c = 0; c < n; ++c) out[c] = static_cast<uint8_t>(Get(first + c));
      return;
    }
    const uint8_t* in = &bytes_[bit / 8];
    if (bits_ == 8) {
      std::memcpy(out, in, static_cast<size_t>(n));
      return;
    }
    if (bits_ == 4) {
      for (int64_t c = 0; c + 1 < n; c += 2) {
        out[c] = in[c / 2] & 0xF;
        out[c + 1] = in[c / 2] >> 4;
      }
      if (n % 2 != 0) out[n - 1] = in[(n - 1) / 2] & 0xF;
      return;
    }
    for (int64_t c = 0; c < n; ++c) {  // 2 bits
      out[c] = static_cast<uint8_t>((in[c / 4] >> ((c % 4) * 2)) & 0x3);
    }
  }
  int64_t bytes() const { return static_cast<int64_t>(bytes_.size()); }
  const std::vector<uint8_t>& raw() const { return bytes_; }
  // 8-bit codes only: code i is byte i.
  uint8_t* Codes8At(int64_t first) { return &bytes_[first]; }
  // Codes as serialised (the packed bytes, unused high bits included).
  static PackedCodes FromRaw(int bits, std::vector<uint8_t> raw) {
    PackedCodes c(bits, 0);
    c.bytes_ = std::move(raw);
    return c;
  }

 private:
  int bits_;
  std::vector<uint8_t> bytes_;
};

// ---- Serialisation helpers (little-endian; floats as their bit patterns) ----
static_assert(std::endian::native == std::endian::little,
              "the serialised row formats store f32 in host order; big-endian hosts unsupported");

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
}
void PutFloats(std::string* out, const std::vector<float>& v) {
  if (v.empty()) return;
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Full-precision rows travel in the narrowest dtype that holds every value
// exactly: a bf16 or f16 model's K/V are already rounded to its dtype
// (docs/numerics.md, "Model dtype"), so its kept rows take 2 bytes a value
// on the wire and in the store, losslessly; anything else stays f32. The
// choice is a function of the values alone (bf16 tried before f16), so the
// decoder can insist on it and every accepted encoding re-encodes the same.
Dtype NarrowestExactDtype(const std::vector<float>& v) {
  for (Dtype d : {Dtype::kBf16, Dtype::kF16}) {
    bool exact = true;
    for (float x : v) {
      const float y = WidenBits(NarrowBits(x, d), d);
      if (std::bit_cast<uint32_t>(x) != std::bit_cast<uint32_t>(y)) {  // bits: -0, NaN payloads
        exact = false;
        break;
      }
    }
    if (exact && !v.empty()) return d;
  }
  return Dtype::kF32;
}

// u32 dtype, then the values in it.
void PutRows(std::string* out, const std::vector<float>& v) {
  const Dtype d = NarrowestExactDtype(v);
  PutU32(out, static_cast<uint32_t>(d));
  if (d == Dtype::kF32) {
    PutFloats(out, v);
    return;
  }
  const size_t at = out->size();
  out->resize(at + 2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = NarrowBits(v[i], d);
    (*out)[at + 2 * i] = static_cast<char>(h & 0xff);
    (*out)[at + 2 * i + 1] = static_cast<char>(h >> 8);
  }
}

// Reads fixed-size fields from a byte range; every read is bounds-checked.
class Reader {
 public:
  Reader(std::string_view bytes, size_t offset) : bytes_(bytes), offset_(offset) {}
  size_t offset() const { return offset_; }
  size_t remaining() const { return offset_ <= bytes_.size() ? bytes_.size() - offset_ : 0; }
  bool U32(uint32_t* v) {
    if (remaining() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      *v |= uint32_t{static_cast<uint8_t>(bytes_[offset_ + i])} << (8 * i);
    }
    offset_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (remaining() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) {
      *v |= uint64_t{static_cast<uint8_t>(bytes_[offset_ + i])} << (8 * i);
    }
    offset_ += 8;
    return true;
  }
  // Callers have checked that `n` items fit in remaining().
  void Floats(int64_t n, std::vector<float>* v) {
    v->resize(static_cast<size_t>(n));
    if (n == 0) return;  // data() may be null: memcpy's pointers must not be
    std::memcpy(v->data(), bytes_.data() + offset_, static_cast<size_t>(n) * sizeof(float));
    offset_ += static_cast<size_t>(n) * sizeof(float);
  }
  // PutRows' block of n values: the dtype (known, and the one PutRows
  // picks for these values) and enough bytes, checked before allocating.
  absl::Status Rows(int64_t n, std::vector<float>* v) {
    uint32_t code = 0;
    if (!U32(&code)) {
      return absl::InvalidArgumentError("serialised row store: truncated rows dtype");
    }
    const std::optional<Dtype> d =
        code <= 0xff ? DtypeFromByte(static_cast<uint8_t>(code)) : std::nullopt;
    if (!d.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("serialised row store: unknown rows dtype ",
                                                     code, " (known: 0 = f32, 1 = bf16, 2 = f16)"));
    }
    const uint64_t width = static_cast<uint64_t>(DtypeBytes(*d));
    if (remaining() / width < static_cast<uint64_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat("serialised row store: ", n, " ",
                                                     DtypeName(*d), " values need more than the ",
                                                     remaining(), " bytes left"));
    }
    if (*d == Dtype::kF32) {
      Floats(n, v);
    } else {
      v->resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const size_t at = offset_ + 2 * static_cast<size_t>(i);
        const uint16_t h = static_cast<uint16_t>(static_cast<uint8_t>(bytes_[at]) |
                                                 (static_cast<uint8_t>(bytes_[at + 1]) << 8));
        (*v)[static_cast<size_t>(i)] = WidenBits(h, *d);
      }
      offset_ += 2 * static_cast<size_t>(n);
    }
    if (NarrowestExactDtype(*v) != *d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "serialised row store: rows sent as ", DtypeName(*d), " but their values call for ",
          DtypeName(NarrowestExactDtype(*v)), " (non-canonical encoding)"));
    }
    return absl::OkStatus();
  }
  void Bytes(int64_t n, std::vector<uint8_t>* v) {
    v->assign(bytes_.begin() + offset_, bytes_.begin() + offset_ + n);
    offset_ += static_cast<size_t>(n);
  }

 private:
  std::string_view bytes_;
  size_t offset_;
};

// Stored sizes of a quantised store, all derived from (spec, n, dim) exactly
// as QuantRowStore's encoder lays them out, so the format need not repeat them.
struct QuantLayout {
  int group = 1;
  int64_t n_quant = 0;
  int64_t code_bytes = 0;
  int64_t scales = 0;
  int64_t zeros = 0;
  int64_t residual_floats = 0;
};

QuantLayout LayoutOf(const RowCodecSpec& spec, int64_t n, int dim) {
  QuantLayout q;
  q.group = spec.group > 0 ? spec.group : (spec.kind == Kind::kPerChannelAsymmetric ? 1 : dim);
  int64_t quantisable = std::max<int64_t>(0, n - spec.residual);
  if (spec.kind == Kind::kPerChannelAsymmetric) quantisable -= quantisable % q.group;
  q.n_quant = quantisable;
  q.code_bytes = (q.n_quant * dim * spec.bits + 7) / 8;
  if (spec.kind == Kind::kPerChannelAsymmetric) {
    q.scales = q.zeros = (q.n_quant / q.group) * dim;
  } else {
    q.scales = q.n_quant * ((dim + q.group - 1) / q.group);
    q.zeros = spec.kind == Kind::kPerTokenAsymmetric ? q.scales : 0;
  }
  q.residual_floats = (n - q.n_quant) * dim;
  return q;
}

// Header of a serialised store: kind, bits, group, residual (u32 each),
// rows (u64), dim (u32).
void PutHeader(std::string* out, const RowCodecSpec& spec, int64_t n, int dim) {
  PutU32(out, static_cast<uint32_t>(spec.kind));
  PutU32(out, static_cast<uint32_t>(spec.bits));
  PutU32(out, static_cast<uint32_t>(spec.group));
  PutU32(out, static_cast<uint32_t>(spec.residual));
  PutU64(out, static_cast<uint64_t>(n));
  PutU32(out, static_cast<uint32_t>(dim));
}

// Rows [0, n_quant) quantised, [n_quant, n) kept as f32.
class QuantRowStore final : public RowStore {
 public:
  QuantRowStore(const RowCodecSpec& spec, const float* rows, int64_t n, int dim)
      : QuantRowStore(spec, n, dim, LayoutOf(spec, n, dim).n_quant) {
    QuantiseInto(rows, 0, n_quant_);
    residual_.assign(rows + n_quant_ * dim, rows + n * dim);
  }

  // RowStore::Rebuild for a quantised spec (see row_codec.h).
  static std::unique_ptr<RowStore> Rebuild(const RowStore& src, std::span<const int64_t> keep,
                                           const float* new_rows, int64_t m,
                                           const RowCodecSpec& spec);

  int64_t rows() const override { return n_; }
  int dim() const override { return dim_; }

  void Decode(int64_t i, float* out) const override { DecodeRows(i, 1, out); }

  // Attention over a non-CPU backend (and CompressedSequenceKv with
  // set_fused_attention(false)) decodes every compressed row of every layer
  // for every draft step through here: the codes of a run of rows are
  // unpacked at once, then each row is one tight loop per group. The fused
  // kernels (kernels/quantized_kv.h) compute each element with the same
  // expression, in registers. The
  // arithmetic per element is that of the format (row_codec_test checks it
  // bit for bit against a plain decoder of the stored form).
  void DecodeRows(int64_t first, int64_t n, float* out) const override {
    const int64_t quantised = std::clamp<int64_t>(n_quant_ - first, 0, n);
    if (quantised > 0) {
      thread_local std::vector<uint8_t> codes;
      codes.resize(static_cast<size_t>(quantised * dim_));
      codes_.Unpack(first * dim_, quantised * dim_, codes.data());
      for (int64_t r = 0; r < quantised; ++r) {
        DecodeQuantised(first + r, &codes[static_cast<size_t>(r * dim_)], out + r * dim_);
      }
    }
    if (quantised < n) {
      std::memcpy(out + quantised * dim_, &residual_[(first + quantised - n_quant_) * dim_],
                  static_cast<size_t>((n - quantised) * dim_) * sizeof(float));
    }
  }

  // From serialised parts; sizes already checked against LayoutOf(spec, n, dim).
  QuantRowStore(const RowCodecSpec& spec, int64_t n, int dim, const QuantLayout& layout,
                PackedCodes codes, std::vector<float> scale, std::vector<float> zero,
                std::vector<float> residual)
      : spec_(spec),
        n_(n),
        dim_(dim),
        group_(layout.group),
        n_quant_(layout.n_quant),
        codes_(std::move(codes)),
        scale_(std::move(scale)),
        zero_(std::move(zero)),
        residual_(std::move(residual)) {}

  const float* RowIfF32(int64_t i) const override {
    return i >= n_quant_ ? &residual_[(i - n_quant_) * dim_] : nullptr;
  }

  kernels::QuantizedKvRows QuantizedRows() const override {
    using Layout = kernels::QuantizedKvRows::Layout;
    kernels::QuantizedKvRows v;
    v.layout = spec_.kind == Kind::kPerTokenSymmetric    ? Layout::kPerTokenSymmetric
               : spec_.kind == Kind::kPerTokenAsymmetric ? Layout::kPerTokenAsymmetric
                                                         : Layout::kPerChannelAsymmetric;
    v.bits = spec_.bits;
    v.dim = dim_;
    v.group = group_;
    v.rows = n_quant_;
    v.codes = codes_.raw().data();
    v.scales = scale_.data();
    v.zeros = zero_.empty() ? nullptr : zero_.data();
    return v;
  }

  void AppendSerialized(std::string* out) const override {
    PutHeader(out, spec_, n_, dim_);
    out->append(reinterpret_cast<const char*>(codes_.raw().data()), codes_.raw().size());
    PutFloats(out, scale_);
    PutFloats(out, zero_);
    PutRows(out, residual_);
  }

  int64_t bytes() const override {
    return codes_.bytes() + static_cast<int64_t>((scale_.size() + zero_.size()) * sizeof(float) +
                                                 residual_.size() * sizeof(float));
  }

 private:
  // Quantised row i from its unpacked codes.
  void DecodeQuantised(int64_t i, const uint8_t* codes, float* out) const {
    if (spec_.kind == Kind::kPerChannelAsymmetric) {
      const float* scale = &scale_[(i / group_) * dim_];
      const float* zero = &zero_[(i / group_) * dim_];
      for (int c = 0; c < dim_; ++c) out[c] = static_cast<float>(codes[c]) * scale[c] + zero[c];
      return;
    }
    const int64_t groups_per_row = (dim_ + group_ - 1) / group_;
    const int half = (1 << (spec_.bits - 1)) - 1;
    for (int64_t gi = 0; gi < groups_per_row; ++gi) {
      const int64_t g = i * groups_per_row + gi;
      const int begin = static_cast<int>(gi * group_);
      const int end = std::min(dim_, begin + group_);
      const float scale = scale_[g];
      if (spec_.kind == Kind::kPerTokenSymmetric) {
        for (int c = begin; c < end; ++c) {
          out[c] = static_cast<float>(static_cast<int>(codes[c]) - half) * scale;
        }
      } else {
        const float zero = zero_[g];
        for (int c = begin; c < end; ++c) out[c] = static_cast<float>(codes[c]) * scale + zero;
      }
    }
  }

  // Sized for n rows of which the first n_quant are quantised (codes, scales
  // and zero points zeroed; residual rows not yet set).
  QuantRowStore(const RowCodecSpec& spec, int64_t n, int dim, int64_t n_quant)
      : spec_(spec), n_(n), dim_(dim), n_quant_(n_quant), codes_(spec.bits, n_quant * dim) {
    group_ = spec.group > 0 ? spec.group : (spec.kind == Kind::kPerChannelAsymmetric ? 1 : dim);
    if (spec.kind == Kind::kPerChannelAsymmetric) {
      scale_.resize((n_quant_ / group_) * dim);
      zero_.resize(scale_.size());
    } else {
      const int64_t groups_per_row = (dim + group_ - 1) / group_;
      scale_.resize(n_quant_ * groups_per_row);
      if (spec.kind == Kind::kPerTokenAsymmetric) zero_.resize(scale_.size());
    }
  }

  // Quantises `count` rows (row-major, dim_ floats each) into stored rows
  // [row0, row0 + count). Per-channel: row0 and count are multiples of the
  // token group. Every group / row is quantised on its own, so encoding a
  // store in pieces gives the same codes as encoding it at once.
  void QuantiseInto(const float* rows, int64_t row0, int64_t count) {
    const RowCodecSpec& spec = spec_;
    const int dim = dim_, group = group_;
    const uint32_t max_code = (1u << spec.bits) - 1u;
    if (spec.kind == Kind::kPerChannelAsymmetric) {
      // One (scale, zero) per channel per group of `group` rows. Each
      // channel's min and max run over the group's rows in order, as one
      // chain per channel (so NaNs and signed zeros land as they always
      // did), the channels side by side; then a row's codes at once.
      const int64_t groups = count / group, g0 = row0 / group;
      std::vector<float> lo(static_cast<size_t>(dim)), hi(static_cast<size_t>(dim));
      std::vector<uint8_t> row_codes(static_cast<size_t>(dim));
      for (int64_t g = 0; g < groups; ++g) {
        const float* block = rows + g * group * dim;
        std::copy_n(block, dim, lo.data());
        std::copy_n(block, dim, hi.data());
        for (int r = 0; r < group; ++r) {
          for (int c = 0; c < dim; ++c) {
            const float x = block[int64_t{r} * dim + c];
            lo[c] = std::min(lo[c], x);
            hi[c] = std::max(hi[c], x);
          }
        }
        float* scale = &scale_[(g0 + g) * dim];
        for (int c = 0; c < dim; ++c) scale[c] = (hi[c] - lo[c]) / static_cast<float>(max_code);
        std::copy_n(lo.data(), dim, &zero_[(g0 + g) * dim]);
        for (int r = 0; r < group; ++r) {
          EncodeAsymmetricPerValue(block + int64_t{r} * dim, scale, lo.data(), dim, max_code,
                                   row_codes.data());
          codes_.SetRun((row0 + g * group + r) * dim, row_codes.data(), dim);
        }
      }
      return;
    }
    const int64_t groups_per_row = (dim + group - 1) / group;
    const kv_internal::Int8Encoder& int8 = Int8EncoderForThisCpu();
    for (int64_t row = 0; row < count; ++row) {
      const int64_t out_row = row0 + row;
      for (int64_t g = 0; g < groups_per_row; ++g) {
        const int c0 = static_cast<int>(g * group), c1 = std::min(dim, c0 + group);
        const float* x = rows + row * dim;
        if (spec.kind == Kind::kPerTokenSymmetric) {
          // Symmetric: codes in [-(2^(b-1)-1), 2^(b-1)-1], stored offset.
          const int half = (1 << (spec.bits - 1)) - 1;
          const float scale = int8.abs_max(x + c0, c1 - c0) / static_cast<float>(half);
          scale_[out_row * groups_per_row + g] = scale;
          if (spec.bits == 8) {
            int8.encode(x + c0, c1 - c0, scale, half, codes_.Codes8At(out_row * dim + c0));
            continue;
          }
          const float hi = static_cast<float>(half);
          for (int c = c0; c < c1; ++c) {
            const float q = scale > 0.0f ? NearestInRange(x[c] / scale, -hi, hi) : 0.0f;
            codes_.Set(out_row * dim + c, static_cast<uint32_t>(static_cast<int>(q) + half));
          }
        } else {
          float lo = x[c0], hi = x[c0];
          for (int c = c0; c < c1; ++c) {
            lo = std::min(lo, x[c]);
            hi = std::max(hi, x[c]);
          }
          const float scale = (hi - lo) / static_cast<float>(max_code);
          scale_[out_row * groups_per_row + g] = scale;
          zero_[out_row * groups_per_row + g] = lo;
          uint8_t group_codes[kMaxGroupCodes];
          for (int c = c0; c < c1; c += kMaxGroupCodes) {
            const int n = std::min(c1 - c, kMaxGroupCodes);
            EncodeAsymmetricGroup(x + c, scale, lo, n, max_code, group_codes);
            codes_.SetRun(out_row * dim + c, group_codes, n);
          }
        }
      }
    }
  }

  RowCodecSpec spec_;
  int64_t n_;
  int dim_;
  int group_ = 1;
  int64_t n_quant_ = 0;
  PackedCodes codes_;
  std::vector<float> scale_, zero_;
  std::vector<float> residual_;
};

class F32RowStore final : public RowStore {
 public:
  F32RowStore(const float* rows, int64_t n, int dim) : n_(n), dim_(dim), data_(rows, rows + n * dim) {}
  int64_t rows() const override { return n_; }
  int dim() const override { return dim_; }
  void Decode(int64_t i, float* out) const override {
    std::memcpy(out, &data_[i * dim_], dim_ * sizeof(float));
  }
  void DecodeRows(int64_t first, int64_t n, float* out) const override {
    std::memcpy(out, &data_[first * dim_], static_cast<size_t>(n * dim_) * sizeof(float));
  }
  F32RowStore(int64_t n, int dim, std::vector<float> data)
      : n_(n), dim_(dim), data_(std::move(data)) {}
  const float* RowIfF32(int64_t i) const override { return &data_[i * dim_]; }
  kernels::QuantizedKvRows QuantizedRows() const override {
    kernels::QuantizedKvRows v;
    v.dim = dim_;
    return v;  // no quantised rows
  }
  int64_t bytes() const override { return static_cast<int64_t>(data_.size() * sizeof(float)); }
  void AppendSerialized(std::string* out) const override {
    PutHeader(out, RowCodecSpec::F32(), n_, dim_);
    PutRows(out, data_);
  }

 private:
  int64_t n_;
  int dim_;
  std::vector<float> data_;
};

std::unique_ptr<RowStore> QuantRowStore::Rebuild(const RowStore& src, std::span<const int64_t> keep,
                                                 const float* new_rows, int64_t m,
                                                 const RowCodecSpec& spec) {
  const int dim = src.dim();
  const int group =
      spec.group > 0 ? spec.group : (spec.kind == Kind::kPerChannelAsymmetric ? 1 : dim);
  const auto* q = dynamic_cast<const QuantRowStore*>(&src);
  const bool same_format = q != nullptr && q->spec_.kind == spec.kind &&
                           q->spec_.bits == spec.bits && q->group_ == group;
  const int64_t kept = static_cast<int64_t>(keep.size());
  // Rows whose codes carry over unchanged: every kept quantised row of a
  // per-token format; for per-channel keys only whole token groups from row 0
  // that lost no row (a group's scale covers all of its rows).
  int64_t preserved = 0;
  if (same_format) {
    if (spec.kind == Kind::kPerChannelAsymmetric) {
      while (preserved + group <= q->n_quant_ && preserved + group <= kept &&
             keep[preserved + group - 1] == preserved + group - 1) {
        preserved += group;
      }
    } else {
      while (preserved < kept && keep[preserved] < q->n_quant_) ++preserved;
    }
  }
  // Everything else is re-encoded: the kept rows after the preserved ones
  // (decoded: exact for f32 rows) and the new rows.
  const int64_t pool_n = kept - preserved + m;
  std::vector<float> pool(static_cast<size_t>(pool_n) * dim);
  for (int64_t i = preserved; i < kept; ++i) src.Decode(keep[i], &pool[(i - preserved) * dim]);
  if (m > 0) std::copy_n(new_rows, m * dim, &pool[(kept - preserved) * dim]);
  const int64_t n = preserved + pool_n;
  int64_t n_quant = std::max<int64_t>(0, n - spec.residual);
  if (spec.kind == Kind::kPerChannelAsymmetric) n_quant -= n_quant % group;
  n_quant = std::max(n_quant, preserved);  // quantised rows are never un-quantised
  // The stored spec must reproduce the layout (LayoutOf): keep the method's
  // residual when it does, so that an append-only rebuild is byte-identical
  // to encoding all rows at once; otherwise record the actual f32 count.
  RowCodecSpec stored = spec;
  if (LayoutOf(spec, n, dim).n_quant != n_quant) stored.residual = static_cast<int>(n - n_quant);
  std::unique_ptr<QuantRowStore> out(new QuantRowStore(stored, n, dim, n_quant));
  if (preserved > 0) {
    if (spec.kind == Kind::kPerChannelAsymmetric) {
      for (int64_t i = 0; i < preserved * dim; ++i) out->codes_.Set(i, q->codes_.Get(i));
      const int64_t params = (preserved / group) * dim;
      std::copy_n(q->scale_.begin(), params, out->scale_.begin());
      std::copy_n(q->zero_.begin(), params, out->zero_.begin());
    } else {
      const int64_t gpr = (dim + group - 1) / group;
      for (int64_t r = 0; r < preserved; ++r) {
        const int64_t from = keep[r];
        for (int c = 0; c < dim; ++c) out->codes_.Set(r * dim + c, q->codes_.Get(from * dim + c));
        std::copy_n(q->scale_.begin() + from * gpr, gpr, out->scale_.begin() + r * gpr);
        if (!q->zero_.empty()) {
          std::copy_n(q->zero_.begin() + from * gpr, gpr, out->zero_.begin() + r * gpr);
        }
      }
    }
  }
  out->QuantiseInto(pool.data(), preserved, n_quant - preserved);
  out->residual_.assign(pool.begin() + (n_quant - preserved) * dim, pool.end());
  return out;
}

}  // namespace

absl::Status RowCodecSpec::Validate(int dim) const {
  if (kind == Kind::kF32) return absl::OkStatus();
  if (bits != 2 && bits != 4 && bits != 8) {
    return absl::InvalidArgumentError(absl::StrCat("bits must be 2, 4 or 8, got ", bits));
  }
  if (group < 0) return absl::InvalidArgumentError(absl::StrCat("group must be >= 0, got ", group));
  if (kind != Kind::kPerChannelAsymmetric && group > dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("channel group ", group, " is larger than head_dim ", dim));
  }
  if (residual < 0) {
    return absl::InvalidArgumentError(absl::StrCat("residual must be >= 0, got ", residual));
  }
  return absl::OkStatus();
}

std::string RowCodecSpec::DebugString() const {
  switch (kind) {
    case Kind::kF32:
      return "f32";
    case Kind::kPerTokenSymmetric:
      return absl::StrCat("int", bits, "-per-token(group=", group, ",residual=", residual, ")");
    case Kind::kPerTokenAsymmetric:
      return absl::StrCat("uint", bits, "-per-token(group=", group, ",residual=", residual, ")");
    case Kind::kPerChannelAsymmetric:
      return absl::StrCat("uint", bits, "-per-channel(group=", group, ",residual=", residual, ")");
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Encode(const RowCodecSpec& spec,
                                                           const float* rows, int64_t n, int dim) {
  if (auto s = spec.Validate(dim); !s.ok()) return s;
  if (n < 0 || dim <= 0) return absl::InvalidArgumentError("RowStore::Encode: bad shape");
  if (spec.kind == RowCodecSpec::Kind::kF32) {
    return std::unique_ptr<RowStore>(std::make_unique<F32RowStore>(rows, n, dim));
  }
  return std::unique_ptr<RowStore>(std::make_unique<QuantRowStore>(spec, rows, n, dim));
}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Rebuild(const RowStore& src,
                                                            std::span<const int64_t> keep,
                                                            const float* new_rows, int64_t m,
                                                            const RowCodecSpec& spec) {
  const int dim = src.dim();
  if (absl::Status s = spec.Validate(dim); !s.ok()) return s;
  if (m < 0 || (m > 0 && new_rows == nullptr)) {
    return absl::InvalidArgumentError("RowStore::Rebuild: bad new rows");
  }
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || keep[i] >= src.rows() || (i > 0 && keep[i] <= keep[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RowStore::Rebuild: kept rows must be increasing and inside [0, ", src.rows(), ")"));
    }
  }
  if (spec.kind == RowCodecSpec::Kind::kF32) {
    const int64_t n = static_cast<int64_t>(keep.size()) + m;
    std::vector<float> data(static_cast<size_t>(n) * dim);
    for (size_t i = 0; i < keep.size(); ++i) src.Decode(keep[i], &data[i * dim]);
    if (m > 0) std::copy_n(new_rows, m * dim, &data[keep.size() * dim]);
    return std::unique_ptr<RowStore>(std::make_unique<F32RowStore>(n, dim, std::move(data)));
  }
  return QuantRowStore::Rebuild(src, keep, new_rows, m, spec);
}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Deserialize(std::string_view bytes,
                                                                size_t* offset) {
  // Bounds keep every size product below 2^62 (no overflow) before any
  // allocation: rows < 2^31, dim < 2^20, bits <= 32.
  constexpr uint64_t kMaxRows = std::numeric_limits<int32_t>::max();
  constexpr uint32_t kMaxDim = 1u << 20;
  Reader r(bytes, *offset);
  uint32_t kind = 0, bits = 0, group = 0, residual = 0, dim = 0;
  uint64_t n = 0;
  if (!r.U32(&kind) || !r.U32(&bits) || !r.U32(&group) || !r.U32(&residual) || !r.U64(&n) ||
      !r.U32(&dim)) {
    return absl::InvalidArgumentError("serialised row store: truncated header");
  }
  if (kind > static_cast<uint32_t>(Kind::kPerChannelAsymmetric)) {
    return absl::InvalidArgumentError(absl::StrCat("serialised row store: unknown kind ", kind));
  }
  if (n > kMaxRows || dim == 0 || dim > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("serialised row store: bad shape rows=", n, " dim=", dim));
  }
  RowCodecSpec spec;
  spec.kind = static_cast<Kind>(kind);
  spec.bits = static_cast<int>(std::min<uint32_t>(bits, 1024));
  spec.group = static_cast<int>(std::min<uint32_t>(group, std::numeric_limits<int32_t>::max()));
  spec.residual =
      static_cast<int>(std::min<uint32_t>(residual, std::numeric_limits<int32_t>::max()));
  const int d = static_cast<int>(dim);
  const int64_t rows = static_cast<int64_t>(n);
  if (spec.kind == Kind::kF32) {
    if (bits != 32 || group != 0 || residual != 0) {
      return absl::InvalidArgumentError(absl::StrCat("serialised row store: f32 with bits=", bits,
                                                     " group=", group, " residual=", residual,
                                                     " (expected 32, 0, 0)"));
    }
    std::vector<float> data;
    if (absl::Status s = r.Rows(rows * d, &data); !s.ok()) return s;
    *offset = r.offset();
    return std::unique_ptr<RowStore>(std::make_unique<F32RowStore>(rows, d, std::move(data)));
  }
  if (bits != static_cast<uint32_t>(spec.bits) || group != static_cast<uint32_t>(spec.group) ||
      residual != static_cast<uint32_t>(spec.residual)) {
    return absl::InvalidArgumentError("serialised row store: spec field out of range");
  }
  if (absl::Status s = spec.Validate(d); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("serialised row store: ", s.message()));
  }
  const QuantLayout layout = LayoutOf(spec, rows, d);
  // The residual rows' own block is checked by Reader::Rows (its width
  // depends on its dtype); at least 2 bytes a value either way.
  const uint64_t need = static_cast<uint64_t>(layout.code_bytes) +
                        sizeof(float) * static_cast<uint64_t>(layout.scales + layout.zeros) +
                        sizeof(uint32_t) + 2 * static_cast<uint64_t>(layout.residual_floats);
  if (r.remaining() < need) {
    return absl::InvalidArgumentError(absl::StrCat("serialised row store (", spec.DebugString(),
                                                   ", ", rows, " rows of ", d, "): needs ", need,
                                                   " bytes, ", r.remaining(), " left"));
  }
  std::vector<uint8_t> codes;
  std::vector<float> scale, zero, rest;
  r.Bytes(layout.code_bytes, &codes);
  r.Floats(layout.scales, &scale);
  r.Floats(layout.zeros, &zero);
  if (absl::Status s = r.Rows(layout.residual_floats, &rest); !s.ok()) return s;
  *offset = r.offset();
  return std::unique_ptr<RowStore>(std::make_unique<QuantRowStore>(
      spec, rows, d, layout, PackedCodes::FromRaw(spec.bits, std::move(codes)), std::move(scale),
      std::move(zero), std::move(rest)));
}

namespace kv_internal {

const Int8Encoder* Int8EncoderFor(kernels::SimdLevel level) {
  static const Int8Encoder baseline{AbsMaxBaseline, EncodeBaseline};
#if defined(__x86_64__)
  static const Int8Encoder avx2{AbsMaxAvx2, EncodeAvx2};
  static const Int8Encoder avx512{AbsMaxAvx512, EncodeAvx512};
  __builtin_cpu_init();
  switch (level) {
    case kernels::SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f") ? &avx512 : nullptr;
    case kernels::SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") ? &avx2 : nullptr;
    case kernels::SimdLevel::kScalar:
      break;
  }
#endif
  return level == kernels::SimdLevel::kScalar ? &baseline : nullptr;
}

}  // namespace kv_internal
}  // namespace vc
