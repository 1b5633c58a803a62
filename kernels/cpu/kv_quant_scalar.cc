// Portable path of the fused attention over quantised K/V rows
// (kernels/quantized_kv.h): the 16 logical lanes as a plain array.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/internal/kv_quant_ops.h"
#include "kernels/cpu/internal/simd_ops.h"

namespace vc::kernels::cpu {
namespace {

struct ScalarVec {
  struct F {
    float l[16];
  };
  struct I {
    int32_t l[16];
  };
  static F Zero() { return Set1(0.0f); }
  static F Set1(float x) {
    F v;
    for (float& l : v.l) l = x;
    return v;
  }
  static F Load(const float* p, int m) {
    F v;
    for (int l = 0; l < 16; ++l) v.l[l] = l < m ? p[l] : 0.0f;
    return v;
  }
  static void Store(float* p, const F& v, int m) {
    for (int l = 0; l < m; ++l) p[l] = v.l[l];
  }
  static F Mul(const F& a, const F& b) {
    F v;
    for (int l = 0; l < 16; ++l) v.l[l] = a.l[l] * b.l[l];
    return v;
  }
  static F Add(const F& a, const F& b) {
    F v;
    for (int l = 0; l < 16; ++l) v.l[l] = a.l[l] + b.l[l];
    return v;
  }
  static F Fma(const F& a, const F& b, const F& c) {
    F v;
    for (int l = 0; l < 16; ++l) v.l[l] = std::fma(a.l[l], b.l[l], c.l[l]);
    return v;
  }
  static F KeepFirst(F v, int m) {
    for (int l = m; l < 16; ++l) v.l[l] = 0.0f;
    return v;
  }
  template <int kBits>
  static I Unpack(const uint8_t* p) {
    I v;
    for (int l = 0; l < 16; ++l) {
      v.l[l] = (p[l * kBits / 8] >> ((l * kBits) % 8)) & ((1 << kBits) - 1);
    }
    return v;
  }
  static I SubConst(I v, int c) {
    for (int32_t& l : v.l) l -= c;
    return v;
  }
  static F ToFloat(const I& v) {
    F f;
    for (int l = 0; l < 16; ++l) f.l[l] = static_cast<float>(v.l[l]);
    return f;
  }
  static float Reduce(const F& v) { return ReduceLanes16(v.l); }
};

}  // namespace

const KvQuantOps& KvQuantScalarOps() {
  static const KvQuantOps ops = KvQuantKernels<ScalarVec>::Ops();
  return ops;
}

}  // namespace vc::kernels::cpu
