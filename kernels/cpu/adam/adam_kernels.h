// The multi-tensor Adam step, written once over a vector type and compiled once per SIMD
// tier (formula in te_kernels/adam.h). All tensors are cut into chunks of kAdamChunkElements and one parallel loop walks every chunk of every tensor, so a param group of many
// small tensors still fills all threads with one fork/join. Each element is read and written
// once: 28 bytes per fp32 parameter (read p, g, m, v; write p, m, v). The state is updated
// in place (its lines are read anyway), so streaming stores would save nothing.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including adam_kernels.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// The step's constants, broadcast once per chunk into vectors of type W.
template <typename W>
struct AdamConstants {
  W one_minus_beta1, beta2, one_minus_beta2, eps, decay_factor, weight_decay, neg_step_size, bias_correction2_sqrt,
      inv_grad_scale;
  explicit AdamConstants(const AdamStepParams& s)
      : one_minus_beta1(W::broadcast(1.f - s.beta1)), beta2(W::broadcast(s.beta2)),
        one_minus_beta2(W::broadcast(1.f - s.beta2)), eps(W::broadcast(s.eps)),
        decay_factor(W::broadcast(1.f - s.lr * s.weight_decay)), weight_decay(W::broadcast(s.weight_decay)),
        neg_step_size(W::broadcast(-s.step_size)), bias_correction2_sqrt(W::broadcast(s.bias_correction2_sqrt)),
        inv_grad_scale(W::broadcast(s.inv_grad_scale)) {}
};

// Updates element(s) [i, i + W::kWidth) of one tensor.
template <typename W, bool kMaster, typename PT, typename GT>
inline void adam_update(const AdamStepParams& s, const AdamConstants<W>& c, const AdamTensor& t, int64_t i) {
  PT* param = static_cast<PT*>(t.param);
  W p = kMaster ? W::load(t.master + i) : W::load(param + i);
  W g = W::load(static_cast<const GT*>(t.grad) + i) * c.inv_grad_scale;
  if (!s.adam_w_mode) g = fmadd(p, c.weight_decay, g);  // L2: decay enters the moments
  W m = W::load(t.exp_avg + i);
  m = fmadd(g - m, c.one_minus_beta1, m);
  const W v = fmadd(g * g, c.one_minus_beta2, W::load(t.exp_avg_sq + i) * c.beta2);
  if (s.adam_w_mode) p = p * c.decay_factor;  // decoupled decay, before the Adam update
  // sqrt(v) / sqrt(bias_correction2) rather than sqrt(v / bias_correction2): PyTorch's order.
  const W denom = sqrt(v) / c.bias_correction2_sqrt + c.eps;
  p = fmadd(m / denom, c.neg_step_size, p);
  m.store(t.exp_avg + i);
  v.store(t.exp_avg_sq + i);
  if constexpr (kMaster) p.store(t.master + i);
  p.store(param + i);  // bf16/fp16 params: the master rounded once
}

// The four input streams are prefetched this many elements (1 KiB of fp32) ahead, once per
// 16 elements: with seven streams per thread the hardware prefetchers fall behind (25M fp32
// params on a 2-core Sapphire Rapids VM: 14.8-15.0 -> 14.0-14.2 ms per step). Prefetches
// past a tensor's end are harmless (they never fault).
constexpr int64_t kAdamPrefetchElements = 256;

template <bool kMaster, typename PT, typename GT>
void adam_range(const AdamStepParams& s, const AdamTensor& t, int64_t begin, int64_t end) {
  using Scalar = VecPortable<float, 1>;
  const AdamConstants<Vec> vector_constants(s);
  const AdamConstants<Scalar> scalar_constants(s);
  const GT* grad = static_cast<const GT*>(t.grad);
  // The param stream updated in place: the fp32 master, or the param itself.
  const char* param = kMaster ? reinterpret_cast<const char*>(t.master) : static_cast<const char*>(t.param);
  constexpr size_t kParamBytes = kMaster ? sizeof(float) : sizeof(PT);
  int64_t i = begin;
  for (; i + Vec::kWidth <= end; i += Vec::kWidth) {
    if (i % 16 == 0) {
      const int64_t ahead = i + kAdamPrefetchElements;
      __builtin_prefetch(grad + ahead);
      __builtin_prefetch(param + ahead * kParamBytes, 1);
      __builtin_prefetch(t.exp_avg + ahead, 1);
      __builtin_prefetch(t.exp_avg_sq + ahead, 1);
    }
    adam_update<Vec, kMaster, PT, GT>(s, vector_constants, t, i);
  }
  for (; i < end; ++i) adam_update<Scalar, kMaster, PT, GT>(s, scalar_constants, t, i);
}

template <bool kMaster, typename PT>
void adam_range_grad(const AdamStepParams& s, const AdamTensor& t, int64_t begin, int64_t end) {
  switch (t.grad_dtype) {
    case DType::kFloat32: return adam_range<kMaster, PT, float>(s, t, begin, end);
    case DType::kBFloat16: return adam_range<kMaster, PT, bf16_t>(s, t, begin, end);
    case DType::kFloat16: return adam_range<kMaster, PT, fp16_t>(s, t, begin, end);
    case DType::kFloat64: break;  // rejected by adam.cpp
  }
}

template <bool kMaster>
void adam_range_param(const AdamStepParams& s, const AdamTensor& t, int64_t begin, int64_t end) {
  switch (t.param_dtype) {
    case DType::kFloat32: return adam_range_grad<kMaster, float>(s, t, begin, end);
    case DType::kBFloat16: return adam_range_grad<kMaster, bf16_t>(s, t, begin, end);
    case DType::kFloat16: return adam_range_grad<kMaster, fp16_t>(s, t, begin, end);
    case DType::kFloat64: break;
  }
}

void adam_step(const AdamStepParams& s, const ThreadPool& pool) {
  const int64_t* chunk_starts = s.chunk_starts;
  pool.parallel_for(chunk_starts[s.num_tensors], 1, [&](int64_t first, int64_t last) {
    int64_t k = 0;
    for (int64_t chunk = first; chunk < last; ++chunk) {
      while (chunk >= chunk_starts[k + 1]) ++k;  // empty tensors own no chunks
      const AdamTensor& t = s.tensors[k];
      const int64_t begin = (chunk - chunk_starts[k]) * kAdamChunkElements;
      const int64_t end = std::min(t.numel, begin + kAdamChunkElements);
      if (t.master != nullptr) adam_range_param<true>(s, t, begin, end);
      else adam_range_param<false>(s, t, begin, end);
    }
  });
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
