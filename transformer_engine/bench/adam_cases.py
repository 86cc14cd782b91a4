"""FusedAdam step benchmark cases: one optimizer step over a model-like list of tensors.

Providers, each with its own copy of the same params, gradients and (zero-initialised) state:
    ours:        te.optimizers.FusedAdam (one torch.ops.portable_te.multi_tensor_adam call)
    eager:       torch.optim.AdamW(foreach=True)
    torch_fused: torch.optim.AdamW(fused=True), where this torch supports it on the device
    compile:     torch.compile of a plain AdamW step (reference.adam_step)
bf16 params use fp32 master weights: ours keeps them in the optimizer (master_weights=True);
the PyTorch providers step fp32 masters and copy gradients in and params out with _foreach_copy_.
Minimal bytes per parameter: read grad, param (or master), exp_avg, exp_avg_sq; write param
(or master), exp_avg, exp_avg_sq (+ the bf16 param): 28 bytes for fp32, and for bf16 with
masters too (2 + 4 * 6 + 2).
"""
from typing import Callable, Iterator, List, Tuple

import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference

from .harness import Case

# (hidden, layers): each layer holds 4 h^2 (attention) + 8 h^2 (MLP) weights and 4 h vectors
Config = Tuple[int, int, torch.dtype]
HEADLINE = [(1024, 2, torch.float32)]  # 25M params
SUITE = HEADLINE + [(1024, 2, torch.bfloat16), (1024, 4, torch.float32)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(HEADLINE=[(16, 1, torch.float32)], SUITE=[(16, 1, torch.float32), (16, 1, torch.bfloat16)])
HYPER = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def model_shapes(hidden: int, layers: int) -> List[Tuple[int, ...]]:
    per_layer = [(3 * hidden, hidden), (hidden, hidden), (4 * hidden, hidden), (hidden, 4 * hidden)]
    per_layer += [(hidden,)] * 4
    return per_layer * layers


def make_params(shapes, dtype, device) -> List[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.randn(shape, device=device).mul_(0.02).to(dtype)) for shape in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device).mul_(1e-3).to(dtype)
    return params


def torch_step(optimizer_ctor: Callable, params, dtype) -> Callable[[], object]:
    """A PyTorch optimizer over params, or, for low-precision params, over fp32 masters."""
    if dtype == torch.float32:
        optimizer = optimizer_ctor(params)
        return optimizer.step
    masters = [torch.nn.Parameter(p.detach().float()) for p in params]
    for m in masters:
        m.grad = torch.empty_like(m)
    optimizer = optimizer_ctor(masters)

    def step():
        torch._foreach_copy_([m.grad for m in masters], [p.grad for p in params])
        optimizer.step()
        torch._foreach_copy_([p.data for p in params], [m.detach() for m in masters])
    return step


def compiled_reference_step(params, dtype) -> Callable[[], object]:
    """torch.compile of the plain-PyTorch step (reference.adam_step) over all tensors."""
    grads = [p.grad for p in params]
    exp_avgs = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    exp_avg_sqs = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    masters = [p.detach().float() for p in params] if dtype != torch.float32 else []
    plain_params = [p.data for p in params]
    compiled = torch.compile(reference.adam_step)
    beta1, beta2 = HYPER["betas"]
    # A fixed step count keeps the compiled graph's constants: one compile, as in the other rows.
    return lambda: compiled(plain_params, grads, exp_avgs, exp_avg_sqs, masters, HYPER["lr"], beta1, beta2,
                            HYPER["eps"], 10, True, HYPER["weight_decay"], True, 1.0)


def adam_case(config: Config, device: torch.device) -> Case:
    hidden, layers, dtype = config
    shapes = model_shapes(hidden, layers)
    numel = sum(torch.Size(s).numel() for s in shapes)
    ours_params = make_params(shapes, dtype, device)
    ours = te.optimizers.FusedAdam(ours_params, master_weights=dtype != torch.float32, **HYPER)
    providers = {"ours": ours.step,
                 "eager": torch_step(lambda ps: torch.optim.AdamW(ps, foreach=True, **HYPER),
                                     make_params(shapes, dtype, device), dtype)}
    try:
        fused = torch_step(lambda ps: torch.optim.AdamW(ps, fused=True, **HYPER), make_params(shapes, dtype, device),
                           dtype)
        fused()  # raises here where fused=True has no kernel for this device
        providers["torch_fused"] = fused
    except RuntimeError:
        pass
    providers["compile"] = compiled_reference_step(make_params(shapes, dtype, device), dtype)
    return Case(op="fused_adam", shape=(numel,), dtype=dtype, mode="step", device=device, bytes=28 * numel,
                main_bytes=numel * torch.tensor([], dtype=dtype).element_size(), providers=providers)


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """25M fp32 params alone when quick, else fp32 and bf16-with-masters at 25M and 50M."""
    for config in HEADLINE if quick else SUITE:
        yield adam_case(config, device)
