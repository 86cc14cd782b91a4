// Public block-scaled FP8 cast API: the run-time tier choice (the scale definitions are inline
// in fp8_block.h).
#include <cassert>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8_block.h"

namespace te_kernels {

// The entry points of fp8_block_kernels.h, built once per SIMD tier.
TE_CPU_TIER_ENTRY(fp8_block_quantize, Fp8BlockQuantizeParams)
TE_CPU_TIER_ENTRY(fp8_block_dequantize, Fp8BlockDequantizeParams)

// bindings/fp8_block_ops.cpp checks every argument, with messages naming it; the asserts
// state what the kernels assume of a direct C++ caller, and run in debug builds.
namespace {

// A matrix of non-negative size cut into blocks at least 1 x 1 and at most kMaxBlockCols wide.
[[maybe_unused]] bool valid_blocks(int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols) {
  return rows >= 0 && cols >= 0 && block_rows >= 1 && block_cols >= 1 && block_cols <= kMaxBlockCols;
}

}  // namespace

void fp8_block_quantize(const Fp8BlockQuantizeParams& params, const ThreadPool& pool) {
  assert(valid_blocks(params.rows, params.cols, params.block_rows, params.block_cols) &&
         "fp8_block_quantize: negative matrix size, or blocks below 1 x 1 or wider than kMaxBlockCols");
  assert(params.in_dtype != DType::kFloat64 && "fp8_block_quantize: float64 input is not supported");
  return TE_CPU_ACTIVE_TIER(fp8_block_quantize)(params, pool);
}

void fp8_block_dequantize(const Fp8BlockDequantizeParams& params, const ThreadPool& pool) {
  assert(valid_blocks(params.rows, params.cols, params.block_rows, params.block_cols) &&
         "fp8_block_dequantize: negative matrix size, or blocks below 1 x 1 or wider than kMaxBlockCols");
  assert(params.out_dtype != DType::kFloat64 && "fp8_block_dequantize: float64 output is not supported");
  return TE_CPU_ACTIVE_TIER(fp8_block_dequantize)(params, pool);
}

}  // namespace te_kernels
