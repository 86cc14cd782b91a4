"""te.ops activations (GELU, GEGLU, QGELU, QGEGLU, ReLU, ReGLU, SReLU, SReGLU, SiLU, GLU,
SwiGLU, ClampedSwiGLU) on this package's activation kernels (te.kernels.activation). The
gated ones take [..., 2n] and give [..., n]: act(first half) * second half."""
from typing import Optional

from torch import Tensor

from ...kernels.activation import activation
from ...utils import check_module_input
from ..op import BasicOperation


class Activation(BasicOperation):
    """Base: `kind` names the kernel's activation; limit / alpha are clamped_swiglu's."""
    kind: str
    limit: float = 7.0
    alpha: float = 1.702

    def __init__(self, *, cache_quantized_input: bool = False, glu_interleave_size: Optional[int] = None) -> None:
        super().__init__()
        if glu_interleave_size is not None:
            raise NotImplementedError(f"{type(self).__name__}: glu_interleave_size is not implemented (the halves "
                                      f"are contiguous)")
        self.cache_quantized_input = cache_quantized_input

    def forward(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """act(x) (act(x + bias) with the bias fused in, its gradient in the backward kernel)."""
        check_module_input(type(self).__name__, "x", x)
        return activation(x, self.kind, bias, self.limit, self.alpha)


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


class ClampedSwiGLU(Activation):
    """GPT-OSS's SwiGLU: the gate clamped to <= limit, the linear half to [-limit, limit], and
    sigmoid(alpha * gate)."""
    kind = "clamped_swiglu"

    def __init__(self, *, limit: float = 7.0, alpha: float = 1.702, cache_quantized_input: bool = False,
                 glu_interleave_size: Optional[int] = None) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.limit, self.alpha = float(limit), float(alpha)


class ScaledActivation(BasicOperation):
    """act(x) times a per-row scale, the extra input: scales [..., ] for act(x) [..., n]
    (MoE experts' routing probabilities applied after the activation)."""
    num_extra_inputs = 1
    kind: str
    limit: float = 7.0
    alpha: float = 1.702

    def __init__(self, *, glu_interleave_size: Optional[int] = None, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__()
        if glu_interleave_size is not None:
            raise NotImplementedError(f"{type(self).__name__}: glu_interleave_size is not implemented (the halves "
                                      f"are contiguous)")
        self.activation_recompute_in_mlp = activation_recompute_in_mlp

    def forward(self, x: Tensor, scales: Tensor) -> Tensor:
        check_module_input(type(self).__name__, "x", x)
        if tuple(scales.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"{type(self).__name__}: scales has shape {tuple(scales.shape)}, expected "
                             f"{tuple(x.shape[:-1])} (the input's without its last dimension)")
        return activation(x, self.kind, None, self.limit, self.alpha) * scales.unsqueeze(-1).to(x.dtype)


class ScaledSwiGLU(ScaledActivation):
    kind = "swiglu"


class ScaledSReLU(ScaledActivation):
    kind = "srelu"

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(activation_recompute_in_mlp=activation_recompute_in_mlp)


class ScaledClampedQGeGLU(ScaledActivation):
    """ClampedSwiGLU's numerics (GPT-OSS: the linear half clamped and offset by 1), post-scaled."""
    kind = "clamped_swiglu"

    def __init__(self, *, glu_interleave_size: Optional[int] = None, activation_recompute_in_mlp: bool = False,
                 limit: float = 7.0, alpha: float = 1.702, glu_linear_offset: float = 1.0) -> None:
        super().__init__(glu_interleave_size=glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        if glu_linear_offset != 1.0:
            raise NotImplementedError(f"ScaledClampedQGeGLU: glu_linear_offset={glu_linear_offset} is not "
                                      f"implemented (the kernel adds 1)")
        self.limit, self.alpha = float(limit), float(alpha)
