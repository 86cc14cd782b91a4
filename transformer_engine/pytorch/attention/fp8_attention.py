"""FP8 attention, TE's fp8_dpa / fp8_mha under a per-tensor recipe: DotProductAttention's six
FP8 slots and the autograd function that casts between them around the FP8 flash ops
(custom_ops/attention_fp8.py; the numerics in docs/fp8_numerics.md).

The slots of the module's fp8_meta, TE's layout (three GEMMs' worth, as TE's
DotProductAttention has):
    forward   2 QKV (q, k and v cast together: one amax, one scale), 3 O, 8 S (the probabilities)
    backward  0 dQKV (the three gradients together), 3 dO, 5 dP (dL/dlogits)
Under DelayedScaling every slot follows the recipe. Under Float8CurrentScaling QKV, O, dO and
dQKV scale from their own tensors, while S and dP keep delayed scales, as TE's fused attention
does (it needs their scales before the products): a DelayedScaling of the recipe's format, with
TE's defaults for them (history 1, most_recent). The state is made for that DelayedScaling.

Forward: q, k, v cast (QKV slot) -> the FP8 forward on their code values (P cast with S's
scale, its amax recorded) -> out (fp32) cast (O slot) -> dequantised to the input dtype.
Backward: grad_out cast (dO slot) -> the FP8 backward (G cast with dP's scale, its amax
recorded) -> dq, dk, dv (fp32) cast together (dQKV slot) -> dequantised; then the backward
scales are updated, as the GEMM modules' are.
"""
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ...common import recipe as recipes
from ..custom_ops.attention_fp8 import flash_attention_fp8_backward, flash_attention_fp8_forward
from ..custom_ops.fp8_cast import fp8_dequantize
from ..fp8.codes import Float8Codes
from ..fp8.context import Fp8Context
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta
from ..tensor.for_recipe import slot_quantizer
from ..tensor.quantizer import Quantizer, operand_for
from .backends.base import AttentionProblem
from .backends.flash import kernel_arguments

QKV, O, S = 2, 3, 8  # forward slots (TE's META_QKV, META_O, META_S)
DQKV, DO, DP = 0, 3, 5  # backward slots (TE's META_DQKV, META_DO, META_DP)
FORWARD_SLOTS, BACKWARD_SLOTS = 9, 6


def asked(recipe: recipes.Recipe) -> bool:
    """Whether the recipe asks for FP8 attention (fp8_dpa, or fp8_mha which implies it)."""
    return bool(getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False))


def recipe_refusal(recipe: recipes.Recipe) -> Optional[str]:
    """Why FP8 attention does not run under `recipe` (None: a per-tensor recipe, it does)."""
    if recipe.delayed() or recipe.float8_current_scaling():
        return None
    return (f"FP8 attention takes the per-tensor recipes (DelayedScaling, Float8CurrentScaling), not "
            f"{type(recipe).__name__}")


def refusal(recipe: recipes.Recipe, problem: AttentionProblem) -> Optional[str]:
    """Why FP8 attention does not run this call under `recipe` (None: it does)."""
    reason = recipe_refusal(recipe)
    if reason is None and problem.page_table is not None:
        return "FP8 attention does not read a paged KV cache"
    return reason


def state_recipe(recipe: recipes.Recipe) -> recipes.DelayedScaling:
    """The recipe the module's FP8 state is made for: DelayedScaling itself, or under
    Float8CurrentScaling the DelayedScaling that S and dP follow."""
    if recipe.delayed():
        return recipe
    return recipes.DelayedScaling(fp8_format=recipe.fp8_format, amax_history_len=1, amax_compute_algo="most_recent",
                                  fp8_dpa=recipe.fp8_dpa, fp8_mha=recipe.fp8_mha)


class Handoffs(NamedTuple):
    """Which tensors MultiheadAttention hands between its GEMMs and its attention in FP8 (TE
    2.18's rules): the QKV projection's output (fp8_mha, without RoPE, which rotates values,
    and not under Float8CurrentScaling, whose GEMM writes high precision first), attention's
    output O (fp8_dpa or fp8_mha) and the gradient the output projection hands back to
    attention (as O, but not under Float8CurrentScaling)."""
    qkv_output: bool
    attention_output: bool
    proj_grad_input: bool


def handoffs(context: Optional[Fp8Context], rotary: bool) -> Handoffs:
    """The FP8 hand-offs of a MultiheadAttention forward in `context` (None: no te.autocast)."""
    if context is None or not context.enabled or not asked(context.recipe) or recipe_refusal(context.recipe):
        return Handoffs(False, False, False)
    current = context.recipe.float8_current_scaling()
    return Handoffs(qkv_output=bool(context.recipe.fp8_mha) and not rotary and not current, attention_output=True,
                    proj_grad_input=not current)


class Quantizers(NamedTuple):
    qkv: Quantizer
    o: Quantizer
    s: Quantizer
    dqkv: Quantizer
    do: Quantizer
    dp: Quantizer


def slot_quantizers(recipe: recipes.Recipe, meta: Fp8Meta) -> Quantizers:
    """The six slots' quantizers under `recipe` (the forward's), over `meta` (made for
    state_recipe(recipe))."""
    def of(rec, direction, slot):  # attention's tensors are never a weight's (no 2-D weight blocks)
        return slot_quantizer(rec, meta, direction, slot, "input", columnwise=False)
    delayed = meta.made_for
    return Quantizers(qkv=of(recipe, FORWARD, QKV), o=of(recipe, FORWARD, O), s=of(delayed, FORWARD, S),
                      dqkv=of(recipe, BACKWARD, DQKV), do=of(recipe, BACKWARD, DO), dp=of(delayed, BACKWARD, DP))


def _cast_together(quantizer: Quantizer, tensors: Tuple[Tensor, ...]) -> Float8Codes:
    """The tensors cast with one scale from their joint amax (TE casts q, k, v as one tensor),
    as one flat tensor of codes."""
    return quantizer.operand_of(torch.cat([t.detach().reshape(-1) for t in tensors]))  # any float dtype as it is


def _split(flat: Tensor, tensors: Tuple[Tensor, ...]) -> Tuple[Tensor, ...]:
    """flat [sum of numels] as views in the tensors' shapes."""
    return tuple(part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors))


def _qkv_codes(quantizer: Quantizer, tensors: Tuple[Tensor, ...]) -> List[Float8Codes]:
    """q, k, v's codes: an FP8 tensor's own, with its own scale (fp8_mha: the projection's
    output, not cast again), the others cast together by the QKV slot."""
    taken = [operand_for(quantizer, t) if isinstance(t, QuantizedTensor) else None for t in tensors]
    taken = [o if isinstance(o, Float8Codes) else None for o in taken]
    plain = [t.dequantize() if isinstance(t, QuantizedTensor) else t for t, o in zip(tensors, taken) if o is None]
    if plain:
        cast = _cast_together(quantizer, tuple(plain))
        parts = iter(Float8Codes(part, cast.scale_inv) for part in _split(cast.data, tuple(plain)))
        taken = [o if o is not None else next(parts) for o in taken]
    return taken


def _code_values(codes: Tensor, dtype: torch.dtype) -> Tensor:
    """FP8 codes as their values in dtype (exact): the dequantising kernel with scale_inv 1
    (torch's own conversion from float8 runs element by element, 20x slower on the CPU)."""
    return fp8_dequantize(codes, torch.ones(1, device=codes.device), dtype)


def _fp8_format(quantizer: Quantizer) -> int:
    return 0 if quantizer.fp8_dtype == torch.float8_e4m3fn else 1


class _Fp8Attention(torch.autograd.Function):
    """The FP8 ops between the slots' casts. q, k, v's codes go to the ops as values of q's
    dtype (every FP8 value is one, exactly), so a bias in q's dtype is read as it is.

    FP8 tensors pass without a high-precision round trip (fp8_mha): FP8 q, k, v are read as
    their codes; with fp8_output, O comes back as the FP8 tensor of the O slot's cast; an FP8
    gradient of O is read as its codes (the dO slot casts nothing); and when q, k and v came
    in FP8, their gradients go back as the FP8 tensors of the dQKV slot's cast."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], softmax_offset: Optional[Tensor],
                problem: AttentionProblem, quantizers: Quantizers, update_backward: Callable[[], None],
                fp8_output: bool):
        dtype = q.dtype
        arguments = {**kernel_arguments(q, k, problem), "softmax_offset": softmax_offset,
                     "bias": None if bias is None else bias.to(dtype)}
        dropout_rng = None
        if problem.dropout > 0:
            dropout_rng = torch.randint(2 ** 62, (2,), dtype=torch.int64, device=q.device)
        codes = _qkv_codes(quantizers.qkv, (q, k, v))
        q8, k8, v8 = (_code_values(c.data, dtype) for c in codes)
        qkv_si = torch.cat([c.scale_inv.reshape(1).float() for c in codes])  # [3]
        probs_scale = quantizers.s.scale.detach().float().clone()  # the backward recomputes P with it
        scales = torch.cat([qkv_si.to(probs_scale.device), probs_scale, torch.reciprocal(probs_scale)]).cpu()
        out, lse, probs_amax = flash_attention_fp8_forward(q8, k8, v8, problem.scale, scales, dropout=problem.dropout,
                                                           dropout_rng=dropout_rng, **arguments)
        quantizers.s.record_amax(probs_amax.to(probs_scale.device))
        o = quantizers.o.operand_of(out)
        ctx.save_for_backward(q8, k8, v8, o.data, o.scale_inv, lse, qkv_si, probs_scale, dropout_rng)
        ctx.problem, ctx.arguments = problem, arguments
        ctx.quantizers, ctx.update_backward = quantizers, update_backward
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.fp8_inputs = all(isinstance(t, QuantizedTensor) for t in (q, k, v))
        if fp8_output:
            return quantizers.o.tensor_of(o, out.shape, dtype)
        return fp8_dequantize(o.data, o.scale_inv, dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q8, k8, v8, o_codes, o_si, lse, qkv_si, probs_scale, dropout_rng = ctx.saved_tensors
        quantizers, problem, dtype = ctx.quantizers, ctx.problem, q8.dtype
        do = operand_for(quantizers.do, grad_out if isinstance(grad_out, QuantizedTensor) else grad_out.contiguous())
        dp_scale = quantizers.dp.scale.detach().float()
        scales = torch.cat([qkv_si, o_si, do.scale_inv.reshape(1).float().to(o_si.device), probs_scale,
                            torch.reciprocal(probs_scale), dp_scale, torch.reciprocal(dp_scale)]).cpu()
        bias_grad = ctx.needs_input_grad[3]
        dq, dk, dv, grad_bias, grad_offset, grad_scores_amax = flash_attention_fp8_backward(
            _code_values(do.data, dtype), q8, k8, v8, _code_values(o_codes, dtype), lse, problem.scale, scales,
            _fp8_format(quantizers.dp),
            dropout=problem.dropout, dropout_rng=dropout_rng, bias_grad=bias_grad, **ctx.arguments)
        quantizers.dp.record_amax(grad_scores_amax.to(dp_scale.device))
        dqkv = _cast_together(quantizers.dqkv, (dq, dk, dv))
        ctx.update_backward()
        if ctx.fp8_inputs:  # one FP8 tensor, its three parts views of it (one scale: they concatenate as FP8)
            flat = quantizers.dqkv.tensor_of(dqkv, dqkv.data.shape, dtype)
            grads = _split(flat, (dq, dk, dv))
        else:
            grads = _split(fp8_dequantize(dqkv.data, dqkv.scale_inv, dtype), (dq, dk, dv))
        return (*grads, grad_bias.to(ctx.bias_dtype) if bias_grad else None,
                grad_offset if ctx.needs_input_grad[4] else None, None, None, None, None)


def fp8_attention(q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem, quantizers: Quantizers,
                  update_backward: Callable[[], None], fp8_output: bool = False) -> Tensor:
    """FP8 attention of q [b, h, sq, dk], k / v [b, g, skv, d] (or a thd call's packed [t, h | g, d])
    over `problem`, with the six slots' quantizers: out [b, h, sq, dv] ([t, h, dv]), O's FP8
    values in q's dtype, or with fp8_output the FP8 tensor itself. q, k, v may be FP8 tensors
    (per-tensor codes), read as they are. update_backward runs once its backward has recorded
    the backward amaxes. The bias and the sinks' logits get their gradients."""
    return _Fp8Attention.apply(q, k, v, problem.bias, problem.softmax_offset, problem, quantizers, update_backward,
                               fp8_output)
