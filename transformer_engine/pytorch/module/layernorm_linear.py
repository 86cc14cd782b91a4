"""te.LayerNormLinear: a LayerNorm or RMSNorm followed by a Linear, TransformerEngine's
arguments and parameter names. Under delayed-scaling FP8 the norm writes the GEMM's FP8
input itself (ops.layernorm_fp8 / rmsnorm_fp8); other recipes cast the norm's output."""
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from ..custom_ops.linear import cast
from ..parallel.autograd import gather_replicated
from ..utils import default_device, forward_param
from ._recompute_replay import replays_fp8_forward
from ._norm_choice import (
    check_normalization,
    normalize,
    register_norm_parameters,
    reset_norm_parameters,
)
from ._tensor_parallel import resolved_size
from .linear import Linear


class LayerNormLinear(Linear):
    """y = norm(x) W^T + b.

    Args (TransformerEngine's names and defaults): in_features, out_features, eps (of the
    norm), bias, normalization ("LayerNorm" or "RMSNorm"), return_bias (return (y, bias)
    without adding it), return_layernorm_output (also return norm(x)),
    return_layernorm_output_gathered (the same here: no sequence parallelism),
    parameters_split (names, or {name: rows}: separately named `<name>_weight` /
    `<name>_bias` over the output rows, e.g. {"query": h, "key": kv, "value": kv}),
    zero_centered_gamma (norm weight initialised to 0, the norm uses 1 + weight),
    init_method (on the weight; default normal(0, 0.023)), params_dtype, device (default:
    the accelerator if present, else CPU; "meta" then reset_parameters()),
    fuse_wgrad_accumulation, delay_wgrad_compute, get_rng_state_tracker, name (as te.Linear).
    Tensor parallelism as te.Linear's in parallel_mode='column' (row parallelism would split
    the normalised features, and is refused as in TE): with sequence_parallel the norm runs on
    this rank's tokens and its output is gathered for the GEMM; the norm's parameters are marked
    sequence_parallel. return_layernorm_output gives this rank's norm output,
    return_layernorm_output_gathered the gathered one.
    Parameters: layer_norm_weight [in], layer_norm_bias [in] (LayerNorm only), weight
    [out, in], bias [out].
    forward(inp, is_first_microbatch=None, fp8_output=False, fp8_grad=False): inp [..., in]
    -> y [..., out], or (y, bias), (y, ln_out), (y, bias, ln_out) with ln_out [..., in].
    fp8_output and fp8_grad as te.Linear's, inside an enabled te.autocast only: y in FP8 (the
    output slot's cast); and, as TE's LayerNormLinear does, the GEMM's input gradient (the
    gradient of the norm's output) cast by the grad-input slot, whose values the norm's
    backward then reads: inp's gradient itself stays in high precision.
    """

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Optional[object] = None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable] = None,
                 init_method: Optional[Callable[[Tensor], None]] = None, bias: bool = True,
                 normalization: str = "LayerNorm", return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 return_layernorm_output: bool = False, return_layernorm_output_gathered: bool = False,
                 parameters_split: Optional[Union[Sequence[str], dict]] = None, zero_centered_gamma: bool = False,
                 device: Optional[Union[torch.device, str]] = None, delay_wgrad_compute: bool = False,
                 name: Optional[str] = None, ub_overlap_ag: bool = False, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 ub_name: Optional[str] = None, symmetric_ar_type: Optional[str] = None):
        check_normalization("LayerNormLinear", normalization)
        if parallel_mode == "row" and resolved_size(tp_group, tp_size) > 1:
            raise NotImplementedError("LayerNormLinear: parallel_mode='row' would split the normalised features over "
                                      "the ranks; normalization does not support tensor-parallel distribution")
        super().__init__(in_features, out_features, bias=bias, return_bias=return_bias, params_dtype=params_dtype,
                         device="meta", init_method=init_method, parallel_mode=parallel_mode, tp_group=tp_group,
                         tp_size=tp_size, sequence_parallel=sequence_parallel,
                         fuse_wgrad_accumulation=fuse_wgrad_accumulation, parameters_split=parameters_split,
                         delay_wgrad_compute=delay_wgrad_compute, get_rng_state_tracker=get_rng_state_tracker,
                         name=name)
        self.eps = float(eps)
        self.normalization = normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output or return_layernorm_output_gathered
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        # The GEMM's parameters were made on "meta" (nothing allocated, nothing initialised):
        # they are made again here after the norm's, TransformerEngine's state_dict order.
        linear_params = dict(self._parameters)
        factory = {"dtype": params_dtype or torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        self._parameters.clear()
        register_norm_parameters(self, in_features, normalization, factory)
        for key, param in linear_params.items():
            self.register_parameter(key, None if param is None else torch.nn.Parameter(
                torch.empty(param.shape, **factory)))
        if factory["device"].type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()  # Linear's, which materialises every parameter of the module first
        reset_norm_parameters(self, self.zero_centered_gamma)

    @replays_fp8_forward
    def forward(self, inp: Tensor, is_first_microbatch: Optional[bool] = None, fp8_output: bool = False,
                fp8_grad: bool = False):
        inp, x = self._gemm_input("LayerNormLinear", inp, self.in_features, "in_features")  # x [tokens, in]
        weight, bias = self.weight_and_bias()
        norm_weight, norm_bias = forward_param(self, "layer_norm_weight"), forward_param(self, "layer_norm_bias")
        context = self._fp8_context()
        fp8 = self._fp8_call_in(context, weight, is_first_microbatch, (x, weight, bias, norm_weight, norm_bias),
                                fp8_output, fp8_grad)
        ln_out, gemm_fp8 = normalize(x, norm_weight, norm_bias, self.normalization, self.eps,
                                     self.zero_centered_gamma, fp8, self.return_layernorm_output)
        y = self._output_gemm(inp, ln_out, weight, None if self.return_bias else bias, gemm_fp8, context,
                              is_first_microbatch)  # [..., out]
        outputs = (y, cast(bias, y.dtype)) if self.return_bias else (y,)
        if self.return_layernorm_output:
            ln_out = ln_out.reshape(inp.shape)
            if self.return_layernorm_output_gathered and self.sequence_parallel:
                ln_out = gather_replicated(ln_out, self.tp_group)
            outputs += (ln_out,)
        return outputs if len(outputs) > 1 else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalization={self.normalization}, eps={self.eps}"
