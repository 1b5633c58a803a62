// AVX-512 path of the fused attention over quantised K/V rows
// (kernels/quantized_kv.h): one zmm register holds the 16 logical lanes; a
// block of 16 codes is unpacked in registers (variable shifts) and widened
// to f32 exactly. Compiled with -mavx512f; only called after
// DetectSimdLevel() saw AVX-512F.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/avx512_lanes.h"
#include "kernels/cpu/internal/kv_quant_ops.h"

namespace vc::kernels::cpu {
namespace {

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports falsely once inlined (see simd_avx512.cc).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

struct Avx512Vec {
  using F = __m512;
  using I = __m512i;
  static __mmask16 Mask(int m) { return static_cast<__mmask16>((1u << m) - 1u); }
  static F Zero() { return _mm512_setzero_ps(); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p, int m) {
    return m == 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(Mask(m), p);
  }
  static void Store(float* p, F v, int m) { _mm512_mask_storeu_ps(p, Mask(m), v); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F KeepFirst(F v, int m) { return _mm512_maskz_mov_ps(Mask(m), v); }
  template <int kBits>
  static I Unpack(const uint8_t* p) {
    if constexpr (kBits == 8) {
      return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else if constexpr (kBits == 4) {
      // Code 2i is the low nibble of byte i, code 2i + 1 the high one.
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      const __m128i m = _mm_set1_epi8(0x0F);
      const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
      return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    } else {
      uint32_t w;
      std::memcpy(&w, p, sizeof(w));
      const __m512i shifts =
          _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      return _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(w)), shifts),
                              _mm512_set1_epi32(0x3));
    }
  }
  static I SubConst(I v, int c) { return _mm512_sub_epi32(v, _mm512_set1_epi32(c)); }
  static F ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
  static float Reduce(F v) { return cpu::Reduce(v); }
  // out[r] = Reduce(acc[r]) * scale, the 8 trees interleaved.
  static void ReduceScaled8(const F (&acc)[8], float scale, float* out) {
    _mm256_storeu_ps(out, _mm256_mul_ps(cpu::Reduce8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5],
                                                     acc[6], acc[7]),
                                        _mm256_set1_ps(scale)));
  }
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

const KvQuantOps* KvQuantAvx512Ops() {
  static const KvQuantOps ops = KvQuantKernels<Avx512Vec>::Ops();
  return &ops;
}

}  // namespace vc::kernels::cpu
