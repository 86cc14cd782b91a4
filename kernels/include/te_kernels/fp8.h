// FP8 casts. Formats are OCP's E4M3 ("fn": no infinities, max 448, NaN 0x7f/0xff) and E5M2
// (max 57344, infinities, NaN 0x7d-0x7f). Every cast to FP8 *saturates*: |x * scale| above
// the format's max becomes +-max, never inf or NaN; NaN stays NaN. Rounding is to nearest,
// ties to even, matching torch's own conversion of in-range values bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

enum class Fp8Format : int { kE4M3 = 0, kE5M2 = 1 };

float fp8_max(Fp8Format format);

// Exact scalar conversions: the definition every vector path must reproduce.
uint8_t to_fp8(float value, Fp8Format format);  // saturating
float fp8_to_float(uint8_t code, Fp8Format format);

struct Fp8QuantizeParams {
  int64_t numel = 0;
  DType in_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  const void* in = nullptr;          // [numel]
  Fp8Format format = Fp8Format::kE4M3;
  const float* scale = nullptr;  // [1]: out = saturate(in * scale)
  uint8_t* out = nullptr;        // [numel] FP8 codes
  float* amax = nullptr;         // [1]: max |in| of the unscaled input (NaN elements skipped)
  void* workspace = nullptr;     // fp8_quantize_workspace_bytes(pool) bytes: per-task amaxes
  // Optional fused transpose: with out_t set, `in` is read as [rows, cols] (rows * cols ==
  // numel) and out_t [cols, rows] receives the transposed codes as well.
  uint8_t* out_t = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct Fp8DequantizeParams {
  int64_t numel = 0;
  const uint8_t* in = nullptr;  // [numel] FP8 codes
  Fp8Format format = Fp8Format::kE4M3;
  const float* scale_inv = nullptr;    // [1]: out = in * scale_inv
  DType out_dtype = DType::kFloat32;  // float32, bfloat16 or float16
  void* out = nullptr;                // [numel]
};

// out [cols, rows] = the transpose of in [rows, cols], FP8 codes (any one-byte elements), both
// contiguous: the layout a GEMM contracting the other dimension reads.
struct Fp8TransposeParams {
  int64_t rows = 0, cols = 0;
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
};

size_t fp8_quantize_workspace_bytes(const ThreadPool& pool);
void fp8_quantize(const Fp8QuantizeParams& params, const ThreadPool& pool);
void fp8_dequantize(const Fp8DequantizeParams& params, const ThreadPool& pool);
void fp8_transpose(const Fp8TransposeParams& params, const ThreadPool& pool);

}  // namespace te_kernels
