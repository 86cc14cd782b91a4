"""activation_fwd's C++ autograd (bindings/activation_ops.cpp) and its direct call
(bindings/direct_calls.h): the same results and gradients as the backward ops called by
hand, the bias gradient only where the bias needs one, saved tensors visible to saved-tensor
hooks, no double backward, and __torch_function__ modes still seeing the op."""
import pytest
import torch

from function_log import FunctionLog
from transformer_engine.pytorch.custom_ops.activation import activation

ops = torch.ops.portable_te
ARGS = (7.0, 1.702)  # limit, alpha (clamped_swiglu's defaults)


def _inputs(dtype, name, with_bias=True):
    torch.manual_seed(0)
    cols = 48
    x = torch.randn(5, 3, cols, dtype=dtype).transpose(0, 1).requires_grad_()  # non-contiguous
    bias = torch.randn(cols, dtype=dtype).requires_grad_() if with_bias else None
    return x, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["gelu", "silu", "swiglu", "clamped_swiglu", "srelu"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_gradients_are_the_backward_ops(name, dtype, with_bias):
    x, bias = _inputs(dtype, name, with_bias)
    y = activation(x, name, bias)
    assert torch.equal(y, ops.activation_fwd(x.detach(), None if bias is None else bias.detach(), name, *ARGS))
    dy = torch.randn_like(y)
    wrt = (x,) if bias is None else (x, bias)
    grads = torch.autograd.grad(y, wrt, dy)
    if bias is None:
        expected = (ops.activation_bwd(dy, x.detach(), None, name, *ARGS),)
    else:
        expected = ops.activation_bwd_dbias(dy, x.detach(), bias.detach(), name, *ARGS)
    for got, want in zip(grads, expected, strict=True):
        assert torch.equal(got, want)


def test_a_frozen_bias_gets_no_gradient():
    x, bias = _inputs(torch.float32, "gelu")
    bias.requires_grad_(False)
    y = activation(x, "gelu", bias)
    y.sum().backward()
    assert x.grad is not None and bias.grad is None
    expected = ops.activation_bwd(torch.ones_like(y), x.detach(), bias, "gelu", *ARGS)
    assert torch.equal(x.grad, expected)


def test_an_input_without_grad_builds_no_graph():
    x, bias = _inputs(torch.float32, "gelu", with_bias=False)
    assert not activation(x.detach(), "gelu").requires_grad


def test_saved_tensors_go_through_saved_tensor_hooks():
    x, bias = _inputs(torch.float32, "swiglu")
    packed = []

    def pack(tensor):
        packed.append(tuple(tensor.shape))
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = activation(x, "swiglu", bias)
    assert packed == [(3, 5, 48), (48,)]  # input and bias: the backward recomputes the activation
    y.sum().backward()
    assert x.grad is not None and bias.grad is not None


def test_double_backward_is_refused():
    x, bias = _inputs(torch.float32, "gelu")
    y = activation(x, "gelu", bias)
    (grad_x,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="activation_bwd"):
        grad_x.sum().backward()


def test_a_torch_function_mode_sees_the_op():
    x, bias = _inputs(torch.float32, "gelu")
    with FunctionLog() as log:
        activation(x, "gelu", bias)
    assert any("activation_fwd" in name for name in log.names), log.names


def test_compiled_equals_eager():
    x, bias = _inputs(torch.float32, "swiglu")
    dy = torch.randn(3, 5, 24)

    def forward(x, bias):
        return activation(x, "swiglu", bias)
    results = []
    for run in (forward, torch.compile(forward, fullgraph=True, backend="aot_eager")):
        y = run(x, bias)
        results.append((y,) + torch.autograd.grad(y, (x, bias), dy))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
