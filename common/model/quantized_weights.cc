#include "common/model/quantized_weights.h"

#include "common/base/status_macros.h"

namespace vc {

absl::StatusOr<std::unique_ptr<QuantizedWeights>> QuantizedWeights::Create(
    const Model& model, const QuantizeOptions& options) {
  if (options.format == kernels::WeightFormat::kF32) {
    return absl::InvalidArgumentError("QuantizedWeights needs int8 or int4, not f32");
  }
  const ModelConfig& c = model.config();
  VC_RETURN_IF_ERROR(c.Validate());
  auto q = std::unique_ptr<QuantizedWeights>(new QuantizedWeights());
  q->options_ = options;
  q->config_ = c;
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  auto quantize = [&](const float* w, int64_t out, int64_t in) {
    return kernels::Quantize(w, out, in, options.format, options.int4_group);
  };
  for (const LayerWeights& lw : model.weights().layers) {
    QuantizedLayerWeights ql;
    VC_ASSIGN_OR_RETURN(ql.wq, quantize(lw.wq, qd, dim));
    VC_ASSIGN_OR_RETURN(ql.wk, quantize(lw.wk, kvd, dim));
    VC_ASSIGN_OR_RETURN(ql.wv, quantize(lw.wv, kvd, dim));
    VC_ASSIGN_OR_RETURN(ql.wo, quantize(lw.wo, dim, qd));
    VC_ASSIGN_OR_RETURN(ql.w1, quantize(lw.w1, hid, dim));
    VC_ASSIGN_OR_RETURN(ql.w2, quantize(lw.w2, dim, hid));
    VC_ASSIGN_OR_RETURN(ql.w3, quantize(lw.w3, hid, dim));
    q->layers_.push_back(std::move(ql));
  }
  VC_ASSIGN_OR_RETURN(q->classifier_, quantize(model.weights().classifier, c.vocab_size, dim));
  return q;
}

int64_t QuantizedWeights::bytes() const {
  int64_t n = classifier_.bytes();
  for (const QuantizedLayerWeights& l : layers_) {
    n += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w1.bytes() + l.w2.bytes() +
         l.w3.bytes();
  }
  return n;
}

}  // namespace vc
