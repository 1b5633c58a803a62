// Private to kernels/: one table of the quantised-weight products per SIMD
// level (kernels/quantized.h states their numerics). Like simd_ops.h, each
// level is its own translation unit compiled with that level's -m flags.
#pragma once

#include <cstdint>

namespace vc::kernels::cpu {

// Output rows [o_begin, o_end) for `tokens` tokens: token t's input at
// x + t * ldx, padded_in floats (already zero-padded); y[t * ldy + o].
struct QuantOps {
  void (*int8_rows)(const float* x, int64_t tokens, int64_t ldx, const int8_t* q,
                    const float* scales, const float* bias, int64_t padded_in, int64_t o_begin,
                    int64_t o_end, int64_t ldy, float* y);
  // scales is [out][groups]; group is a multiple of 16.
  void (*int4_rows)(const float* x, int64_t tokens, int64_t ldx, const uint8_t* q,
                    const float* scales, int64_t groups, int group, const float* bias,
                    int64_t padded_in, int64_t o_begin, int64_t o_end, int64_t ldy, float* y);
};

// A tile's R rows' per-group state along the row (Src::Group: int4's scale
// or its 16 values; nothing for int8), for 16-element blocks visited in
// order: the state of group g is made once, when its first block comes, and
// g is counted rather than divided out of each block's index.
template <int R, class Src>
class GroupCursor {
 public:
  GroupCursor(const Src& src, int64_t o0) : src_(src), o0_(o0) {
    for (int r = 0; r < R; ++r) state_[r] = src.GroupOf(o0 + r, 0);
    if constexpr (Src::kGrouped) left_ = src.BlocksPerGroup();
  }
  const typename Src::Group& operator[](int r) const { return state_[r]; }
  // Called once the block at element i has been loaded: the next block's
  // group becomes current when it starts a new one.
  void Advance(int64_t i) {
    if constexpr (Src::kGrouped) {
      if (--left_ == 0 && i + 16 < src_.padded_in) {
        ++g_;
        left_ = src_.BlocksPerGroup();
        for (int r = 0; r < R; ++r) state_[r] = src_.GroupOf(o0_ + r, g_);
      }
    }
  }

 private:
  const Src& src_;
  const int64_t o0_;
  typename Src::Group state_[R];
  int64_t g_ = 0;
  int left_ = 0;
};

const QuantOps& QuantScalarOps();
const QuantOps* QuantAvx2Ops();    // null when not compiled in
const QuantOps* QuantAvx512Ops();  // null when not compiled in

}  // namespace vc::kernels::cpu
