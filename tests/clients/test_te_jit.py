"""transformer_engine.pytorch.jit (TE's fused elementwise helpers) against plain PyTorch: the
GELU and its gradients, the L2 normalisation and its gradient, bias-dropout-add, and the
compile helpers."""
import pytest
import torch
import torch.nn.functional as F

from transformer_engine.pytorch import jit

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def reference_gelu(x):
    return F.gelu(x.float(), approximate="tanh")


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_and_its_gradients_match_torch(dtype):
    torch.manual_seed(0)
    inp = torch.randn(3, 5, 40, dtype=dtype, requires_grad=True)
    bias = torch.randn(40, dtype=dtype, requires_grad=True)
    grad = torch.randn(3, 5, 40, dtype=dtype)
    rtol, atol = TOLERANCE[dtype]
    out = jit.bias_gelu_fused(inp, bias)
    reference_inp, reference_bias = inp.detach().float().requires_grad_(), bias.detach().float().requires_grad_()
    reference = reference_gelu(reference_inp + reference_bias)
    torch.testing.assert_close(out.float(), reference, rtol=rtol, atol=atol)
    reference.backward(grad.float())
    grad_bias, grad_input = jit.bgrad_dgelu_fused(grad, inp.detach(), bias.detach())
    torch.testing.assert_close(grad_input.float(), reference_inp.grad, rtol=rtol, atol=atol)
    torch.testing.assert_close(grad_bias.float(), reference_bias.grad, rtol=rtol, atol=atol * 15)
    out.backward(grad)  # autograd through the kernel gives the same gradients
    torch.testing.assert_close(inp.grad, grad_input)
    dgelu = jit.dgelu_fused_(grad, inp.detach())
    x = inp.detach().float().requires_grad_()
    reference_gelu(x).backward(grad.float())
    torch.testing.assert_close(dgelu.float(), x.grad, rtol=rtol, atol=atol)
    torch.testing.assert_close(jit.gelu_fused_(inp.detach()).float(), reference_gelu(inp.detach()), rtol=rtol,
                               atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_l2_normalisation_and_its_gradient_match_autograd(dtype):
    torch.manual_seed(1)
    x = torch.randn(6, 64, dtype=dtype)
    grad = torch.randn(6, 64, dtype=dtype)
    eps = 1e-6
    y, rsqrt_norm = jit.l2normalization_fwd_fused(x, eps)
    reference_x = x.double().requires_grad_()
    reference = reference_x * torch.rsqrt(reference_x.square().sum(-1, keepdim=True) + eps)
    reference.backward(grad.double())
    rtol, atol = TOLERANCE[dtype]
    assert y.dtype == dtype and rsqrt_norm.dtype == torch.float32 and rsqrt_norm.shape == (6, 1)
    torch.testing.assert_close(y.double(), reference.detach(), rtol=rtol, atol=atol)
    assert torch.equal(jit.l2normalization_fused(x, eps), y)
    dx = jit.l2normalization_backward_fused(grad, x, rsqrt_norm, eps)
    torch.testing.assert_close(dx.double(), reference_x.grad, rtol=rtol, atol=atol)


def test_bias_dropout_add():
    torch.manual_seed(2)
    x, residual, bias = torch.randn(4, 2, 16), torch.randn(4, 2, 16), torch.randn(16)
    assert torch.equal(jit.bias_dropout_add_fused_inference(x, bias, residual, 0.5), residual + (x + bias))
    assert torch.equal(jit.get_bias_dropout_add(False)(x, bias, residual, 0.5), residual + (x + bias))
    torch.manual_seed(3)
    trained = jit.bias_dropout_add_fused_train(x, bias, residual, 0.5)
    torch.manual_seed(3)
    assert torch.equal(trained, residual + F.dropout(x + bias, p=0.5, training=True))
    assert torch.equal(jit.bias_dropout_add(x, None, residual, 0.0, True), residual + x)


def test_compile_helpers_and_warmups():
    calls = []

    @jit.jit_fuser
    def scaled(x):
        return x * 2 + 1

    @jit.no_torch_dynamo()
    def eager_only(x):
        calls.append(torch.compiler.is_compiling())
        return x - 1

    x = torch.randn(8)
    assert torch.equal(scaled(x), x * 2 + 1)
    assert torch.equal(torch.compile(lambda t: eager_only(t) * 3)(x), (x - 1) * 3)
    assert calls == [False]  # run eagerly, outside the compiled graph
    jit.set_jit_fusion_options()
    jit.warmup_jit_bias_dropout_add_all_dtypes(16, 4, 2)
    jit.warmup_jit_bias_gelu_all_dtypes(32, 4, 2)
    jit.warmup_jit_l2normalization_all_dtypes(16, 4, 2)
