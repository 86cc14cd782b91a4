// The scaled GEMM ops' binding: their schemas and CPU kernels. scaled_gemm and
// scaled_gemm_accumulate on the CPU: bf16 operands and FP8 codes through
// te_kernels::gemm_bf16 (the codes widened to bf16 inside it; fp32 sums, fused fp32 epilogue),
// fp32 operands through ATen's CPU GEMM and the same epilogue in fp32.
#include <ATen/ops/empty.h>
#include <cstring>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten_thread_pool.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/gemm.h"
#include "tensor_checks.h"

// The schemas of the family's ops (torch.ops.portable_te.*). A fragment: each family declares
// its own ops beside their kernels, in the one namespace.
TORCH_LIBRARY_FRAGMENT(portable_te, m) {
  // out = a_scale_inv * b_scale_inv * (a @ b^T) + bias for a [m, k] and b [n, k], each bf16 or
  // FP8 codes (float8_e4m3fn / float8_e5m2), or both fp32: fp32 sums, the scale_invs (fp32, one
  // element each, 1 when absent) and bias [n] applied in fp32, one rounding to out_dtype. Given
  // FP8 codes and their scale_invs, this is TransformerEngine's FP8 GEMM.
  // b_packed: _kernels.gemm_pack_b(b) at the active CPU tier, for a b that serves many GEMMs
  // (the CPU kernel then skips packing it; ignored elsewhere).
  m.def(
      "scaled_gemm(Tensor a, Tensor b, Tensor? a_scale_inv, Tensor? b_scale_inv, Tensor? bias, ScalarType out_dtype,"
      " Tensor? b_packed=None) -> Tensor");
  // out += a_scale_inv * b_scale_inv * (a @ b^T), in place: out [m, n] (fp32, bf16 or fp16, rows
  // contiguous) is added in fp32 before the one rounding (the weight gradient added into
  // main_grad, as TE's GEMM with accumulate=True).
  m.def("scaled_gemm_accumulate(Tensor a, Tensor b, Tensor? a_scale_inv, Tensor? b_scale_inv, Tensor(a!) out) -> ()");
}

namespace portable_te {
namespace {

// The product of the scale_invs given (each fp32, one element), in fp32.
float alpha_of(const char* op, const std::optional<at::Tensor>& a_scale_inv,
               const std::optional<at::Tensor>& b_scale_inv, const at::Tensor& a) {
  float alpha = 1.0f;
  for (const auto& [name, scale] : {std::pair{"a_scale_inv", &a_scale_inv}, std::pair{"b_scale_inv", &b_scale_inv}}) {
    if (!scale->has_value()) continue;
    check_same_device(op, name, **scale, "a", a);
    check_dtype(op, name, **scale, at::kFloat);
    TORCH_CHECK_VALUE((*scale)->numel() == 1, op, ": ", name, " must hold one element, got shape ",
                      (*scale)->sizes());
    alpha *= (*scale)->item<float>();
  }
  return alpha;
}

// The operand itself when its rows are contiguous and do not overlap (any longer row stride),
// else a contiguous copy: a broadcast operand (row stride 0) is expanded here, never read as
// rows that are not there.
at::Tensor rows_contiguous(const at::Tensor& t) {
  const bool rows_apart = t.size(0) <= 1 || t.stride(0) >= t.size(1);
  return t.size(1) > 0 && t.stride(1) == 1 && rows_apart ? t : t.contiguous();
}

// The kernel's name for the elements of a bf16 or FP8 operand (others are refused before).
te_kernels::GemmOperand operand_format(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat8_e4m3fn: return te_kernels::GemmOperand::kFp8E4M3;
    case at::kFloat8_e5m2: return te_kernels::GemmOperand::kFp8E5M2;
    default: return te_kernels::GemmOperand::kBFloat16;
  }
}

bool bf16_products(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2;
}

// a [m, k] and b [n, k]: both fp32, or each bf16 or FP8 codes; on one device.
void check_operands(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_VALUE((a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat) ||
                        (bf16_products(a.scalar_type()) && bf16_products(b.scalar_type())),
                    op, ": a and b must both be float32, or each bfloat16, float8_e4m3fn or float8_e5m2, got ",
                    a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, op, ": a and b must be 2-D, got shapes ", a.sizes(), " and ",
                    b.sizes());
  TORCH_CHECK_VALUE(a.size(1) == b.size(1), op, ": a [m, k] and b [n, k] must share k, got shapes ", a.sizes(),
                    " and ", b.sizes());
  check_same_device(op, "b", b, "a", a);
}

// gemm_pack_b's output: this header, then the kernel's packed b from byte kPackedHeaderBytes on
// (64-byte aligned, as the CPU allocator aligns the tensor). The header says what the packing
// was for, so that a packed b from another b shape or tier is refused, never misread.
struct PackedHeader {
  uint64_t magic;
  int64_t tier, n, k;
};
constexpr uint64_t kPackedMagic = 0x31424b5045545450ull;  // "PTTEPKB1"
constexpr int64_t kPackedHeaderBytes = 64;

// gemm_pack_b's output bytes for b [n, k] at the active tier.
int64_t packed_b_numel(int64_t n, int64_t k) {
  return kPackedHeaderBytes + int64_t(te_kernels::gemm_bf16_packed_b_bytes(n, k));
}

// b_packed's kernel layout, after checking that it was packed for b [n, k] at the active tier.
const void* checked_packed_b(const char* op, const at::Tensor& packed, const at::Tensor& b) {
  const int64_t n = b.size(0), k = b.size(1);
  check_same_device(op, "b_packed", packed, "b", b);
  check_dtype(op, "b_packed", packed, at::kByte);
  const int64_t want = packed_b_numel(n, k);
  TORCH_CHECK_VALUE(packed.dim() == 1 && packed.is_contiguous() && packed.numel() == want, op,
                    ": b_packed must be gemm_pack_b(b) of this b [", n, ", ", k, "] at the active CPU tier (",
                    te_kernels::cpu_isa_name(te_kernels::active_cpu_isa()), "): ", want, " contiguous bytes, got shape ",
                    packed.sizes());
  PackedHeader header;
  std::memcpy(&header, packed.const_data_ptr(), sizeof(header));
  const int64_t tier = int64_t(te_kernels::active_cpu_isa());
  TORCH_CHECK_VALUE(header.magic == kPackedMagic && header.tier == tier && header.n == n && header.k == k, op,
                    ": b_packed was not packed for this b [", n, ", ", k, "] at the active CPU tier (",
                    te_kernels::cpu_isa_name(te_kernels::active_cpu_isa()), "); pack it again with gemm_pack_b");
  return static_cast<const uint8_t*>(packed.const_data_ptr()) + kPackedHeaderBytes;
}

// The b side of gemm_bf16's parameters for b [n, k] (rows contiguous).
te_kernels::GemmBf16Params b_params(const at::Tensor& b) {
  te_kernels::GemmBf16Params p;
  p.n = b.size(0);
  p.k = b.size(1);
  p.b = b.const_data_ptr();
  p.b_format = operand_format(b);
  p.ldb = b.size(0) <= 1 ? p.k : b.stride(0);
  return p;
}

// gemm_bf16 into out ([m, n], rows contiguous), adding to it where accumulate.
void bf16_gemm_into(const at::Tensor& a_arg, const at::Tensor& b_arg, float alpha, const at::Tensor& bias,
                    const at::Tensor& out, te_kernels::DType dtype, bool accumulate, const void* b_packed) {
  const at::Tensor a = rows_contiguous(a_arg), b = rows_contiguous(b_arg);
  te_kernels::GemmBf16Params p = b_params(b);
  p.m = a.size(0);
  p.a = a.const_data_ptr();
  p.a_format = operand_format(a);
  p.lda = a.size(0) <= 1 ? p.k : a.stride(0);
  p.alpha = alpha;
  p.bias = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  p.out_dtype = dtype;
  p.out = out.mutable_data_ptr();
  p.ldc = out.size(0) <= 1 ? p.n : out.stride(0);
  p.accumulate = accumulate;
  p.b_packed = b_packed;
  te_kernels::gemm_bf16(p, AtenThreadPool());
}

}  // namespace

// b in the layout the active tier's kernel reads, behind the header (build_info.cpp exposes it
// as _kernels.gemm_pack_b: a CPU-kernel matter, not an op of the dispatcher).
at::Tensor gemm_pack_b_cpu(const at::Tensor& b_arg) {
  constexpr const char* kOp = "gemm_pack_b";
  TORCH_CHECK_VALUE(bf16_products(b_arg.scalar_type()), kOp,
                    ": b must be bfloat16, float8_e4m3fn or float8_e5m2 (fp32 GEMMs are ATen's), got ",
                    b_arg.scalar_type());
  TORCH_CHECK_VALUE(b_arg.dim() == 2, kOp, ": b must be 2-D [n, k], got shape ", b_arg.sizes());
  const at::Tensor b = rows_contiguous(b_arg);
  at::Tensor packed = at::empty({packed_b_numel(b.size(0), b.size(1))}, b.options().dtype(at::kByte));
  const PackedHeader header{kPackedMagic, int64_t(te_kernels::active_cpu_isa()), b.size(0), b.size(1)};
  uint8_t* bytes = static_cast<uint8_t*>(packed.mutable_data_ptr());
  std::memset(bytes, 0, kPackedHeaderBytes);
  std::memcpy(bytes, &header, sizeof(header));
  te_kernels::gemm_bf16_pack_b(b_params(b), bytes + kPackedHeaderBytes, AtenThreadPool());
  return packed;
}

at::Tensor scaled_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& a_scale_inv,
                           const std::optional<at::Tensor>& b_scale_inv, const std::optional<at::Tensor>& bias_arg,
                           at::ScalarType out_dtype, const std::optional<at::Tensor>& b_packed) {
  constexpr const char* kOp = "scaled_gemm";
  check_operands(kOp, a, b);
  TORCH_CHECK_VALUE(!b_packed.has_value() || a.scalar_type() != at::kFloat, kOp,
                    ": b_packed serves bf16 and FP8 operands (fp32 GEMMs are ATen's)");
  const te_kernels::DType dtype = high_precision_dtype(kOp, "out_dtype", out_dtype);
  const float alpha = alpha_of(kOp, a_scale_inv, b_scale_inv, a);
  const at::Tensor bias = bias_arg.has_value() ? fp32_bias(kOp, *bias_arg, b.size(0), "[n]", "a", a) : at::Tensor();
  if (a.scalar_type() == at::kFloat) {
    // at::cpu::mm calls the CPU GEMM directly: no re-dispatch, so no torch.autocast region can
    // turn it into a bf16 GEMM.
    at::Tensor sums = at::cpu::mm(a, b.t());  // [m, k] x [n, k]^T, fp32
    if (alpha != 1.0f) sums.mul_(alpha);
    if (bias.defined()) sums.add_(bias);
    return sums.to(out_dtype);
  }
  const void* packed = b_packed.has_value() ? checked_packed_b(kOp, *b_packed, b) : nullptr;
  at::Tensor out = at::empty({a.size(0), b.size(0)}, a.options().dtype(out_dtype));
  bf16_gemm_into(a, b, alpha, bias, out, dtype, /*accumulate=*/false, packed);
  return out;
}

void scaled_gemm_accumulate_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& a_scale_inv,
                                const std::optional<at::Tensor>& b_scale_inv, const at::Tensor& out) {
  constexpr const char* kOp = "scaled_gemm_accumulate";
  check_operands(kOp, a, b);
  check_same_device(kOp, "out", out, "a", a);
  check_shape(kOp, "out", out, {a.size(0), b.size(0)}, "[m, n]");
  const te_kernels::DType dtype = high_precision_dtype(kOp, "out", out.scalar_type());
  check_written_rows(kOp, out, "a", a, "b", b);
  const float alpha = alpha_of(kOp, a_scale_inv, b_scale_inv, a);
  if (a.scalar_type() == at::kFloat) {
    at::Tensor sums = at::cpu::mm(a, b.t());  // [m, k] x [n, k]^T, fp32
    out.add_(alpha != 1.0f ? sums.mul_(alpha) : sums);
    return;
  }
  bf16_gemm_into(a, b, alpha, at::Tensor(), out, dtype, /*accumulate=*/true, /*b_packed=*/nullptr);
}

}  // namespace portable_te

// The CPU kernels of these ops (schemas above).
TORCH_LIBRARY_IMPL(portable_te, CPU, m) {
  m.impl("scaled_gemm", &portable_te::scaled_gemm_cpu);
  m.impl("scaled_gemm_accumulate", &portable_te::scaled_gemm_accumulate_cpu);
}
