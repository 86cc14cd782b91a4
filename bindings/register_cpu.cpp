// The CPU dispatch key's implementations of the schemas in schemas.cpp.
#include <torch/library.h>

#include "activation_ops.h"
#include "fp8_block_ops.h"
#include "fp8_ops.h"
#include "norm_ops.h"

TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("layernorm_fwd", &portable_te::layernorm_fwd_cpu);
  m.impl("layernorm_bwd", &portable_te::layernorm_bwd_cpu);
  m.impl("rmsnorm_fwd", &portable_te::rmsnorm_fwd_cpu);
  m.impl("rmsnorm_bwd", &portable_te::rmsnorm_bwd_cpu);
  m.impl("fp8_quantize", &portable_te::fp8_quantize_cpu);
  m.impl("fp8_quantize_transpose", &portable_te::fp8_quantize_transpose_cpu);
  m.impl("fp8_dequantize", &portable_te::fp8_dequantize_cpu);
  m.impl("fp8_block_quantize", &portable_te::fp8_block_quantize_cpu);
  m.impl("fp8_block_dequantize", &portable_te::fp8_block_dequantize_cpu);
  m.impl("activation_fwd", &portable_te::activation_fwd_cpu);
  m.impl("activation_bwd", &portable_te::activation_bwd_cpu);
  m.impl("activation_bwd_dbias", &portable_te::activation_bwd_dbias_cpu);
  m.impl("activation_fp8", &portable_te::activation_fp8_cpu);
}
