"""TE 2.18's forward keywords of the GEMM modules. te.Linear and te.LayerNormLinear:
fp8_output (the output as an FP8 tensor, the output slot's cast) and fp8_grad (the GEMM's
input gradient as one, the grad-input slot's cast), bit for bit against the casts of the
results computed without them, with the slots' amaxes; both ignored outside FP8.
te.GroupedLinear: out= and dgrad_out=, the caller's buffers the results are written into."""
import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8.quantized_tensor import QuantizedTensor
from transformer_engine.pytorch.reference.fp8_cast import fp8_dequantize, fp8_quantize
from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
from numerics import assert_same_fp8, assert_value_error_naming, fp32_quotient

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
IN, OUT = 64, 48
OUTPUT_SLOT, GRAD_INPUT_SLOT = 2, 1  # forward (input, weight, output); backward (grad_output, grad_input)

RECIPES = {"delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
           "current": recipe.Float8CurrentScaling}
DTYPES = [torch.float32, torch.bfloat16]
MODULES = ["Linear", "LayerNormLinear"]


def make(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    module = getattr(te, kind)(IN, OUT, params_dtype=dtype)
    with torch.no_grad():
        module.bias.normal_()  # a bias that shows where it is added
    return module


def gemm_of(module: torch.nn.Module, x: torch.Tensor, rec) -> "tuple[torch.Tensor, te.Linear]":
    """(the GEMM's input for x, a te.Linear with the module's weight, bias and FP8 state): the
    module's GEMM on its own. A LayerNormLinear's GEMM input is its norm's output (the codes of
    its FP8 forms are those of that output's cast)."""
    if isinstance(module, te.LayerNormLinear):
        twin = copy.deepcopy(module)
        twin.return_layernorm_output = True
        with te.autocast(recipe=rec):
            gemm_input = twin(x)[1].detach()
    else:
        gemm_input = x.detach()
    linear = te.Linear(IN, OUT, params_dtype=module.weight.dtype)
    linear.load_state_dict({name: module.state_dict()[name] for name in ("weight", "bias", "_extra_state")})
    return gemm_input, linear


def unrounded(module: torch.nn.Module, x: torch.Tensor, rec, fp32: bool) -> "tuple[te.Linear, torch.Tensor]":
    """(the module's GEMM with its FP8 state, its input): widened to fp32 (exact: the same FP8
    codes, the GEMM's fp32 result) when fp32, else in the module's dtype."""
    gemm_input, linear = gemm_of(module, x, rec)
    if fp32:
        linear.float()
        gemm_input = gemm_input.float()
    return linear, gemm_input


def assert_cast(got: torch.Tensor, values: torch.Tensor, scale: torch.Tensor, fp8_dtype, dtype) -> None:
    """got is the Float8Tensor of nominal dtype `dtype` holding saturate(values * scale) in
    fp8_dtype with scale_inv 1 / scale: codes, scale_inv and dequantised values bit for bit."""
    assert isinstance(got, Float8Tensor) and got.dtype == dtype and got.shape == values.shape
    codes, _ = fp8_quantize(values, scale, fp8_dtype)
    assert_same_fp8(got._data.view(fp8_dtype), codes)
    scale_inv = torch.reciprocal(scale.reshape(1).float())
    assert torch.equal(got._scale_inv, scale_inv)
    assert torch.equal(got.dequantize(dtype=torch.float32), fp8_dequantize(codes, scale_inv, torch.float32))


def slot_scale(module, direction: str, slot: int) -> torch.Tensor:
    """The slot's scale now: 1 before the module's first FP8 forward."""
    if module.fp8_meta is None:
        return torch.ones(())
    return module.fp8_meta[direction].scale[slot].clone()


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", sorted(RECIPES))
def test_fp8_output_is_the_output_slot_cast_of_the_gemm_result(kind, dtype, scaling):
    """DelayedScaling: the GEMM's fp32 result (bias added in fp32) cast once with the output
    slot's scale (set by the update after a first step from the amax it recorded), that amax
    recorded again. Float8CurrentScaling: the result in the activation dtype (TE casts after a
    GEMM that wrote it) cast with the scale of its own amax, both kept in the slot."""
    rec, module = RECIPES[scaling](), make(kind, dtype)
    x = torch.randn(2, 5, IN, dtype=dtype)
    with te.autocast(recipe=rec):
        module(x, fp8_output=True)  # step 1: the output slot records its first amax
    linear, gemm_input = unrounded(module, x, rec, fp32=scaling == "delayed")
    with te.autocast(recipe=rec):
        result = linear(gemm_input)  # [2, 5, OUT], fp32 (delayed) or the activation dtype (current)
    amax = result.abs().max().float()
    scale = slot_scale(module, "scaling_fwd", OUTPUT_SLOT) if scaling == "delayed" else fp32_quotient(448.0, amax)
    if scaling == "delayed":
        assert torch.equal(scale, fp32_quotient(448.0, module.fp8_meta["scaling_fwd"].amax_history[-1, OUTPUT_SLOT]))
    with te.autocast(recipe=rec):
        y = module(x, fp8_output=True)
        assert module.fp8_meta["scaling_fwd"].amax_history[0, OUTPUT_SLOT] == amax  # recorded in this step
    assert_cast(y, result, scale, E4M3, dtype)
    if scaling == "current":
        assert torch.equal(slot_scale(module, "scaling_fwd", OUTPUT_SLOT), scale)


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", sorted(RECIPES))
def test_fp8_output_leaves_the_gradients_as_they_are(kind, dtype, scaling):
    """The gradient passes through the cast: every gradient is that of the same call without
    fp8_output (from the same FP8 state), bit for bit; a preceding op gets a plain one."""
    rec, module = RECIPES[scaling](), make(kind, dtype)
    twin = copy.deepcopy(module)
    x = torch.randn(2, 5, IN, dtype=dtype)
    dy = torch.randn(2, 5, OUT, dtype=dtype)
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    with te.autocast(recipe=rec):
        y = module(inputs[0], fp8_output=True)
    with te.autocast(recipe=rec):
        plain = twin(inputs[1])
    assert isinstance(y, Float8Tensor) and not isinstance(plain, QuantizedTensor)
    y.backward(dy)
    plain.backward(dy)
    assert type(inputs[0].grad) is torch.Tensor and torch.equal(inputs[0].grad, inputs[1].grad)
    for (name, param), (_, twin_param) in zip(module.named_parameters(), twin.named_parameters()):
        assert torch.equal(param.grad, twin_param.grad), name


def unrounded_dgrad(module: te.Linear, x: torch.Tensor, dy: torch.Tensor, rec, fp32: bool) -> torch.Tensor:
    """The input gradient of the module's FP8 backward from its current FP8 state, computed on
    a twin: fp32 (the dgrad GEMM's result) when fp32, else in the module's dtype."""
    twin, twin_input = unrounded(module, x, rec, fp32)
    twin_input.requires_grad_()
    with te.autocast(recipe=rec):
        twin_y = twin(twin_input)
    twin_y.backward(dy.to(twin_input.dtype))
    return twin_input.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", sorted(RECIPES))
def test_linear_fp8_grad_is_the_grad_input_slot_cast_of_the_input_gradient(dtype, scaling):
    """inp's gradient is a Float8Tensor (E5M2 under HYBRID): DelayedScaling casts the dgrad
    GEMM's fp32 result with backward slot 1's scale and records its amax, which the same
    backward's update uses (after a first step the scale is 57344 / that step's amax);
    Float8CurrentScaling casts the dgrad in the activation dtype with the scale of its own
    amax. The weight and bias gradients are those of a call without fp8_grad."""
    rec, module = RECIPES[scaling](), make("Linear", dtype)
    delayed = scaling == "delayed"
    live = -1 if delayed else 0  # the delayed update has rolled the step's amax to the last row
    for step in range(2):
        x, dy = torch.randn(2, 5, IN, dtype=dtype), torch.randn(2, 5, OUT, dtype=dtype)
        dgrad = unrounded_dgrad(module, x, dy, rec, fp32=delayed)  # fp32 (delayed) or the activation dtype
        amax = dgrad.abs().max().float()
        scale = slot_scale(module, "scaling_bwd", GRAD_INPUT_SLOT) if delayed else fp32_quotient(57344.0, amax)
        module.zero_grad(set_to_none=True)
        plain = copy.deepcopy(module)
        inp, plain_input = x.clone().requires_grad_(), x.clone().requires_grad_()
        with te.autocast(recipe=rec):
            y, plain_y = module(inp, fp8_grad=True), plain(plain_input)
        y.backward(dy)
        plain_y.backward(dy)
        assert_cast(inp.grad, dgrad, scale, E5M2, dtype)
        backward = module.fp8_meta["scaling_bwd"]
        assert backward.amax_history[live, GRAD_INPUT_SLOT] == amax
        if delayed:  # this backward's update has read it: 57344 / max(history), this amax on the first step
            history_amax = backward.amax_history[:, GRAD_INPUT_SLOT].max()
            assert torch.equal(backward.scale[GRAD_INPUT_SLOT], fp32_quotient(57344.0, history_amax))
            assert step == 1 or torch.equal(backward.scale[GRAD_INPUT_SLOT], fp32_quotient(57344.0, amax))
        assert torch.equal(module.weight.grad, plain.weight.grad) and torch.equal(module.bias.grad, plain.bias.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", sorted(RECIPES))
def test_layernorm_linear_fp8_grad_casts_the_norm_output_gradient(dtype, scaling):
    """As TE's LayerNormLinear: the GEMM's input gradient (the norm output's) is cast by the
    grad-input slot, and the norm's backward reads those FP8 values; inp's gradient is that
    backward's, in high precision. Checked against the pieces: a te.Linear with the module's
    GEMM and FP8 state, fp8_grad on the norm's output, then te.LayerNorm's backward."""
    rec, module = RECIPES[scaling](), make("LayerNormLinear", dtype)
    x, dy = torch.randn(10, IN, dtype=dtype), torch.randn(10, OUT, dtype=dtype)
    gemm_input, linear = gemm_of(module, x, rec)
    norm = te.LayerNorm(IN, params_dtype=dtype)
    norm.load_state_dict({"weight": module.layer_norm_weight, "bias": module.layer_norm_bias})
    norm_output = gemm_input.clone().requires_grad_()
    with te.autocast(recipe=rec):
        linear(norm_output, fp8_grad=True).backward(dy)
    assert isinstance(norm_output.grad, Float8Tensor) and norm_output.grad._fp8_dtype == te.DType.kFloat8E5M2
    x_norm = x.clone().requires_grad_()
    norm(x_norm).backward(norm_output.grad.dequantize())

    inp = x.clone().requires_grad_()
    with te.autocast(recipe=rec):
        module(inp, fp8_grad=True).backward(dy)
    assert type(inp.grad) is torch.Tensor and torch.equal(inp.grad, x_norm.grad)
    assert torch.equal(module.fp8_meta["scaling_bwd"].amax_history, linear.fp8_meta["scaling_bwd"].amax_history)
    assert module.fp8_meta["scaling_bwd"].amax_history[:, GRAD_INPUT_SLOT].max() > 0


def test_fp8_grad_reaches_the_preceding_op():
    """The FP8 gradient is what a preceding te.Linear's backward receives (its gradients are
    those of the same values in high precision)."""
    rec = recipe.DelayedScaling()
    first, second = te.Linear(IN, IN), te.Linear(IN, OUT)
    first_twin = copy.deepcopy(first)
    x, dy = torch.randn(10, IN), torch.randn(10, OUT)
    arrived = []
    with te.autocast(recipe=rec):
        h = first(x)
        h.register_hook(arrived.append)
        y = second(h, fp8_grad=True)
    y.backward(dy)
    assert isinstance(arrived[0], Float8Tensor)
    with te.autocast(recipe=rec):
        first_twin(x).backward(arrived[0].dequantize())
    assert torch.equal(first.weight.grad, first_twin.weight.grad)
    assert torch.equal(first.bias.grad, first_twin.bias.grad)


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("region", ["none", "disabled", "calibrating"])
def test_fp8_output_and_fp8_grad_are_ignored_outside_fp8(kind, dtype, region):
    """Outside an enabled te.autocast (TE: fp8_output and self.fp8): plain tensors, the same
    bits as a call without them, and no FP8 state written for them."""
    module = make(kind, dtype)
    x, dy = torch.randn(2, 5, IN, dtype=dtype), torch.randn(2, 5, OUT, dtype=dtype)
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    contexts = {"none": lambda: torch.enable_grad(), "disabled": lambda: te.autocast(enabled=False),
                "calibrating": lambda: te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling())}
    with contexts[region]():
        y = module(inputs[0], fp8_output=True, fp8_grad=True)
        plain = module(inputs[1])
    assert type(y) is torch.Tensor and torch.equal(y, plain)
    y.backward(dy)
    plain.backward(dy)
    assert type(inputs[0].grad) is torch.Tensor and torch.equal(inputs[0].grad, inputs[1].grad)
    if region == "calibrating":
        assert module.fp8_meta["scaling_fwd"].amax_history[:, OUTPUT_SLOT].max() == 0
        assert module.fp8_meta["scaling_bwd"].amax_history.max() == 0


@pytest.mark.parametrize("rec", [recipe.MXFP8BlockScaling(), recipe.Float8BlockScaling()],
                         ids=lambda r: type(r).__name__)
def test_block_recipes_hand_on_their_own_fp8_tensors(rec):
    """As TE, whose block quantizers cast after a GEMM that wrote the activation dtype: the
    output is the output slot's quantizer's cast of the plain output, the input gradient the
    grad-input slot's cast of the plain one."""
    module = te.Linear(IN, IN, params_dtype=torch.bfloat16)  # MXFP8 blocks: 32 elements along the last dim
    twin = copy.deepcopy(module)
    x, dy = torch.randn(32, IN, dtype=torch.bfloat16), torch.randn(32, IN, dtype=torch.bfloat16)
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    with te.autocast(recipe=rec):
        y = module(inputs[0], fp8_output=True, fp8_grad=True)
        plain = twin(inputs[1])
    y.backward(dy)
    plain.backward(dy)
    for got, values, direction, slot in ((y, plain, "forward", OUTPUT_SLOT),
                                         (inputs[0].grad, inputs[1].grad, "backward", GRAD_INPUT_SLOT)):
        expected = module.get_quantizer(direction, slot).quantize(values.detach())
        assert type(got) is type(expected) and got.dtype == torch.bfloat16
        assert torch.equal(got.dequantize(dtype=torch.float32), expected.dequantize(dtype=torch.float32))


@pytest.mark.parametrize("keyword,mode", [("fp8_output", "row"), ("fp8_grad", "column")])
def test_fp8_forms_of_a_sum_over_ranks_are_refused(keyword, mode):
    """A row-parallel output and a column-parallel input gradient are the ranks' sum: refused
    by name (TE would cast each rank's partial result), before any exchange."""
    module = te.Linear(IN, 2 * OUT, tp_size=2, parallel_mode=mode)
    x = torch.randn(4, module.in_features, requires_grad=True)
    with te.autocast(recipe=recipe.DelayedScaling()):
        assert_value_error_naming(lambda: module(x, **{keyword: True}), [keyword, mode, "tp_size=2"])


def test_forward_keywords_in_te_order():
    """TE's positional order: Linear/LayerNormLinear (inp, is_first_microbatch, fp8_output,
    fp8_grad); GroupedLinear (inp, m_splits, is_first_microbatch, out, dgrad_out)."""
    module = make("Linear", torch.float32)
    x = torch.randn(3, IN)
    with te.autocast(recipe=recipe.DelayedScaling()):
        y = module(x, None, True, False)
    assert isinstance(y, Float8Tensor)
    grouped = te.GroupedLinear(2, IN, OUT)
    out = torch.empty(3, OUT)
    assert grouped(x, [1, 2], None, out, None).data_ptr() == out.data_ptr()


GROUPED_RECIPES = {"high_precision": None, **RECIPES}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scaling", sorted(GROUPED_RECIPES))
def test_grouped_linear_writes_out_and_dgrad_out(dtype, scaling):
    """The output is a view of out and the input gradient is written into dgrad_out, both the
    bits of the call without them (a split of 0 rows included); the buffers stay plain
    tensors, reusable on the next call."""
    make_recipe = GROUPED_RECIPES[scaling]
    module = te.GroupedLinear(3, IN, OUT, params_dtype=dtype)
    twin = copy.deepcopy(module)
    out, dgrad_out = torch.empty(10, OUT, dtype=dtype), torch.empty(10, IN, dtype=dtype)
    for _ in range(2):
        x, dy = torch.randn(2, 5, IN, dtype=dtype), torch.randn(2, 5, OUT, dtype=dtype)
        inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        with te.autocast(enabled=make_recipe is not None, recipe=make_recipe and make_recipe()):
            y = module(inputs[0], [4, 0, 6], out=out, dgrad_out=dgrad_out)
        with te.autocast(enabled=make_recipe is not None, recipe=make_recipe and make_recipe()):
            plain = twin(inputs[1], [4, 0, 6])
        assert y.shape == (2, 5, OUT) and y.data_ptr() == out.data_ptr() and torch.equal(y, plain)
        assert not out.requires_grad
        y.backward(dy)
        plain.backward(dy)
        assert torch.equal(dgrad_out, inputs[1].grad.reshape(10, IN))
        assert torch.equal(inputs[0].grad, inputs[1].grad)
        for i in range(3):
            assert torch.equal(getattr(module, f"weight{i}").grad, getattr(twin, f"weight{i}").grad)
            assert torch.equal(getattr(module, f"bias{i}").grad, getattr(twin, f"bias{i}").grad)


def test_grouped_linear_dgrad_out_is_the_gradient_arriving_at_inp():
    """The gradient the preceding op receives is dgrad_out itself (same storage)."""
    module = te.GroupedLinear(2, IN, OUT)
    dgrad_out = torch.empty(6, IN)
    x = torch.randn(6, IN, requires_grad=True)
    arrived = []
    h = x * 2
    h.register_hook(arrived.append)
    module(h, [2, 4], dgrad_out=dgrad_out).sum().backward()
    assert arrived[0].data_ptr() == dgrad_out.data_ptr()
    assert torch.equal(x.grad, 2 * dgrad_out)


def test_grouped_linear_output_stays_differentiable_through_out():
    """Ops on the output (a view of out) differentiate as usual."""
    module = te.GroupedLinear(2, IN, OUT)
    twin = copy.deepcopy(module)
    x = torch.randn(6, IN)
    residual = torch.randn(6, OUT)
    y = module(x, [3, 3], out=torch.empty(6, OUT)) + residual
    (y * y).sum().backward()
    plain = twin(x, [3, 3]) + residual
    (plain * plain).sum().backward()
    assert torch.equal(module.weight1.grad, twin.weight1.grad) and torch.equal(module.bias0.grad, twin.bias0.grad)


@pytest.mark.parametrize("name,buffer,words", [
    ("out", torch.empty(6, OUT + 1), ["out", "(6, 49)", "(6, 48)"]),
    ("out", torch.empty(5, OUT), ["out", "(5, 48)", "(6, 48)"]),
    ("out", torch.empty(6, 2, OUT // 2), ["out", "(6, 2, 24)"]),
    ("out", torch.empty(6, OUT, dtype=torch.bfloat16), ["out", "torch.bfloat16", "torch.float32"]),
    ("out", torch.empty(OUT, 6).t(), ["out", "contiguous"]),
    ("out", torch.empty(6, OUT, requires_grad=True), ["out", "requires grad"]),
    ("out", torch.empty(6, OUT, device="meta"), ["out", "meta", "cpu"]),
    ("dgrad_out", torch.empty(6, IN - 1), ["dgrad_out", "(6, 63)", "(6, 64)"]),
    ("dgrad_out", torch.empty(6, IN, dtype=torch.float16), ["dgrad_out", "torch.float16"]),
    ("dgrad_out", torch.empty(6, IN, device="meta"), ["dgrad_out", "meta"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_grouped_linear_refuses_bad_buffers(name, buffer, words):
    """Checked in the forward, with or without grad (TE checks dgrad_out only in its backward)."""
    module = te.GroupedLinear(2, IN, OUT)
    x = torch.randn(6, IN, requires_grad=True)
    assert_value_error_naming(lambda: module(x, [3, 3], **{name: buffer}), words)
    with torch.no_grad():
        assert_value_error_naming(lambda: module(x, [3, 3], **{name: buffer}), words)
