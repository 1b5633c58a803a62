#include "kernels/quantized.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"
#include "kernels/cpu/internal/quant_ops.h"

namespace vc::kernels {
namespace {

const cpu::QuantOps& QuantOpsFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      if (cpu::QuantAvx512Ops() != nullptr) return *cpu::QuantAvx512Ops();
      [[fallthrough]];
    case SimdLevel::kAvx2:
      if (cpu::QuantAvx2Ops() != nullptr) return *cpu::QuantAvx2Ops();
      [[fallthrough]];
    case SimdLevel::kScalar:
      break;
  }
  return cpu::QuantScalarOps();
}

// Symmetric round-to-nearest: the scale maps max |w| onto `qmax`; an all-zero
// range gets scale 0 and all-zero codes.
float ScaleFor(const float* w, int64_t n, int qmax) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m / static_cast<float>(qmax);
}

int Code(float w, float scale, int qmin, int qmax) {
  if (scale == 0.0f || !std::isfinite(w)) return 0;
  const float r = std::nearbyint(w / scale);
  return static_cast<int>(std::clamp(r, static_cast<float>(qmin), static_cast<float>(qmax)));
}

}  // namespace

absl::StatusOr<WeightFormat> ParseWeightFormat(std::string_view name) {
  if (name == "f32") return WeightFormat::kF32;
  if (name == "int8") return WeightFormat::kInt8;
  if (name == "int4") return WeightFormat::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("weight format '", std::string(name), "': expected f32, int8 or int4"));
}

std::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

absl::StatusOr<QuantizedMatrix> Quantize(const float* w, int64_t out, int64_t in,
                                         WeightFormat format, int group) {
  if (out < 1 || in < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot quantise a ", out, " x ", in, " matrix"));
  }
  QuantizedMatrix m;
  m.format = format;
  m.out = out;
  m.in = in;
  m.padded_in = (in + 15) / 16 * 16;
  switch (format) {
    case WeightFormat::kF32:
      return absl::InvalidArgumentError("f32 weights are not quantised");
    case WeightFormat::kInt8: {
      m.groups = 1;
      m.data.assign(static_cast<size_t>(out * m.padded_in), 0);
      m.scales.resize(static_cast<size_t>(out));
      for (int64_t o = 0; o < out; ++o) {
        const float* row = w + o * in;
        const float s = ScaleFor(row, in, 127);
        m.scales[o] = s;
        for (int64_t i = 0; i < in; ++i) {
          m.data[o * m.padded_in + i] = static_cast<uint8_t>(static_cast<int8_t>(Code(row[i], s, -127, 127)));
        }
      }
      return m;
    }
    case WeightFormat::kInt4: {
      if (group < 16 || group % 16 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("int4 group size must be a positive multiple of 16, got ", group));
      }
      m.group = group;
      m.groups = (in + group - 1) / group;
      const int64_t row_bytes = m.padded_in / 2;
      m.data.assign(static_cast<size_t>(out * row_bytes), 0x88);  // code 0 in both nibbles
      m.scales.resize(static_cast<size_t>(out * m.groups));
      for (int64_t o = 0; o < out; ++o) {
        const float* row = w + o * in;
        uint8_t* bytes = &m.data[o * row_bytes];
        for (int64_t g = 0; g < m.groups; ++g) {
          const int64_t i0 = g * group, i1 = std::min(in, i0 + group);
          const float s = ScaleFor(row + i0, i1 - i0, 7);
          m.scales[o * m.groups + g] = s;
          for (int64_t i = i0; i < i1; ++i) {
            const uint8_t nibble = static_cast<uint8_t>(Code(row[i], s, -8, 7) + 8);
            const int64_t b = i / 16, j = i % 16;
            uint8_t& byte = bytes[b * 8 + j % 8];
            byte = j < 8 ? static_cast<uint8_t>((byte & 0xF0) | nibble)
                         : static_cast<uint8_t>((byte & 0x0F) | (nibble << 4));
          }
        }
      }
      return m;
    }
  }
  return absl::InvalidArgumentError("unknown weight format");
}

void QuantizedMatmul(SimdLevel level, ThreadPool* pool, const float* x, int64_t tokens,
                     const QuantizedMatrix& w, const float* bias, float* y) {
  if (tokens <= 0) return;
  const cpu::QuantOps& ops = QuantOpsFor(level);
  // The kernels read whole 16-element blocks: pad x with zeros when `in` is
  // not a multiple of 16 (as the definition pads it).
  const float* xs = x;
  thread_local std::vector<float> padded;
  if (w.padded_in != w.in) {
    padded.assign(static_cast<size_t>(tokens * w.padded_in), 0.0f);
    for (int64_t t = 0; t < tokens; ++t) std::copy_n(x + t * w.in, w.in, &padded[t * w.padded_in]);
    xs = padded.data();
  }
  auto rows = [&](int64_t o0, int64_t o1) {
    if (w.format == WeightFormat::kInt8) {
      ops.int8_rows(xs, tokens, w.padded_in, reinterpret_cast<const int8_t*>(w.data.data()),
                    w.scales.data(), bias, w.padded_in, o0, o1, w.out, y);
    } else {
      ops.int4_rows(xs, tokens, w.padded_in, w.data.data(), w.scales.data(), w.groups, w.group,
                    bias, w.padded_in, o0, o1, w.out, y);
    }
  };
  // Split only over output rows (never a value's own sum); runs of 16 rows
  // and at least ~64K multiply-adds each keep small products inline.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (w.out + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (kBlock * w.padded_in * tokens));
  if (pool == nullptr || pool->num_threads() == 1 || blocks <= grain) {
    rows(0, w.out);
    return;
  }
  pool->ParallelFor(blocks, grain, [&](int64_t b0, int64_t b1) {
    rows(b0 * kBlock, std::min(w.out, b1 * kBlock));
  });
}

}  // namespace vc::kernels
