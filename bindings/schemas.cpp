// Every operator schema of the library, in one place. Each family's binding (<family>_ops.cpp)
// registers its CPU implementations with its own TORCH_LIBRARY_IMPL block beside them; fake
// (meta) kernels and autograd formulas are registered from Python
// (transformer_engine/pytorch/custom_ops/), except the autograd kernels of the norms, the
// activations and RoPE, which are C++ (<family>_autograd.cpp).
//
// Norms: input [..., H]; weight, bias [H]; mean, rstd [...] (input's leading dims) in
// float32, or float64 for float64 input.
// FP8 casts: data has input's shape in fp8_dtype (float8_e4m3fn or float8_e5m2); scale and
// scale_inv are float32 tensors of one element; amax is a float32 scalar tensor.
#include <torch/library.h>

TORCH_LIBRARY(portable_te, m) {
  m.def(
      "layernorm_fwd(Tensor input, Tensor weight, Tensor? bias, float eps, bool zero_centered_gamma)"
      " -> (Tensor output, Tensor mean, Tensor rstd)");
  m.def(
      "layernorm_bwd(Tensor grad_output, Tensor input, Tensor mean, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def(
      "rmsnorm_fwd(Tensor input, Tensor weight, float eps, bool zero_centered_gamma)"
      " -> (Tensor output, Tensor rstd)");
  m.def(
      "rmsnorm_bwd(Tensor grad_output, Tensor input, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight)");
  // Residual add + norm: sum = input + residual (the next residual stream), output = norm(sum).
  // grad_sum is the gradient reaching sum from its other uses; grad_input (of input and of
  // residual alike) = norm_backward(grad_output) + grad_sum.
  m.def(
      "add_layernorm_fwd(Tensor input, Tensor residual, Tensor weight, Tensor? bias, float eps,"
      " bool zero_centered_gamma) -> (Tensor output, Tensor sum, Tensor mean, Tensor rstd)");
  m.def(
      "add_layernorm_bwd(Tensor grad_output, Tensor grad_sum, Tensor sum, Tensor mean, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def(
      "add_rmsnorm_fwd(Tensor input, Tensor residual, Tensor weight, float eps, bool zero_centered_gamma)"
      " -> (Tensor output, Tensor sum, Tensor rstd)");
  m.def(
      "add_rmsnorm_bwd(Tensor grad_output, Tensor grad_sum, Tensor sum, Tensor rstd, Tensor weight,"
      " bool zero_centered_gamma) -> (Tensor grad_input, Tensor grad_weight)");
  // Norm -> FP8 (forward only): data = saturate(output * scale) in fp8_dtype, amax = max |output|;
  // output (input's dtype) is returned only when return_output, else an empty [0] tensor.
  m.def(
      "layernorm_fp8_fwd(Tensor input, Tensor weight, Tensor? bias, Tensor scale, ScalarType fp8_dtype, float eps,"
      " bool zero_centered_gamma, bool return_output)"
      " -> (Tensor data, Tensor amax, Tensor mean, Tensor rstd, Tensor output)");
  m.def(
      "rmsnorm_fp8_fwd(Tensor input, Tensor weight, Tensor scale, ScalarType fp8_dtype, float eps,"
      " bool zero_centered_gamma, bool return_output) -> (Tensor data, Tensor amax, Tensor rstd, Tensor output)");
  // data = saturate(input * scale) in FP8, amax = max |input| (NaN if input has a NaN).
  m.def("fp8_quantize(Tensor input, Tensor scale, ScalarType fp8_dtype) -> (Tensor data, Tensor amax)");
  // The same for input [..., N] viewed as [M, N], plus data_t [N, M]: the transposed codes,
  // written in the same pass (the weight-gradient GEMM needs both layouts).
  m.def(
      "fp8_quantize_transpose(Tensor input, Tensor scale, ScalarType fp8_dtype)"
      " -> (Tensor data, Tensor data_t, Tensor amax)");
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
  // output = data * scale_inv in out_dtype.
  m.def("fp8_dequantize(Tensor data, Tensor scale_inv, ScalarType out_dtype) -> Tensor");
  // data_t [cols, rows] = the transpose of FP8 codes data [rows, cols], contiguous.
  m.def("fp8_transpose(Tensor data) -> Tensor");
  // Block scaling of a 2-D input [rows, cols]: one scale per block_rows x block_cols block,
  // scale_inv [ceil(rows / block_rows), ceil(cols / block_cols)]; scale_mode 'fp32' or 'pow2'
  // (float32 scale_inv = 1 / scale, scale = fp8_max / max(block amax, amax_epsilon)) or
  // 'e8m0' (MXFP8: uint8 biased exponents, scale_inv = 2^(e - 127)).
  m.def(
      "fp8_block_quantize(Tensor input, int block_rows, int block_cols, ScalarType fp8_dtype, str scale_mode,"
      " float amax_epsilon) -> (Tensor data, Tensor scale_inv)");
  // output = data * scale_inv of each element's block, in out_dtype.
  m.def(
      "fp8_block_dequantize(Tensor data, Tensor scale_inv, int block_rows, int block_cols, ScalarType out_dtype)"
      " -> Tensor");
  // RoPE of input [s, b, h, d] ('sbhd'), [b, s, h, d] ('bshd') or [t, h, d] ('thd', packed
  // sequences split by cu_seqlens [b + 1]); freqs [max_seq_len, 1, 1, d2] float32 angles, d2
  // even and <= d; start_positions [b] offsets the positions. rope_bwd applies the transpose.
  m.def(
      "rope_fwd(Tensor input, Tensor freqs, str tensor_format, bool interleaved, Tensor? cu_seqlens,"
      " Tensor? start_positions) -> Tensor");
  m.def(
      "rope_bwd(Tensor grad_output, Tensor freqs, str tensor_format, bool interleaved, Tensor? cu_seqlens,"
      " Tensor? start_positions) -> Tensor");
  // Flash attention (kernels/include/te_kernels/attention.h): out = dropout(softmax(logits,
  // masked, sink)) v, per head, never holding the scores. q [b, h, sq, dk], k [b, g, skv, dk],
  // v [b, g, skv, dv] (g divides h: query head i reads key/value head i / (h / g)), or packed
  // q [tq, h, dk], k / v [tkv, g, d] with cu_seqlens_q / cu_seqlens_kv [b + 1] (required) and
  // cu_seqlens_*_padded [b + 1] where sequences start; padded tensors take cu_seqlens for their
  // lengths. Query t of a sequence sits at key position t (+ lkv - lq when bottom_right) and
  // sees keys [pos - window_left, pos + window_right] (-1: unlimited) not set in mask (bool
  // [b | 1, h | 1, sq, skv], True = masked out). logits = cap(scale q k^T) + ALiBi + bias:
  // cap(x) = softcap tanh(x / softcap) (softcap 0: none), alibi_slopes fp32 [h] or [b, h] add
  // -slope |pos - key|, bias (q's dtype, [b | 1, h | 1, sq, skv]) is added; mask and bias only
  // with [b, h, s, d] tensors. softmax_offset fp32 [h]: each head's sink logit joins the
  // denominator. dropout p in [0, 1) draws from the header's Philox keyed by dropout_rng
  // (int64 [2] on the host: seed, offset; required when p > 0, so that the backward draws the
  // same mask again and torch.compile sees the draw as a tensor). page_table int32 [>= b, pages]
  // (forward only): k, v are a paged KV cache [pages, page_size, g, d], key j of sequence i in
  // page page_table[i, j / page_size], its lengths in cu_seqlens_kv (required). out has q's
  // layout with dv channels; lse fp64 [b, h, sq] or [tq, h] (-inf and a zero output row where
  // the denominator is empty); max_logit fp32 [h], the largest logit of each head, when
  // return_max_logit (else empty). The backward's grad_bias has bias's shape
  // and dtype when bias_grad (else empty); grad_softmax_offset fp32 [h] with a sink (else empty).
  m.def(
      "flash_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv,"
      " Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded, Tensor? alibi_slopes, Tensor? bias,"
      " Tensor? mask, Tensor? softmax_offset, Tensor? dropout_rng, Tensor? page_table, float scale, int window_left,"
      " int window_right, bool bottom_right, float softcap, float dropout, bool return_max_logit)"
      " -> (Tensor out, Tensor lse, Tensor max_logit)");
  m.def(
      "flash_attention_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
      " Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? cu_seqlens_q_padded, Tensor? cu_seqlens_kv_padded,"
      " Tensor? alibi_slopes, Tensor? bias, Tensor? mask, Tensor? softmax_offset, Tensor? dropout_rng,"
      " Tensor? page_table, float scale, int window_left, int window_right, bool bottom_right, float softcap,"
      " float dropout, bool bias_grad) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor grad_bias,"
      " Tensor grad_softmax_offset)");
  // One Adam/AdamW step over all tensors of a param group, in place; master_params is empty
  // or holds a float32 master per param (then params receive the rounded master).
  m.def(
      "multi_tensor_adam(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs,"
      " Tensor(d!)[] master_params, float lr, float beta1, float beta2, float eps, int step, bool bias_correction,"
      " float weight_decay, bool adam_w_mode, float inv_grad_scale) -> ()");
  // Attention softmax over the last dim of input [b, h, sq, sk] (or [b*h, sq, sk]), fp32 math:
  // output = softmax(scale * input) with mask_type 'none', 'padding' (mask bool, broadcast as
  // [b or 1, h or 1, sq or 1, sk], True = masked out: the logit becomes -10000), 'causal' (keys
  // j > i dropped, sq == sk) or 'causal_bottom_right' (keys j > i + sk - sq dropped); dropped
  // keys give exactly 0. The backward takes the forward's output.
  m.def("scaled_softmax_fwd(Tensor input, Tensor? mask, float scale, str mask_type) -> Tensor");
  m.def(
      "scaled_softmax_bwd(Tensor grad_output, Tensor output, Tensor? mask, float scale, str mask_type)"
      " -> Tensor");
  // Cross-entropy of logits [N, V] against target [N] (int64): loss [N] float32 (float64 for
  // float64 logits; 0 where target == ignore_index) and, when compute_grad, grad [N, V] in
  // logits' dtype = grad_scale * d loss[n] / d logits[n] (else [0, V]); grad_scale [] or
  // [N] (a factor per row) in loss's dtype, 1 when None. The backward scales grad's rows by
  // grad_loss [N].
  m.def(
      "cross_entropy_fwd(Tensor logits, Tensor target, float label_smoothing, int ignore_index, bool compute_grad,"
      " Tensor? grad_scale=None) -> (Tensor loss, Tensor grad)");
  m.def("cross_entropy_bwd(Tensor grad, Tensor grad_loss) -> Tensor");
  // Activations over input [..., H] with an optional bias [H] added first; activation is one of
  // gelu, qgelu, relu, srelu, silu (output [..., H]) or glu, geglu, qgeglu, reglu, sreglu,
  // swiglu, clamped_swiglu (gated: output [..., H/2] = act(first half) * second half); limit
  // and alpha are clamped_swiglu's. The backward ops recompute the activation from input.
  m.def("activation_fwd(Tensor input, Tensor? bias, str activation, float limit, float alpha) -> Tensor");
  m.def(
      "activation_bwd(Tensor grad_output, Tensor input, Tensor? bias, str activation, float limit, float alpha)"
      " -> Tensor");
  // The same plus grad_bias [H]: grad_input summed over all rows, in the same pass.
  m.def(
      "activation_bwd_dbias(Tensor grad_output, Tensor input, Tensor bias, str activation, float limit,"
      " float alpha) -> (Tensor grad_input, Tensor grad_bias)");
  // data = saturate(y * scale) in fp8_dtype and amax = max |y|, for y = activation_fwd(...)
  // (rounded to input's dtype), without materialising y.
  m.def(
      "activation_fp8(Tensor input, Tensor? bias, str activation, float limit, float alpha, Tensor scale,"
      " ScalarType fp8_dtype) -> (Tensor data, Tensor amax)");
}
