"""te.Linear: TransformerEngine's Linear, in high precision or, inside te.autocast, in FP8
(the GEMM and its FP8 casts: _linear_function.py)."""
from typing import Callable, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..custom_ops.linear import cast
from ..fp8.context import Fp8Context
from ..fp8.model_init import weight_quantization_in_force
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.state import WEIGHT_SLOT, Fp8Meta
from ..utils import default_device, forward_param
from ._fp8_call import ONE_GEMM, Fp8Call
from ._gemm_module import GemmModule
from ._linear_function import builds_backward, plain_linear
from ._init import default_weight_init, materialize_parameters
from ._joined_rows import joinable, joined, views_of
from ..parallel.attributes import mark_sequence_parallel, set_tensor_model_parallel_attributes
from ..dtensor import local_tensor
from ._output_forms import with_fp8_forms
from ._recompute_replay import replays_fp8_forward
from ._tensor_parallel import divide, rng_fork, sharded_tokens


class Linear(GemmModule, torch.nn.Module):

    """y = x W^T + b, TransformerEngine's arguments and parameter names.

    Args: in_features, out_features, bias, return_bias (return (y, bias) without adding it),
    params_dtype, device (default: the accelerator if present, else CPU), init_method
    (called on the weight; default normal(0, 0.023)), parameters_split (names, or
    {name: size}, splitting the output features into separately named parameters
    `<name>_weight` / `<name>_bias`), fuse_wgrad_accumulation (gradients go to
    weight.main_grad, .grad stays None; with Megatron-LM's grad_added_to_main_grad on the
    weight, that is set to True and .grad gets zeros), delay_wgrad_compute (backward computes only the
    input gradient; backward_dw() computes and accumulates the weight and bias gradients
    later, for pipeline schedules), save_original_input (in FP8, keep the high-precision input
    for the weight gradient and cast it again in the backward instead of keeping its FP8
    transpose; not with DelayedScaling, whose input scale has moved on by then),
    get_rng_state_tracker and rng_tracker_name (the weight is initialised inside
    get_rng_state_tracker().fork(rng_tracker_name), as Megatron's trackers expect), name.
    Tensor parallelism (tp_size > 1, or a tp_group of more than one rank; see
    set_tensor_parallel_group()): parallel_mode='column' splits the weight (and bias) along
    out_features, the output is this rank's feature shard; 'row' splits it along in_features,
    the input is this rank's feature shard and the output the ranks' sum, the bias added after
    it. in_features / out_features are this rank's sizes, as in TE. sequence_parallel=True: the
    tokens (the first dimension) are sharded outside the module, all-gathered before a column
    GEMM and reduce-scattered after a row GEMM (parallel/gemm_split.py has the exchanges of
    each). The communication-overlap flags ub_* and symmetric_ar_type are accepted and change
    nothing (torch.distributed's collectives run asynchronously beside the GEMMs instead).
    forward(inp, is_first_microbatch=None, fp8_output=False, fp8_grad=False): inp [...,
    in_features]. Inside te.autocast the GEMMs run in FP8; is_first_microbatch=False reuses
    the weight cast on the last True call without updating the weight amax. Inside an enabled
    te.autocast (ignored elsewhere, as in TE): fp8_output=True returns the output as an FP8
    tensor (a Float8Tensor under the per-tensor recipes, of the activation dtype), cast from
    the GEMM's fp32 result under DelayedScaling, from its result in the activation dtype
    otherwise, by the output slot (fp8_meta forward slot 2, whose amax it records);
    fp8_grad=True makes inp's gradient such a tensor, cast by backward slot 1 before the
    backward's scaling update (_output_forms.py). Gradients pass through both unchanged.
    """
    row_bias_after_sum = True  # row parallelism: one bias, added to the ranks' sum (te.ops.Linear: False)
    gemms = ONE_GEMM

    def __init__(self, in_features: int, out_features: int, bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, device: Optional[Union[torch.device, str]] = None,
                 init_method: Optional[Callable[[Tensor], None]] = None, parallel_mode: Optional[str] = None,
                 tp_group: Optional[object] = None, tp_size: int = 1, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False,
                 parameters_split: Optional[Union[Sequence[str], dict]] = None, delay_wgrad_compute: bool = False,
                 get_rng_state_tracker: Optional[Callable] = None, rng_tracker_name: Optional[str] = None,
                 save_original_input: bool = False, name: Optional[str] = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False, ub_name: Optional[str] = None,
                 symmetric_ar_type: Optional[str] = None):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear: in_features and out_features must be positive, got {in_features}, {out_features}")
        self._set_tensor_parallel(tp_size, parallel_mode, tp_group, sequence_parallel)
        out_ranks = self.tp_size if parallel_mode == "column" else 1  # the ranks out_features is split over
        self.parameter_names = self._split_names(parameters_split, out_features, out_ranks)
        if self.tp_size > 1 and parallel_mode == "column":
            out_features = divide(type(self).__name__, "out_features", out_features, self.tp_size)
        elif self.tp_size > 1 and parallel_mode == "row":
            in_features = divide(type(self).__name__, "in_features", in_features, self.tp_size)
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        self.save_original_input = save_original_input
        self.name = name
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = delay_wgrad_compute
        self._deferred_wgrad: list = []
        self.wgrad_accumulation_and_reduce_hooks: list = []  # register_wgrad_accumulation_and_reduce_hooks
        self.init_method = init_method or default_weight_init
        factory = {"dtype": params_dtype or torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        for name, size in self.parameter_names:
            self.register_parameter(f"{name}weight", torch.nn.Parameter(torch.empty(size, in_features, **factory)))
            bias_param = torch.nn.Parameter(torch.empty(size, **factory)) if bias else None
            self.register_parameter(f"{name}bias", bias_param)  # None without bias, as torch.nn.Linear
        self._joined_weight: Optional[Tensor] = None  # the parts' views' tensors (_join_parts)
        self._joined_bias: Optional[Tensor] = None
        self._fp8_join: Optional[Tuple[tuple, Tensor]] = None  # (the parts' operands, their join)
        self.fp8_meta: Optional[Fp8Meta] = None
        self.weight_quantization = weight_quantization_in_force()  # te.quantized_model_init
        if factory["device"].type != "meta":
            self.reset_parameters()

    @staticmethod
    def _split_names(parameters_split, out_features: int, ranks: int = 1):
        """[(prefix, rows on this rank)]: ("", out_features / ranks) unsplit, else one entry per
        named part, each part split over the ranks (column parallelism)."""
        if parameters_split is None:
            return [("", out_features // ranks)]
        if isinstance(parameters_split, dict):
            sizes = dict(parameters_split)
        else:
            names = list(parameters_split)
            if out_features % len(names):
                raise ValueError(f"Linear: out_features={out_features} is not divisible by "
                                 f"{len(names)} parameters_split names {names}")
            sizes = {name: out_features // len(names) for name in names}
        if sum(sizes.values()) != out_features:
            raise ValueError(f"Linear: parameters_split sizes {sizes} do not add up to out_features={out_features}")
        return [(f"{name.rstrip('_')}_", divide("Linear", f"parameters_split[{name!r}]", size, ranks))
                for name, size in sizes.items()]

    def reset_parameters(self) -> None:
        materialize_parameters(self)
        with torch.no_grad():
            for name, _ in self.parameter_names:
                weight = getattr(self, f"{name}weight")
                with rng_fork(self.get_rng_state_tracker, self.rng_tracker_name):
                    self.init_method(weight)  # an FP8 weight re-quantises what is written into it
                if self.weight_quantization is not None and not isinstance(local_tensor(weight), QuantizedTensor):
                    setattr(self, f"{name}weight", self.stored_weight(weight, WEIGHT_SLOT))
                if self.use_bias:
                    getattr(self, f"{name}bias").zero_()
            self._join_parts()
        self._mark_partitions()

    def _join_parts(self) -> None:
        """Under parameters_split, TE's layout for high-precision parameters: the parts' weights
        (and biases) re-made as views of one tensor holding them in order (_joined_rows), so that
        weight_and_bias reads it without a copy. FP8 parts (te.quantized_model_init) stay tensors of
        their own: a write into a view of one quantized tensor re-quantises all of it, which
        would round the other parts' values again whenever the scale has moved since their cast."""
        self._joined_weight = self._joined_bias = None
        if len(self.parameter_names) == 1:
            return
        for kind in ("weight", "bias"):
            names = [f"{name}{kind}" for name, _ in self.parameter_names]
            parts = [getattr(self, name) for name in names]
            if parts[0] is None or not joinable(parts):
                continue
            tensor = torch.cat([part.detach() for part in parts])
            for name, view in zip(names, views_of(tensor, parts)):
                setattr(self, name, view)
            setattr(self, f"_joined_{kind}", tensor)

    def _mark_partitions(self) -> None:
        """TE's attributes on the GEMM's parameters: every weight is marked tensor-parallel
        along the dimension its mode splits (0 unless 'row'), a column-parallel bias along 0,
        a row-parallel bias (applied to token shards under sequence parallelism) with
        sequence_parallel."""
        for name, _ in self.parameter_names:
            set_tensor_model_parallel_attributes(getattr(self, f"{name}weight"), True,
                                                 1 if self.parallel_mode == "row" else 0, 1)
            bias = getattr(self, f"{name}bias")
            if bias is not None and self.parallel_mode == "row":
                mark_sequence_parallel(bias, self.sequence_parallel)
            elif bias is not None and self.parallel_mode == "column":
                set_tensor_model_parallel_attributes(bias, True, 0, 1)

    def weight_and_bias(self) -> Tuple[Tensor, Optional[Tensor]]:
        """The GEMM's weight [out, in] and bias [out] (None without): the parameters, or their
        concatenation under parameters_split."""
        if len(self.parameter_names) == 1 and self.parameter_names[0][0] == "":
            return forward_param(self, "weight"), forward_param(self, "bias") if self.use_bias else None
        parts = [getattr(self, f"{n}weight") for n, _ in self.parameter_names]
        if isinstance(parts[0], QuantizedTensor) and not builds_backward(parts):
            weight = self._kept_fp8_join(parts)
        else:
            weight = joined(parts, self._joined_weight)
        bias = (joined([getattr(self, f"{n}bias") for n, _ in self.parameter_names], self._joined_bias)
                if self.use_bias else None)
        return weight, bias

    def _kept_fp8_join(self, parts) -> Tensor:
        """FP8 parts (their own quantized tensors) joined for a forward that records no backward
        (inference, decoding): the concatenation is kept while every part still holds the very
        operand it was made from (a write gives a quantized tensor a new one), so that a decoding
        step does not join them again: a copy of the codes at best, a dequantise and a cast of
        the weight where the parts' scales differ."""
        operands = tuple(part._storage.operand for part in parts)
        kept = self._fp8_join
        if kept is not None and len(kept[0]) == len(operands) and all(a is b for a, b in zip(kept[0], operands)):
            return kept[1]
        weight = torch.cat(parts)
        if not isinstance(weight, QuantizedTensor):
            # Parts of their own scales (current scaling, blocks, NVFP4) join as values: cast them
            # once, as the forward would cast them on every step (the same quantizer).
            weight = parts[0]._get_quantizer().quantize(weight)
        self._fp8_join = (operands, weight)
        return weight

    def gemm(self, x: Tensor, weight: Tensor, bias: Optional[Tensor], is_first_microbatch: Optional[bool] = None,
             producer: Optional[Callable] = None, producer_params: Tuple[Optional[Tensor], ...] = ()) -> Tensor:
        """The module's GEMM, the seam te.ops' fused operations build on: x [tokens, in] ->
        [tokens, out] with `weight` (weight_and_bias()'s) and `bias` (None: none added) in the
        epilogue, in FP8 inside an enabled te.autocast. producer(x, fp8_call) -> (GEMM input,
        call), when given, makes the GEMM's input from x: a norm or activation that may write
        the FP8 operand itself (_fused_fp8.py); producer_params are its own parameters (a
        norm's), whose gradients the FP8 call then prepares for too."""
        context = self._fp8_context()
        fp8 = self._fp8_call_in(context, weight, is_first_microbatch, (x, weight, bias, *producer_params))
        gemm_input, fp8 = producer(x, fp8) if producer is not None else (x, fp8)
        if self._plain_gemm(fp8, context, gemm_input, weight, bias, self.parallel_mode):
            return plain_linear(gemm_input, weight, bias)
        return self._gemm(gemm_input, weight, bias, fp8, context, is_first_microbatch)

    def _fp8_call_in(self, context: Optional[Fp8Context], weight: Tensor, is_first_microbatch: Optional[bool],
                     grad_inputs: Tuple[Optional[Tensor], ...], fp8_output: bool = False,
                     fp8_grad: bool = False) -> Optional[Fp8Call]:
        """_fp8_call for a forward of grad_inputs, whose requires_grad (in grad mode) decides
        whether the casts prepare a backward. Outside every te.autocast region None at once,
        without that question: it costs every call of a small GEMM a few microseconds."""
        if context is None:
            return None
        return self._fp8_call(context, weight, is_first_microbatch, builds_backward(grad_inputs), fp8_output, fp8_grad)

    def _fp8_call(self, context: Optional[Fp8Context], weight: Tensor, is_first_microbatch: Optional[bool],
                  needs_backward: bool, fp8_output: bool = False, fp8_grad: bool = False) -> Optional[Fp8Call]:
        """The FP8 call of this forward's GEMM inside an enabled te.autocast (or a checkpoint's
        recompute of such a forward: context from _fp8_context), else None; with the quantizers
        of the output (fp8_output) and of the input's gradient (fp8_grad) when asked for
        (_output_forms.py)."""
        calls = self._fp8_calls(context, (weight,), is_first_microbatch, needs_backward)
        if calls is None:
            return None
        return with_fp8_forms(type(self).__name__, calls[0], self.fp8_meta, fp8_output, fp8_grad, self.parallel_mode,
                              self.tp_size)

    def _gemm(self, x: Tensor, weight: Tensor, bias: Optional[Tensor], fp8: Optional[Fp8Call],
              context: Optional[Fp8Context], is_first_microbatch: Optional[bool]) -> Tensor:
        """x [tokens, in] -> [tokens, out] through LinearFunction (bias None: not added)."""
        y = self._linear(self.gemms[0], x, weight, bias, fp8, context, self.parallel_mode, self.row_bias_after_sum)
        self._keep_weights_fp8(None if fp8 is None else (fp8,), is_first_microbatch)
        return y

    def _output_gemm(self, inp: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], fp8: Optional[Fp8Call],
                     context: Optional[Fp8Context], is_first_microbatch: Optional[bool]) -> Tensor:
        """The forward's output [..., out] from x [tokens, in], the GEMM input made from inp
        [..., in]. Where _plain_gemm: torch.nn.Linear's graph, F.linear with the output viewed
        as [..., out] only for an input of more than 2 dims (each op costs a small GEMM a few
        microseconds). Else TE's: LinearFunction, its [tokens, out] always viewed as [..., out]."""
        if self._plain_gemm(fp8, context, x, weight, bias, self.parallel_mode):
            y = plain_linear(x, weight, bias)
            return y if inp.dim() == 2 else y.reshape(*inp.shape[:-1], self.out_features)
        y = self._gemm(x, weight, bias, fp8, context, is_first_microbatch)
        out_shape = self.output_shape(inp)
        # y itself where it has that shape: a view would be the module's output, on which an
        # in-place op (out += residual) drops FSDP2's pre-backward hook.
        return y if y.shape == out_shape else y.reshape(out_shape)

    @replays_fp8_forward
    def forward(self, inp: Tensor, is_first_microbatch: Optional[bool] = None, fp8_output: bool = False,
                fp8_grad: bool = False):
        inp, x = self._gemm_input("Linear", inp, self.in_features, "in_features")  # x [tokens, in]
        weight, bias = self.weight_and_bias()
        gemm_bias = None if self.return_bias else bias
        context = self._fp8_context()
        fp8 = self._fp8_call_in(context, weight, is_first_microbatch, (x, weight, gemm_bias), fp8_output, fp8_grad)
        y = self._output_gemm(inp, x, weight, gemm_bias, fp8, context, is_first_microbatch)
        # As TE: the returned bias is in the activation dtype (the input's, or torch.autocast's).
        return (y, cast(bias, y.dtype)) if self.return_bias else y

    def output_shape(self, inp: Tensor) -> tuple:
        """The shape of the output for an input inp [..., in]: [..., out], its first dimension
        changed where the GEMM gathers or reduce-scatters token shards (te.ops' fused operations
        shape the [tokens, out] result of gemm() with it)."""
        return (*sharded_tokens(type(self).__name__, inp, self._gemm_split(self.parallel_mode)), self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}"
