"""fuse_wgrad_accumulation with Megatron-LM's DDP convention: weights carry main_grad and
grad_added_to_main_grad, and a hook on each weight's gradient accumulation adds .grad to main_grad
unless the GEMM already did, then reduces main_grad. The GEMM must set the flag and return a
(zero) gradient so that the hook runs; it returned None, so the hook never ran (Megatron's
gradient reduction then waits for those weights forever)."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from numerics import assert_close

MODULES = {
    "Linear": (lambda **kw: te.Linear(32, 48, **kw), lambda m, x: m(x)),
    "LayerNormLinear": (lambda **kw: te.LayerNormLinear(32, 48, **kw), lambda m, x: m(x)),
    "LayerNormMLP": (lambda **kw: te.LayerNormMLP(32, 64, **kw), lambda m, x: m(x)),
    "GroupedLinear": (lambda **kw: te.GroupedLinear(2, 32, 48, **kw), lambda m, x: m(x, [8, 8])),
}


def gemm_weights(module):
    return [p for name, p in module.named_parameters() if "weight" in name and "layer_norm" not in name]


def megatron_ddp(weights):
    """Megatron's buffers, flag and hook on the weights; returns the list of hook calls."""
    calls = []
    for weight in weights:
        weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)
        weight.grad_added_to_main_grad = False

        def hook(param):
            if param.grad is not None and not param.grad_added_to_main_grad:
                param.main_grad.add_(param.grad)
            param.grad = None
            calls.append(param)
        weight.register_post_accumulate_grad_hook(hook)
    return calls


@pytest.mark.parametrize("fp8", [False, True], ids=["high_precision", "fp8"])
@pytest.mark.parametrize("name", MODULES)
def test_megatron_main_grad_convention(name, fp8):
    make, call = MODULES[name]
    plain, fused = make(), make(fuse_wgrad_accumulation=True)
    fused.load_state_dict(plain.state_dict())
    calls = megatron_ddp(gemm_weights(fused))
    for microbatch in range(2):  # gradients accumulate over microbatches until the optimizer step
        x = torch.randn(16, 32)
        for module in (plain, fused):
            with te.autocast(enabled=fp8, recipe=recipe.DelayedScaling()):
                y = call(module, x)
            y.backward(torch.ones_like(y))
        assert len(calls) == len(gemm_weights(fused)) * (microbatch + 1), "the hook runs once per weight and backward"
    for want, weight in zip(gemm_weights(plain), gemm_weights(fused)):
        assert weight.grad_added_to_main_grad and weight.grad is None
        assert_close(weight.main_grad, want.grad, name="main_grad")


def test_deferred_weight_gradient_marks_main_grad_too():
    """delay_wgrad_compute: the weight gradient goes to main_grad in backward_dw(), which sets
    grad_added_to_main_grad as the GEMM's backward does without the delay."""
    plain, fused = te.Linear(32, 48), te.Linear(32, 48, fuse_wgrad_accumulation=True, delay_wgrad_compute=True)
    fused.load_state_dict(plain.state_dict())
    fused.weight.main_grad = torch.zeros(48, 32)
    fused.weight.grad_added_to_main_grad = False
    x = torch.randn(16, 32)
    for module in (plain, fused):
        module(x).sum().backward()
    assert not fused.weight.grad_added_to_main_grad, "nothing added before backward_dw()"
    fused.backward_dw()
    assert fused.weight.grad_added_to_main_grad and fused.weight.grad is None
    assert_close(fused.weight.main_grad, plain.weight.grad, name="main_grad")


@pytest.mark.parametrize("fp8_recipe", [None, recipe.MXFP8BlockScaling(), recipe.DelayedScaling()],
                         ids=lambda r: type(r).__name__)
def test_frozen_weight_with_fused_wgrad_accumulation_gets_no_weight_gradient(fp8_recipe):
    """fuse_wgrad_accumulation=True with a weight that does not require grad (frozen, so no
    main_grad set): the backward skips the weight-gradient GEMM and still gives the input's."""
    layer = te.Linear(32, 16, fuse_wgrad_accumulation=True)
    layer.weight.requires_grad_(False)
    x = torch.randn(8, 32, requires_grad=True)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        y = layer(x)
    y.sum().backward()
    assert x.grad is not None and layer.weight.grad is None
    assert layer.bias.grad is not None
