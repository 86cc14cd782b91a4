"""te.Linear forward + backward, FP8 against high precision.

Providers on the same input x [tokens, in], upstream gradient dy and parameters:
    ours:      te.Linear inside te.autocast(DelayedScaling()): FP8 (E4M3 / E5M2) GEMMs
    ours_current: the same under Float8CurrentScaling() (each tensor's own amax, this step's)
    ours_block, ours_mxfp8: the same under Float8BlockScaling() (1x128 / 128x128 blocks) and
               MXFP8BlockScaling() (1x32 blocks, E8M0 scales)
    ours_nvfp4: the same under NVFP4BlockScaling() (E2M1 codes, 1x16 / 16x16 E4M3 scales, the
               Hadamard transform and stochastic rounding of the weight gradient's operands)
    ours_hp:   te.Linear without autocast, in the input dtype (high precision)
    eager:     torch.nn.Linear
    compile:   torch.compile of that torch.nn.Linear
FLOPs: 3 GEMMs of 2 * tokens * in * out (forward, dgrad, wgrad).
"""
from typing import Iterator, Tuple

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

from ..pytorch.custom_ops.linear import gemm_dtype
from .harness import Case

Shape = Tuple[int, int, int]  # tokens, in_features, out_features
# [4096]^3 bf16 is the FP8-against-bf16 comparison of te.Linear. Its eager and compile providers
# run only where the CPU has bf16 matrix units: elsewhere torch.nn.Linear's bf16 backward runs
# at about 0.8 GFLOP/s (minutes per step); te.Linear computes bf16 GEMMs in fp32 on such CPUs
# (custom_ops/linear.py).
SUITE = [((2048, 2048, 2048), torch.float32), ((4096, 4096, 4096), torch.bfloat16),
         ((4096, 4096, 4096), torch.float32)]
# On a GPU: [8192]^3 bf16, where FP8 GEMMs reach the tensor cores' rate (the GPU check's case).
ACCELERATOR_SUITE = [((8192, 8192, 8192), torch.bfloat16)]
# Sizes that make every case build and run in milliseconds: tests/bench/test_bench_cases.py sets these
# attributes to them, so each family declares its own.
TINY = dict(SUITE=[((16, 32, 24), torch.float32)])
ROUNDS = 5  # each step takes about a second on 2 cores


def linear_case(shape: Shape, dtype: torch.dtype, device: torch.device) -> Case:
    tokens, in_features, out_features = shape
    ours = te.Linear(in_features, out_features, params_dtype=dtype, device=device)
    plain = torch.nn.Linear(in_features, out_features, dtype=dtype, device=device)
    plain.load_state_dict(ours.state_dict(), strict=False)
    compiled = torch.compile(plain)
    x = torch.randn(tokens, in_features, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(tokens, out_features, dtype=dtype, device=device)
    def step(module, fp8_recipe=None):
        def run():
            with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
                y = module(x)
            return torch.autograd.grad(y, (x, *module.parameters()), dy)
        return run

    providers = {"ours": step(ours, recipe.DelayedScaling()), "ours_current": step(ours, recipe.Float8CurrentScaling()),
                 "ours_block": step(ours, recipe.Float8BlockScaling()),
                 "ours_mxfp8": step(ours, recipe.MXFP8BlockScaling()),
                 "ours_nvfp4": step(ours, recipe.NVFP4BlockScaling()), "ours_hp": step(ours)}
    if gemm_dtype(device, dtype) == dtype:  # torch's GEMM in this dtype is one ours does not widen
        providers.update(eager=step(plain), compile=step(compiled))
    return Case(op="linear", shape=shape, dtype=dtype, mode="full", device=device, bytes=None,
                main_bytes=x.numel() * x.element_size(), flops=3 * 2.0 * tokens * in_features * out_features,
                providers=providers,
                fp8_providers=("ours", "ours_current", "ours_block"))  # FP8 recipes; ours_mxfp8 says so in its name


def cases(quick: bool, device: torch.device) -> Iterator[Case]:
    """Not in the quick suite: a GEMM-bound step takes seconds on a 2-core CPU. Accelerators get
    their own, larger shapes."""
    if not quick:
        for shape, dtype in SUITE if device.type == "cpu" else ACCELERATOR_SUITE:
            yield linear_case(shape, dtype, device)
