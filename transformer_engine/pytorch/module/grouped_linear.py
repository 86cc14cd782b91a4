"""te.GroupedLinear: num_gemms Linear layers, each applied to its own block of consecutive rows
of one input (the expert GEMMs of a mixture-of-experts layer), in high precision or, inside
te.autocast, in FP8 with one fp8_meta for all of them.

fp8_meta slots (TransformerEngine's GroupedLinear layout, n = num_gemms):
    scaling_fwd: inputs 0..n-1, weights n..2n-1, outputs 2n..3n-1
    scaling_bwd: grad outputs 0..n-1, grad inputs n..2n-1
Split i's input, weight and output gradient are cast with their own slots, so every group
keeps its own scales. A split of 0 rows casts nothing: its input and gradient slots keep
their amaxes and scales (an empty tensor has no amax to learn from).
"""
import functools
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..fp8.context import Fp8Context
from ..fp8.model_init import weight_quantization_in_force
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta, Fp8Operand
from ..parallel.attributes import set_tensor_model_parallel_attributes
from ..dtensor import local_tensor
from ..custom_ops.linear import linear, linear_accumulate
from ..fp8.gemm import fp8_gemm, fp8_gemm_accumulate
from ..quantization import QuantizerRole
from ..utils import default_device
from ._fp8_call import Fp8Call, ModuleGemm
from ._gemm_module import GemmModule
from ._init import default_weight_init, materialize_parameters
from ._linear_function import (WeightGradient, builds_backward, defer_gradients, main_grad_placeholder,
                               rowwise_operand, transposed_input)
from ._output_forms import check_buffer, into_buffer
from ._recompute_replay import replays_fp8_forward
from ._tensor_parallel import divide, rng_fork


def split_sizes(owner: str, m_splits: Union[Sequence[int], Tensor], num_gemms: int,
                rows: Optional[int]) -> Tuple[int, ...]:
    """m_splits as a tuple of Python ints, checked: num_gemms entries, none negative, summing
    to `rows` (unless None). A 1-D integer tensor is accepted and read with .tolist()."""
    if isinstance(m_splits, Tensor):
        m_splits = m_splits.tolist()
    sizes = tuple(int(m) for m in m_splits)
    if len(sizes) != num_gemms:
        raise ValueError(f"{owner}: m_splits has {len(sizes)} entries {list(sizes)}, expected num_gemms={num_gemms}")
    if any(m < 0 for m in sizes):
        raise ValueError(f"{owner}: m_splits {list(sizes)} has a negative size")
    if rows is not None and sum(sizes) != rows:
        raise ValueError(f"{owner}: m_splits {list(sizes)} add up to {sum(sizes)}, but the input has {rows} rows")
    return sizes


def _pack(entries: List[Optional[object]]) -> Tuple[List[Tensor], List[Tuple[int, Optional[Callable]]]]:
    """FP8 operands (or plain tensors, or None) as (tensors for ctx.save_for_backward, how to
    rebuild each entry from its share of them)."""
    tensors, layout = [], []
    for entry in entries:
        if entry is None:
            layout.append((0, None))
        elif isinstance(entry, Tensor):
            tensors.append(entry)
            layout.append((1, None))
        else:
            saved, rebuild = entry.saved()
            tensors.extend(saved)
            layout.append((len(saved), rebuild))
    return tensors, layout


def _unpack(tensors: Sequence[Tensor], layout: List[Tuple[int, Optional[Callable]]]) -> List[Optional[object]]:
    entries, start = [], 0
    for count, rebuild in layout:
        part = tensors[start:start + count]
        start += count
        entries.append(None if count == 0 else rebuild(*part) if rebuild is not None else part[0])
    return entries


class _GroupedLinearFunction(torch.autograd.Function):
    """y_i = x_i @ W_i.T + b_i for the row blocks x_i [m_i, in] of x [tokens, in] and
    W_i [out, in]; y [tokens, out] stacks them. FP8 when fp8 is given.

    params: the n weights, then the n biases (None where no bias is added).
    fuse_wgrad_accumulation: weight gradient i is added to main_grads[i] and
    main_grad_placeholder(weight i) returned (see _linear_function.py).
    deferred_wgrad: a list; when given, the weight and bias gradients are not computed in
    backward but appended to it as one closure, for GroupedLinear.backward_dw().
    out, dgrad_out: the caller's buffers ([tokens, out], [tokens, in], checked by the module)
    that y and the input gradient are written into (None: allocated).
    """

    @staticmethod
    def forward(ctx, inp: Tensor, m_splits: Tuple[int, ...], fp8: Optional[Tuple[Fp8Call, ...]],
                fuse_wgrad_accumulation: bool, main_grads: Optional[List[Tensor]], deferred_wgrad: Optional[list],
                out: Optional[Tensor], dgrad_out: Optional[Tensor], *params: Optional[Tensor]):
        n = len(m_splits)
        weights, biases = params[:n], params[n:]
        ctx.m_splits, ctx.fp8 = m_splits, fp8
        ctx.dgrad_out = dgrad_out
        ctx.fuse_wgrad_accumulation, ctx.main_grads = fuse_wgrad_accumulation, main_grads
        ctx.weights = weights if fuse_wgrad_accumulation else None
        ctx.deferred_wgrad = deferred_wgrad
        ctx.params = params if deferred_wgrad is not None else None
        ctx.input_dtype, ctx.weight_dtype = inp.dtype, weights[0].dtype
        ctx.in_features, ctx.out_features = weights[0].shape[1], weights[0].shape[0]
        xs = torch.split(inp, list(m_splits))  # n x [m_i, in]
        dtype = inp.dtype
        override = ctx.backward_override = fp8[0].recipe.backward_override if fp8 is not None else None
        if fp8 is None or override == "high_precision":  # the backward sees the unquantised x and W
            ctx.save_for_backward(inp, *weights)
        if fp8 is None:
            return into_buffer([linear(x, w.to(dtype), b.to(dtype) if b is not None else None)
                                for x, w, b in zip(xs, weights, biases)], out)
        training, save_original_input = fp8[0].needs_backward, fp8[0].save_original_input
        # The backward needs x_i^T (wgrad) and W_i^T (dgrad): both come out of the casts' pass
        # (the quantizers' column-wise usage), unless backward_override runs the backward GEMMs
        # in high precision.
        transposes = training and override is None
        outs, kept_inputs = [], []
        weights_fp8 = [call.weight_fp8 for call in fp8]
        for x, w_fp8, b, call in zip(xs, weights_fp8, biases, fp8):
            if x.shape[0] == 0:  # nothing to cast: the slot keeps its amax and scale
                outs.append(x.new_empty(0, ctx.out_features))
                kept_inputs.append(None)
                continue
            x_fp8 = call.quantizers.input.operand_of(x)
            outs.append(_fp8_gemm(x_fp8, w_fp8, dtype, b))
            if override == "dequantized":
                kept_inputs.append(x_fp8)
            else:
                kept_inputs.append(x if save_original_input else x_fp8.t() if transposes else None)
        if training and override == "dequantized":  # the forward's operands, dequantised once here
            ctx.save_for_backward(torch.cat([x if kept is None or x.shape[0] == 0 else rowwise_operand(kept).dequantize(dtype)
                                             for x, kept in zip(xs, kept_inputs)]),
                                  *[rowwise_operand(w).dequantize(dtype) for w in weights_fp8])
        elif training and override is None:  # only the transposed layouts are used later: keep those, in FP8
            input_tensors, ctx.input_layout = _pack(kept_inputs)
            weight_tensors, ctx.weight_layout = _pack([w.t() for w in weights_fp8])
            ctx.input_count = len(input_tensors)
            ctx.save_for_backward(*input_tensors, *weight_tensors)
        return into_buffer(outs, out)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        dtype, n = ctx.input_dtype, len(ctx.m_splits)
        # Which weights and biases take a gradient (a frozen one costs no GEMM): params follow
        # the 8 other inputs of forward; a missing bias needs none.
        needs_weight, needs_bias = ctx.needs_input_grad[8:8 + n], ctx.needs_input_grad[8 + n:]
        # The caller's buffer takes the input gradient when there is one to take.
        dgrad_out = ctx.dgrad_out if ctx.needs_input_grad[0] else None
        grads_out = torch.split(grad_output, list(ctx.m_splits))  # n x [m_i, out]
        if ctx.fp8 is None or ctx.backward_override is not None:
            inp, *weights = ctx.saved_tensors
            xs = torch.split(inp, list(ctx.m_splits))
            grad_input = into_buffer([linear(dy, w.to(dtype).t()) for dy, w in zip(grads_out, weights)], dgrad_out)
            wgrads = [_weight_gradient(dy, x) if needed else None for dy, x, needed in zip(grads_out, xs, needs_weight)]
        else:
            grad_input, wgrads = _fp8_backward(ctx, grads_out, needs_weight, dgrad_out)
        grads_b = [functools.partial(dy.sum, dim=0) if needed else None for dy, needed in zip(grads_out, needs_bias)]
        # m_splits, fp8, fuse_wgrad_accumulation, main_grads, deferred_wgrad, out, dgrad_out
        no_grads = (None,) * 7
        if ctx.deferred_wgrad is not None:
            _defer(ctx, wgrads, grads_b)
            return (grad_input, *no_grads) + (None,) * (2 * n)
        if ctx.fuse_wgrad_accumulation:
            for wgrad, main_grad in zip(wgrads, ctx.main_grads):
                if wgrad is not None:
                    wgrad.add_into(main_grad)
            grads_w = [main_grad_placeholder(w) if wgrad is not None else None for w, wgrad in zip(ctx.weights, wgrads)]
        else:
            grads_w = [wgrad.compute().to(ctx.weight_dtype) if wgrad is not None else None for wgrad in wgrads]
        return (grad_input, *no_grads, *grads_w, *[grad() if grad is not None else None for grad in grads_b])


def _weight_gradient(dy: Tensor, x: Tensor) -> WeightGradient:
    """One group's high-precision weight gradient [out, m_i] x [in, m_i]^T."""
    return WeightGradient(lambda: linear(dy.t(), x.t()), lambda main_grad: linear_accumulate(dy.t(), x.t(), main_grad))


def _defer(ctx, wgrads: List[Optional[WeightGradient]], grads_b: List[Optional[Callable[[], Tensor]]]) -> None:
    """The gradients of the weights and biases that take one, left for backward_dw()."""
    n = len(wgrads)
    main_grads = ctx.main_grads if ctx.fuse_wgrad_accumulation else [None] * n
    weights = [(weight, wgrad, main_grad) for weight, wgrad, main_grad in zip(ctx.params[:n], wgrads, main_grads)
               if wgrad is not None]
    biases = [(bias, grad) for bias, grad in zip(ctx.params[n:], grads_b) if grad is not None]
    defer_gradients(ctx.deferred_wgrad, weights, biases)


def _fp8_backward(ctx, grads_out: Sequence[Tensor], needs_weight: Sequence[bool], dgrad_out: Optional[Tensor]):
    """FP8 input gradient [tokens, in] (into dgrad_out when given) and, per group, its weight
    gradient (None where the weight takes none): each output-gradient split cast with its own
    backward slot."""
    fp8, dtype = ctx.fp8, ctx.input_dtype
    saved = ctx.saved_tensors
    inputs = _unpack(saved[:ctx.input_count], ctx.input_layout)  # [in, m_i] FP8, x_i [m_i, in], or None
    weights_t = _unpack(saved[ctx.input_count:], ctx.weight_layout)  # [in, out]
    grad_inputs, wgrads = [], []
    # Each gradient straight in the dtype it ends up in (see _linear_function.py).
    wgrad_dtypes = ([g.dtype if g is not None else None for g in ctx.main_grads] if ctx.fuse_wgrad_accumulation
                    else [ctx.weight_dtype] * len(grads_out))
    for i, (dy, x, call) in enumerate(zip(grads_out, inputs, fp8)):
        quantizers = call.quantizers
        if dy.shape[0] == 0:
            grad_inputs.append(dy.new_empty(0, ctx.in_features, dtype=dtype))
            wgrads.append(_empty_split_weight_gradient(ctx, wgrad_dtypes[i], dy.device) if needs_weight[i] else None)
            continue
        dy_fp8 = quantizers.grad_output.operand_of(dy)
        grad_inputs.append(_fp8_gemm(dy_fp8, weights_t[i], dtype))  # [m_i, out] x [in, out]^T
        if not needs_weight[i]:
            wgrads.append(None)
            continue
        if isinstance(x, Tensor):  # save_original_input: cast again, as in the forward, for x^T
            x = transposed_input(quantizers.input, x)
        wgrads.append(_fp8_weight_gradient(dy_fp8, x, wgrad_dtypes[i]))
    for call in fp8:  # one of them names the module's state
        if call.update_after_backward is not None:
            call.update_after_backward.update(BACKWARD, call.amax_reduction_group)
    return into_buffer(grad_inputs, dgrad_out), wgrads


def _fp8_weight_gradient(dy_fp8: Fp8Operand, x_t: Fp8Operand, out_dtype: torch.dtype) -> WeightGradient:
    """One group's FP8 weight gradient [out, m_i] x [in, m_i]^T."""
    return WeightGradient(lambda: _fp8_gemm(dy_fp8.t(), x_t, out_dtype),
                          lambda main_grad: fp8_gemm_accumulate(dy_fp8.t(), x_t, main_grad))


def _empty_split_weight_gradient(ctx, out_dtype: torch.dtype, device: torch.device) -> WeightGradient:
    """The weight gradient of a split of 0 rows: zero, adding nothing."""
    shape = (ctx.out_features, ctx.in_features)
    return WeightGradient(lambda: torch.zeros(shape, dtype=out_dtype, device=device), lambda main_grad: None)


def _fp8_gemm(a: Fp8Operand, b: Fp8Operand, out_dtype: torch.dtype, bias: Optional[Tensor] = None) -> Tensor:
    """fp8_gemm with the zero-sized cases answered directly (a split of 0 rows): FP8 GEMM
    kernels such as torch._scaled_mm reject empty operands."""
    rows, inner, cols = a.shape[0], a.shape[1], b.shape[0]
    if rows and inner:
        return fp8_gemm(a, b, out_dtype, bias)
    out = torch.zeros(rows, cols, dtype=out_dtype, device=a.device)
    return out + bias.to(out_dtype) if bias is not None else out


def is_module_grouped_tensor_path_supported(recipe, dtype: torch.dtype) -> bool:
    """TE main's predicate: whether GroupedLinear's native grouped-tensor path (the splits
    handed to one grouped GEMM on the device, never read on the host: cuBLASLt's grouped GEMM
    under CUDA graphs) takes this recipe and dtype. This package does not have that path on
    any device, so the answer is False for every recipe and dtype: GroupedLinear runs one GEMM
    per group, which is what TE falls back to for discrete parameters."""
    return False


class GroupedLinear(GemmModule, torch.nn.Module):
    """num_gemms Linear layers over consecutive row blocks of one input, TransformerEngine's
    arguments and parameter names: weight0..weight{n-1} [out_features, in_features] and
    bias0..bias{n-1} [out_features] (None without bias); with single_grouped_weight=True one
    parameter `weight` [num_gemms, out_features, in_features] instead (single_grouped_bias:
    `bias` [num_gemms, out_features]), not with quantized_model_init or
    fuse_wgrad_accumulation yet.

    Args: num_gemms, in_features, out_features; fuse_wgrad_accumulation (weight gradient i
    goes to weight{i}.main_grad, .grad stays None); get_rng_state_tracker, rng_tracker_name
    (the weights are initialised inside get_rng_state_tracker().fork(rng_tracker_name), as
    Megatron-style trackers expect); init_method (called on each weight; default
    normal(0, 0.023)); bias; return_bias (return (y, [bias_i cast to the input dtype]) without
    adding them); params_dtype; device (default: the accelerator if present, else CPU;
    "meta" defers initialisation to reset_parameters()); delay_wgrad_compute (backward
    computes only the input gradient; backward_dw() computes and accumulates the weight and
    bias gradients later); save_original_input (in FP8, keep the high-precision input for
    the weight gradient and cast it again in the backward, instead of keeping its FP8
    transpose; not with DelayedScaling, whose input scale has moved on by then); name.
    Tensor parallelism (tp_size > 1, or a tp_group of more ranks), as in TE, decides the
    weights' shapes only: parallel_mode 'column' splits out_features, 'row' in_features (the
    attributes are this rank's sizes), and the exchanges are the MoE layer's dispatch and
    combine (so bias=True is refused there). sequence_parallel and the communication-overlap
    flags ub_* are accepted and change nothing. use_grouped_tensor (TE main: prefer the native
    grouped-tensor GEMM path, None for TE's default) is accepted; that path is not offered here
    (is_module_grouped_tensor_path_supported), and the groups run one GEMM each, as TE's
    fallback does.

    forward(inp, m_splits, is_first_microbatch=None, out=None, dgrad_out=None): inp [...,
    in_features], read as [tokens, in_features]; m_splits: num_gemms row counts (zeros
    allowed) adding up to tokens; row block i goes through weight{i} / bias{i}. Returns
    [..., out_features]. Inside te.autocast the GEMMs run in FP8; is_first_microbatch=False
    reuses the weights cast on the last True call without updating their amaxes. out: a
    preallocated [tokens, out_features] tensor the output is written into, and dgrad_out a
    [tokens, in_features] one the backward writes inp's gradient into (TE's: contiguous, in the
    input's dtype and on its device, not requiring grad; checked here, in the forward). The
    output returned is a view of out, differentiable as usual (as TE's, made inside the
    autograd function: autograd refuses in-place ops on it); the gradient reaching inp is
    dgrad_out's contents (autograd may copy it, e.g. into a leaf's .grad, or add it to the
    gradients of inp's other uses).
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Optional[object] = None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable] = None, rng_tracker_name: Optional[str] = None,
                 init_method: Optional[Callable[[Tensor], None]] = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 device: Optional[Union[torch.device, str]] = None, delay_wgrad_compute: bool = False,
                 save_original_input: bool = False, name: Optional[str] = None, ub_overlap_rs: bool = False,
                 ub_overlap_ag: bool = False, ub_name: Optional[str] = None, single_grouped_weight: bool = False,
                 single_grouped_bias: bool = False, use_grouped_tensor: Optional[bool] = None):
        super().__init__()
        if use_grouped_tensor is not None and not isinstance(use_grouped_tensor, bool):
            raise TypeError(f"GroupedLinear: use_grouped_tensor must be a bool or None, got "
                            f"{type(use_grouped_tensor).__name__}")
        self.use_grouped_tensor = bool(use_grouped_tensor)
        if num_gemms <= 0 or in_features <= 0 or out_features <= 0:
            raise ValueError(f"GroupedLinear: num_gemms, in_features and out_features must be positive, got "
                             f"{num_gemms}, {in_features}, {out_features}")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.fp8_forward_slots, self.fp8_backward_slots = 3 * num_gemms, 2 * num_gemms  # layout above
        # Group i's GEMM; the first runs the module's backward scaling update, once every group's
        # output gradient is cast.
        self.gemms = tuple(ModuleGemm(f"weight{i}", input_slot=i, weight_slot=num_gemms + i, grad_output_slot=i,
                                      updates_backward=i == 0) for i in range(num_gemms))
        self.use_bias, self.return_bias = bias, return_bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = delay_wgrad_compute
        self.save_original_input = save_original_input
        # As TE: tensor parallelism decides the weights' shapes only; an MoE layer's dispatch
        # and combine stages do the exchanges, and a bias would be added on every rank.
        self._set_tensor_parallel(tp_size, parallel_mode, tp_group, sequence_parallel)
        if self.tp_size > 1 and bias:
            raise ValueError(f"GroupedLinear: bias=True with tp_size={self.tp_size}: the tensor-parallel exchanges "
                             "are the MoE layer's, outside this module, so a bias cannot be added here")
        if self.tp_size > 1 and parallel_mode == "column":
            out_features = divide("GroupedLinear", "out_features", out_features, self.tp_size)
        elif self.tp_size > 1 and parallel_mode == "row":
            in_features = divide("GroupedLinear", "in_features", in_features, self.tp_size)
        self.in_features, self.out_features = in_features, out_features
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        self.name = name
        self._deferred_wgrad: list = []
        self.wgrad_accumulation_and_reduce_hooks: list = []  # register_wgrad_accumulation_and_reduce_hooks
        self.init_method = init_method or default_weight_init
        factory = {"dtype": params_dtype or torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        self.weight_quantization = weight_quantization_in_force()  # te.quantized_model_init
        self.single_grouped_weight, self.single_grouped_bias = single_grouped_weight, single_grouped_bias
        if single_grouped_weight and (self.weight_quantization is not None or fuse_wgrad_accumulation):
            raise NotImplementedError("GroupedLinear: single_grouped_weight=True is not implemented with "
                                      "te.quantized_model_init or fuse_wgrad_accumulation=True")
        if single_grouped_weight:
            self.weight = torch.nn.Parameter(torch.empty(num_gemms, out_features, in_features, **factory))
        for i in range(num_gemms if not single_grouped_weight else 0):
            self.register_parameter(f"weight{i}", torch.nn.Parameter(torch.empty(out_features, in_features, **factory)))
        if single_grouped_bias:
            self.register_parameter("bias", torch.nn.Parameter(torch.empty(num_gemms, out_features, **factory))
                                    if bias else None)
        for i in range(num_gemms if not single_grouped_bias else 0):
            self.register_parameter(f"bias{i}", torch.nn.Parameter(torch.empty(out_features, **factory))
                                    if bias else None)
        self.fp8_meta: Optional[Fp8Meta] = None
        self.reset_parameters(defer_init=factory["device"].type == "meta")
        split_dim = 1 if parallel_mode == "row" else 0
        for weight in ([self.weight] if single_grouped_weight else self.weights()):
            set_tensor_model_parallel_attributes(weight, True, split_dim + int(single_grouped_weight), 1)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Weights from init_method (inside the RNG tracker's fork when one is given), biases
        zero. defer_init=True does nothing (TransformerEngine's spelling for meta tensors)."""
        if defer_init:
            return
        materialize_parameters(self)
        with torch.no_grad():
            weights = self.weights()
            for i, weight in enumerate(weights):
                with rng_fork(self.get_rng_state_tracker, self.rng_tracker_name):
                    self.init_method(weight)  # an FP8 weight re-quantises what is written into it
                if self.weight_quantization is not None and not isinstance(local_tensor(weight), QuantizedTensor):
                    setattr(self, f"weight{i}", self.stored_weight(weight, self.gemms[i].weight_slot))
            for bias in self.biases():
                if bias is not None:
                    bias.zero_()

    def weights(self) -> List[Tensor]:
        """The n weights [out, in]: the parameters weight0..., or views of the single grouped
        weight [n, out, in] (single_grouped_weight=True; gradients flow into it)."""
        if self.single_grouped_weight:
            return list(self.weight.unbind(0))
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    def biases(self) -> List[Optional[Tensor]]:
        """The n biases [out] (None without bias), as weights() for single_grouped_bias."""
        if self.single_grouped_bias:
            return list(self.bias.unbind(0)) if self.bias is not None else [None] * self.num_gemms
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)]

    @replays_fp8_forward
    def forward(self, inp: Tensor, m_splits: Union[Sequence[int], Tensor], is_first_microbatch: Optional[bool] = None,
                out: Optional[Tensor] = None, dgrad_out: Optional[Tensor] = None):
        inp, x = self._gemm_input("GroupedLinear", inp, self.in_features, "in_features")  # x [tokens, in]
        sizes = split_sizes("GroupedLinear", m_splits, self.num_gemms, x.shape[0])
        check_buffer("GroupedLinear", "out", out, (x.shape[0], self.out_features), x)
        check_buffer("GroupedLinear", "dgrad_out", dgrad_out, (x.shape[0], self.in_features), x)
        n = self.num_gemms
        weights, biases = self.weights(), self.biases()
        context = self._fp8_context()
        self._calibrate_groups(context, x, sizes, weights)
        fp8 = self._fp8_calls(context, weights, is_first_microbatch, builds_backward((x, *weights)))
        main_grads = ([self._main_grad(weight, gemm.weight_name) for gemm, weight in zip(self.gemms, weights)]
                      if self.fuse_wgrad_accumulation else None)
        applied = [None] * n if self.return_bias else biases
        deferred = self._deferred_wgrad if self.delay_wgrad_compute else None
        y = _GroupedLinearFunction.apply(x, sizes, fp8, self.fuse_wgrad_accumulation, main_grads, deferred, out,
                                         dgrad_out, *weights, *applied)
        self._keep_weights_fp8(fp8, is_first_microbatch)
        y = y.reshape(*inp.shape[:-1], self.out_features)
        if self.return_bias:
            return y, [b.to(inp.dtype) if b is not None else None for b in biases]
        return y

    def _quantizer_roles(self) -> dict:
        """TransformerEngine's roles (module_type 'grouped_linear') in this module's slot
        layout: inputs, weights, outputs (None: consumer unknown); grad outputs, grad inputs."""
        n, name = self.num_gemms, self.name or ""
        inputs, weights, grads = (QuantizerRole("grouped_linear", kind, name)
                                  for kind in ("input", "weight", "grad_output"))
        return {FORWARD: [inputs] * n + [weights] * n + [None] * n, BACKWARD: [grads] * n + [None] * n}

    def _calibrate_groups(self, context: Optional[Fp8Context], x: Tensor, sizes: Tuple[int, ...],
                          weights: List[Tensor]) -> None:
        """When calibrating, each group's GEMM records the amaxes of its split of x [tokens, in]
        and of its weight (an empty split has none), in its own slots."""
        if context is None or context.enabled or not context.calibrating:
            return
        for gemm, split, weight in zip(self.gemms, torch.split(x.detach(), list(sizes)), weights):
            self._calibrate(context, gemm, split, weight)

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}")
