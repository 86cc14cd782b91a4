"""The autograd function of one GEMM y = x W^T + b, shared by te.Linear, te.LayerNormLinear
and te.LayerNormMLP (one call per GEMM, split_linear). A high-precision GEMM that it would
compute exactly as torch.nn.functional.linear under torch's own autograd runs as that instead
(plain_linear_applies, asked by the modules: Fp8ModuleMixin._plain_gemm): the same bits, at
about the per-call cost of torch.nn.Linear.

FP8 (every recipe): the input and weight are cast to the forward format (E4M3), the gradient
of the output to the backward format (E5M2 under HYBRID), per tensor or in the blocks of
Float8BlockScaling / MXFP8BlockScaling, each by its own quantizer (the Fp8Call's
GemmQuantizers, _fp8_call.py); the GEMMs multiply the dequantised operands with fp32
accumulation (fp8/gemm.py); the input is saved for the weight gradient in FP8, so the
activation memory is a quarter of fp32's.
"""
import dataclasses
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from ..fp8.block_tensor import Float8BlockPair
from ..fp8.nvfp4_operand import Nvfp4Pair
from ..fp8.state import BACKWARD, Fp8Operand
from .._autocast import autocast_enabled_for
from ..custom_ops.linear import (cast, few_rows_linear, gemm_keeps_dtype, linear, linear_accumulate,
                                 on_few_rows_kernel)
from ..fp8.gemm import fp8_gemm, fp8_gemm_accumulate
from ..parallel.collectives import all_gather, all_reduce, wait
from ..parallel.gemm_split import GemmSplit
from ..tensor.for_recipe import with_columnwise
from ..tensor.quantizer import Quantizer, operand_for
from ._fp8_call import Fp8Call
from ._output_forms import fp8_form, written_dtype


class LinearFunction(torch.autograd.Function):
    """y = x @ W.T + b over x [tokens, in] and W [out, in]; FP8 when fp8 is given.

    fuse_wgrad_accumulation: the weight gradient is added to weight.main_grad and
    main_grad_placeholder(weight) returned for it (None: weight.grad stays None).
    deferred_wgrad: a list; when given, the weight (and bias) gradient is not computed in
    backward but appended to it as a closure, for the module's backward_dw() to run later.
    split: the GEMM's tensor-parallel split (parallel/gemm_split.py), or None on one rank:
    a GEMM over gathered token shards (x of a column-parallel GEMM under sequence parallelism,
    the output gradient of a row-parallel one) multiplies this rank's shard while the others
    travel (GemmSplit.gemm_gathered); a column-parallel GEMM under sequence parallelism keeps only
    its own shard for the backward, gathered again there beside the dgrad GEMM; a row-parallel
    GEMM returns the ranks' sum (the caller adds the bias after it); the column-parallel dgrad
    is reduced while the weight-gradient GEMM runs.
    """

    @staticmethod
    def forward(ctx, inp: Tensor, weight: Tensor, bias: Optional[Tensor], fp8: Optional[Fp8Call],
                fuse_wgrad_accumulation: bool, main_grad: Optional[Tensor], deferred_wgrad: Optional[list],
                split: Optional[GemmSplit] = None):
        # The backward needs the call's slots, not the forward's FP8 input (kept in ctx in its
        # transposed layout only, below).
        ctx.fp8 = dataclasses.replace(fp8, input_fp8=None) if fp8 is not None else None
        ctx.backward_override = None
        ctx.deferred_wgrad = deferred_wgrad
        ctx.params = (weight, bias) if deferred_wgrad is not None else None
        ctx.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        ctx.main_grad = main_grad
        ctx.weight = weight if fuse_wgrad_accumulation else None
        ctx.input_dtype = inp.dtype
        ctx.weight_dtype = weight.dtype
        ctx.split = split
        gathers = split is not None and split.gathers_input
        # Whether the saved input is this rank's high-precision shard, gathered in backward.
        ctx.gather_saved_input = gathers
        if fp8 is None:
            ctx.save_for_backward(inp, weight)
            weight_hp, bias_hp = cast(weight, inp.dtype), cast(bias, inp.dtype)
            gemm = lambda rows: linear(rows, weight_hp, bias_hp)  # noqa: E731
            # [tokens, in] from the ranks' shards, this rank's rows multiplied while they travel
            y = split.gemm_gathered(split.gather_rows(inp), gemm)[0] if gathers else gemm(inp)
            return split.reduce_output(y) if split is not None else y
        # The backward needs x^T (wgrad) and W^T (dgrad): both come out of the casts' pass
        # (the quantizers' column-wise usage), unless the recipe's backward_override runs the
        # backward GEMMs in high precision.
        override = ctx.backward_override = fp8.recipe.backward_override
        training = fp8.needs_backward
        weight_fp8 = fp8.weight_fp8
        gemm = lambda rows: _fp8_gemm_of_call(rows, fp8, bias, inp.dtype)  # noqa: E731
        if gathers:  # the whole x [tokens, in] from the ranks' shards, as FP8
            gathered = split.gather_operand(inp, fp8.quantizers.input, fp8.input_fp8)
            y, inp_fp8 = split.gemm_gathered(gathered, gemm)
        else:
            inp_fp8 = fp8.input_fp8 or operand_for(fp8.quantizers.input, inp)
            y = gemm(inp_fp8)
        if training and override == "high_precision":  # the backward sees the unquantised x and W
            ctx.save_for_backward(inp, weight)
        elif training and override == "dequantized":  # ... or the forward's FP8 operands, dequantised
            ctx.gather_saved_input = False  # the gathered operand is kept
            inp_tensors, ctx.rebuild_inp = rowwise_operand(inp_fp8).saved()
            weight_tensors, ctx.rebuild_weight = rowwise_operand(weight_fp8).saved()
            ctx.inp_count = len(inp_tensors)
            ctx.save_for_backward(*inp_tensors, *weight_tensors)
        elif training:  # only the transposed layouts are used later: keep just those, in FP8
            weight_t_tensors, ctx.rebuild_weight_t = weight_fp8.t().saved()
            inp_t_tensors, ctx.rebuild_inp_t = (inp,), None  # save_original_input: cast again in backward
            if not fp8.save_original_input:
                ctx.gather_saved_input = False  # the gathered operand's transpose is kept
                inp_t_tensors, ctx.rebuild_inp_t = inp_fp8.t().saved()
            ctx.inp_t_count = len(inp_t_tensors)
            ctx.save_for_backward(*inp_t_tensors, *weight_t_tensors)
        # (fp8_output is refused where the output is reduced over ranks: it is this rank's whole.)
        y = split.reduce_output(y) if split is not None else y
        return fp8_form(fp8.quantizers.output, y, inp.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        dtype = ctx.input_dtype
        split = ctx.split
        received = grad_output  # this rank's token shard under row + sequence parallelism
        gathers = split is not None and split.gathers_grad_output
        # fp8_grad: the input gradient is cast (from what its GEMM writes) when it is asked for.
        grad_input_quantizer = None
        if ctx.fp8 is not None and ctx.needs_input_grad[0]:
            grad_input_quantizer = ctx.fp8.quantizers.grad_input

        def grad_bias():
            """The bias gradient: over every token, the shards' sums added up where the output was
            reduce-scattered (a row-parallel bias inside the GEMM: te.ops.Linear's)."""
            summed = received.sum(dim=0)
            return wait(all_reduce(summed, split.group)) if gathers else summed
        if ctx.fp8 is None or ctx.backward_override is not None:
            inp, weight = _high_precision_operands(ctx)
            # The input's shards are gathered while the dgrad GEMM runs (waited for by the wgrad).
            inp = all_gather(inp, split.group) if ctx.gather_saved_input else inp  # [tokens, in]
            weight_t = cast(weight, dtype).t()  # [in, out]
            dgrad = lambda rows: linear(rows, weight_t)  # noqa: E731  [tokens, out] x [in, out]^T
            if gathers:  # [tokens / size, out] -> [tokens, out], this rank's rows multiplied while they travel
                grad_input, grad_output = split.gemm_gathered(split.gather_rows(grad_output), dgrad)
            else:
                grad_input = dgrad(grad_output)

            wgrad = WeightGradient(lambda: linear(grad_output.t(), wait(inp).t()),  # [out, tokens] x [in, tokens]^T
                                   lambda main_grad: linear_accumulate(grad_output.t(), wait(inp).t(), main_grad))
        else:
            saved = ctx.saved_tensors
            fp8 = ctx.fp8
            if ctx.rebuild_inp_t is None:  # the high-precision input, cast as in the forward
                inp = split.gather(saved[0]) if ctx.gather_saved_input else saved[0]  # [tokens, in]
                inp_t = transposed_input(fp8.quantizers.input, inp)  # [in, tokens]
            else:
                inp_t = ctx.rebuild_inp_t(*saved[:ctx.inp_t_count])  # [in, tokens]
            weight_t = ctx.rebuild_weight_t(*saved[ctx.inp_t_count:])  # [in, out]
            dgrad = lambda rows: fp8_gemm(rows, weight_t,  # noqa: E731  [tokens, out] x [in, out]^T
                                          written_dtype(grad_input_quantizer, rows, weight_t, dtype))
            if gathers:  # [tokens / size, out] -> [tokens, out], as in the high-precision branch
                gathered = split.gather_operand(grad_output, fp8.quantizers.grad_output)
                grad_input, grad_fp8 = split.gemm_gathered(gathered, dgrad)
            else:
                grad_fp8 = operand_for(fp8.quantizers.grad_output, grad_output)
                grad_input = dgrad(grad_fp8)

            # Straight in the dtype the gradient ends up in: a CPU GEMM in bf16 (AMX) would
            # otherwise be widened to fp32 only to be rounded back to a bf16 weight's dtype.
            wgrad_dtype = ctx.main_grad.dtype if ctx.main_grad is not None else ctx.weight_dtype

            wgrad = WeightGradient(lambda: fp8_gemm(grad_fp8.t(), inp_t, wgrad_dtype),  # [out, tokens] x [in, tokens]^T
                                   lambda main_grad: fp8_gemm_accumulate(grad_fp8.t(), inp_t, main_grad))
        # Cast before the backward's scaling update, which reads the grad-input slot's amax
        # (fp8_grad is refused where the input gradient is reduced over ranks, below).
        grad_input = fp8_form(grad_input_quantizer, grad_input, dtype)
        update = ctx.fp8.update_after_backward if ctx.fp8 is not None and ctx.backward_override is None else None
        if update is not None:
            update.update(BACKWARD, ctx.fp8.amax_reduction_group)
        # A column-parallel dgrad is summed over the ranks while the weight gradient is computed.
        grad_input = split.reduce_grad_input(grad_input) if split is not None else grad_input
        grad_weight, grad_b = _weight_and_bias_grads(ctx, wgrad, grad_bias)
        return wait(grad_input), grad_weight, grad_b, None, None, None, None, None


def _weight_and_bias_grads(ctx, wgrad: "WeightGradient", grad_bias: Callable[[], Tensor]):
    """(weight gradient, bias gradient) as the backward returns them, for the parameters that
    take one (ctx.needs_input_grad: a frozen weight costs no weight-gradient GEMM): computed
    now, or (None, None) with their computation left for backward_dw (delay_wgrad_compute)."""
    needs_weight, needs_bias = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    if ctx.deferred_wgrad is not None:
        weight, bias = ctx.params
        defer_gradients(ctx.deferred_wgrad, [(weight, wgrad, ctx.main_grad)] if needs_weight else [],
                        [(bias, grad_bias)] if needs_bias else [])
        return None, None
    grad_b = grad_bias() if needs_bias else None
    if not needs_weight:
        return None, grad_b
    if ctx.fuse_wgrad_accumulation:
        wgrad.add_into(ctx.main_grad)
        return main_grad_placeholder(ctx.weight), grad_b
    return cast(wgrad.compute(), ctx.weight_dtype), grad_b


def _fp8_gemm_of_call(rows: Fp8Operand, fp8: Fp8Call, bias: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """The forward GEMM of an FP8 call: rows (the input's operand) x the call's weight operand,
    the bias in the epilogue, written in the dtype its output cast wants (fp8_output) or `dtype`."""
    weight_fp8 = fp8.weight_fp8
    return fp8_gemm(rows, weight_fp8, written_dtype(fp8.quantizers.output, rows, weight_fp8, dtype), bias)


def fp8_forward_only(x: Tensor, bias: Optional[Tensor], fp8: Fp8Call) -> Tensor:
    """LinearFunction's FP8 forward on one rank where it prepares no backward (inference,
    decoding): the same casts and GEMM, without the autograd function around them, whose
    per-call cost (27 us measured on 2 Zen 4 cores) is a twentieth of a decoding GEMV of a
    4096 x 4096 FP8 weight."""
    x_fp8 = fp8.input_fp8 or operand_for(fp8.quantizers.input, x)
    return fp8_form(fp8.quantizers.output, _fp8_gemm_of_call(x_fp8, fp8, bias, x.dtype), x.dtype)


def high_precision_forward_only(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """LinearFunction's high-precision forward on one rank where no graph is recorded (inference,
    decoding): the same GEMM, without the autograd function around it (on 2 Zen 3 cores a bf16
    te.Linear call at one token took 56-61 us with it, 30-36 without; the [1, 256] x [256, 768]
    GEMV itself takes 18)."""
    return linear(x, cast(weight, x.dtype), cast(bias, x.dtype))


def split_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], fp8: Optional[Fp8Call],
                 fuse_wgrad_accumulation: bool, main_grad: Optional[Tensor], deferred_wgrad: Optional[list],
                 split: Optional[GemmSplit], row_bias_after_sum: bool = True) -> Tensor:
    """LinearFunction over x [tokens, in], the bias in the GEMM's epilogue; a row-parallel
    GEMM's bias is added after the sum over the ranks (te.Linear's one bias), or, with
    row_bias_after_sum=False, each rank's own in its partial product before the sum (te.ops.Linear's)."""
    if split is None and fp8 is not None and not fp8.needs_backward:
        return fp8_forward_only(x, bias, fp8)
    if split is None and fp8 is None and not builds_backward((x, weight, bias)):
        return high_precision_forward_only(x, weight, bias)
    after_sum = split is not None and split.mode == "row" and row_bias_after_sum
    fused_bias = None if after_sum else bias
    y = LinearFunction.apply(x, weight, fused_bias, fp8, fuse_wgrad_accumulation, main_grad, deferred_wgrad, split)
    if bias is not None and fused_bias is None:
        y = y + cast(bias, y.dtype)
    return y


# Tensor subclasses (FP8 parameters, DTensors) take LinearFunction, which reads them as it must.
_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)


def builds_backward(tensors) -> bool:
    """Whether a forward over `tensors` (None entries ignored) records a graph for a backward:
    grad mode on and one of them requiring grad. (A loop rather than any() over a generator:
    asked on every call of every GEMM module, where the generator's cost shows.)"""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def plain_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The GEMM where plain_linear_applies: torch.nn.functional.linear under torch's autograd; with
    no backward to record (inference, decoding), the few rows that our kernel reads the weight
    for in place (few_rows_linear) go there instead."""
    if on_few_rows_kernel(x, weight) and not builds_backward((x, weight, bias)):
        return few_rows_linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def plain_linear_applies(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether LinearFunction's high-precision GEMMs of x [tokens, in], weight [out, in] and
    bias (one rank, no FP8, no main_grad, no deferred weight gradient: the caller's part) are
    exactly those of torch.nn.functional.linear and its C++ autograd: plain tensors of one
    dtype that the GEMM computes in (no widening: gemm_keeps_dtype), no torch.autocast region
    (which would recast them), and the layouts for which autograd's backward GEMMs are LinearFunction's
    own: grad_input = grad @ W needs x not column-major (autograd multiplies W^T grad^T for
    that, to return a column-major gradient), grad_weight = grad^T @ x a row-major weight
    (autograd multiplies x^T grad otherwise). The bias gradient is the sum over tokens in both.
    (Asked on every call of a small GEMM, where each step costs: the cheapest tests first, the
    strides read once.)"""
    dtype = x.dtype
    if type(x) not in _PLAIN_TENSOR_TYPES or type(weight) not in _PLAIN_TENSOR_TYPES or weight.dtype != dtype:
        return False
    if bias is not None and (type(bias) not in _PLAIN_TENSOR_TYPES or bias.dtype != dtype):
        return False
    x_row_stride, x_column_stride = x.stride()
    weight_row_stride, weight_column_stride = weight.stride()
    # torch's mm backward: an operand is column-major when stride(0) == 1 and stride(1) == rows.
    x_column_major = x_row_stride == 1 and x_column_stride == x.shape[0]
    weight_row_major = weight_column_stride == 1 and weight_row_stride == weight.shape[1]  # weight^T column-major
    return weight_row_major and not x_column_major and not autocast_enabled_for(x) and gemm_keeps_dtype(x)


class WeightGradient(NamedTuple):
    """The weight-gradient GEMM of a backward (GroupedLinear's: one per group), run when asked
    for: as the gradient, or added into main_grad (fuse_wgrad_accumulation) by a GEMM that
    accumulates, so that the gradient is never rounded before it is added."""
    compute: Callable[[], Tensor]
    add_into: Callable[[Tensor], None]  # (main_grad)


def transposed_input(quantizer: Quantizer, x: Tensor) -> Fp8Operand:
    """x^T [in, tokens] in FP8 for the weight-gradient GEMM, cast in the backward from the
    kept high-precision input x [tokens, in] (save_original_input) by the forward's input
    quantizer, here with the column-wise usage the forward's cast went without."""
    return with_columnwise(quantizer, True).operand_of(x).t()


def rowwise_operand(operand: Fp8Operand):
    """The FP8 operand the forward GEMM consumed (a block pair's row-wise codes, NVFP4's too)."""
    return operand.rowwise if isinstance(operand, (Float8BlockPair, Nvfp4Pair)) else operand


def _high_precision_operands(ctx) -> "tuple[Tensor, Tensor]":
    """(x, W) for a high-precision backward: as saved (no FP8, or backward_override=
    'high_precision'; an FP8-stored weight reads as its values), or the forward's FP8 operands
    dequantised (backward_override='dequantized')."""
    saved = ctx.saved_tensors
    if ctx.backward_override != "dequantized":
        return saved
    inp = ctx.rebuild_inp(*saved[:ctx.inp_count]).dequantize(ctx.input_dtype)
    return inp, ctx.rebuild_weight(*saved[ctx.inp_count:]).dequantize(ctx.input_dtype)


def main_grad_placeholder(weight: Tensor) -> Optional[Tensor]:
    """What a GEMM returns as the weight's gradient once it has added it to weight.main_grad
    (fuse_wgrad_accumulation). Megatron-LM's DDP marks its weights with the attribute
    grad_added_to_main_grad and reduces main_grad from a hook on each weight's gradient
    accumulation; for such a weight the attribute is set to True (the hook then adds nothing)
    and a zero gradient is returned so that the hook runs. Other weights get None (.grad stays None)."""
    if not _mark_added_to_main_grad(weight):
        return None
    return torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)


def _mark_added_to_main_grad(weight: Tensor) -> bool:
    """Sets Megatron-LM's grad_added_to_main_grad on a weight that carries it; whether it does."""
    if not hasattr(weight, "grad_added_to_main_grad"):
        return False
    weight.grad_added_to_main_grad = True
    return True


class DeferredGradients:
    """The weight and bias gradients of one backward, left for the module's backward_dw()
    (delay_wgrad_compute): `accumulate` adds them where autograd would have. Run once, outside
    autograd: the saved input may require grad, and a graph built now would hang off .grad,
    keep that input alive and chain the microbatches' gradients. Once run it holds nothing, so
    the microbatch's saved tensors are freed whatever still refers to it."""

    def __init__(self, accumulate: Callable[[], None]):
        self._accumulate = accumulate

    def __call__(self) -> None:
        accumulate, self._accumulate = self._accumulate, None
        with torch.no_grad():
            accumulate()


def defer_gradients(pending: list, weights: "list[tuple[Tensor, WeightGradient, Optional[Tensor]]]",
                    biases: "list[tuple[Tensor, Callable[[], Tensor]]]") -> None:
    """Appends to `pending` (a module's deferred work) the gradients of the parameters that
    take one, nothing where none does (every parameter frozen): (weight, its gradient's GEMM,
    the main_grad it is added into under fuse_wgrad_accumulation, the weight then marked as
    main_grad_placeholder does; None: added to .grad) and (bias, its gradient)."""
    if not weights and not biases:
        return

    def accumulate() -> None:
        for weight, wgrad, main_grad in weights:
            if main_grad is not None:
                wgrad.add_into(main_grad)
                _mark_added_to_main_grad(weight)
            else:
                add_grad(weight, wgrad.compute())
        for bias, grad in biases:
            add_grad(bias, grad())
    pending.append(DeferredGradients(accumulate))


def add_grad(param: Tensor, grad: Tensor) -> None:
    """Accumulates grad into param.grad in the parameter's dtype, as autograd does. A GEMM
    operand made from parameters (te.Linear's concatenation under parameters_split,
    GroupedLinear's views of single_grouped_weight) has no .grad of its own to keep: autograd
    takes the gradient back to them."""
    grad = cast(grad, param.dtype)
    if not param.is_leaf:
        torch.autograd.backward(param, grad)
        return
    param.grad = grad if param.grad is None else param.grad + grad
