// Element types of weights and KV rows (f32, bf16, f16), and the exact
// conversions between them that every path shares (docs/numerics.md,
// "Model dtype"): widening is exact; narrowing rounds to nearest, ties to
// even, so the same f32 value always gives the same 16 bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace vc {

// The numeric values are written into on-disk and on-wire formats.
enum class Dtype : uint8_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

inline constexpr int DtypeBytes(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

inline constexpr const char* DtypeName(Dtype d) {
  switch (d) {
    case Dtype::kF32:
      return "f32";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kF16:
      return "f16";
  }
  return "?";
}

// Accepts the names above; the wire byte of an unknown dtype is rejected by
// the decoders with this, never cast blindly.
inline std::optional<Dtype> DtypeFromByte(uint8_t b) {
  if (b > static_cast<uint8_t>(Dtype::kF16)) return std::nullopt;
  return static_cast<Dtype>(b);
}

inline std::optional<Dtype> ParseDtype(std::string_view name) {
  if (name == "f32") return Dtype::kF32;
  if (name == "bf16") return Dtype::kBf16;
  if (name == "f16") return Dtype::kF16;
  return std::nullopt;
}

inline float Bf16BitsToF32(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;  // bf16 is the top half of an f32
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float F16BitsToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else {
    // Zero or subnormal: mant * 2^-24, exact in f32.
    const float magnitude = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -magnitude : magnitude;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even on the 16 dropped bits; NaN stays a (quiet) NaN.
inline uint16_t F32ToBf16Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

// Round to nearest even, with f16's subnormals and overflow to infinity.
inline uint16_t F32ToF16Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Below f16's smallest normal (2^-14): a multiple of 2^-24. Scaling by
    // 2^24 is exact and nearbyint rounds to nearest even (default mode).
    float a;
    std::memcpy(&a, &abs, 4);
    const float m = std::nearbyint(std::ldexp(a, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(m));  // 1024 = smallest normal
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to even
  // (a carry into the exponent is the correct result).
  const uint32_t lsb = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xfffu + lsb;
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

inline float WidenBits(uint16_t h, Dtype d) {
  return d == Dtype::kBf16 ? Bf16BitsToF32(h) : F16BitsToF32(h);
}

inline uint16_t NarrowBits(float f, Dtype d) {
  return d == Dtype::kBf16 ? F32ToBf16Bits(f) : F32ToF16Bits(f);
}

// The value `f` takes when stored in dtype d (identity for f32).
inline float RoundToDtype(float f, Dtype d) {
  return d == Dtype::kF32 ? f : WidenBits(NarrowBits(f, d), d);
}

}  // namespace vc
