"""te.ops activations (GELU, GEGLU, QGELU, QGEGLU, ReLU, ReGLU, SReLU, SReGLU, SiLU, GLU,
SwiGLU, ClampedSwiGLU, SiTUGLU, and the post-scaled ScaledSwiGLU, ScaledSReLU,
ScaledClampedQGeGLU, ScaledSiTUGLU) on this package's activation kernels
(te.kernels.activation). The gated ones take [..., 2n] and give [..., n]: act(first half) *
second half; with glu_interleave_size=g the halves come interleaved in blocks of g (a block of
the first, one of the second, ...), which are put back into halves (one copy) before the
kernel."""
import math
from typing import Optional

import torch
from torch import Tensor

from ...custom_ops.activation import activation
from ...reference.activation import GATED
from ...utils import check_module_input
from ..op import BasicOperation


def _halves(op: str, x: Tensor, interleave: Optional[int]) -> Tensor:
    """x [..., 2n] with its halves contiguous, from blocks of `interleave` alternating."""
    if interleave is None:
        return x
    width = x.shape[-1]
    if width % (2 * interleave):
        raise ValueError(f"{op}: the last dimension ({width}) is not a multiple of 2 * glu_interleave_size "
                         f"({2 * interleave})")
    blocks = x.reshape(*x.shape[:-1], width // (2 * interleave), 2, interleave)  # [..., blocks, 2, g]
    return blocks.transpose(-3, -2).reshape(x.shape)  # [..., 2, blocks, g] -> [..., 2n]


class _Kind(BasicOperation):
    """What every activation op holds: `kind` names the kernel's activation; limit / alpha are
    clamped_swiglu's; glu_interleave_size the gated ones' input layout."""
    kind: str
    limit: float = 7.0
    alpha: float = 1.702

    def __init__(self, glu_interleave_size: Optional[int]) -> None:
        super().__init__()
        if glu_interleave_size is not None and (self.kind not in GATED or glu_interleave_size <= 0):
            raise ValueError(f"{type(self).__name__}: glu_interleave_size must be a positive int for a gated "
                             f"activation, got {glu_interleave_size!r}")
        self.glu_interleave_size = glu_interleave_size

    def _activation(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        check_module_input(type(self).__name__, "x", x)
        x = _halves(type(self).__name__, x, self.glu_interleave_size)
        return activation(x, self.kind, bias, self.limit, self.alpha)


class Activation(_Kind):
    def __init__(self, *, cache_quantized_input: bool = False, glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(glu_interleave_size)
        self.cache_quantized_input = cache_quantized_input

    def forward(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """act(x) (act(x + bias) with the bias fused in, its gradient in the backward kernel)."""
        return self._activation(x, bias)

    def describe_context(self, ctx, input_: Tensor) -> None:
        """TE's activation context: the saved input and its dtype."""
        ctx.save_for_backward(input_)
        ctx.dtype = input_.dtype

    def backward_from_context(self, ctx, grad_output: Tensor, grad_extra_outputs):
        """The activation's backward kernel on the saved input (its forward recomputed under
        autograd: the kernel pair's backward reads what its forward keeps)."""
        (saved_input,) = ctx.saved_tensors
        with torch.enable_grad():
            x = saved_input.detach().requires_grad_(True)
            (grad_input,) = torch.autograd.grad(self(x), x, grad_output)
        return grad_input, (), ()


def _activation(name: str, kind: str) -> type:
    return type(name, (Activation,), {"kind": kind, "__doc__": f"The {kind} activation."})


GELU = _activation("GELU", "gelu")
GEGLU = _activation("GEGLU", "geglu")
QGELU = _activation("QGELU", "qgelu")
QGEGLU = _activation("QGEGLU", "qgeglu")
ReLU = _activation("ReLU", "relu")
ReGLU = _activation("ReGLU", "reglu")
SReLU = _activation("SReLU", "srelu")
SReGLU = _activation("SReGLU", "sreglu")
SiLU = _activation("SiLU", "silu")
GLU = _activation("GLU", "glu")
SwiGLU = _activation("SwiGLU", "swiglu")


def _clamped_swiglu(op: _Kind, x: Tensor, offset: float) -> Tensor:
    """The kernel computes offset 1 (GPT-OSS's); another offset runs the formula in plain
    PyTorch, in fp32 with one rounding, differentiated by autograd."""
    if offset == 1.0:
        return op._activation(x)
    check_module_input(type(op).__name__, "x", x)
    gate, linear = _halves(type(op).__name__, x, op.glu_interleave_size).float().chunk(2, dim=-1)
    gate = gate.clamp(max=op.limit)
    return (gate * torch.sigmoid(op.alpha * gate) * (linear.clamp(-op.limit, op.limit) + offset)).to(x.dtype)


class ClampedSwiGLU(Activation):
    """GPT-OSS's SwiGLU: act(min(a, limit)) * (clamp(b, -limit, limit) + glu_linear_offset),
    act(z) = z * sigmoid(alpha * z). The kernel computes offset 1 (GPT-OSS's); see
    _clamped_swiglu for others."""
    kind = "clamped_swiglu"

    def __init__(self, *, limit: float = 7.0, alpha: float = 1.702, glu_linear_offset: float = 1.0,
                 cache_quantized_input: bool = False, glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.limit, self.alpha, self.glu_linear_offset = float(limit), float(alpha), float(glu_linear_offset)

    def forward(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        if bias is not None:
            if self.glu_linear_offset != 1.0:
                raise NotImplementedError("ClampedSwiGLU: a fused bias with glu_linear_offset other than 1")
            return self._activation(x, bias)
        return _clamped_swiglu(self, x, self.glu_linear_offset)


def _soft_caps(op: str, beta1: float, beta2: float) -> tuple:
    """SiTU-GLU's soft caps as floats, refused unless finite and positive (they divide)."""
    caps = (float(beta1), float(beta2))
    for name, value in zip(("beta1", "beta2"), caps):
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(f"{op}: {name} must be finite and positive, got {value}")
    return caps


def _situglu(op: _Kind, x: Tensor) -> Tensor:
    """beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2) of the halves a, b of x, in plain
    PyTorch (no kernel computes it here), in fp32 with one rounding, differentiated by autograd."""
    check_module_input(type(op).__name__, "x", x)
    gate, up = _halves(type(op).__name__, x, op.glu_interleave_size).float().chunk(2, dim=-1)
    capped_gate = op.beta1 * torch.tanh(gate / op.beta1) * torch.sigmoid(gate)
    return (capped_gate * op.beta2 * torch.tanh(up / op.beta2)).to(x.dtype)


class SiTUGLU(_Kind):
    """Kimi K3's soft-capped SiLU GLU (TE main): see _situglu; beta1 (default 4) caps the gate,
    beta2 (default 25) the linear half. Not an Activation: no kernel computes it, so it is not
    fused with a bias or a following Linear. cache_quantized_input is accepted (TE's) and
    changes nothing here."""
    kind = "swiglu"  # the gated layout the glu_interleave_size check needs

    def __init__(self, *, beta1: float = 4.0, beta2: float = 25.0, cache_quantized_input: bool = False,
                 glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(glu_interleave_size)
        self.beta1, self.beta2 = _soft_caps(type(self).__name__, beta1, beta2)
        self.cache_quantized_input = cache_quantized_input

    def forward(self, x: Tensor) -> Tensor:
        return _situglu(self, x)


class ScaledActivation(_Kind):
    """act(x) times a per-row scale, the extra input: scales [...] for act(x) [..., n] (MoE
    experts' routing probabilities applied after the activation)."""
    num_extra_inputs = 1

    def __init__(self, *, glu_interleave_size: Optional[int] = None, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(glu_interleave_size)
        # As TE main: only ScaledSReLU offers recomputing its activation in a grouped MLP's backward.
        if activation_recompute_in_mlp and self.kind in GATED:
            raise ValueError(f"{type(self).__name__} does not support activation recomputation "
                             "(activation_recompute_in_mlp=True)")
        self.activation_recompute_in_mlp = activation_recompute_in_mlp

    def forward(self, x: Tensor, scales: Tensor) -> Tensor:
        if tuple(scales.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"{type(self).__name__}: scales has shape {tuple(scales.shape)}, expected "
                             f"{tuple(x.shape[:-1])} (the input's without its last dimension)")
        return self._scaled(x) * scales.unsqueeze(-1).to(x.dtype)

    def _scaled(self, x: Tensor) -> Tensor:
        return self._activation(x)


class ScaledSwiGLU(ScaledActivation):
    kind = "swiglu"


class ScaledSReLU(ScaledActivation):
    kind = "srelu"

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(activation_recompute_in_mlp=activation_recompute_in_mlp)


class ScaledClampedQGeGLU(ScaledActivation):
    """ClampedSwiGLU's numerics, post-scaled."""
    kind = "clamped_swiglu"

    def __init__(self, *, glu_interleave_size: Optional[int] = None, activation_recompute_in_mlp: bool = False,
                 limit: float = 7.0, alpha: float = 1.702, glu_linear_offset: float = 1.0) -> None:
        super().__init__(glu_interleave_size=glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.limit, self.alpha, self.glu_linear_offset = float(limit), float(alpha), float(glu_linear_offset)

    def _scaled(self, x: Tensor) -> Tensor:
        return _clamped_swiglu(self, x, self.glu_linear_offset)


class ScaledSiTUGLU(ScaledActivation):
    """SiTUGLU's numerics (see _situglu), post-scaled."""
    kind = "swiglu"  # gated, as SiTUGLU's

    def __init__(self, *, beta1: float = 4.0, beta2: float = 25.0, glu_interleave_size: Optional[int] = None,
                 activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(glu_interleave_size=glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.beta1, self.beta2 = _soft_caps(type(self).__name__, beta1, beta2)

    def _scaled(self, x: Tensor) -> Tensor:
        return _situglu(self, x)
