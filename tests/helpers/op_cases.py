"""Calls of every op of the portable_te namespace, built on a given device: what
tests/ops/test_every_op.py runs through the same checks on every backend.

A case named after its op ("layernorm_fwd") is the op's one small, valid call; a case named
"op[what]" calls it again where its dtypes, options, mask kinds, formats or odd shapes take
other paths (the calls the op families' tests used to opcheck and compile one by one). Inputs
made with grad=True require grad: opcheck then tests the autograd registration with them, and
the compile check compares the gradients too. Cases are built on demand, one at a time."""
from typing import NamedTuple

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
F32, BF16 = torch.float32, torch.bfloat16
ops = torch.ops.portable_te


class Case(NamedTuple):
    args: tuple
    fp8_outputs: tuple = ()  # which outputs hold FP8 codes, compared bit for bit
    compile: bool = True  # also torch.compile(fullgraph=True) against eager (else opcheck only)


_BUILDERS = {}  # case name -> (build(device) -> (args, fp8_outputs), compile)


def _case(name, compile=True):
    def register(build):
        assert name not in _BUILDERS, name
        _BUILDERS[name] = (build, compile)
        return build
    return register


def names() -> list:
    return sorted(_BUILDERS)


def op_of(name: str) -> str:
    return name.split("[")[0]


def build(name: str, device: torch.device) -> Case:
    make, compile = _BUILDERS[name]
    args, fp8_outputs = make(torch.device(device))
    return Case(tuple(args), tuple(fp8_outputs), compile)


def randn(device, *shape, dtype=BF16, scale=1.0, shift=0.0, grad=False):
    return (torch.randn(*shape) * scale + shift).to(dtype).to(device).requires_grad_(grad)


def _dtype_name(dtype):
    return {F32: "fp32", BF16: "bf16"}[dtype]


# --- the basic call of every op ---------------------------------------------------------------

def _basic(device):
    x, w = randn(device, 6, 96), randn(device, 96, dtype=F32, shift=1.0)
    b, dy = randn(device, 96, dtype=F32), randn(device, 6, 96)
    return x, w, b, dy


def _stats(x, w, b):
    with torch.no_grad():
        _, mean, rstd = ops.layernorm_fwd(x, w, b, 1e-5, False)
        _, rms_rstd = ops.rmsnorm_fwd(x, w, 1e-5, False)
    return mean, rstd, rms_rstd


@_case("layernorm_fwd")
def _(d):
    x, w, b, _ = _basic(d)
    return (x, w, b, 1e-5, False), ()


@_case("layernorm_bwd")
def _(d):
    x, w, b, dy = _basic(d)
    mean, rstd, _ = _stats(x, w, b)
    return (dy, x, mean, rstd, w, False), ()


@_case("rmsnorm_fwd")
def _(d):
    x, w, _, _ = _basic(d)
    return (x, w.bfloat16(), 1e-5, True), ()


@_case("rmsnorm_bwd")
def _(d):
    x, w, b, dy = _basic(d)
    _, _, rms_rstd = _stats(x, w, b)
    return (dy, x, rms_rstd, w, False), ()


@_case("add_layernorm_fwd")
def _(d):
    x, w, b, dy = _basic(d)
    return (x, dy, w, b, 1e-5, False), ()


@_case("add_layernorm_bwd")
def _(d):
    x, w, b, dy = _basic(d)
    mean, rstd, _ = _stats(x, w, b)
    return (dy, x, x, mean, rstd, w, False), ()


@_case("add_rmsnorm_fwd")
def _(d):
    x, w, b, dy = _basic(d)
    return (x, dy, w, 1e-5, False), ()


@_case("add_rmsnorm_bwd")
def _(d):
    x, w, b, dy = _basic(d)
    _, _, rms_rstd = _stats(x, w, b)
    return (dy, x, x, rms_rstd, w, False), ()


@_case("layernorm_fp8_fwd")
def _(d):
    x, w, b, _ = _basic(d)
    return (x, w, b, torch.tensor([3.0], device=d), E4M3, 1e-5, False, True), (0,)


@_case("rmsnorm_fp8_fwd")
def _(d):
    x, w, _, _ = _basic(d)
    return (x, w, torch.tensor([3.0], device=d), E5M2, 1e-5, False, False), (0,)


@_case("fp8_quantize")
def _(d):
    x, _, _, _ = _basic(d)
    return (x, torch.tensor([3.0], device=d), E4M3), (0,)


@_case("fp8_quantize_transpose")
def _(d):
    x, _, _, _ = _basic(d)
    return (x, torch.tensor([3.0], device=d), E5M2), (0, 1)


@_case("fp8_dequantize")
def _(d):
    x, _, _, _ = _basic(d)
    scale = torch.tensor([3.0], device=d)
    codes, _ = ops.fp8_quantize(x, scale, E4M3)
    return (codes, 1 / scale, BF16), ()


@_case("fp8_block_quantize")
def _(d):
    x, _, _, _ = _basic(d)
    return (x, 1, 32, E4M3, "e8m0", 0.0), (0,)


@_case("fp8_block_dequantize")
def _(d):
    x, _, _, _ = _basic(d)
    codes, scales = ops.fp8_block_quantize(x.float(), 1, 32, E4M3, "e8m0", 0.0)
    return (codes, scales, 1, 32, F32), ()


def _block_gemm_operands(d, m, n, k):
    a = ops.fp8_block_quantize(randn(d, m, k, dtype=F32), 1, 32, E4M3, "e8m0", 0.0)
    b = ops.fp8_block_quantize(randn(d, n, k, dtype=F32), 1, 32, E4M3, "e8m0", 0.0)
    return a, b


@_case("fp8_block_gemm")
def _(d):
    (a, a_scales), (b, b_scales) = _block_gemm_operands(d, 6, 64, 96)
    return (a, a_scales, [1, 32], False, b, b_scales, [1, 32], False, None, F32), ()


@_case("scaled_gemm")
def _(d):
    x, _, _, _ = _basic(d)
    scale = torch.tensor([3.0], device=d)
    codes = ops.fp8_quantize(x, scale, E4M3)[0].float()
    return (codes, codes[:4], scale, scale, None, BF16), ()


@_case("fp8_transpose")
def _(d):
    x, _, _, _ = _basic(d)
    return (ops.fp8_quantize(x, torch.tensor([3.0], device=d), E4M3)[0],), (0,)


# Odd sizes: partial 16 x 16 blocks and a partial tile; E5M2 codes.
@_case("fp8_transpose[e5m2, 131 x 300]")
def _(d):
    x = randn(d, 131, 300)
    return (ops.fp8_quantize(x, torch.tensor([3.0], device=d), E5M2)[0],), (0,)


@_case("scaled_gemm_accumulate")
def _(d):
    x, _, _, _ = _basic(d)
    scale = torch.tensor([3.0], device=d)
    codes = ops.fp8_quantize(x, scale, E4M3)[0]
    return (codes, codes[:4], scale, scale, randn(d, 6, 4, dtype=F32)), ()


@_case("activation_fwd")
def _(d):
    x, _, b, _ = _basic(d)
    return (x, b.bfloat16(), "swiglu", 7.0, 1.702), ()


@_case("activation_bwd")
def _(d):
    x, _, b, _ = _basic(d)
    return (x[:, :48].contiguous(), x, b.bfloat16(), "geglu", 7.0, 1.702), ()


@_case("activation_bwd_dbias")
def _(d):
    x, _, b, dy = _basic(d)
    return (dy, x, b.bfloat16(), "gelu", 7.0, 1.702), ()


@_case("activation_fp8")
def _(d):
    x, _, _, _ = _basic(d)
    return (x, None, "silu", 7.0, 1.702, torch.tensor([3.0], device=d), E4M3), (0,)


@_case("scaled_softmax_fwd")
def _(d):
    return (randn(d, 2, 3, 8, 8), None, 0.5, "causal"), ()


@_case("scaled_softmax_bwd")
def _(d):
    scores = randn(d, 2, 3, 8, 8)
    return (randn(d, 2, 3, 8, 8), ops.scaled_softmax_fwd(scores, None, 0.5, "causal"), None, 0.5, "causal"), ()


def _logits(d):
    return randn(d, 5, 70, scale=3.0), torch.tensor([0, 69, 3, -100, 12], device=d)


@_case("cross_entropy_fwd")
def _(d):
    logits, target = _logits(d)
    return (logits, target, 0.1, -100, True, None), ()


@_case("cross_entropy_bwd")
def _(d):
    logits, target = _logits(d)
    _, grad = ops.cross_entropy_fwd(logits, target, 0.1, -100, True, None)
    return (grad, torch.rand(5, device=d)), ()


@_case("cross_entropy_partials")
def _(d):
    logits, target = _logits(d)
    return (logits[:, 35:].contiguous(), target, 35, -100), ()


@_case("cross_entropy_sharded_grad")
def _(d):
    logits, target = _logits(d)
    return (logits[:, 35:].contiguous(), target, 35, torch.zeros(5, device=d), torch.full((5,), 70.0, device=d),
            0.1, 70, -100, torch.ones(5, device=d)), ()


def _rope_freqs(d, positions, rotary_dim):
    return (torch.rand(positions, 1, 1, rotary_dim) * 6).to(d)


@_case("rope_fwd")
def _(d):
    return (randn(d, 4, 2, 2, 16), _rope_freqs(d, 8, 12), "sbhd", False, None, None), ()


@_case("rope_bwd")
def _(d):
    return (randn(d, 4, 2, 2, 16), _rope_freqs(d, 8, 12), "sbhd", True, None, torch.tensor([1, 3], device=d)), ()


def _attention(d, dtype=BF16, grad=False):
    """q [2, 4, 9, 16], k [2, 2, 11, 16], v [2, 2, 11, 8]: GQA, sq != skv, dk != dv."""
    return (randn(d, 2, 4, 9, 16, dtype=dtype, grad=grad), randn(d, 2, 2, 11, 16, dtype=dtype, grad=grad),
            randn(d, 2, 2, 11, 8, dtype=dtype, grad=grad))


def _packed_attention(d):
    """Packed q [12, 2, 8], k / v [14, 2, 8]: three sequences with a gap, ALiBi."""
    q, k, v = (randn(d, n, 2, 8, dtype=F32, grad=True) for n in (12, 14, 14))
    cu_q, cu_kv = torch.tensor([0, 5, 5, 9], device=d), torch.tensor([0, 4, 7, 12], device=d)
    padded_q, padded_kv = torch.tensor([0, 6, 6, 12], device=d), torch.tensor([0, 4, 8, 14], device=d)
    return q, k, v, cu_q, cu_kv, padded_q, padded_kv, torch.rand(2, device=d)


# flash_attention_fwd's arguments after the sequences and ALiBi (bias, mask, softmax_offset,
# dropout_rng, page_table) and after the scale (window, bottom_right, softcap, dropout,
# return_max_logit).
_NO_TERMS = (None, None, None, None, None)


@_case("flash_attention_fwd")
def _(d):
    return (*_attention(d), None, None, None, None, None, *_NO_TERMS, 0.25, -1, 0, True, 0.0, 0.0, False), ()


@_case("flash_attention_bwd")
def _(d):
    q, k, v = _attention(d)
    out, lse, _ = ops.flash_attention_fwd(q, k, v, None, None, None, None, None, *_NO_TERMS, 0.25, -1, 0, True, 0.0,
                                          0.0, False)
    return (randn(d, *out.shape), q, k, v, out, lse, None, None, None, None, None, *_NO_TERMS, 0.25, -1, 0, True,
            0.0, 0.0, False), ()


@_case("flash_attention_fwd[fp32, window, lengths]")
def _(d):
    cu = torch.tensor([0, 9, 14], device=d), torch.tensor([0, 11, 14], device=d)
    return (*_attention(d, F32, grad=True), *cu, None, None, None, *_NO_TERMS, 0.25, 3, 2, False, 0.0, 0.0, True), ()


@_case("flash_attention_fwd[fp32, packed, alibi]")
def _(d):
    return (*_packed_attention(d), *_NO_TERMS, 0.3, -1, 0, True, 0.0, 0.0, False), ()


@_case("flash_attention_bwd[fp32, packed, alibi]", compile=False)
def _(d):
    q, k, v, *rest = _packed_attention(d)
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse, _ = ops.flash_attention_fwd(q, k, v, *rest, *_NO_TERMS, 0.3, -1, 0, True, 0.0, 0.0, False)
    return (torch.randn_like(out), q, k, v, out, lse, *rest, *_NO_TERMS, 0.3, -1, 0, True, 0.0, 0.0, False), ()


def _attention_terms(d, dtype):
    """bias [1, 4, 9, 11], mask [2, 1, 9, 11], sinks [4], dropout's (seed, offset), no page table."""
    return (randn(d, 1, 4, 9, 11, dtype=dtype, grad=True), torch.rand(2, 1, 9, 11, device=d) > 0.7,
            randn(d, 4, dtype=F32, grad=True), torch.tensor([11, 3], device=d), None)


@_case("flash_attention_fwd[bf16, bias, mask, sink, softcap, dropout, max logit]")
def _(d):
    return (*_attention(d, grad=True), None, None, None, None, None, *_attention_terms(d, BF16), 0.25, -1, 0, True,
            5.0, 0.2, True), ()


@_case("flash_attention_bwd[fp32, bias, mask, sink, softcap, dropout]", compile=False)
def _(d):
    q, k, v = _attention(d, F32)
    terms = tuple(None if t is None else t.detach() for t in _attention_terms(d, F32))
    out, lse, _ = ops.flash_attention_fwd(q, k, v, None, None, None, None, None, *terms, 0.25, 4, 0, False, 5.0, 0.2,
                                          False)
    return (torch.randn_like(out), q, k, v, out, lse, None, None, None, None, None, *terms, 0.25, 4, 0, False, 5.0,
            0.2, True), ()


@_case("flash_attention_fwd[bf16, paged cache, decode]")
def _(d):
    """q [2, 4, 1, 16] against a paged cache of 6 pages of 4 tokens, sequences of 7 and 3 keys."""
    q = randn(d, 2, 4, 1, 16)
    k_pages, v_pages = randn(d, 6, 4, 2, 16), randn(d, 6, 4, 2, 8)
    table = torch.tensor([[4, 1, 0], [2, 0, 0]], dtype=torch.int32, device=d)
    cu_q, cu_kv = torch.tensor([0, 1, 2], device=d), torch.tensor([0, 7, 10], device=d)
    return (q, k_pages, v_pages, cu_q, cu_kv, None, None, None, None, None, None, None, table, 0.25, -1, 0, True, 0.0,
            0.0, False), ()


def _adam_lists(d, sizes, param_dtype, grad_dtype, with_master):
    params = [randn(d, *s, dtype=param_dtype) for s in sizes]
    grads = [randn(d, *s, dtype=grad_dtype) for s in sizes]
    exp_avgs = [randn(d, *s, dtype=F32).abs() * 0.1 for s in sizes]
    exp_avg_sqs = [randn(d, *s, dtype=F32).abs() * 0.1 for s in sizes]
    masters = [p.float() + 0.01 * randn(d, *p.shape, dtype=F32) for p in params] if with_master else []
    return params, grads, exp_avgs, exp_avg_sqs, masters


@_case("multi_tensor_adam")
def _(d):
    params = [randn(d, 5, 7, dtype=F32), randn(d, 33, dtype=F32)]
    grads = [torch.randn_like(p) for p in params]
    moments = [torch.zeros_like(p) for p in params]
    return (params, grads, moments, [m.clone() for m in moments], [], 1e-3, 0.9, 0.999, 1e-8, 1, True, 0.01, True,
            1.0), ()


# --- further calls: dtypes, options, layouts ----------------------------------------------------
# Norms: x, weight and bias of one dtype, [4, 3, 40]; the forwards with grad. torch.compile runs
# on the fp32 forwards (forward and backward).

def _norm_inputs(d, dtype, grad):
    x = randn(d, 4, 3, 40, dtype=dtype, scale=2.0, shift=0.5, grad=grad)
    w = randn(d, 40, dtype=dtype, scale=0.3, shift=1.0, grad=grad)
    b = randn(d, 40, dtype=dtype, grad=grad)
    return x, w, b, randn(d, 4, 3, 40, dtype=dtype), randn(d, 4, 3, 40, dtype=dtype)


for _dtype in (F32, BF16):
    _t, _fp32 = _dtype_name(_dtype), _dtype == F32

    @_case(f"layernorm_fwd[{_t}, bias]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, b, _, _ = _norm_inputs(d, dtype, grad=True)
        return (x, w, b, 1e-5, False), ()

    @_case(f"layernorm_fwd[{_t}, no bias, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, _, _, _ = _norm_inputs(d, dtype, grad=True)
        return (x, w, None, 1e-5, True), ()

    @_case(f"rmsnorm_fwd[{_t}]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, _, _, _ = _norm_inputs(d, dtype, grad=True)
        return (x, w, 1e-5, False), ()

    @_case(f"layernorm_bwd[{_t}]", compile=False)
    def _(d, dtype=_dtype):
        x, w, b, dy, _ = _norm_inputs(d, dtype, grad=False)
        mean, rstd, _ = _stats(x, w, b)
        return (dy, x, mean, rstd, w, False), ()

    @_case(f"rmsnorm_bwd[{_t}, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, b, dy, _ = _norm_inputs(d, dtype, grad=False)
        _, _, rms_rstd = _stats(x, w, b)
        return (dy, x, rms_rstd, w, True), ()

    # The residual-add fusions: x and the residual with grad.
    @_case(f"add_layernorm_fwd[{_t}, bias]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, b, residual, _ = _norm_inputs(d, dtype, grad=True)
        return (x, residual.requires_grad_(), w, b, 1e-5, False), ()

    @_case(f"add_layernorm_fwd[{_t}, no bias, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, _, residual, _ = _norm_inputs(d, dtype, grad=True)
        return (x, residual.requires_grad_(), w, None, 1e-5, True), ()

    @_case(f"add_rmsnorm_fwd[{_t}]", compile=_fp32)
    def _(d, dtype=_dtype):
        x, w, _, residual, _ = _norm_inputs(d, dtype, grad=True)
        return (x, residual.requires_grad_(), w, 1e-5, False), ()

    @_case(f"add_layernorm_bwd[{_t}]", compile=False)
    def _(d, dtype=_dtype):
        x, w, b, residual, dy = _norm_inputs(d, dtype, grad=False)
        with torch.no_grad():
            _, s, mean, rstd = ops.add_layernorm_fwd(x, residual, w, b, 1e-5, False)
        return (dy, randn(d, 4, 3, 40, dtype=dtype), s, mean, rstd, w, False), ()

    @_case(f"add_rmsnorm_bwd[{_t}, zero-centred]", compile=False)
    def _(d, dtype=_dtype):
        x, w, _, residual, dy = _norm_inputs(d, dtype, grad=False)
        with torch.no_grad():
            _, s, rms_rstd = ops.add_rmsnorm_fwd(x, residual, w, 1e-5, False)
        return (dy, randn(d, 4, 3, 40, dtype=dtype), s, rms_rstd, w, True), ()

    # Norm -> FP8, with and without the high-precision output.
    for _output in (False, True):
        _o = ", output" if _output else ""

        @_case(f"layernorm_fp8_fwd[{_t}{_o}]", compile=_fp32)
        def _(d, dtype=_dtype, output=_output):
            x, w, b, _, _ = _norm_inputs(d, dtype, grad=False)
            return (x, w, b, torch.tensor([3.0], device=d), E4M3, 1e-5, False, output), (0,)

        @_case(f"rmsnorm_fp8_fwd[{_t}, e5m2, zero-centred{_o}]", compile=_fp32)
        def _(d, dtype=_dtype, output=_output):
            x, w, _, _, _ = _norm_inputs(d, dtype, grad=False)
            return (x, w, torch.tensor([3.0], device=d), E5M2, 1e-5, True, output), (0,)


@_case("rmsnorm_fp8_fwd[fp32, e4m3]")
def _(d):
    x, w, _, _, _ = _norm_inputs(d, F32, grad=False)
    return (x, w, torch.tensor([2.0], device=d), E4M3, 1e-5, False, False), (0,)


# Activations: [4, 3, 40] (x * 3) with a bias of x's dtype; a plain and a gated kind, fp32 and
# bf16; the forwards with grad (torch.compile: the fp32 ones, forward and backward).
def _activation_inputs(d, kind, dtype, grad):
    x = randn(d, 4, 3, 40, dtype=dtype, scale=3.0, grad=grad)
    bias = randn(d, 40, dtype=dtype, grad=grad)
    dy = randn(d, 4, 3, 20 if kind.endswith("glu") else 40, dtype=dtype)
    return x, bias, dy


for _kind, _dtype in (("gelu", F32), ("clamped_swiglu", BF16), ("swiglu", F32)):
    _t, _fp32 = f"{_kind}, {_dtype_name(_dtype)}", _dtype == F32

    @_case(f"activation_fwd[{_t}, bias]", compile=_fp32)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, _ = _activation_inputs(d, kind, dtype, grad=True)
        return (x, bias, kind, 7.0, 1.702), ()

    if _kind == "swiglu":  # compiled only
        continue

    @_case(f"activation_fwd[{_t}, no bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, _, _ = _activation_inputs(d, kind, dtype, grad=True)
        return (x, None, kind, 7.0, 1.702), ()

    @_case(f"activation_bwd[{_t}, bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, dy = _activation_inputs(d, kind, dtype, grad=False)
        return (dy, x, bias, kind, 7.0, 1.702), ()

    @_case(f"activation_bwd[{_t}, no bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, _, dy = _activation_inputs(d, kind, dtype, grad=False)
        return (dy, x, None, kind, 7.0, 1.702), ()

    @_case(f"activation_bwd_dbias[{_t}]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, dy = _activation_inputs(d, kind, dtype, grad=False)
        return (dy, x, bias, kind, 7.0, 1.702), ()

    @_case(f"activation_fp8[{_t}, bias]", compile=False)
    def _(d, kind=_kind, dtype=_dtype):
        x, bias, _ = _activation_inputs(d, kind, dtype, grad=False)
        return (x, bias, kind, 7.0, 1.702, torch.tensor([2.0], device=d), E4M3), (0,)


# Softmax: fp32 [2, 3, 5, 11] (square for the upper-triangular mask) in every mask kind, the
# padding mask [b, 1, sq, sk] with a fully masked row; the forward with grad (and compiled).
SOFTMAX_MASKS = ("none", "padding", "causal", "causal_bottom_right")


def _softmax_inputs(d, mask_type):
    shape = (2, 3, 5, 5) if mask_type == "causal" else (2, 3, 5, 11)
    x = randn(d, *shape, dtype=F32, scale=3.0)
    mask = None
    if mask_type == "padding":
        mask = torch.rand(shape[0], 1, *shape[2:]) < 0.3
        mask[:, :, 1] = True
        mask = mask.to(d)
    return x, mask, randn(d, *shape, dtype=F32)


for _mask_type in SOFTMAX_MASKS:
    @_case(f"scaled_softmax_fwd[fp32, {_mask_type}]")
    def _(d, mask_type=_mask_type):
        x, mask, _ = _softmax_inputs(d, mask_type)
        return (x.requires_grad_(), mask, 0.37, mask_type), ()

    @_case(f"scaled_softmax_bwd[fp32, {_mask_type}]", compile=False)
    def _(d, mask_type=_mask_type):
        x, mask, dy = _softmax_inputs(d, mask_type)
        return (dy, ops.scaled_softmax_fwd(x, mask, 0.37, mask_type), mask, 0.37, mask_type), ()


# Cross entropy: fp32 [6, 33] with an ignored token, with and without the gradient in the
# forward (logits with grad where it is), no grad_scale, a 0-d one and one per token.
def _ce_inputs(d):
    logits = randn(d, 6, 33, dtype=F32, scale=3.0)
    return logits, torch.tensor([3, -100, 0, 32, 17, 5], device=d)


for _compute_grad in (True, False):
    for _scale_kind in ("no grad_scale", "0-d grad_scale", "grad_scale per token"):
        @_case(f"cross_entropy_fwd[fp32, compute_grad={_compute_grad}, {_scale_kind}]", compile=False)
        def _(d, compute_grad=_compute_grad, scale_kind=_scale_kind):
            logits, target = _ce_inputs(d)
            grad_scale = {"no grad_scale": None, "0-d grad_scale": torch.tensor(0.25, device=d),
                          "grad_scale per token": torch.rand(6, device=d)}[scale_kind]
            return (logits.requires_grad_(compute_grad), target, 0.1, -100, compute_grad, grad_scale), ()


@_case("cross_entropy_bwd[fp32]", compile=False)
def _(d):
    logits, target = _ce_inputs(d)
    _, grad = ops.cross_entropy_fwd(logits, target, 0.1, -100, True, None)
    return (grad, torch.randn(6, device=d)), ()


@_case("cross_entropy_partials[bf16, whole vocabulary]", compile=False)
def _(d):
    logits = randn(d, 6, 96, scale=4.0)
    return (logits, torch.tensor([3, -100, 0, 95, 40, 7], device=d), 0, -100), ()


# RoPE: fp32 in sbhd [4, 2, 2, 12] and thd (sequences of 3, 0 and 2 tokens), 8 of 12 channels
# rotated, halves without start positions and pairs with them; the input with grad. Compiled:
# sbhd pairs with start positions, forward and backward.
def _rope_inputs(d, tensor_format):
    if tensor_format == "thd":
        t, cu_seqlens = randn(d, 5, 2, 12, dtype=F32, grad=True), torch.tensor([0, 3, 3, 5], dtype=torch.int32)
        return t, cu_seqlens.to(d), torch.tensor([2, 0, 1], device=d), _rope_freqs(d, 5, 8)
    return randn(d, 4, 2, 2, 12, dtype=F32, grad=True), None, torch.tensor([2, 0], device=d), _rope_freqs(d, 6, 8)


for _format in ("sbhd", "thd"):
    for _op in ("rope_fwd", "rope_bwd"):
        for _interleaved in (False, True):
            _what = "pairs, start positions" if _interleaved else "halves"

            @_case(f"{_op}[fp32, {_format}, {_what}]", compile=_interleaved and _format == "sbhd" and _op == "rope_fwd")
            def _(d, op=_op, tensor_format=_format, interleaved=_interleaved):
                t, cu_seqlens, starts, freqs = _rope_inputs(d, tensor_format)
                return (t, freqs, tensor_format, interleaved, cu_seqlens, starts if interleaved else None), ()


# FP8 casts: an odd width (33), both formats.
@_case("fp8_quantize[bf16, 6x33]", compile=False)
def _(d):
    return (randn(d, 6, 33), torch.tensor([7.0], device=d), E4M3), (0,)


@_case("fp8_quantize_transpose[bf16, 6x33, e5m2]", compile=False)
def _(d):
    return (randn(d, 6, 33), torch.tensor([7.0], device=d), E5M2), (0, 1)


@_case("fp8_dequantize[e5m2 to fp32]", compile=False)
def _(d):
    scale = torch.tensor([7.0], device=d)
    codes, _ = ops.fp8_quantize(randn(d, 6, 33), scale, E5M2)
    return (codes, 1 / scale, F32), ()


# Block scaling: bf16 [70, 160] (ragged blocks in both directions) in 1 x 128 power-of-two
# scales and 1 x 32 E8M0 ones, and back.
for _block, _mode in (((1, 128), "pow2"), ((1, 32), "e8m0")):
    _t = f"bf16, 70x160, {_block[0]}x{_block[1]} {_mode}"

    @_case(f"fp8_block_quantize[{_t}]", compile=False)
    def _(d, block=_block, mode=_mode):
        return (randn(d, 70, 160), *block, E4M3, mode, 0.0), (0,)

    @_case(f"fp8_block_dequantize[{_t}]", compile=False)
    def _(d, block=_block, mode=_mode):
        data, scale_inv = ops.fp8_block_quantize(randn(d, 70, 160), *block, E4M3, mode, 0.0)
        return (data, scale_inv, *block, F32), ()


@_case("fp8_block_gemm[bf16 out, 48x32x256]", compile=False)
def _(d):
    (a, a_scales), (b, b_scales) = _block_gemm_operands(d, 48, 32, 256)
    return (a, a_scales, [1, 32], False, b, b_scales, [1, 32], False, None, BF16), ()


# scaled_gemm of bf16 and fp32 operands [20, 36] x [24, 36] with both scales and a bias, to
# fp32 and (compiled) to bf16.
for _dtype in (BF16, F32):
    for _out in (F32, BF16):
        @_case(f"scaled_gemm[{_dtype_name(_dtype)}, bias, {_dtype_name(_out)} out]", compile=_out == BF16)
        def _(d, dtype=_dtype, out=_out):
            return (randn(d, 20, 36, dtype=dtype), randn(d, 24, 36, dtype=dtype), torch.tensor([0.5], device=d),
                    torch.tensor([3.0], device=d), randn(d, 24, dtype=F32), out), ()


# scaled_gemm of FP8 codes as they are (E4M3 x E5M2, and E4M3 x bf16), widened inside the kernel.
for _b_name, _b_dtype in (("e5m2", torch.float8_e5m2), ("bf16", BF16)):
    @_case(f"scaled_gemm[e4m3 codes x {_b_name}, bias, bf16 out]", compile=True)
    def _(d, b_dtype=_b_dtype):
        return (randn(d, 20, 36, dtype=torch.float8_e4m3fn, scale=30.0), randn(d, 24, 36, dtype=b_dtype, scale=30.0),
                torch.tensor([0.5], device=d), torch.tensor([3.0], device=d), randn(d, 24, dtype=F32), BF16), ()


# scaled_gemm_accumulate of bf16 operands into a bf16 out, and of fp32 operands into fp32.
for _dtype in (BF16, F32):
    @_case(f"scaled_gemm_accumulate[{_dtype_name(_dtype)}]")
    def _(d, dtype=_dtype):
        return (randn(d, 20, 36, dtype=dtype), randn(d, 24, 36, dtype=dtype), torch.tensor([0.5], device=d), None,
                randn(d, 20, 24, dtype=dtype)), ()


# Adam: bf16 parameters and gradients with fp32 master weights, an empty tensor and one
# spanning two kernel chunks.
@_case("multi_tensor_adam[bf16, master weights]", compile=False)
def _(d):
    lists = _adam_lists(d, [(7, 3), (33,), (1,), (0, 4), (130, 129)], BF16, BF16, True)
    return (*lists, 1e-3, 0.9, 0.999, 1e-8, 1, True, 0.01, True, 1.0), ()
