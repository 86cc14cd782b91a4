// Entry points of the per-ISA builds of the kernels (cpu/<family>/<family>_<tier>.cpp compiles a
// family's *_kernels.h once per tier). The public API files (norm.cpp, fp8_cast.cpp) pick a tier at
// run time; nothing else calls these.
#pragma once

#include "te_kernels/activation.h"
#include "te_kernels/fp8.h"
#include "te_kernels/fp8_block.h"
#include "te_kernels/gemm.h"
#include "te_kernels/norm.h"
#include "te_kernels/rope.h"
#include "te_kernels/adam.h"
#include "te_kernels/softmax.h"
#include "te_kernels/cross_entropy.h"

namespace te_kernels::cpu {
#define TE_DECLARE_ISA_ENTRIES(isa)                                                  \
  namespace isa {                                                                    \
  void norm_fwd(const NormFwdParams& params, const ThreadPool& pool);                \
  void norm_bwd(const NormBwdParams& params, const ThreadPool& pool);                \
  void fp8_quantize(const Fp8QuantizeParams& params, const ThreadPool& pool);        \
  void fp8_dequantize(const Fp8DequantizeParams& params, const ThreadPool& pool);    \
  void fp8_block_quantize(const Fp8BlockQuantizeParams& params, const ThreadPool& pool);     \
  void fp8_block_dequantize(const Fp8BlockDequantizeParams& params, const ThreadPool& pool); \
  void rope(const RopeParams& params, const ThreadPool& pool);                       \
  void adam_step(const AdamStepParams& params, const ThreadPool& pool);              \
  void softmax_fwd(const SoftmaxFwdParams& params, const ThreadPool& pool);          \
  void softmax_bwd(const SoftmaxBwdParams& params, const ThreadPool& pool);          \
  void cross_entropy_fwd(const CrossEntropyFwdParams& params, const ThreadPool& pool); \
  void cross_entropy_bwd(const CrossEntropyBwdParams& params, const ThreadPool& pool); \
  void activation_fwd(const ActivationFwdParams& params, const ThreadPool& pool);    \
  void activation_bwd(const ActivationBwdParams& params, const ThreadPool& pool);    \
  void activation_fp8(const ActivationFp8Params& params, const ThreadPool& pool);    \
  void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool);              \
  }
TE_DECLARE_ISA_ENTRIES(portable)
TE_DECLARE_ISA_ENTRIES(avx2)
TE_DECLARE_ISA_ENTRIES(avx512)
#undef TE_DECLARE_ISA_ENTRIES

// Workspace layout shared by norm.cpp (sizing) and norm_kernels.h (use): each [cols]
// vector of accumulators starts on a 64-byte boundary.
inline int64_t padded_cols(int64_t cols, size_t acc_bytes) {
  const int64_t per_line = int64_t(64 / acc_bytes);
  return (cols + per_line - 1) / per_line * per_line;
}
inline size_t accumulator_bytes(DType x_dtype) { return x_dtype == DType::kFloat64 ? 8 : 4; }

// Rows are handed to threads in tasks of at least this many elements, so that a task's
// work dwarfs the cost of waking a thread.
constexpr int64_t kMinElementsPerTask = 32768;

}  // namespace te_kernels::cpu
