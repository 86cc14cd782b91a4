"""Per-call overhead: each te module on a tiny input against its torch.nn equivalent, where the
Python and dispatch work of a call costs more than its arithmetic (decoding steps, small models).

Cases: te.LayerNorm, te.RMSNorm, te.Linear, te.LayerNormLinear and te.LayerNormMLP (ffn 4 x
hidden, GELU) on x [4, 768] fp32, the same parameters on every provider:
    ours:    the te module
    eager:   its torch.nn equivalent (nn.LayerNorm, nn.RMSNorm, nn.Linear, and nn.Sequential of
             those with nn.GELU(approximate="tanh"), TE's default activation)
    compile: torch.compile of that torch.nn module
Modes: "fwd" is the forward under torch.no_grad; "fwd_grad" the forward of an input that
requires grad (the autograd graph is built, then dropped); "full" forward + backward, taking
every gradient with torch.autograd.grad. A provider's one call runs CALLS[op] module calls, so
a row's time divided by CALLS[op] is the time of one.

CALLS makes one round last a few milliseconds on a 2-core CPU. Between rounds the harness runs
its copy reference (64 MB), which leaves the caches cold: the first calls of a round then pay
a refill that is not per-call overhead: with 100 calls a round it added 1.7 us to each call of
te.LayerNorm (7.3 us) and 0.6 us to torch.nn's (6.2 us), measured on a Xeon with AMX. At a
thousand calls it is a few percent.
"""
from typing import Callable, Iterator, Tuple

import torch

import transformer_engine.pytorch as te

from .harness import Case

SHAPE = (4, 768)
MODES = ("fwd", "fwd_grad", "full")
OPS = ("layernorm", "rmsnorm", "linear", "layernorm_linear", "layernorm_mlp")
# Module calls per provider call (see above): one call alone is microseconds.
CALLS = {"layernorm": 1000, "rmsnorm": 1000, "linear": 250, "layernorm_linear": 250, "layernorm_mlp": 100}
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(SHAPE=(2, 16), CALLS=dict.fromkeys(OPS, 2))


def module_pair(op: str, hidden: int, device: torch.device) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """(the te module, its torch.nn equivalent with the same parameter values)."""
    ffn = 4 * hidden
    if op == "layernorm":
        return te.LayerNorm(hidden, device=device), torch.nn.LayerNorm(hidden, device=device)
    if op == "rmsnorm":
        return te.RMSNorm(hidden, device=device), torch.nn.RMSNorm(hidden, eps=1e-5, device=device)
    if op == "linear":
        ours, plain = te.Linear(hidden, hidden, device=device), torch.nn.Linear(hidden, hidden, device=device)
        plain.load_state_dict(ours.state_dict(), strict=False)
        return ours, plain
    if op == "layernorm_linear":
        ours = te.LayerNormLinear(hidden, hidden, device=device)
        plain = torch.nn.Sequential(torch.nn.LayerNorm(hidden, device=device),
                                    torch.nn.Linear(hidden, hidden, device=device))
        _copy(plain, [ours.layer_norm_weight, ours.layer_norm_bias, ours.weight, ours.bias])
        return ours, plain
    ours = te.LayerNormMLP(hidden, ffn, device=device)
    plain = torch.nn.Sequential(torch.nn.LayerNorm(hidden, device=device), torch.nn.Linear(hidden, ffn, device=device),
                                torch.nn.GELU(approximate="tanh"), torch.nn.Linear(ffn, hidden, device=device))
    _copy(plain, [ours.layer_norm_weight, ours.layer_norm_bias, ours.fc1_weight, ours.fc1_bias, ours.fc2_weight,
                  ours.fc2_bias])
    return ours, plain


def _copy(plain: torch.nn.Module, values) -> None:
    """plain's parameters, in order, set to `values`."""
    with torch.no_grad():
        for param, value in zip(plain.parameters(), values, strict=True):
            param.copy_(value)


def provider(module: torch.nn.Module, x: torch.Tensor, mode: str, calls: int) -> Callable[[], object]:
    """`calls` calls of module(x) in `mode` (see the module docstring)."""
    if mode == "fwd":
        def run_fwd():
            with torch.no_grad():
                for _ in range(calls):
                    module(x)
        return run_fwd
    if mode == "fwd_grad":
        def run_fwd_grad():
            for _ in range(calls):
                module(x)
        return run_fwd_grad
    params = tuple(module.parameters())

    def run_full():
        for _ in range(calls):
            y = module(x)
            torch.autograd.grad(y, (x, *params), torch.ones_like(y))
    return run_full


def overhead_case(op: str, mode: str, device: torch.device) -> Case:
    ours, plain = module_pair(op, SHAPE[-1], device)
    x = torch.randn(SHAPE, device=device, requires_grad=mode != "fwd")
    # torch.compile's module wraps plain: its parameters are plain's.
    calls = CALLS[op]
    providers = {"ours": provider(ours, x, mode, calls), "eager": provider(plain, x, mode, calls),
                 "compile": provider(torch.compile(plain), x, mode, calls)}
    return Case(op=op, shape=SHAPE, dtype=torch.float32, mode=mode, device=device, bytes=None,
                main_bytes=x.numel() * x.element_size(), providers=providers)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """Every module and mode; the quick suite times the forward under no_grad and forward + backward."""
    for op in OPS:
        for mode in (("fwd", "full") if quick else MODES):
            yield overhead_case(op, mode, device)
