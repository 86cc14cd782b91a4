// One Adam/AdamW step over many tensors in one parallel loop (the multi-tensor apply of a
// fused optimizer). Per element, in fp32, with the ordering torch.optim.Adam/AdamW use:
//   g  = grad * inv_grad_scale            (+ weight_decay * p   when !adam_w_mode: L2 Adam)
//   m  = m + (1 - beta1) * (g - m)        (lerp)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p * (1 - lr * weight_decay)      (adam_w_mode: decoupled decay)
//   p  = p - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// p is the fp32 master copy when the tensor has one (the param, bf16/fp16, then receives
// the master rounded once); otherwise the param itself (its dtype's values widened to fp32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

struct AdamTensor {
  void* param = nullptr;        // [numel] in param_dtype; updated in place
  const void* grad = nullptr;   // [numel] in grad_dtype
  float* exp_avg = nullptr;     // [numel] first moment m
  float* exp_avg_sq = nullptr;  // [numel] second moment v
  float* master = nullptr;      // [numel] fp32 master weights, or null
  int64_t numel = 0;
  DType param_dtype = DType::kFloat32;
  DType grad_dtype = DType::kFloat32;
};

// Tensors are cut into chunks of this many elements, the unit of work of the one parallel loop.
constexpr int64_t kAdamChunkElements = 16384;

struct AdamStepParams {
  const AdamTensor* tensors = nullptr;
  int64_t num_tensors = 0;
  // [num_tensors + 1]: the first chunk of tensor k; set by adam_step(), not by its caller.
  const int64_t* chunk_starts = nullptr;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool adam_w_mode = true;
  float step_size = 1e-3f;               // lr / (1 - beta1^step), or lr without bias correction
  float bias_correction2_sqrt = 1.f;     // sqrt(1 - beta2^step), or 1
  float inv_grad_scale = 1.f;
};

// Updates every tensor. The binding (bindings/adam_ops.cpp) checks them first; debug builds
// assert what the kernel assumes (sizes, dtypes, buffers present).
void adam_step(const AdamStepParams& params, const ThreadPool& pool);

}  // namespace te_kernels
