"""The norms' C++ autograd (bindings/norm_ops.cpp) and direct calls (bindings/direct_calls.h):
the same results as the torch.ops route, saved tensors visible to saved-tensor hooks (what
activation offloading reads), frozen parameters left without gradients, and __torch_function__
modes still seeing the op."""
import pytest
import torch

from function_log import FunctionLog
from transformer_engine.pytorch.custom_ops import norm

ops = torch.ops.portable_te


def _inputs(dtype, with_bias=True):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 48, dtype=dtype).transpose(0, 1).requires_grad_()  # non-contiguous
    weight = (torch.rand(48, dtype=dtype) + 0.5).requires_grad_()
    bias = torch.randn(48, dtype=dtype).requires_grad_() if with_bias else None
    return x, weight, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_direct_call_equals_the_torch_ops_route(op, dtype):
    x, weight, bias = _inputs(dtype)
    params = (weight, bias) if op == "layernorm" else (weight,)

    def through_ops():
        if op == "layernorm":
            return ops.layernorm_fwd(x, weight, bias, 1e-5, True)[0]
        return ops.rmsnorm_fwd(x, weight, 1e-5, True)[0]
    direct = getattr(norm, op)(x, *params, 1e-5, True)
    dy = torch.randn_like(direct)
    expected = through_ops()
    assert torch.equal(direct, expected)
    grads = torch.autograd.grad(direct, (x, *params), dy)
    expected_grads = torch.autograd.grad(expected, (x, *params), dy)
    for got, want in zip(grads, expected_grads):
        assert torch.equal(got, want)


def test_saved_tensors_go_through_saved_tensor_hooks():
    x, weight, bias = _inputs(torch.float32)
    packed = []

    def pack(tensor):
        packed.append(tuple(tensor.shape))
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = norm.layernorm(x, weight, bias)
    assert packed == [(3, 5, 48), (48,), (3, 5), (3, 5)]  # input, weight, mean, rstd
    y.sum().backward()
    assert x.grad is not None and weight.grad is not None and bias.grad is not None


def test_frozen_parameters_get_no_gradient_and_no_bias_is_none():
    x, weight, _ = _inputs(torch.float32, with_bias=False)
    weight.requires_grad_(False)
    y = norm.layernorm(x, weight, None)
    y.sum().backward()
    assert x.grad is not None and weight.grad is None
    assert not ops.layernorm_fwd(x.detach(), weight, None, 1e-5, False)[0].requires_grad


def test_statistics_are_not_differentiable():
    x, weight, bias = _inputs(torch.float32)
    _, mean, rstd = ops.layernorm_fwd(x, weight, bias, 1e-5, False)
    assert not mean.requires_grad and not rstd.requires_grad


def test_a_torch_function_mode_sees_the_op():
    x, weight, bias = _inputs(torch.float32)
    with FunctionLog() as log:
        norm.layernorm(x, weight, bias)
        norm.rmsnorm(x, weight)
    seen = log.names
    assert any("layernorm_fwd" in name for name in seen) and any("rmsnorm_fwd" in name for name in seen), seen
