// Flash attention (te_kernels/attention.h), written once over the tier's vector type and
// compiled once per SIMD tier.
//
// Forward, one task per (sequence, head, block of query rows), tasks handed out from a shared
// counter so that cheap (early causal) and dear blocks balance over the threads:
//   pack the block's queries (fp32);
//   for each key block the mask reaches: S = Q K^T (fp32 FMAs), turned into logits (scale,
//   softcap, ALiBi, bias, dense mask) within each row's key range; the online softmax rescales
//   the running output, P = exp(S - m), dropout's keep factors applied; O += P V;
//   the sink (if any) joins l; out = O / l rounded once, lse = m + log l.
// Backward (FlashAttention-2), one task per (sequence, query head): the task packs its
// queries and output gradient, D = rowsum(dO * out) (row_deltas: the same FMA chain as dP),
// then walks the key blocks; for each it walks the query blocks that reach it, recomputes
// P = exp(S - lse) from the fp64 lse (split into two floats, so no rounding of lse scales P),
// and accumulates, with Z dropout's keep factors (1 without dropout) and cap' the softcap's
// derivative (1 without),
//   dV += (P Z)^T dO,  G = P * (Z dO V^T - D) (dL/dS, the bias's gradient),
//   dS = G * cap' * scale,  dK += dS^T Q,  dQ += dS K
// in fp32; a sink's gradient is -sum over rows of exp(offset - lse) D. dK and dV of a block are final once its query blocks are done; with GQA each query
// head writes its share to an fp32 buffer and a second pass adds the shares in head order.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including attention_kernels.h"
#endif

#if defined(TE_CPU_ISA_AVX512_X86)
#include "cpu/attention/attention_bf16_dots.h"  // first: Forward and Backward of bf16 use it
#endif
#include "cpu/attention/attention_backward.h"
#include "cpu/attention/attention_forward.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace attention_detail {

template <typename Params, template <typename> class Pass>
void dispatch(const Params& p, const ThreadPool& pool) {
  switch (p.shape.dtype) {
    case DType::kFloat32: return Pass<float>::run(p, pool);
    case DType::kBFloat16: return Pass<bf16_t>::run(p, pool);
    case DType::kFloat16: return Pass<fp16_t>::run(p, pool);
    case DType::kFloat64: return;  // refused by attention.cpp
  }
}

}  // namespace attention_detail

void attention_fwd(const AttentionFwdParams& p, const ThreadPool& pool) {
  attention_detail::dispatch<AttentionFwdParams, attention_detail::Forward>(p, pool);
}

void attention_bwd(const AttentionBwdParams& p, const ThreadPool& pool) {
  attention_detail::dispatch<AttentionBwdParams, attention_detail::Backward>(p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
