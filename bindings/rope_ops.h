// CPU implementations of the RoPE ops (schemas in schemas.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace portable_te {

at::Tensor rope_fwd_cpu(const at::Tensor& input, const at::Tensor& freqs, const std::string& tensor_format,
                        bool interleaved, const std::optional<at::Tensor>& cu_seqlens,
                        const std::optional<at::Tensor>& start_positions);
at::Tensor rope_bwd_cpu(const at::Tensor& grad_output, const at::Tensor& freqs, const std::string& tensor_format,
                        bool interleaved, const std::optional<at::Tensor>& cu_seqlens,
                        const std::optional<at::Tensor>& start_positions);

}  // namespace portable_te
