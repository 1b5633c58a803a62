// Portable ceilings, for CPUs without AVX2 (plain code, no -m flags).
#include <cmath>

#include "bench/ceilings.h"

namespace vc::bench {
namespace {
constexpr int kAcc = 8;
}

float ReadSumScalar(const float* p, int64_t n) {
  float a[kAcc] = {};
  for (int64_t i = 0; i + kAcc <= n; i += kAcc) {
    for (int k = 0; k < kAcc; ++k) a[k] += p[i + k];
  }
  float s = 0;
  for (float v : a) s += v;
  return s;
}

float FmaLoopScalar(int64_t iters) {
  float acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = 0.001f * static_cast<float>(k);
  for (int64_t it = 0; it < iters; ++it) {
    for (int k = 0; k < kAcc; ++k) acc[k] = std::fma(acc[k], 0.999f, 0.001f);
  }
  float s = 0;
  for (float v : acc) s += v;
  return s;
}

int64_t FmaFlopsPerIterScalar() { return int64_t{kAcc} * 2; }

}  // namespace vc::bench
