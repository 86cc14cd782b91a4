// A GEMM of bf16 products with fp32 accumulation and a fused fp32 epilogue, for the FP8 GEMMs
// of the Linear modules: FP8 codes (E4M3 and E5M2) are exact in bf16, so the product of two
// code matrices, summed in fp32, scaled once in fp32 and rounded once to the output dtype, is
// TransformerEngine's FP8 GEMM. The operands are bf16, FP8 codes or NVFP4 codes with their block
// scales, widened to bf16 (exactly) while the kernel packs them, so that no widened copy is ever
// written. PyTorch's CPU bf16 GEMM rounds its output to bf16, which is why this exists.
#pragma once

#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

// What an operand's elements are: bf16 values, FP8 codes (OCP E4M3 "fn" / E5M2), one byte each,
// or NVFP4 (te_kernels/nvfp4.h): E2M1 codes two a byte, the even element in the low nibble, each
// 16 consecutive values of a row (along k) multiplied by their E4M3 block scale. An E2M1 value
// (two significant bits) times an E4M3 scale (four) is a bf16 value, so the widening is exact;
// the global scales of TE's NVFP4 GEMM go into alpha.
enum class GemmOperand : int { kBFloat16, kFp8E4M3, kFp8E5M2, kNvfp4 };

// The block scales of an FP8 operand (Float8BlockScaling's 1 x 128 and 128 x 128 blocks, MXFP8's
// 1 x 32): element [i, k] is code[i, k] * scale[i / rows_per_scale, k / k_per_scale], the scales
// fp32 or E8M0 exponents (2^(e - 127), 255 NaN), rows of scales ld elements apart. The kernel
// multiplies each code by its scale in fp32 and rounds the product to bf16 (nearest even), as
// fp8_block_dequantize to bf16 does: exact where the scales are powers of two, except values
// below 2^-126, which the bf16 dot products flush to zero either way. One exception, with up to
// 8 rows of a on the AVX512-BF16 dot products (decoding, where b is read in place): b's codes are
// widened alone and each k-block's fp32 sums are multiplied by the block's scale and added to the
// running sums by one FMA (the order of TE's block-scaled GEMM; exact scaling for powers of two).
// data null: no block scales (per-tensor codes, whose scale goes into alpha).
struct GemmFp8BlockScales {
  const void* data = nullptr;
  bool e8m0 = false;
  int64_t ld = 0;
  int64_t rows_per_scale = 1;  // a power of two
  int64_t k_per_scale = 32;    // a power of two, at least 32: each 32 values of k read share one scale
};

// Whether gemm_bf16 indexes blocks of these sizes (GemmFp8BlockScales' rule).
inline bool gemm_fp8_blocks_fit(int64_t rows_per_scale, int64_t k_per_scale) {
  const auto power_of_two = [](int64_t x) { return x > 0 && (x & (x - 1)) == 0; };
  return power_of_two(rows_per_scale) && power_of_two(k_per_scale) && k_per_scale >= 32;
}

// out[i, j] = round_to_out_dtype(alpha * sum_k a[i, k] b[j, k] + bias[j] (+ out[i, j]))
// a: [m, k], rows lda elements apart; b: [n, k], rows ldb apart (both contiguous along k: the
// "NT" layout of y = x W^T), each in its own format. An NVFP4 operand's rows are lda (ldb)
// bytes apart, ceil(k / 2) used, and its E4M3 scales a_scales (b_scales) [rows, ceil(k / 16)],
// rows lda_scales (ldb_scales) bytes apart. The sums are fp32 (each bf16 product is
// exact in fp32); their order depends on the kernel and on m (cpu/gemm/gemm_kernels.h,
// gemm_amx.cpp; NVFP4 x NVFP4 on the avx2 tier: each block of 16 summed exactly, then the blocks
// in k order, cpu/gemm/nvfp4_byte_kernel_avx2.h). alpha and bias are applied in fp32 after the sum; bias is fp32 [n] or null.
// out: [m, n] in out_dtype (fp32, bf16 or fp16), rows ldc apart. accumulate: out's values are
// added in fp32 too, before the one rounding (the weight gradient added into main_grad, as
// TransformerEngine's GEMM with accumulate does).
struct GemmBf16Params {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  GemmOperand a_format = GemmOperand::kBFloat16;
  int64_t lda = 0;
  const uint8_t* a_scales = nullptr;  // NVFP4 a only
  int64_t lda_scales = 0;
  const void* b = nullptr;
  GemmOperand b_format = GemmOperand::kBFloat16;
  int64_t ldb = 0;
  const uint8_t* b_scales = nullptr;  // NVFP4 b only
  int64_t ldb_scales = 0;
  GemmFp8BlockScales a_blocks, b_blocks;  // block-scaled FP8 a or b only (not for gemm_bf16_pack_b)
  float alpha = 1.0f;
  const float* bias = nullptr;
  DType out_dtype = DType::kFloat32;
  void* out = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // b packed ahead by gemm_bf16_pack_b (same b, n and k, at the same tier), or null: packed here.
  const void* b_packed = nullptr;
};

void gemm_bf16(const GemmBf16Params& params, const ThreadPool& pool);

// The shortest row stride (lda, ldb) of an operand of k values in `format`: k elements, or an
// NVFP4 row's ceil(k / 2) bytes.
inline int64_t gemm_min_ld(GemmOperand format, int64_t k) {
  return format == GemmOperand::kNvfp4 ? (k + 1) / 2 : k;
}

// A b that serves many GEMMs (a Linear's weight across microbatches, a decoder's at every step)
// can be packed once, in the layout the active tier's kernel reads: gemm_bf16_pack_b writes
// params' b (n, k, b, b_format, ldb) into `packed`, gemm_bf16_packed_b_bytes(n, k) bytes,
// 64-byte aligned; a GemmBf16Params with b_packed set then skips packing b. b itself stays
// needed: few rows of a read it in place. The layout belongs to the active tier (after
// limit_cpu_isa changes the tier, pack again).
size_t gemm_bf16_packed_b_bytes(int64_t n, int64_t k);
void gemm_bf16_pack_b(const GemmBf16Params& params, void* packed, const ThreadPool& pool);

// Which instructions gemm_bf16 runs on at the active tier: "amx" (AMX-BF16 tiles, for every
// m), "avx512_bf16" (AVX512-BF16 dot products) or "fma" (widened to fp32 FMAs: slower).
const char* gemm_bf16_kernel();

}  // namespace te_kernels
