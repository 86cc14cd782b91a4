// The CPU dispatch key's implementations of the schemas in schemas.cpp.
#include <torch/library.h>

#include "activation_ops.h"
#include "fp8_block_ops.h"
#include "fp8_ops.h"
#include "norm_ops.h"
#include "scaled_gemm_ops.h"
#include "rope_ops.h"
#include "adam_ops.h"
#include "softmax_ops.h"
#include "cross_entropy_ops.h"

TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("layernorm_fwd", &portable_te::layernorm_fwd_cpu);
  m.impl("layernorm_bwd", &portable_te::layernorm_bwd_cpu);
  m.impl("rmsnorm_fwd", &portable_te::rmsnorm_fwd_cpu);
  m.impl("rmsnorm_bwd", &portable_te::rmsnorm_bwd_cpu);
  m.impl("add_layernorm_fwd", &portable_te::add_layernorm_fwd_cpu);
  m.impl("add_layernorm_bwd", &portable_te::add_layernorm_bwd_cpu);
  m.impl("add_rmsnorm_fwd", &portable_te::add_rmsnorm_fwd_cpu);
  m.impl("add_rmsnorm_bwd", &portable_te::add_rmsnorm_bwd_cpu);
  m.impl("layernorm_fp8_fwd", &portable_te::layernorm_fp8_fwd_cpu);
  m.impl("rmsnorm_fp8_fwd", &portable_te::rmsnorm_fp8_fwd_cpu);
  m.impl("fp8_quantize", &portable_te::fp8_quantize_cpu);
  m.impl("scaled_gemm", &portable_te::scaled_gemm_cpu);
  m.impl("fp8_quantize_transpose", &portable_te::fp8_quantize_transpose_cpu);
  m.impl("fp8_dequantize", &portable_te::fp8_dequantize_cpu);
  m.impl("fp8_block_quantize", &portable_te::fp8_block_quantize_cpu);
  m.impl("fp8_block_dequantize", &portable_te::fp8_block_dequantize_cpu);
  m.impl("rope_fwd", &portable_te::rope_fwd_cpu);
  m.impl("rope_bwd", &portable_te::rope_bwd_cpu);
  m.impl("multi_tensor_adam", &portable_te::multi_tensor_adam_cpu);
  m.impl("scaled_softmax_fwd", &portable_te::scaled_softmax_fwd_cpu);
  m.impl("scaled_softmax_bwd", &portable_te::scaled_softmax_bwd_cpu);
  m.impl("cross_entropy_fwd", &portable_te::cross_entropy_fwd_cpu);
  m.impl("cross_entropy_bwd", &portable_te::cross_entropy_bwd_cpu);
  m.impl("activation_fwd", &portable_te::activation_fwd_cpu);
  m.impl("activation_bwd", &portable_te::activation_bwd_cpu);
  m.impl("activation_bwd_dbias", &portable_te::activation_bwd_dbias_cpu);
  m.impl("activation_fp8", &portable_te::activation_fp8_cpu);
}
