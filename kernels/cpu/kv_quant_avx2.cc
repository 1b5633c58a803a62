// AVX2+FMA path of the fused attention over quantised K/V rows
// (kernels/quantized_kv.h): the 16 logical lanes live in two ymm registers
// (lanes 0-7 and 8-15); a block of 16 codes is unpacked in registers
// (variable shifts) and widened to f32 exactly. Compiled with -mavx2 -mfma;
// only called after DetectSimdLevel() saw both.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/avx2_lanes.h"
#include "kernels/cpu/internal/kv_quant_ops.h"

namespace vc::kernels::cpu {
namespace {

struct Avx2Vec {
  struct F {
    __m256 lo, hi;
  };
  struct I {
    __m256i lo, hi;
  };
  // Lanes [0, m) of an 8-lane half set (all bits), m clamped to [0, 8].
  static __m256i Mask8(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static F Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F Set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static F Load(const float* p, int m) {
    if (m == 16) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    return {_mm256_maskload_ps(p, Mask8(m)), _mm256_maskload_ps(p + 8, Mask8(m - 8))};
  }
  static void Store(float* p, F v, int m) {
    if (m == 16) {
      _mm256_storeu_ps(p, v.lo);
      _mm256_storeu_ps(p + 8, v.hi);
      return;
    }
    _mm256_maskstore_ps(p, Mask8(m), v.lo);
    _mm256_maskstore_ps(p + 8, Mask8(m - 8), v.hi);
  }
  static F Mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F Add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static F Fma(F a, F b, F c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static F KeepFirst(F v, int m) {
    return {_mm256_and_ps(v.lo, _mm256_castsi256_ps(Mask8(m))),
            _mm256_and_ps(v.hi, _mm256_castsi256_ps(Mask8(m - 8)))};
  }
  static __m256i Shifted(uint32_t w, __m256i shifts, int mask) {
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts),
                            _mm256_set1_epi32(mask));
  }
  template <int kBits>
  static I Unpack(const uint8_t* p) {
    if constexpr (kBits == 8) {
      return {_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
    } else if constexpr (kBits == 4) {
      // Code 2i is the low nibble of byte i, code 2i + 1 the high one.
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      const __m128i m = _mm_set1_epi8(0x0F);
      const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
      const __m128i codes = _mm_unpacklo_epi8(lo, hi);
      return {_mm256_cvtepu8_epi32(codes), _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))};
    } else {
      uint32_t w;
      std::memcpy(&w, p, sizeof(w));
      return {Shifted(w, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), 0x3),
              Shifted(w, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30), 0x3)};
    }
  }
  static I SubConst(I v, int c) {
    const __m256i k = _mm256_set1_epi32(c);
    return {_mm256_sub_epi32(v.lo, k), _mm256_sub_epi32(v.hi, k)};
  }
  static F ToFloat(I v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
  static float Reduce(F v) { return cpu::Reduce(v.lo, v.hi); }
};

}  // namespace

const KvQuantOps* KvQuantAvx2Ops() {
  static const KvQuantOps ops = KvQuantKernels<Avx2Vec>::Ops();
  return &ops;
}

}  // namespace vc::kernels::cpu
