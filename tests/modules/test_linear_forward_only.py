"""The high-precision GEMMs of the Linear modules with no graph to record (inference, decoding:
grad mode off, or nothing requiring grad): what LinearFunction would compute (widened or
torch.autocast GEMMs, mixed dtypes, main_grad and deferred weight-gradient options, FP8-stored
weights read as their values) runs without the autograd function around it
(_linear_function.high_precision_forward_only), bit for bit LinearFunction's output."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.custom_ops.linear import set_cpu_gemm_dtype
from transformer_engine.pytorch.module import _linear_function

IN, OUT = 33, 65


def linear_function_calls(monkeypatch):
    """The number of LinearFunction.apply calls from now on in the test, in a one-entry list."""
    calls = [0]
    apply = _linear_function.LinearFunction.apply

    def counted(*args):
        calls[0] += 1
        return apply(*args)
    monkeypatch.setattr(_linear_function.LinearFunction, "apply", counted)
    return calls


def outputs(result):
    return result if isinstance(result, tuple) else (result,)


CASES = {
    # (module, input dtype): GEMMs that take LinearFunction when a graph is recorded
    "fp16_widened": (lambda d: te.Linear(IN, OUT, params_dtype=torch.float16, device=d), torch.float16),
    "mixed_dtypes": (lambda d: te.LayerNormLinear(IN, OUT, device=d), torch.bfloat16),
    "main_grad": (lambda d: te.Linear(IN, OUT, fuse_wgrad_accumulation=True, device=d), torch.float32),
    "delayed_wgrad": (lambda d: te.LayerNormMLP(IN, OUT, delay_wgrad_compute=True, device=d), torch.float32),
    "return_bias": (lambda d: te.LayerNormMLP(IN, OUT, return_bias=True, params_dtype=torch.float16, device=d),
                    torch.float16),
}


@pytest.mark.parametrize("tokens", [0, 1, 7])
@pytest.mark.parametrize("name", list(CASES))
def test_no_grad_forward_is_bitwise_linear_function(monkeypatch, device, name, tokens):
    make, dtype = CASES[name]
    module = make(device)
    if name == "main_grad":
        module.weight.main_grad = torch.zeros_like(module.weight)
    x = torch.randn(tokens, IN, device=device).to(dtype)
    calls = linear_function_calls(monkeypatch)
    with torch.no_grad():
        got = outputs(module(x))
    assert calls[0] == 0, "no graph to record: no LinearFunction"
    want = outputs(module(x.requires_grad_()))
    assert calls[0] > 0, "with a graph to record these GEMMs take LinearFunction"
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and torch.equal(a, b.detach()), f"output {i}"


def test_nothing_requiring_grad_is_forward_only_under_grad_mode(monkeypatch, device):
    """Grad mode on but a frozen module and an input without grad: no graph either."""
    module = te.Linear(IN, OUT, params_dtype=torch.float16, device=device).requires_grad_(False)
    x = torch.randn(5, IN, device=device, dtype=torch.float16)
    calls = linear_function_calls(monkeypatch)
    got = module(x)
    assert calls[0] == 0 and got.grad_fn is None
    with torch.no_grad():
        assert torch.equal(got, module(x))


def test_widened_bf16_and_torch_autocast_are_bitwise_linear_function(monkeypatch):
    """bf16 GEMMs widened to fp32 (CPUs without bf16 matrix units), and torch.autocast's dtype."""
    previous = set_cpu_gemm_dtype(torch.float32)
    try:
        module = te.Linear(IN, OUT, params_dtype=torch.bfloat16)
        for tokens in (1, 16, 17):
            x = torch.randn(tokens, IN, dtype=torch.bfloat16)
            with torch.no_grad():
                got = module(x)
            assert torch.equal(got, module(x.requires_grad_()).detach())
        fp32 = te.Linear(IN, OUT)
        x = torch.randn(7, IN)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with torch.no_grad():
                got = fp32(x)
            want = fp32(x.requires_grad_())
        assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want.detach())
    finally:
        set_cpu_gemm_dtype(previous)


def test_fp8_stored_weights_outside_autocast_read_their_values(monkeypatch, device):
    with te.quantized_model_init(recipe=recipe.DelayedScaling()):
        module = te.Linear(IN, OUT, device=device)
    x = torch.randn(7, IN, device=device)
    calls = linear_function_calls(monkeypatch)
    with torch.no_grad():
        got = module(x)
    assert calls[0] == 0
    assert torch.equal(got, module(x.requires_grad_()).detach())


def test_plain_path_still_comes_first(monkeypatch, device):
    """Where plain_linear_applies, F.linear (the plain path) serves the call, with or without grad."""
    module = te.Linear(IN, OUT, device=device)
    forward_only = []
    monkeypatch.setattr(_linear_function, "high_precision_forward_only",
                        lambda *args: forward_only.append(args) or None)
    with torch.no_grad():
        module(torch.randn(7, IN, device=device))
    assert forward_only == []
