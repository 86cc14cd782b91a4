"""What each rank of tests/distributed/test_fsdp2.py runs: te modules trained under FSDP2
(torch.distributed.fsdp.fully_shard, DTensor parameters) against the same module trained
unsharded on every rank, and FSDP2's all-gather of FP8 weights (tensor/fsdp2.py).

A training case builds the module from one seed on both ranks, keeps a copy, shards the
module (each child first, then the root, for the stacks of layers), and runs a few steps of
data-parallel training: each rank its half of the batch (the rows of the first dimension, so
that each rank's tokens are a contiguous block of the one-rank run's, 128 of them: the
128-token blocks of Float8BlockScaling's weight-gradient casts lie within one rank, as they
do in the one-rank run), the copy the whole batch. The loss of a rank is its part of the whole
batch's (a sum divided by the whole batch's size) and FSDP2 sums the gradients rather than
averaging them, so that every gradient of the sharded run is the one-rank run's (up to the
order of fp32 sums) and the FP8 casts of the backward see the same values. Compared: the
loss of each step (summed over the ranks) and every parameter after the last step.

Built on the "meta" device (meta cases), the module is sharded first and reset_parameters
materialises each rank's shard; the copy then takes the sharded module's values (FP8 weights
exactly, their codes gathered by FSDP2, with the FP8 state the shards' casts recorded).
"""
import contextlib
import copy
import dataclasses
import functools
import shutil
import tempfile
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8.model_init import WeightQuantization
from transformer_engine.pytorch.fp8.nvfp4_operand import Nvfp4Pair
from transformer_engine.pytorch.tensor import Float8BlockQuantizer, MXFP8Quantizer, QuantizedTensor
from transformer_engine.pytorch.tensor.for_recipe import quantized_weight

HIDDEN, FFN, HEADS, TOKENS, STEPS = 128, 256, 4, 128, 3
# NVFP4 with nearest rounding: stochastic rounding draws other random numbers for a rank's half
# of a gradient than for the whole, so that the runs could not be compared closely.
RECIPES = {"none": None, "delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling,
           "mxfp8": recipe.MXFP8BlockScaling, "block": recipe.Float8BlockScaling,
           "nvfp4": functools.partial(recipe.NVFP4BlockScaling, disable_stochastic_rounding=True)}
MODULE_RECIPES = ("none", "delayed", "current", "mxfp8", "block")  # each module trained under each


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable  # (device=...) -> module
    input_shape: tuple  # one rank's input; the batch is the first dimension
    recipe: str
    stack: bool = False  # a Sequential of layers: each sharded, then the root
    fp8_weights: bool = False  # built under te.quantized_model_init(recipe)
    meta: bool = False  # built on "meta", materialised by reset_parameters after sharding
    optimizer: Optional[dict] = None  # FusedAdam's arguments; None: torch.optim.SGD
    preserve_init: bool = False  # preserve_high_precision_init_val, the masters seeded from it


def _layer(**factory):
    return te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0,
                               attn_input_format="bshd", **factory)


def _layers(**factory):
    return torch.nn.Sequential(_layer(**factory), _layer(**factory))


MODULES = {"Linear": (lambda **f: te.Linear(HIDDEN, 256, **f), (TOKENS, HIDDEN), False),
           "LayerNormLinear": (lambda **f: te.LayerNormLinear(HIDDEN, 256, **f), (TOKENS, HIDDEN), False),
           "LayerNormMLP": (lambda **f: te.LayerNormMLP(HIDDEN, FFN, **f), (TOKENS, HIDDEN), False),
           "LayerNorm": (lambda **f: te.LayerNorm(HIDDEN, **f), (TOKENS, HIDDEN), False),
           "RMSNorm": (lambda **f: te.RMSNorm(HIDDEN, **f), (TOKENS, HIDDEN), False),
           "TransformerLayer": (_layers, (2, TOKENS // 2, HIDDEN), True)}
# FP8 weights: every shard of a Float8BlockScaling weight must be whole 128-row blocks, which
# the layers at HIDDEN=128 do not have (their attention projections shard into 64 rows).
_MLP_256 = (lambda **f: te.LayerNormMLP(256, 256, **f), (TOKENS, 256), False)
FP8_WEIGHT_MODULES = {"Linear": ("delayed", "current", "mxfp8", "block", "nvfp4"),
                      "LayerNormMLP": ("delayed", "current", "mxfp8", "block", "nvfp4"),
                      "TransformerLayer": ("delayed", "current", "mxfp8")}


def cases() -> list:
    found = []
    for module, (build, shape, stack) in MODULES.items():
        for rec in MODULE_RECIPES:
            found.append(Case(f"{module}-{rec}", build, shape, rec, stack))
    for module, recipes in FP8_WEIGHT_MODULES.items():
        build, shape, stack = _MLP_256 if module == "LayerNormMLP" else MODULES[module]
        for rec in recipes:
            found.append(Case(f"fp8-weights-{module}-{rec}", build, shape, rec, stack, fp8_weights=True))
    found += [Case("meta-TransformerLayer-none", _layers, MODULES["TransformerLayer"][1], "none", True, meta=True),
              Case("meta-Linear-delayed", *MODULES["Linear"][:2], "delayed", meta=True)]
    for rec in ("delayed", "current", "mxfp8", "block", "nvfp4"):
        found.append(Case(f"meta-fp8-weights-LayerNormMLP-{rec}", *_MLP_256[:2], rec, fp8_weights=True, meta=True))
    adam = {"lr": 1e-3, "weight_decay": 0.01}
    master = {**adam, "master_weights": True, "master_weight_dtype": torch.float32}
    # FusedAdam's steps are within fp32 rounding of the one-rank run's only where the recipe's
    # casts are (Adam steps by about lr wherever a gradient is rounding noise: current scaling's
    # per-rank casts give such noise). fused_adam_cases compares its steps alone, exactly.
    found += [Case("FusedAdam-Linear-none", *MODULES["Linear"][:2], "none", optimizer=adam),
              Case("FusedAdam-fp8-weights-Linear-delayed-no-master", *MODULES["Linear"][:2], "delayed",
                   fp8_weights=True, optimizer=adam)]
    for rec in ("delayed", "mxfp8", "block"):
        found.append(Case(f"FusedAdam-fp8-weights-LayerNormMLP-{rec}-master", *_MLP_256[:2], rec, fp8_weights=True,
                          optimizer=master))
    found.append(Case("FusedAdam-fp8-weights-LayerNormMLP-delayed-high-precision-init", *_MLP_256[:2], "delayed",
                      fp8_weights=True, meta=True, optimizer=master, preserve_init=True))
    return found


def _shard(model: torch.nn.Module, mesh, stack: bool, mp_policy: Optional[MixedPrecisionPolicy] = None) -> None:
    """fully_shard each layer of a stack (resharded after its forward, gathered again for its
    backward), then the root; the gradients summed over the ranks, not averaged."""
    policy = {"mp_policy": mp_policy} if mp_policy is not None else {}
    if stack:
        for child in model.children():
            fully_shard(child, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum


def _fsdp_modules(model: torch.nn.Module) -> list:
    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def _values(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.dequantize() if isinstance(tensor, QuantizedTensor) else tensor


def _codes(tensor: QuantizedTensor) -> list:
    """The FP8 data of a quantized tensor: its codes and scales (TE's attributes)."""
    names = ("_data", "_scale_inv") if hasattr(tensor, "_data") else (
        "_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
    return [getattr(tensor, name) for name in names]


def _nvfp4_cols(tensor: QuantizedTensor) -> list:
    """The columns each usage of an NVFP4 weight reads its codes as (empty for the FP8 formats):
    a gathered weight's column-wise usage has the whole weight's rows, not a shard's."""
    operand = getattr(getattr(tensor, "_storage", None), "operand", None)
    if not isinstance(operand, Nvfp4Pair):
        return []
    return [usage.cols if usage is not None else None for usage in (operand.rowwise, operand.columnwise)]


def _same_codes(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    return _nvfp4_cols(a) == _nvfp4_cols(b) and all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(_codes(a), _codes(b)))


def _gathered_weights(model: torch.nn.Module, reference: torch.nn.Module, load: bool) -> dict:
    """Unshards the model (FSDP2's all-gather of every layer); returns {name: the gathered
    parameter's class} for its quantized ones and whether their codes are the reference's
    (load: copies them into the reference first, exactly); then reshards."""
    for module in _fsdp_modules(model):
        module.unshard()
    found, same = {}, True
    with torch.no_grad():
        for (name, param), ref in zip(model.named_parameters(), reference.parameters()):
            if isinstance(ref, QuantizedTensor):
                found[name] = type(param).__name__
                if load:
                    ref.copy_(param)
                same = same and isinstance(param, QuantizedTensor) and _same_codes(param, ref)
            elif load:
                ref.copy_(param)
    for module in _fsdp_modules(model):
        module.reshard()
    return {"classes": found, "codes_match": same}


def _load_reference(model: torch.nn.Module, reference: torch.nn.Module, fp8_weights: bool) -> dict:
    """The reference takes the sharded model's values after reset_parameters: plain parameters
    gathered as values, FP8 weights as FSDP2 gathers them (codes copied exactly), and each
    module's FP8 state (the amaxes its shards' casts recorded, which the first scaling update
    reduces over the ranks)."""
    if fp8_weights:
        found = _gathered_weights(model, reference, load=True)
    else:
        with torch.no_grad():
            for param, ref in zip(model.parameters(), reference.parameters()):
                ref.copy_(param.full_tensor())
        found = {}
    for module, ref in zip(model.modules(), reference.modules()):
        if getattr(module, "fp8_meta", None) is not None:
            ref.set_extra_state(module.get_extra_state())
    return found


def _optimizers(case: Case, model, reference, rank: int, world: int):
    if case.optimizer is None:  # steps in proportion to the gradients (Adam's are not, where they are ~0)
        return (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9))
    optimizer = te.optimizers.FusedAdam(model.parameters(), **case.optimizer)
    ref_optimizer = te.optimizers.FusedAdam(reference.parameters(), **case.optimizer)
    if case.preserve_init:  # TE's recipe: the fp32 masters seeded from the weights' initial values
        for param, ref in zip(model.parameters(), reference.parameters()):
            shard = param._local_tensor
            if not isinstance(shard, QuantizedTensor):
                continue
            initial = shard.get_high_precision_init_val()
            optimizer.set_scaled_state(param, "master_param", initial)
            shard.clear_high_precision_init_val()
            pieces = [torch.empty_like(initial) for _ in range(world)]
            dist.all_gather(pieces, initial.contiguous())
            ref_optimizer.set_scaled_state(ref, "master_param", torch.cat(pieces))
    return optimizer, ref_optimizer


def _all_gather_inputs(model: torch.nn.Module, mesh) -> dict:
    """{name: dtypes} of what fsdp_pre_all_gather sends for each FP8 weight's shard."""
    found = {}
    for name, param in model.named_parameters():
        shard = param._local_tensor
        if isinstance(shard, QuantizedTensor):
            inputs, _ = shard.fsdp_pre_all_gather(mesh, param.shape, param.stride(), None, None)
            found[name] = [str(t.dtype) for t in inputs]
    return found


def run_case(case: Case, rank: int, world: int, mesh) -> dict:
    """{"checks": [(what, max |diff|, max |expected|)], "local_classes": the shards' classes}
    for one training case; for FP8 weights also what the gathered weights are and what their
    shards send."""
    step_recipe = RECIPES[case.recipe]() if RECIPES[case.recipe] is not None else None

    def init():  # the region each build runs in
        return (te.quantized_model_init(recipe=step_recipe, preserve_high_precision_init_val=case.preserve_init)
                if case.fp8_weights else contextlib.nullcontext())
    torch.manual_seed(1234)
    with init():
        model = case.build(**({"device": "meta"} if case.meta else {}))
    reference = None if case.meta else copy.deepcopy(model)
    _shard(model, mesh, case.stack)
    if case.meta:
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    found = {"local_classes": sorted({type(p._local_tensor).__name__ for p in model.parameters()})}
    if case.meta:
        with init():
            reference = case.build()
        found["gathered"] = _load_reference(model, reference, case.fp8_weights)
    elif case.fp8_weights:
        found["gathered"] = _gathered_weights(model, reference, load=False)
    if case.fp8_weights:
        found["all_gather_inputs"] = _all_gather_inputs(model, mesh)
    optimizer, ref_optimizer = _optimizers(case, model, reference, rank, world)
    checks = []
    for step in range(STEPS):
        x = torch.randn(world * case.input_shape[0], *case.input_shape[1:])
        y = _forward(model, x.chunk(world)[rank], step_recipe)
        target = torch.randn((world * y.shape[0],) + y.shape[1:])  # drawn alike on both ranks
        losses = [_train_step(y, target.chunk(world)[rank], target.numel(), optimizer)]
        y_ref = _forward(reference, x, step_recipe)
        losses.append(_train_step(y_ref, target, target.numel(), ref_optimizer))
        dist.all_reduce(losses[0])
        checks.append((f"step {step} loss", losses[0], losses[1]))
    for (name, param), ref in zip(model.named_parameters(), reference.parameters()):
        checks.append((f"{name} after {STEPS} steps", _values(param.full_tensor()).float(), _values(ref).float()))
    found["checks"] = [(what, (a - e).abs().max().item(), e.abs().max().item()) for what, a, e in checks]
    return found


def _forward(module: torch.nn.Module, x: torch.Tensor, step_recipe) -> torch.Tensor:
    with te.autocast(enabled=step_recipe is not None, recipe=step_recipe):
        return module(x)


def _train_step(y: torch.Tensor, target: torch.Tensor, batch_numel: int, optimizer) -> torch.Tensor:
    """One optimizer step on this output's part of the whole batch's squared error."""
    loss = ((y.float() - target) ** 2).sum() / batch_numel
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# FSDP2's mixed precision as trainers set it: bf16 parameters for the computation (gathered in
# bf16, the inputs cast to it), gradients reduced and applied in fp32.
MIXED_PRECISION = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
MIXED_PRECISION_MODULES = ("Linear", "LayerNormMLP", "TransformerLayer")


def mixed_precision_cases(rank: int, world: int, mesh) -> dict:
    """{f"mixed-bf16-{module}-{recipe}": {"checks": ..., "dtypes": ...}}: SGD training under
    MIXED_PRECISION against the one-rank run it stands for: each step a bf16 copy of the fp32
    weights computes the whole batch's gradients, which step the fp32 weights in fp32. (The
    copy is kept from step to step, so that delayed scaling's history carries on as in the
    sharded module.)"""
    found = {}
    for module in MIXED_PRECISION_MODULES:
        build, shape, stack = MODULES[module]
        for rec in ("none", "delayed"):
            found[f"mixed-bf16-{module}-{rec}"] = _mixed_precision_case(build, shape, stack, rec, rank, world, mesh)
    return found


def _mixed_precision_case(build, shape: tuple, stack: bool, rec: str, rank: int, world: int, mesh) -> dict:
    step_recipe = RECIPES[rec]() if RECIPES[rec] is not None else None
    torch.manual_seed(1234)
    model = build()
    reference = copy.deepcopy(model)
    compute = copy.deepcopy(model)  # the reference's bf16 copy
    for param in compute.parameters():
        param.data = param.data.to(torch.bfloat16)
    _shard(model, mesh, stack, MIXED_PRECISION)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    checks, dtypes = [], set()
    for step in range(STEPS):
        x = torch.randn(world * shape[0], *shape[1:])
        y = _forward(model, x.chunk(world)[rank], step_recipe)
        dtypes.add(str(y.dtype))
        target = torch.randn((world * y.shape[0],) + y.shape[1:])  # drawn alike on both ranks
        loss = _train_step(y, target.chunk(world)[rank], target.numel(), optimizer)
        dist.all_reduce(loss)
        with torch.no_grad():
            for bf16, fp32 in zip(compute.parameters(), reference.parameters()):
                bf16.copy_(fp32)
        y_ref = _forward(compute, x.to(torch.bfloat16), step_recipe)
        ref_loss = ((y_ref.float() - target) ** 2).sum() / target.numel()
        ref_loss.backward()
        for fp32, bf16 in zip(reference.parameters(), compute.parameters()):
            fp32.grad, bf16.grad = bf16.grad.float(), None
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
        checks.append((f"step {step} loss", loss, ref_loss.detach()))
    dtypes.update(str(param.dtype) for param in model.parameters())
    for (name, param), ref in zip(model.named_parameters(), reference.parameters()):
        checks.append((f"{name} after {STEPS} steps", param.full_tensor(), ref))
    return {"checks": [(what, (a - e).abs().max().item(), e.abs().max().item()) for what, a, e in checks],
            "dtypes": sorted(dtypes)}


def run_all(rank: int, world: int) -> dict:
    mesh = init_device_mesh("cpu", (world,))
    results = {case.name: run_case(case, rank, world, mesh) for case in cases()}
    results.update(mixed_precision_cases(rank, world, mesh))
    results.update(hook_cases(rank, world, mesh))
    results.update(fused_adam_cases(rank, world, mesh))
    results["prepare_te_modules_for_fsdp"] = fsdp1_case()
    results["checkpoint-fp8-weights-current"] = checkpoint_case(rank, world, mesh)
    return results


class _Holder(torch.nn.Module):
    """A module holding one quantized parameter, for FSDP2 to shard and gather."""

    def __init__(self, weight: QuantizedTensor):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)


def _gathered_as_whole(weight: QuantizedTensor, mesh) -> dict:
    """fully_shard a module holding `weight` (a copy), unshard it: the class of the shards and
    of the gathered parameter, and whether the gathered codes are weight's; or the error the
    all-gather raised."""
    holder = _Holder(copy.deepcopy(weight))
    fully_shard(holder, mesh=mesh)
    found = {"shard": type(holder.weight._local_tensor).__name__}
    try:
        holder.unshard()
    except ValueError as error:
        return {**found, "error": str(error)}
    gathered = holder.weight
    found.update(gathered=type(gathered).__name__,
                 codes_match=isinstance(gathered, QuantizedTensor) and _same_codes(gathered, weight))
    holder.reshard()
    return found


def hook_cases(rank: int, world: int, mesh) -> dict:
    """The all-gather of single quantized parameters: per-tensor codes over shards of unequal
    size (FSDP2 pads the last), block-scaled codes (FP8 and NVFP4) over shards of whole blocks
    and over HSDP's shards of one rank, and block-scaled weights whose shards are not whole
    blocks (refused)."""
    torch.manual_seed(99)
    quantizers = {"Float8Tensor-uneven-shards": (te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3), (5, 32)),
                  "MXFP8Tensor": (MXFP8Quantizer(te.DType.kFloat8E4M3), (64, 64)),
                  "Float8BlockwiseQTensor": (Float8BlockQuantizer(te.DType.kFloat8E4M3), (256, 64)),
                  "MXFP8Tensor-not-whole-blocks": (MXFP8Quantizer(te.DType.kFloat8E4M3), (96, 64)),
                  "NVFP4Tensor-16x16": (te.NVFP4Quantizer(with_2d_quantization=True), (64, 64)),
                  "NVFP4Tensor-1x16": (te.NVFP4Quantizer(), (96, 48)),
                  "NVFP4Tensor-not-whole-blocks": (te.NVFP4Quantizer(), (48, 32))}
    found = {f"hooks-{name}": _gathered_as_whole(quantizer(torch.randn(shape)), mesh)
             for name, (quantizer, shape) in quantizers.items()}
    # HSDP whose shard dimension is one rank: FSDP2 copies the one tensor sent, unsent.
    hsdp = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    weight = MXFP8Quantizer(te.DType.kFloat8E4M3)(torch.randn(64, 64))
    found["hooks-MXFP8Tensor-HSDP-shards-of-one-rank"] = _gathered_as_whole(weight, hsdp)
    weight = te.NVFP4Quantizer(with_2d_quantization=True)(torch.randn(64, 64))
    found["hooks-NVFP4Tensor-HSDP-shards-of-one-rank"] = _gathered_as_whole(weight, hsdp)
    found["hooks-Float8Tensor-written-before-gather"] = _written_before_gather(mesh)
    return found


def _written_before_gather(mesh) -> dict:
    """A current-scaling weight whose shards are written before FSDP2 first gathers it (each
    cast with its own amax then): the first all-gather casts them again at one scale. The
    gathered values against the whole weight's, written alike; the ranks' gathered scales."""
    whole = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(torch.randn(64, 32))
    holder = _Holder(copy.deepcopy(whole))
    fully_shard(holder, mesh=mesh)
    rows = torch.linspace(1.0, 8.0, 64).unsqueeze(1)  # the shards' amaxes far apart
    with torch.no_grad():
        holder.weight._local_tensor.mul_(rows.chunk(mesh.size())[mesh.get_local_rank()])
        whole.mul_(rows)
    holder.unshard()
    gathered = holder.weight
    scales = [torch.empty(1) for _ in range(mesh.size())]
    dist.all_gather(scales, gathered._scale_inv.clone())
    error = ((gathered.dequantize() - whole.dequantize()).abs().max() / whole.dequantize().abs().max()).item()
    holder.reshard()
    return {"gathered": type(gathered).__name__, "scales_agree": all(torch.equal(s, scales[0]) for s in scales),
            "relative_error": error}


# name: (the recipe of an FP8 parameter's cast or None, the parameter's dtype, FusedAdam's options)
_MASTER = {"master_weights": True}
FUSED_ADAM_PARAMS = {"fp32": (None, torch.float32, {}),
                     "bf16-master": (None, torch.bfloat16, _MASTER),
                     "bf16-remainders": (None, torch.bfloat16, {**_MASTER, "store_param_remainders": True}),
                     "fp8-current-no-master": ("current", torch.float32, {}),
                     "fp8-current-master": ("current", torch.float32, _MASTER),
                     "fp8-delayed-master": ("delayed", torch.float32, _MASTER),
                     "fp8-mxfp8-master": ("mxfp8", torch.float32, _MASTER),
                     "fp8-block-master": ("block", torch.float32, _MASTER),
                     "fp8-nvfp4-master": ("nvfp4", torch.float32, _MASTER)}


def fused_adam_cases(rank: int, world: int, mesh) -> dict:
    """FusedAdam over one parameter sharded by FSDP2 (a DTensor; a quantized one for the FP8
    variants, per the recipe's weight cast) against FusedAdam over the whole parameter, both
    given the same gradients: Adam is elementwise, so each shard's steps are the whole's,
    bit for bit (the FP8 shards cast with the whole weight's scale). Also: the states are
    DTensors (float32 moments and masters, int16 remainders)."""
    found = {}
    for name, (rec, dtype, options) in FUSED_ADAM_PARAMS.items():
        torch.manual_seed(7)
        values = (0.05 * torch.randn(256, 128)).to(dtype)
        if rec is not None:
            quantization = WeightQuantization(RECIPES[rec](), preserve_high_precision_init_val=False)
            whole = quantized_weight(quantization, values)
        else:
            whole = torch.nn.Parameter(values)
        holder = _Holder(copy.deepcopy(whole.detach()))
        fully_shard(holder, mesh=mesh)
        optimizer = te.optimizers.FusedAdam(holder.parameters(), lr=1e-2, weight_decay=0.01, **options)
        ref_optimizer = te.optimizers.FusedAdam([whole], lr=1e-2, weight_decay=0.01, **options)
        for _ in range(STEPS):
            grad = torch.randn(values.shape).to(dtype)
            holder.weight.grad = distribute_tensor(grad, mesh, [Shard(0)])
            whole.grad = grad
            optimizer.step()
            ref_optimizer.step()
        state = optimizer.state[holder.weight]
        found[f"FusedAdam-dtensor-{name}"] = {
            "diff": (_values(holder.weight.full_tensor()).float() - _values(whole).float()).abs().max().item(),
            "shard": type(holder.weight._local_tensor).__name__,
            "states": {key: (type(value).__name__, str(value.dtype)) for key, value in state.items()
                       if isinstance(value, torch.Tensor)}}
    return found


def fsdp1_case() -> dict:
    """TE's FSDP1 helper: a te module wrapped in FullyShardedDataParallel gets its unit's
    process group and still trains; a module with FP8 weights and an unwrapped root are
    refused (the errors' texts)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from transformer_engine.pytorch.distributed import prepare_te_modules_for_fsdp
    cpu = torch.device("cpu")
    inner = te.Linear(HIDDEN, HIDDEN)
    model = FullyShardedDataParallel(torch.nn.Sequential(FullyShardedDataParallel(inner, device_id=cpu),
                                                         torch.nn.ReLU()), device_id=cpu)
    prepare_te_modules_for_fsdp(model)
    model(torch.randn(TOKENS, HIDDEN)).sum().backward()
    found = {"group_set": inner.fsdp_group is not None,
             "trained": all(p.grad is not None for p in model.parameters())}
    with te.quantized_model_init():
        fp8_weights = FullyShardedDataParallel(te.Linear(HIDDEN, HIDDEN), device_id=cpu)
    for name, root in (("fp8_weights", fp8_weights), ("unwrapped", inner)):
        try:
            prepare_te_modules_for_fsdp(root)
            found[name] = None
        except (RuntimeError, TypeError) as error:
            found[name] = str(error)
    return found


def checkpoint_case(rank: int, world: int, mesh) -> dict:
    """torch.distributed.checkpoint's asynchronous save of a sharded module with FP8 weights
    (current scaling: the quantizers hold the shard group), loaded into a fresh sharded module:
    the outputs of the two, and whether the loaded weights stay quantized."""
    step_recipe = recipe.Float8CurrentScaling()

    def build():
        with te.quantized_model_init(recipe=step_recipe):
            model = te.Linear(HIDDEN, 256)
        _shard(model, mesh, stack=False)
        return model
    torch.manual_seed(5)
    saved, fresh = build(), build()
    x = torch.randn(TOKENS, HIDDEN)
    _train_step(_forward(saved, x, step_recipe), torch.zeros(TOKENS, 256), TOKENS * 256,
                torch.optim.SGD(saved.parameters(), lr=0.1))
    folder = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(folder)
    try:
        dcp.async_save({"model": saved.state_dict()}, checkpoint_id=folder[0]).result()
        with torch.no_grad():  # the FP8 state exists, of the saved one's size (DCP loads in place)
            _forward(fresh, x, step_recipe)
        fresh.reshard()  # a root's forward without a backward leaves it gathered
        state = {"model": fresh.state_dict()}
        dcp.load(state, checkpoint_id=folder[0])
        fresh.load_state_dict(state["model"])
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder[0])
    shard = type(fresh.weight._local_tensor).__name__
    with torch.no_grad():
        diff = (_forward(fresh, x, step_recipe) - _forward(saved, x, step_recipe)).abs().max().item()
    return {"output_diff": diff, "shard": shard}
