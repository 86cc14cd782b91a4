// CPU implementation of the multi-tensor Adam step (schema in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace portable_te {

void multi_tensor_adam_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                           at::TensorList exp_avg_sqs, at::TensorList master_params, double lr, double beta1,
                           double beta2, double eps, int64_t step, bool bias_correction, double weight_decay,
                           bool adam_w_mode, double inv_grad_scale);

}  // namespace portable_te
