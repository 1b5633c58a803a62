// The 16-bit KV and weight dtypes (common/base/dtype.h) against an
// independent reference: every bf16 and f16 bit pattern widens to the value
// its fields define (computed in double) and narrows back to the same bits,
// except a signalling NaN, which narrows to the quiet NaN of the same sign
// and payload (as PyTorch's conversions do, and the checkpoint converter
// matches).
#include "common/base/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace vc {
namespace {

// The value of a binary16/bfloat16 pattern with `mant_bits` of mantissa and
// the given exponent bias, from its fields (NaN for a NaN).
double Reference(uint16_t h, int mant_bits, int exp_bits, int bias) {
  const int sign = h >> 15;
  const int exp = (h >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = h & ((1 << mant_bits) - 1);
  double v;
  if (exp == (1 << exp_bits) - 1) {
    v = mant != 0 ? std::nan("") : INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -mant_bits), exp - bias);
  }
  return sign ? -v : v;
}

TEST(DtypeTest, EveryBf16AndF16PatternWidensToItsValueAndNarrowsBack) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float bf = WidenBits(h, Dtype::kBf16);
    const float hf = WidenBits(h, Dtype::kF16);
    const double bf_ref = Reference(h, 7, 8, 127);
    const double hf_ref = Reference(h, 10, 5, 15);
    if (std::isnan(bf_ref)) {
      ASSERT_TRUE(std::isnan(bf)) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(bf), bf_ref) << std::hex << i;
    }
    if (std::isnan(hf_ref)) {
      ASSERT_TRUE(std::isnan(hf)) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(hf), hf_ref) << std::hex << i;
    }
    const bool bf_snan = std::isnan(bf_ref) && (h & 0x40u) == 0;
    const bool hf_snan = std::isnan(hf_ref) && (h & 0x200u) == 0;
    ASSERT_EQ(NarrowBits(bf, Dtype::kBf16), bf_snan ? (h | 0x40u) : h) << "bf16 " << std::hex << i;
    ASSERT_EQ(NarrowBits(hf, Dtype::kF16), hf_snan ? (h | 0x200u) : h) << "f16 " << std::hex << i;
  }
}

TEST(DtypeTest, ANanWhosePayloadIsDroppedStaysANan) {
  // An f32 NaN with payload only in the low 13 (f16) / 16 (bf16) bits.
  const uint32_t bits = 0x7f800001u;
  float f;
  std::memcpy(&f, &bits, 4);
  EXPECT_TRUE(std::isnan(WidenBits(NarrowBits(f, Dtype::kF16), Dtype::kF16)));
  EXPECT_TRUE(std::isnan(WidenBits(NarrowBits(f, Dtype::kBf16), Dtype::kBf16)));
  EXPECT_TRUE(std::isnan(WidenBits(NarrowBits(-f, Dtype::kF16), Dtype::kF16)));
}

}  // namespace
}  // namespace vc
