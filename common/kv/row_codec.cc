#include "common/kv/row_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace vc {
namespace {

using Kind = RowCodecSpec::Kind;

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
  int64_t bytes() const { return static_cast<int64_t>(bytes_.size()); }

 private:
  int bits_;
  std::vector<uint8_t> bytes_;
};

// Rows [0, n_quant) quantised, [n_quant, n) kept as f32.
class QuantRowStore final : public RowStore {
 public:
  QuantRowStore(const RowCodecSpec& spec, const float* rows, int64_t n, int dim)
      : spec_(spec), n_(n), dim_(dim), codes_(spec.bits, 0) {
    const int group = spec.group > 0 ? spec.group : (spec.kind == Kind::kPerChannelAsymmetric ? 1 : dim);
    group_ = group;
    int64_t quantisable = std::max<int64_t>(0, n - spec.residual);
    if (spec.kind == Kind::kPerChannelAsymmetric) quantisable -= quantisable % group;
    n_quant_ = quantisable;
    codes_ = PackedCodes(spec.bits, n_quant_ * dim);
    const uint32_t max_code = (1u << spec.bits) - 1u;
    if (spec.kind == Kind::kPerChannelAsymmetric) {
      // One (scale, zero) per channel per group of `group` rows.
      const int64_t groups = n_quant_ / group;
      scale_.resize(groups * dim);
      zero_.resize(groups * dim);
      for (int64_t g = 0; g < groups; ++g) {
        for (int c = 0; c < dim; ++c) {
          float lo = rows[g * group * dim + c], hi = lo;
          for (int r = 0; r < group; ++r) {
            const float x = rows[(g * group + r) * dim + c];
            lo = std::min(lo, x);
            hi = std::max(hi, x);
          }
          const float scale = (hi - lo) / static_cast<float>(max_code);
          scale_[g * dim + c] = scale;
          zero_[g * dim + c] = lo;
          for (int r = 0; r < group; ++r) {
            const int64_t row = g * group + r;
            codes_.Set(row * dim + c, Encode(rows[row * dim + c], scale, lo, max_code));
          }
        }
      }
    } else {
      const int64_t groups_per_row = (dim + group - 1) / group;
      scale_.resize(n_quant_ * groups_per_row);
      if (spec.kind == Kind::kPerTokenAsymmetric) zero_.resize(n_quant_ * groups_per_row);
      for (int64_t row = 0; row < n_quant_; ++row) {
        for (int64_t g = 0; g < groups_per_row; ++g) {
          const int c0 = static_cast<int>(g * group), c1 = std::min(dim, c0 + group);
          const float* x = rows + row * dim;
          if (spec.kind == Kind::kPerTokenSymmetric) {
            // Symmetric: codes in [-(2^(b-1)-1), 2^(b-1)-1], stored offset.
            const int half = (1 << (spec.bits - 1)) - 1;
            float amax = 0.0f;
            for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[c]));
            const float scale = amax / static_cast<float>(half);
            scale_[row * groups_per_row + g] = scale;
            for (int c = c0; c < c1; ++c) {
              // A non-finite input (inf/nan scale or element) maps to code 0:
              // converting a NaN to int is undefined behaviour.
              const float r = scale > 0.0f ? std::nearbyint(x[c] / scale) : 0.0f;
              const float q = std::isnan(r) ? 0.0f : r;
              const int code = static_cast<int>(std::clamp(q, -static_cast<float>(half),
                                                           static_cast<float>(half)));
              codes_.Set(row * dim + c, static_cast<uint32_t>(code + half));
            }
          } else {
            float lo = x[c0], hi = x[c0];
            for (int c = c0; c < c1; ++c) {
              lo = std::min(lo, x[c]);
              hi = std::max(hi, x[c]);
            }
            const float scale = (hi - lo) / static_cast<float>(max_code);
            scale_[row * groups_per_row + g] = scale;
            zero_[row * groups_per_row + g] = lo;
            for (int c = c0; c < c1; ++c) codes_.Set(row * dim + c, Encode(x[c], scale, lo, max_code));
          }
        }
      }
    }
    residual_.assign(rows + n_quant_ * dim, rows + n * dim);
  }

  int64_t rows() const override { return n_; }
  int dim() const override { return dim_; }

  void Decode(int64_t i, float* out) const override {
    if (i >= n_quant_) {
      std::memcpy(out, &residual_[(i - n_quant_) * dim_], dim_ * sizeof(float));
      return;
    }
    if (spec_.kind == Kind::kPerChannelAsymmetric) {
      const int64_t g = i / group_;
      for (int c = 0; c < dim_; ++c) {
        out[c] = static_cast<float>(codes_.Get(i * dim_ + c)) * scale_[g * dim_ + c] + zero_[g * dim_ + c];
      }
      return;
    }
    const int64_t groups_per_row = (dim_ + group_ - 1) / group_;
    const int half = (1 << (spec_.bits - 1)) - 1;
    for (int c = 0; c < dim_; ++c) {
      const int64_t g = i * groups_per_row + c / group_;
      const uint32_t code = codes_.Get(i * dim_ + c);
      out[c] = spec_.kind == Kind::kPerTokenSymmetric
                   ? static_cast<float>(static_cast<int>(code) - half) * scale_[g]
                   : static_cast<float>(code) * scale_[g] + zero_[g];
    }
  }

  const float* RowIfF32(int64_t i) const override {
    return i >= n_quant_ ? &residual_[(i - n_quant_) * dim_] : nullptr;
  }

  int64_t bytes() const override {
    return codes_.bytes() + static_cast<int64_t>((scale_.size() + zero_.size()) * sizeof(float) +
                                                 residual_.size() * sizeof(float));
  }

 private:
  static uint32_t Encode(float x, float scale, float zero, uint32_t max_code) {
    if (!(scale > 0.0f)) return 0;
    const float q = std::nearbyint((x - zero) / scale);
    if (std::isnan(q)) return 0;  // non-finite input: casting NaN is undefined
    return static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>(max_code)));
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
  const float* RowIfF32(int64_t i) const override { return &data_[i * dim_]; }
  int64_t bytes() const override { return static_cast<int64_t>(data_.size() * sizeof(float)); }

 private:
  int64_t n_;
  int dim_;
  std::vector<float> data_;
};

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

}  // namespace vc
