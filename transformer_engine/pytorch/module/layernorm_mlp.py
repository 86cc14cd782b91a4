"""te.LayerNormMLP: norm -> fc1 -> activation -> fc2, TransformerEngine's arguments and
parameter names. FP8 under te.autocast with one fp8_meta (forward slots: fc1 input, fc1
weight, fc1 output, fc2 input, fc2 weight, fc2 output; backward: fc1 grad_output, fc1
grad_input, fc2 grad_output, fc2 grad_input). Under delayed scaling the norm writes fc1's
FP8 input and the activation writes fc2's (one kernel pass each, see _fused_fp8.py)."""
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from ..checkpointing import checkpoint as fp8_checkpoint
from ..fp8.context import Fp8Context
from ..fp8.model_init import weight_quantization_in_force
from ..fp8.quantized_tensor import QuantizedTensor
from ..fp8.state import BACKWARD, FORWARD, Fp8Meta
from ..custom_ops.activation import activation as activation_op
from ..custom_ops.linear import cast
from ..quantization import QuantizerRole
from ..reference.activation import GATED, PLAIN
from ..utils import default_device
from ._fp8_call import Fp8Call, ModuleGemm
from ._gemm_module import GemmModule
from ._linear_function import builds_backward, plain_linear
from ._fused_fp8 import activation_to_fp8, grad_operand_quantizer, producer_writes_fp8
from ._init import default_weight_init, materialize_parameters
from ..parallel.attributes import mark_sequence_parallel, set_tensor_model_parallel_attributes
from ..dtensor import local_tensor
from ._norm_choice import (
    check_normalization,
    normalize,
    register_norm_parameters,
    reset_norm_parameters,
)
from ._recompute_replay import replays_fp8_forward
from ._tensor_parallel import divide, rng_fork

ACTIVATIONS = PLAIN + GATED
_CLAMPED_SWIGLU_DEFAULTS = {"limit": 7.0, "alpha": 1.702}
FC1, FC2 = 0, 1
# fc1 and fc2 in TransformerEngine's slot order (the module docstring's); fc1 is the last GEMM
# of the backward, which runs the backward scaling update.
_GEMMS = (ModuleGemm("fc1_weight", input_slot=0, weight_slot=1, grad_output_slot=0, updates_backward=True),
          ModuleGemm("fc2_weight", input_slot=3, weight_slot=4, grad_output_slot=2, updates_backward=False))


class LayerNormMLP(GemmModule, torch.nn.Module):
    """y = fc2(act(fc1(norm(x)))) with fc(z) = z W^T + b.

    Args (TransformerEngine's names and defaults): hidden_size, ffn_hidden_size, eps,
    bias, normalization ("LayerNorm" or "RMSNorm"), activation (one of ACTIVATIONS; the
    gated *glu ones make fc1 produce 2 * ffn_hidden_size: [a; b] -> act(a) * b),
    activation_params ({"limit": ..., "alpha": ...} for clamped_swiglu), return_bias
    (return (y, fc2_bias) without adding fc2_bias), return_layernorm_output (also return
    norm(x); return_layernorm_output_gathered: the same here), zero_centered_gamma,
    init_method (fc1_weight) and output_layer_init_method (fc2_weight), default
    normal(0, 0.023), biases zero; params_dtype; device (default: the accelerator if present,
    else CPU; "meta" then reset_parameters()); fuse_wgrad_accumulation (weight gradients go
    to fc1_weight.main_grad / fc2_weight.main_grad); delay_wgrad_compute (weight gradients
    wait for backward_dw()); checkpoint (keep only the input for backward and recompute
    norm, fc1 and activation there: less memory, identical gradients); get_rng_state_tracker
    (the weights are initialised inside get_rng_state_tracker().fork(), as te.Linear's).
    Tensor parallelism (tp_size > 1 or a tp_group of more ranks, with set_parallel_mode=True):
    fc1 is column-parallel and fc2 row-parallel (te.Linear's modes), ffn_hidden_size split
    over the ranks (size_per_partition on each); sequence_parallel=True shards the tokens
    outside the module (gathered before fc1, reduce-scattered after fc2) and marks the norm's
    parameters and fc2_bias sequence_parallel. tp_group: see set_tensor_parallel_group(). The
    ub_* overlap flags, symmetric_ar_type, seq_length, micro_batch_size and name are accepted
    and change nothing.
    Parameters: layer_norm_weight [hidden], layer_norm_bias [hidden] (LayerNorm only),
    fc1_weight [ffn or 2 ffn, hidden], fc1_bias, fc2_weight [hidden, ffn], fc2_bias [hidden]
    (ffn: this rank's size_per_partition; a gated fc1 holds this rank's [a; b] halves).
    forward(inp, is_first_microbatch=None): inp [..., hidden] -> y [..., hidden], or the
    tuples (y, fc2_bias), (y, ln_out), (y, fc2_bias, ln_out).
    """
    fp8_forward_slots = 6
    fp8_backward_slots = 4
    gemms = _GEMMS

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 return_bias: bool = False, get_rng_state_tracker: Optional[Callable] = None,
                 tp_group: Optional[object] = None, tp_size: int = 1,
                 init_method: Optional[Callable[[Tensor], None]] = None, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu",
                 activation_params: Optional[dict] = None,
                 output_layer_init_method: Optional[Callable[[Tensor], None]] = None,
                 fuse_wgrad_accumulation: bool = False, params_dtype: Optional[torch.dtype] = None,
                 return_layernorm_output: bool = False, return_layernorm_output_gathered: bool = False,
                 seq_length: Optional[int] = None, micro_batch_size: Optional[int] = None,
                 set_parallel_mode: bool = False, zero_centered_gamma: bool = False,
                 device: Optional[Union[torch.device, str]] = None, delay_wgrad_compute: bool = False,
                 checkpoint: bool = False, name: Optional[str] = None, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, symmetric_ar_type: Optional[str] = None):
        super().__init__()
        if hidden_size <= 0 or ffn_hidden_size <= 0:
            raise ValueError(f"LayerNormMLP: hidden_size and ffn_hidden_size must be positive, got {hidden_size}, "
                             f"{ffn_hidden_size}")
        check_normalization("LayerNormMLP", normalization)
        if activation not in ACTIVATIONS:
            raise ValueError(f"LayerNormMLP: unknown activation {activation!r}; expected one of "
                             f"{', '.join(ACTIVATIONS)}")
        self.activation_limit, self.activation_alpha = self._activation_params(activation, activation_params)
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.eps = float(eps)
        self.normalization, self.activation = normalization, activation
        self.activation_params = activation_params
        self.use_bias, self.return_bias = bias, return_bias
        self.return_layernorm_output = return_layernorm_output or return_layernorm_output_gathered
        self.zero_centered_gamma = zero_centered_gamma
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.delay_wgrad_compute = delay_wgrad_compute
        self.checkpoint = checkpoint
        self.set_parallel_mode, self.name = set_parallel_mode, name
        self._set_tensor_parallel(tp_size, None, tp_group, sequence_parallel)
        self.size_per_partition = (divide("LayerNormMLP", "ffn_hidden_size", ffn_hidden_size, self.tp_size)
                                   if set_parallel_mode else ffn_hidden_size)
        self.get_rng_state_tracker = get_rng_state_tracker
        self.init_method = init_method or default_weight_init
        self.output_layer_init_method = output_layer_init_method or default_weight_init
        self._deferred_wgrad: list = []
        self.wgrad_accumulation_and_reduce_hooks: list = []  # register_wgrad_accumulation_and_reduce_hooks
        factory = {"dtype": params_dtype or torch.get_default_dtype(),
                   "device": torch.device(device) if device is not None else default_device()}
        ffn = self.size_per_partition
        fc1_out = 2 * ffn if activation in GATED else ffn
        register_norm_parameters(self, hidden_size, normalization, factory)
        self.fc1_weight = torch.nn.Parameter(torch.empty(fc1_out, hidden_size, **factory))
        self.fc1_bias = torch.nn.Parameter(torch.empty(fc1_out, **factory)) if bias else None
        self.fc2_weight = torch.nn.Parameter(torch.empty(hidden_size, ffn, **factory))
        self.fc2_bias = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if bias else None
        self.fp8_meta: Optional[Fp8Meta] = None
        self.weight_quantization = weight_quantization_in_force()  # te.quantized_model_init
        if factory["device"].type != "meta":
            self.reset_parameters()

    @staticmethod
    def _activation_params(activation: str, params: Optional[dict]) -> Tuple[float, float]:
        """(limit, alpha) of clamped_swiglu from activation_params (its defaults otherwise)."""
        params = dict(params or {})
        if params and activation != "clamped_swiglu":
            raise ValueError(f"LayerNormMLP: activation_params {params} are only taken by clamped_swiglu, "
                             f"not by activation={activation!r}")
        unknown = set(params) - set(_CLAMPED_SWIGLU_DEFAULTS)
        if unknown:
            raise ValueError(f"LayerNormMLP: activation_params has unknown keys {sorted(unknown)}; "
                             f"clamped_swiglu takes {sorted(_CLAMPED_SWIGLU_DEFAULTS)}")
        merged = {**_CLAMPED_SWIGLU_DEFAULTS, **params}
        return float(merged["limit"]), float(merged["alpha"])

    def reset_parameters(self) -> None:
        materialize_parameters(self)
        reset_norm_parameters(self, self.zero_centered_gamma)
        with torch.no_grad():
            for gemm, init in zip(self.gemms, (self.init_method, self.output_layer_init_method)):
                weight = getattr(self, gemm.weight_name)
                with rng_fork(self.get_rng_state_tracker, None):
                    init(weight)  # an FP8 weight re-quantises what is written into it
                if self.weight_quantization is not None and not isinstance(local_tensor(weight), QuantizedTensor):
                    setattr(self, gemm.weight_name, self.stored_weight(weight, gemm.weight_slot))
            for bias in (self.fc1_bias, self.fc2_bias):
                if bias is not None:
                    bias.zero_()
        # TE's partition attributes: fc1 split along its rows, fc2 along its columns.
        set_tensor_model_parallel_attributes(self.fc1_weight, True, 0, 1)
        set_tensor_model_parallel_attributes(self.fc2_weight, True, 1, 1)
        if self.fc1_bias is not None:
            set_tensor_model_parallel_attributes(self.fc1_bias, True, 0, 1)
        if self.fc2_bias is not None:
            mark_sequence_parallel(self.fc2_bias, self.sequence_parallel)

    def _quantizer_roles(self) -> dict:
        """TransformerEngine's roles for fc1 and fc2 (named '<name>.fc1' / '<name>.fc2'): a
        tensor between the two GEMMs is labelled by the GEMM consuming it (fc1's output is
        fc2's input; fc2's input gradient is fc1's output gradient)."""
        fc1, fc2 = (f"{self.name}.{gemm}" if self.name else gemm for gemm in ("fc1", "fc2"))
        return {FORWARD: [QuantizerRole("linear", "input", fc1), QuantizerRole("linear", "weight", fc1),
                          QuantizerRole("linear", "input", fc2), QuantizerRole("linear", "input", fc2),
                          QuantizerRole("linear", "weight", fc2), None],
                BACKWARD: [QuantizerRole("linear", "grad_output", fc1), None,
                           QuantizerRole("linear", "grad_output", fc2), QuantizerRole("linear", "grad_output", fc1)]}

    # --- forward ---------------------------------------------------------------------------

    def _gemm(self, gemm: int, x: Tensor, bias: Optional[Tensor], fp8: Optional[Fp8Call],
              context: Optional[Fp8Context]) -> Tensor:
        """x [tokens, in] -> [tokens, out] through fc1 or fc2 (bias None: not added), by
        LinearFunction (_linear) or, where that computes the same, F.linear (_plain_gemm)."""
        weight = self.fc1_weight if gemm == FC1 else self.fc2_weight
        mode = ("column", "row")[gemm] if self.set_parallel_mode else None
        if self._plain_gemm(fp8, context, x, weight, bias, mode):
            return plain_linear(x, weight, bias)
        return self._linear(self.gemms[gemm], x, weight, bias, fp8, context, mode)

    def _body(self, x: Tensor, context: Optional[Fp8Context], fc1_call: Optional[Fp8Call],
              fc2_call: Optional[Fp8Call]) -> Tuple[Tensor, Tensor]:
        """(y, ln_out) for x [tokens, hidden]: y [tokens, hidden] (fc2_bias added unless
        return_bias), ln_out [tokens, hidden]."""
        ln_out, fc1_call = normalize(x, self.layer_norm_weight, self.layer_norm_bias, self.normalization, self.eps,
                                     self.zero_centered_gamma, fc1_call, self.return_layernorm_output)
        h = self._gemm(FC1, ln_out, self.fc1_bias, fc1_call, context)  # [tokens, ffn] (2 ffn gated)
        if producer_writes_fp8(fc2_call):
            # fc1's backward takes h's gradient as the FP8 codes the activation's backward writes
            # where it can (grad_operand_quantizer).
            a, fc2_call = activation_to_fp8(h, self.activation, self.activation_limit, self.activation_alpha,
                                            fc2_call, grad_operand_quantizer(fc1_call, self.fc1_bias))
        else:
            a = activation_op(h, self.activation, None, self.activation_limit, self.activation_alpha)
        y = self._gemm(FC2, a, None if self.return_bias else self.fc2_bias, fc2_call, context)  # [tokens, hidden]
        return y, ln_out

    @replays_fp8_forward
    def forward(self, inp: Tensor, is_first_microbatch: Optional[bool] = None):
        inp, x = self._gemm_input("LayerNormMLP", inp, self.hidden_size, "hidden_size")  # x [tokens, hidden]
        # The parameters named rather than walked: self.parameters() builds generators over the
        # module tree, a cost on every call of a small module.
        needs_backward = builds_backward((x, self.layer_norm_weight, self.layer_norm_bias, self.fc1_weight,
                                          self.fc1_bias, self.fc2_weight, self.fc2_bias))
        context = self._fp8_context()  # the one read of the autocast state in this forward
        calls = self._fp8_calls(context, (self.fc1_weight, self.fc2_weight), is_first_microbatch, needs_backward)
        fc_calls = calls or (None, None)  # fc1's and fc2's; None in high precision
        if self.checkpoint and needs_backward:
            # te.checkpoint's recompute (fp8/replay.py): the replay in backward casts x with this
            # forward's scales (the weights' codes are the calls' own), and leaves the FP8 state
            # as it found it.
            y, ln_out = fp8_checkpoint(self._body, x, context, *fc_calls, use_reentrant=False)
        else:
            y, ln_out = self._body(x, context, *fc_calls)
        self._keep_weights_fp8(calls, is_first_microbatch)
        y = y if inp.dim() == 2 else y.reshape(inp.shape)  # [tokens, hidden] -> [..., hidden] (no view: see Linear)
        outputs = (y, cast(self.fc2_bias, y.dtype)) if self.return_bias else (y,)  # the bias in the activation dtype
        if self.return_layernorm_output:
            outputs += (ln_out.reshape(inp.shape),)
        return outputs if len(outputs) > 1 else y

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"normalization={self.normalization}, activation={self.activation}, bias={self.use_bias}")
