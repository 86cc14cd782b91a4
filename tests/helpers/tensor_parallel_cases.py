"""What each rank of tests/distributed/test_tensor_parallel.py runs: every module at tensor-parallel size 2
(with and without sequence parallelism, in high precision and under each FP8 recipe) against
the same module on one rank with the full weights, both built on every rank.

A case's TP module gets the full module's parameters, each split where the two shapes differ
(the dimension its parallel mode splits; a gated fc1 split per half). Both see the same input
and the same upstream gradient, each its own shard of them. Compared: the output, the input's
gradient and every parameter's gradient (a parameter marked sequence_parallel is applied to
token shards: its gradient is summed over the ranks first, as a trainer does), and, under FP8,
every scale, which must be the same on both ranks.
"""
import dataclasses
from typing import Callable, Optional

import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

HIDDEN, TOKENS, HEADS = 64, 16, 4
RECIPES = {"none": None, "delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling,
           "mxfp8": recipe.MXFP8BlockScaling, "block": recipe.Float8BlockScaling}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable  # (**parallel kwargs) -> module; {} builds the full one
    input_shape: tuple  # the full input's shape; the sequence is dim 0
    mode: Optional[str]  # "column" / "row" for a te.Linear, None for the composite modules
    sequence_parallel: bool
    recipe: str
    gated: bool = False


def _linear(mode):
    return lambda **tp: te.Linear(HIDDEN, 48, parallel_mode=mode if tp else None, **tp)


def _layernorm_linear(**tp):
    return te.LayerNormLinear(HIDDEN, 48, parallel_mode="column" if tp else None, **tp)


def _mlp(activation):
    return lambda **tp: te.LayerNormMLP(HIDDEN, 96, activation=activation, set_parallel_mode=bool(tp), **tp)


def _layer(**extra):
    return lambda **tp: te.TransformerLayer(HIDDEN, 96, HEADS, hidden_dropout=0.0, attention_dropout=0.0,
                                            set_parallel_mode=bool(tp), **extra, **tp)


def cases() -> list:
    found = []
    for rec in RECIPES:
        for sp in (False, True):
            found += [Case(f"Linear-column-sp{int(sp)}-{rec}", _linear("column"), (TOKENS, HIDDEN), "column", sp, rec),
                      Case(f"Linear-row-sp{int(sp)}-{rec}", _linear("row"), (TOKENS, HIDDEN), "row", sp, rec),
                      Case(f"LayerNormLinear-sp{int(sp)}-{rec}", _layernorm_linear, (TOKENS, HIDDEN), None, sp, rec),
                      Case(f"LayerNormMLP-sp{int(sp)}-{rec}", _mlp("gelu"), (TOKENS, HIDDEN), None, sp, rec)]
    # Shards whose rows are whole scale blocks (MXFP8's 32, Float8BlockScaling's 128): the
    # sequence-parallel gathers move the block-scaled codes themselves.
    found += [Case("Linear-column-sp1-mxfp8-blockrows", _linear("column"), (64, HIDDEN), "column", True, "mxfp8"),
              Case("Linear-row-sp1-mxfp8-blockrows", _linear("row"), (64, HIDDEN), "row", True, "mxfp8"),
              Case("Linear-column-sp1-block-blockrows", _linear("column"), (256, HIDDEN), "column", True, "block")]
    for sp in (False, True):
        found += [Case(f"LayerNormMLP-swiglu-sp{int(sp)}-none", _mlp("swiglu"), (TOKENS, HIDDEN), None, sp, "none",
                       gated=True),
                  Case(f"TransformerLayer-sp{int(sp)}-none", _layer(), (8, 2, HIDDEN), None, sp, "none"),
                  Case(f"TransformerLayer-gqa-fused-sp{int(sp)}-delayed",
                       _layer(num_gqa_groups=2, fuse_qkv_params=True), (8, 2, HIDDEN), None, sp, "delayed"),
                  Case(f"TransformerLayer-rmsnorm-swiglu-sp{int(sp)}-current",
                       _layer(normalization="RMSNorm", activation="swiglu"), (8, 2, HIDDEN), None, sp, "current",
                       gated=True)]
    return found


def _shard(full: torch.Tensor, shape: torch.Size, rank: int, world: int, gated: bool = False) -> torch.Tensor:
    """This rank's part of `full` for a tensor of `shape`: chunk `rank` along each dimension
    where the two differ (a gated fc1's rows are [a; b], each half split)."""
    part = full
    for dim, (whole, local) in enumerate(zip(full.shape, shape)):
        if whole == local:
            continue
        if gated and dim == 0:
            a, b = part.chunk(2, dim=0)
            part = torch.cat([a.chunk(world, dim=0)[rank], b.chunk(world, dim=0)[rank]])
        else:
            part = part.chunk(world, dim=dim)[rank]
    return part


def _gated(name: str, case: Case) -> bool:
    return case.gated and "fc1" in name


def _autocast(step_recipe):
    """The step's te.autocast (disabled without a recipe), amaxes reduced over both ranks."""
    return te.autocast(enabled=step_recipe is not None, recipe=step_recipe, amax_reduction_group=dist.group.WORLD)


def _scales(module) -> list:
    """Every FP8 scale tensor of module's submodules, in module order."""
    found = []
    for sub in module.modules():
        meta = getattr(sub, "fp8_meta", None)
        if meta is not None and not isinstance(meta, dict):
            found += [meta.scaling_fwd.scale.clone(), meta.scaling_bwd.scale.clone()]
    return found


def run_case(case: Case, rank: int, world: int) -> dict:
    """{"checks": [(what, max |diff|, max |expected|)], "scales_agree": bool} for one case."""
    torch.manual_seed(1234)
    full = case.build()
    parallel = case.build(tp_size=world, tp_group=dist.group.WORLD, sequence_parallel=case.sequence_parallel)
    full_params = dict(full.named_parameters())
    with torch.no_grad():
        for name, param in parallel.named_parameters():
            param.copy_(_shard(full_params[name], param.shape, rank, world, _gated(name, case)))
    step_recipe = RECIPES[case.recipe]() if RECIPES[case.recipe] is not None else None
    checks = []
    for step in range(2):  # the second step casts with the scales the first one's amaxes set
        for module in (full, parallel):
            module.zero_grad(set_to_none=True)
        x_full = torch.randn(case.input_shape)
        x_local = x_full
        if case.sequence_parallel and case.mode != "row":  # a row GEMM takes all the tokens, shards its output
            x_local = x_full.chunk(world, dim=0)[rank]
        if case.mode == "row":
            x_local = x_local.chunk(world, dim=-1)[rank]
        x_full.requires_grad_()
        x_local = x_local.detach().clone().requires_grad_()
        # The same upstream gradient on both ranks (the generators are in step), each its shard.
        with _autocast(step_recipe):
            y_full = full(x_full)
        upstream = torch.randn(y_full.shape)
        (y_full * upstream).sum().backward()
        with _autocast(step_recipe):
            y_local = parallel(x_local)
        (y_local * _shard(upstream, y_local.shape, rank, world)).sum().backward()
        checks.append((f"step {step} output", y_local, _shard(y_full, y_local.shape, rank, world)))
        checks.append((f"step {step} input grad", x_local.grad, _shard(x_full.grad, x_local.shape, rank, world)))
        for name, param in parallel.named_parameters():
            grad = param.grad
            if getattr(param, "sequence_parallel", False):
                dist.all_reduce(grad)  # a parameter applied to token shards: the trainer sums its gradient
            expected = _shard(full_params[name].grad, param.shape, rank, world, _gated(name, case))
            checks.append((f"step {step} {name}.grad", grad, expected))
    scales = _scales(parallel)
    gathered = [None] * world
    dist.all_gather_object(gathered, [s.tolist() for s in scales])
    return {"checks": [(what, (a - e).abs().max().item(), e.abs().max().item()) for what, a, e in checks],
            "scales_agree": all(view == gathered[0] for view in gathered),
            "scales_match_full": [s.tolist() for s in scales] == [s.tolist() for s in _scales(full)]}


def run_all(rank: int, world: int) -> dict:
    return {case.name: run_case(case, rank, world) for case in cases()}
