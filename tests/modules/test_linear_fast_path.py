"""The plain GEMM of the Linear modules (GemmModule._plain_gemm, over
_linear_function.plain_linear_applies): where LinearFunction's high-precision GEMMs are
exactly torch.nn.functional.linear's under its own autograd, te.Linear, te.LayerNormLinear and
te.LayerNormMLP run F.linear, and their outputs and every gradient are bit for bit those of
LinearFunction (forced here by patching plain_linear_applies); what only LinearFunction does
(FP8, main_grad, deferred weight gradients, widened or autocast GEMMs, FP8 parameters) still
goes through it."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from numerics import assert_close
from transformer_engine.pytorch.custom_ops import linear as high_precision
from transformer_engine.pytorch.custom_ops.linear import set_cpu_gemm_dtype
from transformer_engine.pytorch.module import _gemm_module, _linear_function

IN, OUT = 33, 65  # odd sizes: no GEMM blocking lines up with them


@pytest.fixture(autouse=True)
def bf16_gemms_in_bf16():
    """bf16 GEMMs in bf16 on every CPU (on one without bf16 units they are otherwise widened
    to fp32, which only LinearFunction does), so that bf16 takes the plain path everywhere."""
    previous = set_cpu_gemm_dtype(torch.bfloat16)
    yield
    set_cpu_gemm_dtype(previous)


@pytest.fixture
def plain_path_choices(monkeypatch):
    """The answers plain_linear_applies gives during the test, in call order."""
    answers = []
    decide = _gemm_module.plain_linear_applies

    def recorded(*args):
        answers.append(decide(*args))
        return answers[-1]
    monkeypatch.setattr(_gemm_module, "plain_linear_applies", recorded)
    return answers


def through_linear_function(monkeypatch):
    """From now on in the test, every GEMM goes through LinearFunction."""
    monkeypatch.setattr(_gemm_module, "plain_linear_applies", lambda *args: False)


MODULES = {
    "Linear": lambda bias, return_bias, **kw: te.Linear(IN, OUT, bias=bias, return_bias=return_bias, **kw),
    "Linear_split": lambda bias, return_bias, **kw: te.Linear(IN, OUT, bias=bias, return_bias=return_bias,
                                                              parameters_split={"query": 20, "key": 45}, **kw),
    "LayerNormLinear": lambda bias, return_bias, **kw: te.LayerNormLinear(IN, OUT, bias=bias,
                                                                          return_bias=return_bias, **kw),
    "LayerNormLinear_rms": lambda bias, return_bias, **kw: te.LayerNormLinear(
        IN, OUT, bias=bias, return_bias=return_bias, normalization="RMSNorm", return_layernorm_output=True, **kw),
    "LayerNormMLP": lambda bias, return_bias, **kw: te.LayerNormMLP(IN, OUT, bias=bias, return_bias=return_bias,
                                                                    activation="gelu", **kw),
    "LayerNormMLP_swiglu": lambda bias, return_bias, **kw: te.LayerNormMLP(
        IN, OUT, bias=bias, return_bias=return_bias, activation="swiglu", return_layernorm_output=True, **kw),
}
GEMMS = {"LayerNormMLP": 2, "LayerNormMLP_swiglu": 2}  # per forward; 1 otherwise


def inputs(layout: str, dtype: torch.dtype, device) -> torch.Tensor:
    """An input [..., IN] of the given layout (the plain path must match LinearFunction for all)."""
    make = {
        "2d": lambda: torch.randn(7, IN),
        "3d": lambda: torch.randn(3, 5, IN),
        "zero_tokens": lambda: torch.randn(0, IN),
        "strided_rows": lambda: torch.randn(7, 2 * IN)[:, ::2],  # every other column: not contiguous
        "3d_transposed": lambda: torch.randn(5, 3, IN).transpose(0, 1),  # sbhd <-> bshd: reshaped with a copy
        "column_major": lambda: torch.randn(IN, 7).t(),  # LinearFunction's: autograd would transpose its dgrad
    }[layout]
    return make().to(dtype=dtype, device=device)


def outputs_and_grads(module: torch.nn.Module, x: torch.Tensor, call=None, **forward_args):
    """(outputs, x's gradient, {parameter: gradient}) of one forward of module (through `call`
    when given: its compiled form) and a backward with fixed random output gradients, from
    fresh gradients."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    outputs = (call if call is not None else module)(x, **forward_args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    generator = torch.Generator().manual_seed(5)
    grads = [torch.randn(o.shape, generator=generator).to(o) for o in outputs]
    torch.autograd.backward(outputs, grads)
    return outputs, x.grad, {name: p.grad for name, p in module.named_parameters()}


def assert_bitwise_equal(got, want):
    (outputs, grad_x, grads), (want_outputs, want_grad_x, want_grads) = got, want
    assert len(outputs) == len(want_outputs)
    for i, (a, b) in enumerate(zip(outputs, want_outputs)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output {i}"
    assert grad_x.dtype == want_grad_x.dtype and torch.equal(grad_x, want_grad_x), "grad_input"
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        assert (grad is None) == (want_grads[name] is None), name
        if grad is not None:
            assert grad.dtype == want_grads[name].dtype and torch.equal(grad, want_grads[name]), name


def graph_node_names(tensor: torch.Tensor) -> set:
    """The names of the autograd nodes behind `tensor`."""
    names, pending, seen = set(), [tensor.grad_fn], set()
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        pending.extend(next_node for next_node, _ in node.next_functions)
    return names


def takes_linear_function(y: torch.Tensor) -> bool:
    return "LinearFunctionBackward" in graph_node_names(y)


@pytest.mark.parametrize("bias, return_bias", [(True, False), (False, False), (True, True)],
                         ids=["bias", "no_bias", "return_bias"])
@pytest.mark.parametrize("layout", ["2d", "3d", "zero_tokens", "strided_rows", "3d_transposed", "column_major"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MODULES))
def test_plain_path_is_bitwise_linear_function(monkeypatch, plain_path_choices, device, name, dtype, layout, bias,
                                               return_bias):
    module = MODULES[name](bias, return_bias, params_dtype=dtype, device=device)
    x = inputs(layout, dtype, device)
    got = outputs_and_grads(module, x)
    # A column-major input is the one layout the plain path leaves to LinearFunction (2-D: the
    # GEMM sees it as it is; the norm modules' GEMMs read the norm's contiguous output).
    plain = layout != "column_major" or name.startswith("LayerNorm")
    assert plain_path_choices == [plain] * GEMMS.get(name, 1)
    assert takes_linear_function(got[0][0]) != plain
    through_linear_function(monkeypatch)
    want = outputs_and_grads(module, x)
    assert takes_linear_function(want[0][0])
    assert_bitwise_equal(got, want)


@pytest.mark.parametrize("tokens, in_features, out_features, plain", [
    (4, 768, 768, True),  # the shape of the per-call overhead measurements
    # One element, contiguous and column-major at once: autograd's dgrad would be W^T grad^T,
    # which rounds differently from LinearFunction's grad W on some CPUs.
    (1, 1, 257, False),
])
def test_edge_shapes_are_bitwise_linear_function(monkeypatch, plain_path_choices, device, tokens, in_features,
                                                 out_features, plain):
    module = te.Linear(in_features, out_features, bias=False, device=device)
    x = torch.randn(tokens, in_features, device=device)
    got = outputs_and_grads(module, x)
    assert plain_path_choices == [plain]
    through_linear_function(monkeypatch)
    assert_bitwise_equal(got, outputs_and_grads(module, x))


def test_column_major_weight_takes_linear_function(monkeypatch, plain_path_choices, device):
    """A weight stored transposed: autograd's weight gradient would be (x^T grad)^T, not
    LinearFunction's grad^T x."""
    module = te.Linear(IN, OUT, device=device)
    module.weight = torch.nn.Parameter(module.weight.detach().t().contiguous().t())
    x = torch.randn(7, IN, device=device)
    got = outputs_and_grads(module, x)
    assert plain_path_choices == [False]
    through_linear_function(monkeypatch)
    assert_bitwise_equal(got, outputs_and_grads(module, x))


@pytest.mark.parametrize("name", list(MODULES))
def test_plain_path_without_grad(monkeypatch, plain_path_choices, device, name):
    module = MODULES[name](True, False, device=device)
    x = torch.randn(2, 3, IN, device=device, requires_grad=True)
    with torch.no_grad():
        got = module(x)
        assert plain_path_choices == [True] * GEMMS.get(name, 1)
        through_linear_function(monkeypatch)
        want = module(x)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("tokens", [1, 5, 16, 17])
@pytest.mark.parametrize("name", ["Linear", "LayerNormMLP"])
@pytest.mark.parametrize("gemm_dtype", [torch.bfloat16, torch.float32], ids=["bf16_gemm", "fp32_gemm"])
def test_decoding_rows_take_our_kernel(device, name, tokens, gemm_dtype):
    """Up to 16 bf16 rows go to our kernel's few-rows path, which reads the weight in place
    (on_few_rows_kernel). Where the CPU's GEMMs run in bf16, with no graph to record (inference,
    decoding): with a backward to record, F.linear's bits. Where they run in fp32 (CPUs without
    bf16 matrix units), always: instead of widening the weight to fp32 for every call. Its bits,
    within bf16 rounding of F.linear's."""
    previous = set_cpu_gemm_dtype(gemm_dtype)
    try:
        module = MODULES[name](True, False, params_dtype=torch.bfloat16, device=device)
        x = torch.randn(tokens, IN, dtype=torch.bfloat16, device=device)
        weight = module.weight if name == "Linear" else module.fc1_weight
        ours = high_precision.on_few_rows_kernel(x, weight)
        assert ours == (device.type == "cpu" and tokens <= 16)
        widened = not high_precision.gemm_keeps_dtype(x)
        calls = []
        original = high_precision.few_rows_linear

        def counted(*args):
            calls.append(args[0].shape)
            return original(*args)
        gemms = GEMMS.get(name, 1) if ours else 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_linear_function, "few_rows_linear", counted)
            patch.setattr(high_precision, "few_rows_linear", counted)
            with torch.no_grad():
                got = module(x)
            assert len(calls) == gemms
            with_backward = module(x.requires_grad_())
            assert len(calls) == (2 * gemms if widened else gemms)  # none more where F.linear is the GEMM
    finally:
        set_cpu_gemm_dtype(previous)
    if name == "Linear":
        want = torch.nn.functional.linear(x, module.weight, module.bias)
        if not widened:
            assert torch.equal(with_backward, want)
        assert_close(got.float(), want.float(), dtype=torch.bfloat16, name="few rows on our kernel")
        if ours:
            assert torch.equal(got, original(x.detach(), module.weight, module.bias))
    else:
        assert_close(got.float(), with_backward.float(), dtype=torch.bfloat16, name="few rows on our kernel")


@pytest.mark.parametrize("frozen", ["weight", "input"])
def test_plain_path_with_frozen_operands(monkeypatch, device, frozen):
    """A weight or input without gradient: autograd skips that GEMM, LinearFunction discards
    it; the gradients that are taken agree bit for bit."""
    module = te.Linear(IN, OUT, device=device)
    module.weight.requires_grad_(frozen != "weight")
    x = torch.randn(7, IN, device=device, requires_grad=frozen != "input")

    def step():
        module.zero_grad(set_to_none=True)
        x.grad = None
        y = module(x)
        y.backward(torch.ones_like(y))
        return y, x.grad, module.weight.grad, module.bias.grad
    got = step()
    through_linear_function(monkeypatch)
    want = step()
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)


def test_is_first_microbatch_in_high_precision(monkeypatch, plain_path_choices, device):
    """The microbatch flag only caches FP8 weights: in high precision every value takes the plain path."""
    module = te.LayerNormMLP(IN, OUT, device=device)
    x = torch.randn(7, IN, device=device)
    got = [outputs_and_grads(module, x, is_first_microbatch=flag) for flag in (True, False, None)]
    assert plain_path_choices == [True] * 6
    through_linear_function(monkeypatch)
    for flag, result in zip((True, False, None), got):
        assert_bitwise_equal(result, outputs_and_grads(module, x, is_first_microbatch=flag))


@pytest.mark.parametrize("ops", ["linear", "norm_linear"])
def test_te_ops_take_the_plain_path_bitwise(monkeypatch, plain_path_choices, device, ops):
    """te.ops.Linear (te.Linear's forward) and the fused norm -> Linear (te.Linear.gemm with the
    norm as the GEMM input's producer)."""
    make = {"linear": lambda: [te.ops.Linear(IN, OUT, device=device)],
            "norm_linear": lambda: [te.ops.LayerNorm(IN, device=device), te.ops.Linear(IN, OUT, device=device)]}
    model = te.ops.Sequential(*make[ops]())
    x = torch.randn(3, 5, IN, device=device)
    got = outputs_and_grads(model, x)
    assert plain_path_choices == [True]
    through_linear_function(monkeypatch)
    want = outputs_and_grads(model, x)
    assert takes_linear_function(want[0][0])
    assert_bitwise_equal(got, want)


# --- what still takes LinearFunction ---------------------------------------------------------

def _forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    y = module(x.requires_grad_())
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_fp8_takes_linear_function(device, name):
    module = MODULES[name](True, False, device=device)
    with te.autocast(recipe=recipe.DelayedScaling()):
        y = _forward(module, torch.randn(16, IN, device=device))
    assert takes_linear_function(y)


@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_calibration_takes_linear_function_and_records_amaxes(device, name):
    module = MODULES[name](True, False, device=device)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling()):
        y = _forward(module, torch.randn(16, IN, device=device))
    assert takes_linear_function(y)
    assert (module.fp8_meta["scaling_fwd"].amax_history > 0).any()


def test_options_of_linear_function_take_it(device):
    """fuse_wgrad_accumulation (main_grad) and delay_wgrad_compute (backward_dw) are LinearFunction's."""
    fused = te.Linear(IN, OUT, fuse_wgrad_accumulation=True, device=device)
    fused.weight.main_grad = torch.zeros_like(fused.weight)
    assert takes_linear_function(_forward(fused, torch.randn(7, IN, device=device)))
    delayed = te.LayerNormMLP(IN, OUT, delay_wgrad_compute=True, device=device)
    assert takes_linear_function(_forward(delayed, torch.randn(7, IN, device=device)))


def test_torch_autocast_takes_linear_function(device):
    """Inside torch.autocast the GEMM's dtype is custom_ops/linear.py's choice, made in LinearFunction."""
    module = te.Linear(IN, OUT, params_dtype=torch.bfloat16, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        assert takes_linear_function(_forward(module, torch.randn(7, IN, dtype=torch.bfloat16, device=device)))


def test_widened_gemms_take_linear_function():
    """On the CPU, fp16 GEMMs (and bf16 ones where the CPU GEMMs run in fp32) are widened to
    fp32 and rounded back, which only LinearFunction does."""
    fp16 = te.Linear(IN, OUT, params_dtype=torch.float16, device="cpu")
    assert takes_linear_function(_forward(fp16, torch.randn(7, IN, dtype=torch.float16)))
    set_cpu_gemm_dtype(torch.float32)  # put back by the autouse fixture
    bf16 = te.Linear(IN, OUT, params_dtype=torch.bfloat16, device="cpu")
    assert takes_linear_function(_forward(bf16, torch.randn(7, IN, dtype=torch.bfloat16)))


def test_mixed_dtypes_take_linear_function(device):
    """An input in another dtype than the parameters: LinearFunction casts the weight to it."""
    module = te.Linear(IN, OUT, device=device)
    assert takes_linear_function(_forward(module, torch.randn(7, IN, dtype=torch.bfloat16, device=device)))


def test_fp8_parameters_take_linear_function(device):
    with te.quantized_model_init(recipe=recipe.DelayedScaling()):
        module = te.Linear(IN, OUT, device=device)
    assert takes_linear_function(_forward(module, torch.randn(7, IN, device=device)))


def test_compile_fullgraph_of_the_plain_path(device):
    """torch.compile(fullgraph=True) traces the plain path (return_bias, parameters_split) and
    gives eager's outputs and gradients."""
    module = MODULES["Linear_split"](True, True, device=device)
    x = torch.randn(3, 5, IN, device=device)
    want = outputs_and_grads(module, x)
    torch._dynamo.reset()
    got = outputs_and_grads(module, x, call=torch.compile(module, fullgraph=True))
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[1], want[1])
    for name, grad in got[2].items():
        torch.testing.assert_close(grad, want[2][name], msg=name)
