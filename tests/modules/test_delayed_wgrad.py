"""delay_wgrad_compute=True as a pipeline schedule (zero-bubble, Megatron's split backward)
uses it: several microbatches run forward and backward, the backward computing only the
input gradients, and backward_dw() later computes the weight (and bias) gradients of every
microbatch since the last call. The gradients must be those of the same module without the
delay, for every recipe, with frozen weights and biases left without a gradient (an optimizer
would move them otherwise), computed without building an autograd graph, and what the
backward kept for them must be freed once backward_dw() has run."""
import gc
import weakref

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

HIDDEN, OUT, TOKENS = 64, 32, 64  # multiples of MXFP8's 32-element blocks

# name: (constructor, forward, the GEMM weights, the GEMM biases)
MODULES = {
    "Linear": (lambda **kw: te.Linear(HIDDEN, OUT, **kw), lambda m, x: m(x),
               ("weight",), ("bias",)),
    "LayerNormLinear": (lambda **kw: te.LayerNormLinear(HIDDEN, OUT, **kw), lambda m, x: m(x),
                        ("weight",), ("bias",)),
    "LayerNormMLP": (lambda **kw: te.LayerNormMLP(HIDDEN, 64, **kw), lambda m, x: m(x),
                     ("fc1_weight", "fc2_weight"), ("fc1_bias", "fc2_bias")),
    "GroupedLinear": (lambda **kw: te.GroupedLinear(2, HIDDEN, OUT, **kw), lambda m, x: m(x, [TOKENS // 2] * 2),
                      ("weight0", "weight1"), ("bias0", "bias1")),
    # The GEMM's weight made from parameters (a concatenation, views of one): the deferred
    # gradients must reach the parameters (they went to the made tensor, and were lost).
    "Linear_parameters_split": (lambda **kw: te.Linear(HIDDEN, OUT, parameters_split=("query", "value"), **kw),
                                lambda m, x: m(x), ("query_weight", "value_weight"), ("query_bias", "value_bias")),
    "GroupedLinear_single_grouped": (lambda **kw: te.GroupedLinear(2, HIDDEN, OUT, single_grouped_weight=True,
                                                                   single_grouped_bias=True, **kw),
                                     lambda m, x: m(x, [TOKENS // 2] * 2), ("weight",), ("bias",)),
}
# Those that take fuse_wgrad_accumulation (main_grad is set on a parameter, not on a GEMM
# operand made from several).
MAIN_GRAD_MODULES = ["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"]
RECIPES = [None, recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8BlockScaling(),
           recipe.MXFP8BlockScaling()]
RECIPE_IDS = ["high_precision", "delayed", "current", "block", "mxfp8"]
# Which GEMM parameters are frozen: a module's first weight, its last bias (LayerNormMLP's
# fc2_bias, GroupedLinear's bias1: one of two GEMMs), or every GEMM parameter.
FROZEN = {
    "none": lambda weights, biases: (),
    "weight": lambda weights, biases: weights[:1],
    "bias": lambda weights, biases: biases[-1:],
    "all": lambda weights, biases: weights + biases,
}


def make_pair(name, frozen="none", **kwargs):
    """(immediate, delayed): the module without and with delay_wgrad_compute, the same
    parameters, the same ones frozen; and the frozen parameters' names."""
    make, _, weights, biases = MODULES[name]
    immediate = make(**kwargs)
    delayed = make(delay_wgrad_compute=True, **kwargs)
    delayed.load_state_dict(immediate.state_dict())
    frozen_names = FROZEN[frozen](weights, biases)
    for module in (immediate, delayed):
        for param_name in frozen_names:
            getattr(module, param_name).requires_grad_(False)
    return immediate, delayed, frozen_names


def forward(name, module, x, rec):
    with te.autocast(enabled=rec is not None, recipe=rec):
        return MODULES[name][1](module, x)


def run_schedule(name, module, inputs, rec, dw_each_step):
    """A 1F1B-like schedule over three microbatches: forward 0, forward 1, backward 1,
    backward 0 (out of order), then forward and backward 2; backward_dw() after each
    backward (dw_each_step) or once at the end. Returns the inputs' gradients."""
    xs = [x.clone().requires_grad_() for x in inputs]

    def backward(y):
        y.square().sum().backward()
        if dw_each_step:
            module.backward_dw()
    y0, y1 = forward(name, module, xs[0], rec), forward(name, module, xs[1], rec)
    backward(y1)
    backward(y0)
    backward(forward(name, module, xs[2], rec))
    module.backward_dw()  # no-op after per-step calls: nothing pending
    return [x.grad for x in xs]


def assert_plain_gradient(param, param_name):
    """A gradient as autograd leaves one: no graph behind it, not itself requiring grad."""
    grad = param.grad
    assert grad.grad_fn is None and not grad.requires_grad, (
        f"{param_name}.grad carries an autograd graph ({grad.grad_fn}): backward_dw() ran with grad enabled")


@pytest.mark.parametrize("dw_each_step", [False, True], ids=["one_backward_dw", "backward_dw_each_step"])
@pytest.mark.parametrize("frozen", list(FROZEN), ids=lambda f: f"frozen_{f}")
@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("name", MODULES)
def test_gradients_match_immediate_backward(name, rec, frozen, dw_each_step):
    """Every gradient (input, GEMM and norm parameters) equals the undelayed module's; a frozen
    parameter has none; a computed one is a plain tensor."""
    immediate, delayed, frozen_names = make_pair(name, frozen)
    inputs = [torch.randn(TOKENS, HIDDEN) for _ in range(3)]
    want_x = run_schedule(name, immediate, inputs, rec, dw_each_step=False)
    got_x = run_schedule(name, delayed, inputs, rec, dw_each_step)
    for got, want in zip(got_x, want_x):
        assert torch.equal(got, want), "input gradient"
    for param_name, param in delayed.named_parameters():
        if param_name in frozen_names:
            assert param.grad is None, f"frozen {param_name} got a gradient from backward_dw()"
            continue
        assert_plain_gradient(param, param_name)
        assert torch.equal(param.grad, immediate.get_parameter(param_name).grad), param_name


def with_main_grads(module, weight_names):
    """Megatron's fp32 main_grad buffers on the trainable weights (none on frozen ones)."""
    for param_name in weight_names:
        weight = module.get_parameter(param_name)
        if weight.requires_grad:
            weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)


@pytest.mark.parametrize("frozen", ["none", "weight", "all"], ids=lambda f: f"frozen_{f}")
@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("name", MAIN_GRAD_MODULES)
def test_fuse_wgrad_accumulation_main_grad(name, rec, frozen):
    """With fuse_wgrad_accumulation the deferred weight gradients add into main_grad as the
    undelayed ones do; a frozen weight, which has no main_grad, is skipped (it raised
    'tensor does not have a device')."""
    immediate, delayed, frozen_names = make_pair(name, frozen, fuse_wgrad_accumulation=True)
    weight_names = MODULES[name][2]
    for module in (immediate, delayed):
        with_main_grads(module, weight_names)
    inputs = [torch.randn(TOKENS, HIDDEN) for _ in range(3)]
    run_schedule(name, immediate, inputs, rec, dw_each_step=False)
    run_schedule(name, delayed, inputs, rec, dw_each_step=False)
    for param_name in weight_names:
        weight, want = delayed.get_parameter(param_name), immediate.get_parameter(param_name)
        assert weight.grad is None, f"{param_name}: the gradient goes to main_grad"
        if param_name in frozen_names:
            assert not hasattr(weight, "main_grad")
            continue
        assert torch.equal(weight.main_grad, want.main_grad), f"{param_name}.main_grad"
    for param_name in MODULES[name][3]:
        bias = delayed.get_parameter(param_name)
        assert (bias.grad is None) == (param_name in frozen_names), param_name


def saved_tensor_refs(name, module, rec):
    """Runs one microbatch's forward and backward on a fresh input, keeping only weak
    references to the input and to the output gradient (what the deferred weight gradient
    needs, and the autograd graph of a gradient computed with grad enabled would keep)."""
    x = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    y = forward(name, module, x, rec)
    dy = torch.randn_like(y)
    y.backward(dy)
    return weakref.ref(x), weakref.ref(dy)


def assert_freed(refs, when):
    gc.collect()
    for ref, what in zip(refs, ("the input", "the output gradient")):
        assert ref() is None, f"{what} is still alive {when}"


@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("name", MODULES)
def test_backward_dw_frees_saved_tensors(name, rec):
    """Once backward_dw() has run, nothing keeps the microbatch's input or output gradient:
    neither the gradients (in high precision, the deferred GEMM ran with grad enabled and
    its graph held the input) nor the module."""
    _, delayed, _ = make_pair(name)
    refs = saved_tensor_refs(name, delayed, rec)
    delayed.backward_dw()
    assert_freed(refs, "after backward_dw()")
    for param_name, param in delayed.named_parameters():
        assert_plain_gradient(param, param_name)


@pytest.mark.parametrize("rec", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("name", MODULES)
def test_deferred_work_drops_its_tensors_once_run(name, rec):
    """A deferred weight gradient that has run holds nothing more, even while something (a
    schedule's queue, an exception's traceback) still holds the work itself."""
    _, delayed, _ = make_pair(name)
    refs = saved_tensor_refs(name, delayed, rec)
    pending = list(delayed._deferred_wgrad)
    assert pending, "the backward deferred the weight gradients"
    delayed.backward_dw()
    assert_freed(refs, "while the deferred work that has run is still referenced")
    del pending


@pytest.mark.parametrize("name", MAIN_GRAD_MODULES)
def test_wgrad_accumulation_and_reduce_hooks(name):
    """TE's register_wgrad_accumulation_and_reduce_hooks: each hook runs at the end of every
    backward_dw(), after the deferred gradients are in place (Megatron-Core reduces them from
    there); need_backward_dw() says whether the module defers; without the delay backward_dw()
    does nothing and runs no hook."""
    immediate, delayed, _ = make_pair(name)
    seen = []
    weight = getattr(delayed, MODULES[name][2][0])
    delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: seen.append(weight.grad is not None))
    immediate.register_wgrad_accumulation_and_reduce_hooks(lambda: seen.append("immediate"))
    assert delayed.need_backward_dw() and not immediate.need_backward_dw()
    x = torch.randn(TOKENS, HIDDEN)
    forward(name, delayed, x, None).sum().backward()
    assert seen == []
    delayed.backward_dw()
    delayed.backward_dw()
    assert seen == [True, True]
    forward(name, immediate, x, None).sum().backward()
    immediate.backward_dw()
    assert seen == [True, True]
