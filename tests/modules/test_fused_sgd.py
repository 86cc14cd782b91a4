"""te.optimizers.FusedSGD against torch.optim.SGD (fp32: bit-identical over every option) and
against the formula computed in float64 (fp16 params: one rounding per step, the step applying
the stored, rounded momentum buffer, as torch.optim.SGD does);
wd_after_momentum, grad_scale, param groups, params without gradients, zero_grad, state_dict
round trips and argument errors."""
import copy as copy_module

import pytest
import torch

import transformer_engine.pytorch as te

OPTIONS = [{"lr": 0.25, "momentum": 0.125}, {"lr": 0.1}, {"lr": 0.1, "momentum": 0.9, "nesterov": True,
                                                          "weight_decay": 0.01},
           {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.1}]


def run(optimizer_class, tensors, options, steps=7, seed=0):
    params = [torch.nn.Parameter(t.clone()) for t in tensors]
    optimizer = optimizer_class(params, **options)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.rand(p.shape, generator=generator).to(p.dtype)
        optimizer.step()
    return params, optimizer


def formula(tensors, options, steps=7, seed=0, wd_after_momentum=False):
    """The update in float64, rounding the params and buffers to their dtype once per step; the
    step applies the rounded buffer."""
    lr, momentum = options["lr"], options.get("momentum", 0.0)
    dampening, decay, nesterov = options.get("dampening", 0.0), options.get("weight_decay", 0.0), \
        options.get("nesterov", False)
    params, buffers = [t.clone() for t in tensors], [None] * len(tensors)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for i, p in enumerate(params):
            g = torch.rand(p.shape, generator=generator).to(p.dtype).double()
            wide = p.double()
            if not wd_after_momentum:
                g = g + decay * wide
            if momentum:
                v = g if buffers[i] is None else buffers[i].double() * momentum + (1 - dampening) * g
                buffers[i] = v.to(p.dtype)
                v = buffers[i].double()
                g = g + momentum * v if nesterov else v
            if wd_after_momentum:
                g = g + decay * wide
            params[i] = (wide - lr * g).to(p.dtype)
    return params


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_float32_equals_torch_sgd(options):
    tensors = [torch.rand(278011), torch.rand(3, 5)]
    ours, _ = run(te.optimizers.FusedSGD, tensors, options)
    torch_params, _ = run(torch.optim.SGD, tensors, options)
    for a, b in zip(ours, torch_params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_float16_params_follow_the_formula_with_one_rounding(options):
    tensors = [torch.rand(4099, dtype=torch.float16)]
    ours, _ = run(te.optimizers.FusedSGD, tensors, options)
    want = formula(tensors, options)
    # Within an ulp or two of the float64 formula rounded per step (the steps compound).
    torch.testing.assert_close(ours[0], want[0], rtol=2e-3, atol=2e-3)


def test_float16_momentum_equals_torch_sgd():
    """torch.optim.SGD rounds the buffer before the step: so do we (TE's test_fused_optimizer
    compares fp16 FusedSGD with torch.optim.SGD)."""
    tensors = [torch.rand(278011, dtype=torch.float16)]
    options = {"lr": 0.25, "momentum": 0.125}
    ours, optimizer = run(te.optimizers.FusedSGD, tensors, options)
    torch_params, torch_optimizer = run(torch.optim.SGD, tensors, options)
    assert torch.equal(ours[0], torch_params[0])
    buffer = optimizer.state[ours[0]]["momentum_buffer"]
    assert buffer.dtype == torch.float16
    assert torch.equal(buffer, torch_optimizer.state[torch_params[0]]["momentum_buffer"])


def test_weight_decay_after_momentum_and_grad_scale():
    options = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.2}
    tensors = [torch.rand(257)]
    params = [torch.nn.Parameter(t.clone()) for t in tensors]
    optimizer = te.optimizers.FusedSGD(params, **options, wd_after_momentum=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(7):
        params[0].grad = torch.rand(257, generator=generator) * 4.0
        optimizer.step(grad_scale=4.0)  # the gradients of a loss scaled by 4
    torch.testing.assert_close(params[0], formula(tensors, options, wd_after_momentum=True)[0].float(),
                               rtol=1e-6, atol=1e-6)


def test_groups_missing_gradients_zero_grad_and_state_dict():
    a, b, frozen = (torch.nn.Parameter(torch.rand(8)) for _ in range(3))
    optimizer = te.optimizers.FusedSGD([{"params": [a, frozen]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    before = frozen.detach().clone()
    a.grad, b.grad = torch.ones(8), torch.ones(8)
    optimizer.step()
    assert torch.equal(frozen, before) and frozen not in optimizer.state
    assert optimizer.param_groups[1]["lr"] == 0.5
    copy = te.optimizers.FusedSGD([torch.nn.Parameter(a.detach().clone())], lr=0.1, momentum=0.9)
    saved = copy_module.deepcopy(optimizer.state_dict())  # state_dict() shares the live buffers
    copy.load_state_dict({"state": {0: saved["state"][0]}, "param_groups": [{**saved["param_groups"][0],
                                                                             "params": [0]}]})
    copy.param_groups[0]["params"][0].grad = torch.ones(8)
    optimizer.step()
    copy.step()
    assert torch.equal(copy.param_groups[0]["params"][0], a)
    optimizer.zero_grad()
    assert a.grad is None


@pytest.mark.parametrize("kwargs, words", [({"lr": -1.0}, "learning rate"), ({"momentum": -0.1}, "momentum"),
                                           ({"weight_decay": -1.0}, "weight_decay"),
                                           ({"nesterov": True}, "Nesterov"),
                                           ({"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "dampening")])
def test_bad_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        te.optimizers.FusedSGD([torch.nn.Parameter(torch.ones(2))], **{"lr": 0.1, **kwargs})
