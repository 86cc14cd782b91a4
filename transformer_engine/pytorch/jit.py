"""transformer_engine.pytorch.jit: TransformerEngine's fused elementwise helpers, which Megatron and
TE-based code import by name, on this package's kernels.

    bias_gelu_fused(inp, bias), gelu_fused_(inp)          tanh-GELU of inp + bias (custom_ops/activation.py)
    bgrad_dgelu_fused(grad_output, inp, bias)             (bias gradient, input gradient) in one pass
    dgelu_fused_(grad_output, inp)                        the input gradient of gelu_fused_
    l2normalization_fused(x, eps)                         x / sqrt(sum(x^2) + eps) over the last dim
    l2normalization_fwd_fused / _backward_fused          the same with its rsqrt kept, and its gradient
    bias_dropout_add(x, bias, residual, prob, training)   residual + dropout(x + bias)

The L2 normalisation and bias-dropout-add are computed by PyTorch ops (in fp32 for the former,
rounded once to x's dtype). jit_fuser and lazy_compile compile a function with torch.compile on
its first call; no_torch_dynamo keeps torch.compile out of one. The warmup_* functions run the
helpers once on the shapes given (forward and backward), as TE's do to compile them ahead.
"""
import functools
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .custom_ops.activation import activation, activation_grad


def lazy_compile(func: Callable) -> Callable:
    """func compiled with torch.compile when first called (importing torch._dynamo and
    compiling cost nothing until then)."""
    compiled = None

    @functools.wraps(func)
    def run(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(func)
        return compiled(*args, **kwargs)
    return run


jit_fuser = lazy_compile


def no_torch_dynamo(recursive: bool = True) -> Callable[[Callable], Callable]:
    """A decorator keeping torch.compile out of a function (and, with recursive, what it calls)."""
    return lambda func: torch.compiler.disable(func, recursive=recursive)


def set_jit_fusion_options() -> None:
    """TE sets TorchScript's fuser flags here. This package fuses with its kernels and
    torch.compile, which take no global flags: nothing to set."""


def bias_gelu_fused(inp: Tensor, bias: Tensor) -> Tensor:
    """gelu(inp + bias), tanh approximation; differentiable in both."""
    return activation(inp, "gelu", bias)


def gelu_fused_(inp: Tensor) -> Tensor:
    return activation(inp, "gelu")


def bgrad_dgelu_fused(grad_output: Tensor, inp: Tensor, bias: Tensor) -> Tuple[Tensor, Tensor]:
    """(bias gradient [H], input gradient [..., H]) of bias_gelu_fused for grad_output."""
    grad_input, grad_bias = activation_grad(grad_output, inp, "gelu", bias)
    return grad_bias, grad_input


def dgelu_fused_(grad_output: Tensor, inp: Tensor) -> Tensor:
    """The input gradient of gelu_fused_ for grad_output."""
    return activation_grad(grad_output, inp, "gelu")[0]


def l2normalization_fused(x: Tensor, eps: float) -> Tensor:
    return l2normalization_fwd_fused(x, eps)[0]


def l2normalization_fwd_fused(x: Tensor, eps: float) -> Tuple[Tensor, Tensor]:
    """(y [..., H] in x's dtype, rsqrt_norm [..., 1] fp32): y = x * rsqrt(sum(x^2) + eps), in fp32."""
    x32 = x.float()
    rsqrt_norm = torch.rsqrt(x32.square().sum(dim=-1, keepdim=True) + eps)
    return (x32 * rsqrt_norm).to(x.dtype), rsqrt_norm


def l2normalization_backward_fused(grad_output: Tensor, x: Tensor, rsqrt_norm: Tensor, eps: float) -> Tensor:
    """dx = r g - r^3 x sum(g x) for r = rsqrt_norm (eps is already in it), in fp32, in x's dtype."""
    g32, x32, r = grad_output.float(), x.float(), rsqrt_norm.float()
    dot = (g32 * x32).sum(dim=-1, keepdim=True)
    return (r * g32 - r.pow(3) * x32 * dot).to(x.dtype)


def bias_dropout_add(x: Tensor, bias: Optional[Tensor], residual: Tensor, prob: float, training: bool) -> Tensor:
    """residual + dropout(x + bias, prob) (no dropout unless training)."""
    return residual + F.dropout(x + bias if bias is not None else x, p=prob, training=training)


def get_bias_dropout_add(training: bool) -> Callable:
    return functools.partial(_bias_dropout_add_with, training)


def _bias_dropout_add_with(training: bool, x: Tensor, bias: Optional[Tensor], residual: Tensor,
                           prob: float) -> Tensor:
    return bias_dropout_add(x, bias, residual, prob, training)


def bias_dropout_add_fused_train(x: Tensor, bias: Optional[Tensor], residual: Tensor, prob: float) -> Tensor:
    return bias_dropout_add(x, bias, residual, prob, True)


def bias_dropout_add_fused_inference(x: Tensor, bias: Optional[Tensor], residual: Tensor, prob: float) -> Tensor:
    return bias_dropout_add(x, bias, residual, prob, False)


def warmup_jit_bias_dropout_add(hidden_size: int, dtype: torch.dtype, seq_length: int, micro_batch_size: int,
                                device: Optional[torch.device] = None) -> None:
    """Runs bias_dropout_add forward and backward once on [seq, batch, hidden] tensors."""
    x, residual = (torch.rand(seq_length, micro_batch_size, hidden_size, dtype=dtype, device=device,
                              requires_grad=True) for _ in range(2))
    bias = torch.rand(hidden_size, dtype=dtype, device=device, requires_grad=True)
    bias_dropout_add_fused_train(x, bias, residual, 0.1).sum().backward()


def warmup_jit_bias_dropout_add_all_dtypes(hidden_size: int, seq_length: int, micro_batch_size: int,
                                           device: Optional[torch.device] = None) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        warmup_jit_bias_dropout_add(hidden_size, dtype, seq_length, micro_batch_size, device)


def warmup_jit_bias_gelu(ffn_hidden_size_per_partition: int, dtype: torch.dtype, seq_length: int,
                         micro_batch_size: int, device: Optional[torch.device] = None) -> None:
    """Runs bias_gelu_fused forward and backward once on [seq, batch, ffn] tensors."""
    inp = torch.rand(seq_length, micro_batch_size, ffn_hidden_size_per_partition, dtype=dtype, device=device,
                     requires_grad=True)
    bias = torch.rand(ffn_hidden_size_per_partition, dtype=dtype, device=device, requires_grad=True)
    bias_gelu_fused(inp, bias).sum().backward()


def warmup_jit_bias_gelu_all_dtypes(ffn_hidden_size: int, seq_length: int, micro_batch_size: int,
                                    device: Optional[torch.device] = None) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        warmup_jit_bias_gelu(ffn_hidden_size, dtype, seq_length, micro_batch_size, device)


def warmup_jit_l2normalization(hidden_size: int, dtype: torch.dtype, seq_length: int, micro_batch_size: int,
                               device: Optional[torch.device] = None) -> None:
    """Runs the L2 normalisation forward and backward once on [seq * batch, hidden] tensors."""
    x = torch.rand(seq_length * micro_batch_size, hidden_size, dtype=dtype, device=device)
    y, rsqrt_norm = l2normalization_fwd_fused(x, 1e-6)
    l2normalization_backward_fused(torch.ones_like(y), x, rsqrt_norm, 1e-6)


def warmup_jit_l2normalization_all_dtypes(hidden_size: int, seq_length: int, micro_batch_size: int,
                                          device: Optional[torch.device] = None) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        warmup_jit_l2normalization(hidden_size, dtype, seq_length, micro_batch_size, device)
