"""te.ops.SiTUGLU / ScaledSiTUGLU (TE main: Kimi K3's soft-capped SiLU GLU, plain PyTorch here,
no kernel of ours yet) against a float64 reference, forward and backward, and the scaled GLUs'
refusal of activation recomputation (as TE main)."""
import pytest
import torch

import transformer_engine.pytorch.ops as te_ops


def _situglu(x, beta1=4.0, beta2=25.0):
    gate, up = x.chunk(2, dim=-1)
    return beta1 * torch.tanh(gate / beta1) * torch.sigmoid(gate) * beta2 * torch.tanh(up / beta2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleave", [None, 4])
def test_situglu_forward_and_backward(dtype, interleave):
    torch.manual_seed(1)
    x_ref = (4 * torch.randn(3, 7, 24, dtype=torch.float64)).requires_grad_()
    x = x_ref.detach().to(dtype).requires_grad_()
    halves = x_ref
    if interleave is not None:  # blocks of 4 alternate between the two halves
        halves = x_ref.reshape(3, 7, 3, 2, interleave).transpose(-3, -2).reshape(3, 7, 24)
    y_ref = _situglu(halves, 2.0, 10.0)
    y = te_ops.SiTUGLU(beta1=2.0, beta2=10.0, glu_interleave_size=interleave)(x)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y.backward(dy.to(dtype))
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1.3e-6, "atol": 1e-5}
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), y_ref, **tol)
    torch.testing.assert_close(x.grad.double(), x_ref.grad, **tol)


def test_scaled_situglu_scales_rows():
    x, scales = torch.randn(6, 32), torch.rand(6)
    torch.testing.assert_close(te_ops.ScaledSiTUGLU()(x, scales), _situglu(x) * scales[:, None])


@pytest.mark.parametrize("name,value", [("beta1", 0.0), ("beta2", float("inf")), ("beta1", -1.0)])
def test_situglu_refuses_bad_caps(name, value):
    for op in (te_ops.SiTUGLU, te_ops.ScaledSiTUGLU):
        with pytest.raises(ValueError, match=name):
            op(**{name: value})


def test_scaled_glus_refuse_activation_recompute():
    for op in (te_ops.ScaledSwiGLU, te_ops.ScaledSiTUGLU, te_ops.ScaledClampedQGeGLU):
        assert op().activation_recompute_in_mlp is False
        with pytest.raises(ValueError, match="does not support activation recomputation"):
            op(activation_recompute_in_mlp=True)
    assert te_ops.ScaledSReLU(activation_recompute_in_mlp=True).activation_recompute_in_mlp
