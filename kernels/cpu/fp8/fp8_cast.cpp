// Public FP8 cast API: argument checks the kernels rely on, and the run-time tier choice.
#include <stdexcept>

#include "cpu/isa/entries.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/fp8.h"

namespace te_kernels {

size_t fp8_quantize_workspace_bytes(const ThreadPool& pool) { return size_t(pool.num_threads() + 1) * sizeof(float); }

void fp8_quantize(const Fp8QuantizeParams& params, const ThreadPool& pool) {
  if (params.in_dtype == DType::kFloat64) throw std::invalid_argument("fp8_quantize: float64 input is not supported");
  if (params.out_t != nullptr && params.rows * params.cols != params.numel) {
    throw std::invalid_argument("fp8_quantize: rows * cols must equal numel for the transposed output");
  }
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::fp8_quantize(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::fp8_quantize(params, pool);
    case CpuIsa::kPortable: return cpu::portable::fp8_quantize(params, pool);
  }
}

void fp8_dequantize(const Fp8DequantizeParams& params, const ThreadPool& pool) {
  if (params.out_dtype == DType::kFloat64) throw std::invalid_argument("fp8_dequantize: float64 output is not supported");
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return cpu::avx512::fp8_dequantize(params, pool);
    case CpuIsa::kAvx2: return cpu::avx2::fp8_dequantize(params, pool);
    case CpuIsa::kPortable: return cpu::portable::fp8_dequantize(params, pool);
  }
}

}  // namespace te_kernels
