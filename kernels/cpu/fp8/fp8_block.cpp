// Public block-scaled FP8 cast API: argument checks the kernels rely on, and the run-time
// tier choice (the scale definitions are inline in fp8_block.h).
#include <stdexcept>
#include <string>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8_block.h"

namespace te_kernels {
namespace {

void check_blocks(const char* op, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument(std::string(op) + ": negative matrix size");
  if (block_rows < 1 || block_cols < 1 || block_cols > kMaxBlockCols) {
    throw std::invalid_argument(std::string(op) + ": blocks must be at least 1 x 1 and at most " +
                                std::to_string(kMaxBlockCols) + " columns wide");
  }
}

}  // namespace

void fp8_block_quantize(const Fp8BlockQuantizeParams& params, const ThreadPool& pool) {
  check_blocks("fp8_block_quantize", params.rows, params.cols, params.block_rows, params.block_cols);
  if (params.in_dtype == DType::kFloat64) throw std::invalid_argument("fp8_block_quantize: float64 input is not supported");
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::fp8_block_quantize(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::fp8_block_quantize(params, pool);
    case CpuIsa::kPortable: return cpu::portable::fp8_block_quantize(params, pool);
  }
}

void fp8_block_dequantize(const Fp8BlockDequantizeParams& params, const ThreadPool& pool) {
  check_blocks("fp8_block_dequantize", params.rows, params.cols, params.block_rows, params.block_cols);
  if (params.out_dtype == DType::kFloat64) throw std::invalid_argument("fp8_block_dequantize: float64 output is not supported");
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::fp8_block_dequantize(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::fp8_block_dequantize(params, pool);
    case CpuIsa::kPortable: return cpu::portable::fp8_block_dequantize(params, pool);
  }
}

}  // namespace te_kernels
