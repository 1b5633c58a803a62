// The public entry points of kernels/quantized_kv.h: CPU-only kernels, so the
// level dispatch lives beside the per-level tables it chooses from.
#include "kernels/quantized_kv.h"

#include "kernels/cpu/internal/kv_quant_ops.h"

namespace vc::kernels {
namespace {

const cpu::KvQuantOps& KvQuantOpsFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      if (cpu::KvQuantAvx512Ops() != nullptr) return *cpu::KvQuantAvx512Ops();
      [[fallthrough]];
    case SimdLevel::kAvx2:
      if (cpu::KvQuantAvx2Ops() != nullptr) return *cpu::KvQuantAvx2Ops();
      [[fallthrough]];
    case SimdLevel::kScalar:
      break;
  }
  return cpu::KvQuantScalarOps();
}

}  // namespace

void QuantizedScores(SimdLevel level, const float* q, const QuantizedKvRows& k, int64_t first,
                     int64_t n, float scale, float* scores) {
  if (n <= 0) return;
  KvQuantOpsFor(level).scores(q, k, first, n, scale, scores);
}

void QuantizedAccumulate(SimdLevel level, const float* p, const QuantizedKvRows& v, int64_t first,
                         int64_t n, float* out) {
  if (n <= 0) return;
  KvQuantOpsFor(level).accumulate(p, v, first, n, out);
}

}  // namespace vc::kernels
