"""RoPE ops and te.attention's API: the fused kernel against the reference (forward and
gradient) in every format, interleaved or not, partial rotary dims, start positions, packed
sequences, on every CPU SIMD tier and on every backend (tests/helpers/backends.py: the Triton kernel in
the interpreter without a GPU); TE's formula; gradcheck and errors, also
from the fake kernels (opcheck and torch.compile of the ops: the op cases at the end)."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch import reference
from backends import assert_refused
from function_log import FunctionLog
from numerics import assert_close, assert_two_reference, assert_value_error_naming
from op_cases import F32, OpCases, randn

ops = torch.ops.portable_te
apply_rope = te.attention.apply_rotary_pos_emb
SEQ_LENS = [5, 0, 17, 3]  # thd: packed sequences, one of them empty


def make_case(tensor_format, seq=37, batch=3, heads=5, head_dim=69, dtype=torch.float32, seq_lens=SEQ_LENS,
              device="cpu"):
    """(input, cu_seqlens or None, the number of positions a sequence can need)."""
    if tensor_format == "thd":
        cu_seqlens = torch.tensor([0] + seq_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        shape = (int(cu_seqlens[-1]), heads, head_dim)
        return torch.randn(shape).to(device, dtype), cu_seqlens.to(device), max(seq_lens)
    shape = (seq, batch, heads, head_dim) if tensor_format == "sbhd" else (batch, seq, heads, head_dim)
    return torch.randn(shape).to(device, dtype), None, seq


def batch_of(t, tensor_format, cu_seqlens):
    if tensor_format == "thd":
        return len(cu_seqlens) - 1
    return t.shape[1] if tensor_format == "sbhd" else t.shape[0]


def fused_fwd_bwd(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions, dy):
    t = t.detach().requires_grad_()
    y = apply_rope(t, freqs, tensor_format, start_positions, interleaved, fused=True, cu_seqlens=cu_seqlens)
    y.backward(dy)
    return y, t.grad


def reference_fwd_bwd(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions, dy):
    args = (freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    return reference.rope_fwd(t, *args), reference.rope_bwd(dy, *args)


def freqs_for(positions, rotary_dim, interleaved=False, device="cpu"):
    return te.RotaryPositionEmbedding(rotary_dim, interleaved=interleaved)(positions).to(device)


def check_against_reference(tensor_format, interleaved, rotary_dim, dtype=torch.float32, device="cpu", **case):
    t, cu_seqlens, needed = make_case(tensor_format, dtype=dtype, device=device, **case)
    start_positions = torch.tensor([4, 0, 2, 1][: batch_of(t, tensor_format, cu_seqlens)], device=device)
    # Arbitrary angles: no symmetry between a pair's channels for the backward to lean on.
    freqs = (torch.randn(needed + 4, 1, 1, rotary_dim) * 3).to(device)
    dy = torch.randn(t.shape).to(device, dtype)
    got = fused_fwd_bwd(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions, dy)
    want = reference_fwd_bwd(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions, dy)
    for name, g, w in zip(("output", "grad_input"), got, want):
        assert g.dtype == dtype and g.is_contiguous()
        assert_close(g, w, name=f"{tensor_format} {name}")
        assert torch.equal(g[..., rotary_dim:], (t if name == "output" else dy)[..., rotary_dim:]), "pass-through"


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("rotary_dim", [68, 34, 2], ids=lambda d: f"d2={d}")
def test_fp32_matches_reference_on_every_tier(cpu_tier, tensor_format, interleaved, rotary_dim):
    check_against_reference(tensor_format, interleaved, rotary_dim)


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("rotary_dim", [68, 34, 2], ids=lambda d: f"d2={d}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_reference_on_every_backend(backend, tensor_format, interleaved, rotary_dim, dtype):
    # 27 (sbhd, bshd) or 25 (thd) tokens: as many programs of the Triton kernel.
    check_against_reference(tensor_format, interleaved, rotary_dim, dtype, backend.device, seq=9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("tensor_format", ["sbhd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
def test_low_precision_two_reference_rule(cpu_tier, dtype, tensor_format, interleaved):
    t, cu_seqlens, needed = make_case(tensor_format, head_dim=64, dtype=dtype)
    freqs = freqs_for(needed, 48, interleaved)
    dy = torch.randn(t.shape).to(dtype)
    args = (freqs, tensor_format, interleaved, cu_seqlens, None)
    ours = fused_fwd_bwd(t, *args[:-1], None, dy)
    exact = (reference.rope_fwd(t.double(), *args), reference.rope_bwd(dy.double(), *args))
    plain = reference_fwd_bwd(t, *args, dy)
    for name, o, p, e, factor in zip(("output", "grad_input"), ours, plain, exact, (2, 3)):
        assert o.dtype == dtype
        assert_two_reference(o, p, e, factor, name=f"{dtype} {name}")


def test_te_formula_sbhd(backend):
    """TE's definition, written out: t * cos + rotate_half(t) * sin on freqs[:s], rest unchanged."""
    s, b, h, d, d2 = 11, 2, 3, 16, 12
    t = torch.randn(s, b, h, d, device=backend.device)
    freqs = freqs_for(s + 5, d2, device=backend.device)
    f = freqs[:s]
    x1, x2 = t[..., : d2 // 2], t[..., d2 // 2: d2]
    want = torch.cat((t[..., :d2] * f.cos() + torch.cat((-x2, x1), -1) * f.sin(), t[..., d2:]), -1)
    assert_close(apply_rope(t, freqs, fused=True), want)
    assert_close(apply_rope(t, freqs, fused=False), want)


def test_thd_positions_restart_per_sequence(backend):
    """Each packed sequence equals the same tokens rotated alone as a bshd batch of one."""
    t, cu_seqlens, needed = make_case("thd", head_dim=32, device=backend.device)
    freqs = freqs_for(needed, 32, device=backend.device)
    out = apply_rope(t, freqs, "thd", fused=True, cu_seqlens=cu_seqlens)
    for begin, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        alone = apply_rope(t[begin:end].unsqueeze(0), freqs, "bshd", fused=True)[0]
        assert torch.equal(out[begin:end], alone)


def test_start_positions_shift_positions(backend):
    t = torch.randn(2, 9, 4, 16, device=backend.device)  # bshd
    freqs = freqs_for(20, 16, device=backend.device)
    out = apply_rope(t, freqs, "bshd", start_positions=torch.tensor([3, 0], device=backend.device), fused=True)
    assert torch.equal(out[0], apply_rope(t[:1], freqs[3:], "bshd", fused=True)[0])
    assert torch.equal(out[1], apply_rope(t[1:], freqs, "bshd", fused=True)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_input_streaming_stores(dtype):
    """>= 16 MiB of output takes the streaming-store path."""
    t = torch.randn(128, 4, 16, 128).to(dtype) if dtype == torch.float32 else torch.randn(256, 4, 16, 128).to(dtype)
    freqs = freqs_for(t.shape[0], 128)
    assert_close(ops.rope_fwd(t, freqs, "sbhd", False, None, None), reference.rope_fwd(t, freqs, "sbhd", False, None, None))
    assert_close(ops.rope_bwd(t, freqs, "sbhd", True, None, None), reference.rope_bwd(t, freqs, "sbhd", True, None, None))


def test_non_contiguous_input_and_zero_tokens(backend):
    device = backend.device
    base = torch.randn(4, 13, 3, 40, device=device)  # bshd storage, viewed as sbhd
    t = base.transpose(0, 1)
    freqs = freqs_for(13, 40, device=device)
    assert_close(apply_rope(t, freqs, "sbhd", fused=True), reference.rope_fwd(t, freqs, "sbhd", False, None, None))
    strided_freqs = freqs_for(13, 80, device=device)[..., ::2]  # non-contiguous angles
    assert_close(apply_rope(t, strided_freqs, "sbhd", fused=True),
                 reference.rope_fwd(t, strided_freqs, "sbhd", False, None, None))
    empty = torch.randn(0, 2, 3, 8, device=device).requires_grad_()
    out = apply_rope(empty, freqs_for(4, 8, device=device), fused=True)
    out.sum().backward()
    assert out.shape == empty.shape and empty.grad.shape == empty.shape
    no_tokens = torch.randn(0, 3, 8, device=device)
    cu_seqlens = torch.tensor([0, 0], device=device)
    assert apply_rope(no_tokens, freqs_for(4, 8, device=device), "thd", fused=True,
                      cu_seqlens=cu_seqlens).shape == (0, 3, 8)
    no_heads = torch.randn(5, 2, 0, 8, device=device)
    assert apply_rope(no_heads, freqs_for(5, 8, device=device), fused=True).shape == (5, 2, 0, 8)


def test_double_backward_is_the_forward(backend):
    """grad_input = rope_bwd(dy) is linear in dy; its own gradient is rope_fwd."""
    t = torch.randn(6, 2, 3, 8, device=backend.device, requires_grad=True)
    dy = torch.randn(6, 2, 3, 8, device=backend.device, requires_grad=True)
    w = torch.randn(6, 2, 3, 8, device=backend.device)
    freqs = freqs_for(6, 8, device=backend.device)
    (grad,) = torch.autograd.grad(apply_rope(t, freqs, fused=True), t, dy, create_graph=True)
    (grad_of_grad,) = torch.autograd.grad((grad * w).sum(), dy)
    assert_close(grad_of_grad, reference.rope_fwd(w, freqs, "sbhd", False, None, None))


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
def test_reference_backward_is_autograd_of_forward_in_fp64(interleaved):
    t = torch.randn(5, 2, 3, 10, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, 2, 3, 10, dtype=torch.float64)
    freqs = torch.randn(7, 1, 1, 8)  # arbitrary angles: no symmetry between the halves
    args = (freqs, "sbhd", interleaved, None, torch.tensor([2, 0]))
    (autograd_grad,) = torch.autograd.grad(reference.rope_fwd(t, *args), t, dy)
    assert_close(reference.rope_bwd(dy, *args), autograd_grad)


@pytest.mark.filterwarnings("ignore:Input #0 requires gradient and is not a double")
def test_gradcheck(backend):
    """The op is linear in input, so fp32 central differences are exact up to rounding. Small:
    each of the 24 elements costs three calls."""
    t = torch.randn(2, 2, 1, 6, device=backend.device, requires_grad=True)
    freqs = torch.randn(6, 1, 1, 4, device=backend.device)
    start_positions = torch.tensor([1, 2], device=backend.device)
    assert torch.autograd.gradcheck(lambda x: apply_rope(x, freqs, "sbhd", start_positions, True, fused=True),
                                    (t,), eps=1e-2, atol=2e-3, rtol=1e-2)


def test_rotary_position_embedding():
    rope = te.RotaryPositionEmbedding(8, rotary_base=100.0)
    inv_freq = 1 / 100.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    freqs = rope(5, offset=2)
    angles = torch.outer(torch.arange(2, 7, dtype=torch.float32), inv_freq)
    assert freqs.shape == (5, 1, 1, 8) and freqs.dtype == torch.float32
    assert torch.equal(freqs[:, 0, 0], torch.cat((angles, angles), -1))
    pairs = te.RotaryPositionEmbedding(8, rotary_base=100.0, interleaved=True)(5, offset=2)
    assert torch.equal(pairs[:, 0, 0], angles.repeat_interleave(2, -1))
    assert te.RotaryPositionEmbedding(64, rotary_percent=0.5)(3).shape == (3, 1, 1, 32)
    scaled = te.RotaryPositionEmbedding(8, seq_len_interpolation_factor=2.0)(4)
    assert torch.allclose(scaled, te.RotaryPositionEmbedding(8)(4) / 2)
    dynamic = te.RotaryPositionEmbedding(8, seq_len_interpolation_factor=2.0, pretrained_max_position_embeddings=2)(8)
    assert torch.allclose(dynamic, te.RotaryPositionEmbedding(8)(8) * (2 / 8))
    assert "inv_freq" not in rope.state_dict()


def test_bad_arguments_raise_clear_errors():
    t, cu_seqlens, _ = make_case("thd", head_dim=16, seq_lens=[3, 4])
    freqs = freqs_for(8, 16)

    def thd(cu, f=freqs):
        return lambda: apply_rope(t, f, "thd", fused=True, cu_seqlens=cu)
    assert_value_error_naming(thd(torch.tensor([1, 3, 7])), ["cu_seqlens", "start at 0", "1"])
    assert_value_error_naming(thd(torch.tensor([0, 5, 3, 7])), ["cu_seqlens", "non-decreasing", "5", "3"])
    assert_value_error_naming(thd(torch.tensor([0, 3, 6])), ["cu_seqlens", "6", "7 tokens"])
    assert_value_error_naming(thd(cu_seqlens, freqs_for(3, 16)), ["freqs", "3 positions", "need 4"])
    assert_value_error_naming(lambda: apply_rope(t, freqs, "thd", fused=True), ["thd", "cu_seqlens"])
    sbhd = torch.randn(5, 2, 3, 16)
    assert_value_error_naming(lambda: apply_rope(sbhd, freqs_for(4, 16), fused=True), ["freqs", "4 positions", "need 5"])
    assert_value_error_naming(lambda: apply_rope(sbhd, freqs_for(8, 32), fused=True), ["rotary dim 32", "head dim"])
    odd = torch.zeros(8, 1, 1, 7)
    assert_value_error_naming(lambda: apply_rope(sbhd, odd, fused=True), ["rotary dim", "even", "7"])
    assert_value_error_naming(lambda: apply_rope(sbhd, freqs, "shbd", fused=True), ["tensor_format", "shbd"])
    assert_value_error_naming(lambda: apply_rope(sbhd, freqs, fused=True, start_positions=torch.tensor([0])),
                              ["start_positions", "2 sequences"])
    assert_value_error_naming(lambda: apply_rope(sbhd, freqs, fused=True, start_positions=torch.tensor([4, 0])),
                              ["freqs", "8 positions", "need 9"])
    for fused in (False, True):
        assert_value_error_naming(lambda: apply_rope(sbhd, freqs_for(4, 16), fused=fused), ["freqs", "need 5"])
    assert_value_error_naming(lambda: apply_rope(sbhd, freqs, fused=True, cp_size=2, cp_rank=1), ["5 tokens", "two"])
    assert_value_error_naming(lambda: apply_rope(sbhd[:4], freqs, fused=True, cp_size=2, cp_rank=2),
                              ["cp_rank", "cp_size=2"])
    # thd under context parallelism: the global offsets, each sequence padded to 2 cp_size tokens.
    assert_value_error_naming(lambda: apply_rope(t, freqs, "thd", fused=True, cu_seqlens=torch.tensor([0, 6, 14]),
                                                 cp_size=2), ["cu_seqlens", "multiple of 2 * cp_size = 4", "6"])
    assert_value_error_naming(lambda: apply_rope(t, freqs, "thd", fused=True, cu_seqlens=torch.tensor([0, 4, 8]),
                                                 cp_size=2), ["cu_seqlens", "8", "14 tokens"])


def _x(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


def _freqs(rows, rotary_dim=16):
    return torch.zeros(rows, 1, 1, rotary_dim)


def _i(*values):
    return torch.tensor(values)


# (call, words in the message, whether the check reads the values of cu_seqlens / start_positions,
# which meta tensors do not hold)
BAD_INPUTS = [
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8), "shbd", False, None, None),
     ["rope_fwd", "tensor_format", "'shbd'"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16, dtype=torch.int32), _freqs(8), "sbhd", False, None, None),
     ["rope_fwd", "input", "Int", "[5, 2, 3, 16]"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16, dtype=torch.float64), _freqs(8), "sbhd", False, None, None),
     ["input", "float64", "fused=False"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8), "thd", False, _i(0, 5), None),
     ["input", "'thd'", "3-D", "[5, 2, 3, 16]"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8).bfloat16(), "sbhd", False, None, None),
     ["freqs", "BFloat16", "Float"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8).to("meta"), "sbhd", False, None, None),
     ["freqs", "meta", "input", "cpu"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), torch.zeros(8, 16), "sbhd", False, None, None),
     ["freqs", "[max_seq_len, 1, 1, rotary_dim]", "[8, 16]"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8, 7), "sbhd", False, None, None),
     ["rotary dim", "even", "[8, 1, 1, 7]"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8, 32), "sbhd", False, None, None),
     ["rotary dim 32", "head dim", "[5, 2, 3, 16]"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(4), "sbhd", False, None, None),
     ["freqs", "covers 4 positions", "need 5"], False),
    (lambda: ops.rope_bwd(_x(7, 3, 16), _freqs(8), "thd", False, None, None), ["rope_bwd", "'thd'", "cu_seqlens"],
     False),
    (lambda: ops.rope_fwd(_x(7, 3, 16), _freqs(8), "thd", False, _i(0, 3, 7).float(), None),
     ["cu_seqlens", "int32 or int64", "Float"], False),
    (lambda: ops.rope_fwd(_x(7, 3, 16), _freqs(8), "thd", False, _i(0, 3, 7)[None], None),
     ["cu_seqlens", "1-D", "[1, 3]"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8), "sbhd", False, _i(0, 5), None),
     ["cu_seqlens", "only meaningful", "'sbhd'"], False),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8), "sbhd", False, None, _i(0)),
     ["start_positions", "[1]", "2 sequences"], False),
    (lambda: ops.rope_bwd(_x(5, 2, 3, 16, dtype=torch.int64), _freqs(8), "sbhd", False, None, None),
     ["rope_bwd", "grad_output", "Long"], False),
    (lambda: ops.rope_fwd(_x(7, 3, 16), _freqs(8), "thd", False, _i(1, 3, 7), None),
     ["cu_seqlens", "start at 0", "1"], True),
    (lambda: ops.rope_fwd(_x(7, 3, 16), _freqs(8), "thd", False, _i(0, 5, 3, 7), None),
     ["cu_seqlens", "non-decreasing", "cu_seqlens[2] = 3 < cu_seqlens[1] = 5"], True),
    (lambda: ops.rope_fwd(_x(7, 3, 16), _freqs(8), "thd", False, _i(0, 3, 6), None),
     ["cu_seqlens", "ends at 6", "7 tokens"], True),
    (lambda: ops.rope_fwd(_x(7, 3, 16), _freqs(3), "thd", False, _i(0, 3, 7), None),
     ["freqs", "covers 3 positions", "need 4"], True),
    (lambda: ops.rope_fwd(_x(5, 2, 3, 16), _freqs(8), "sbhd", False, None, _i(0, -1)),
     ["start_positions[1] = -1", "negative"], True),
    (lambda: ops.rope_bwd(_x(2, 5, 3, 16), _freqs(8), "bshd", False, None, _i(4, 0)),
     ["freqs", "covers 8 positions", "need 9"], True),
]


@pytest.mark.parametrize("call,words,reads_values", BAD_INPUTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_raises_value_error_naming_argument(backend, call, words, reads_values):
    """On every backend (the Triton kernel and the reference check in Python, custom_ops/rope.py,
    as the compiled op does), and in the fake kernels torch.compile traces with."""
    assert_refused(backend, call, words, on_meta=not reads_values)


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_thd_cu_seqlens_are_checked_on_both_paths(fused):
    """One check for both paths (the unfused one accepted non-monotonic cu_seqlens)."""
    t = torch.randn(7, 2, 16)
    freqs = freqs_for(8, 16)

    def thd(cu):
        return lambda: apply_rope(t, freqs, "thd", fused=fused, cu_seqlens=cu)
    assert_value_error_naming(thd(torch.tensor([0, 5, 3, 7])), ["cu_seqlens", "non-decreasing", "[0, 5, 3, 7]"])
    assert_value_error_naming(thd(torch.tensor([2, 3, 7])), ["cu_seqlens", "start at 0", "[2, 3, 7]"])
    assert_value_error_naming(thd(torch.tensor([0, 3, 6])), ["cu_seqlens", "7 tokens", "ends at 6"])
    assert_value_error_naming(thd(torch.tensor([0, 3, 9])), ["cu_seqlens", "7 tokens", "ends at 9"])
    assert_value_error_naming(thd(torch.tensor([[0, 3, 7]])), ["cu_seqlens", "1-D integer", "(1, 3)"])


@pytest.mark.parametrize("freqs_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("tensor_format", ["sbhd", "thd"])
def test_16_bit_freqs_are_computed_in_fp32(backend, freqs_dtype, tensor_format):
    """TE takes bf16 / fp16 angles and computes in fp32 (the fused path refused them): both
    paths equal the fp32 computation on the same (rounded) angles, forward and gradient."""
    t, cu_seqlens, needed = make_case(tensor_format, seq=9, head_dim=32, device=backend.device)
    freqs = freqs_for(needed, 32, device=backend.device).to(freqs_dtype)
    dy = torch.randn_like(t)
    want = reference_fwd_bwd(t, freqs.float(), tensor_format, False, cu_seqlens, None, dy)
    for fused in (False, True):
        x = t.detach().requires_grad_()
        y = apply_rope(x, freqs, tensor_format, fused=fused, cu_seqlens=cu_seqlens)
        y.backward(dy)
        for name, got, expected in zip(("output", "grad_input"), (y, x.grad), want):
            assert_close(got, expected, name=f"{'fused' if fused else 'unfused'} {name}")


def test_bench_case_providers_agree():
    from transformer_engine.bench.rope_cases import rope_case
    case = rope_case(((8, 2, 3, 16), torch.float32, "bshd", True, 12), "full", torch.device("cpu"))
    assert case.bytes == 4 * 8 * 2 * 3 * 16 * 4
    (ours,), (eager,) = case.providers["ours"](), case.providers["eager"]()
    assert_close(ours, eager)


@pytest.mark.parametrize("tensor_format", ["sbhd", "thd"])
def test_direct_call_equals_the_torch_ops_route_and_modes_see_it(tensor_format):
    """custom_ops.rope's direct dispatcher call (bindings/direct_calls.h, through the C++
    autograd of rope_ops.cpp) gives torch.ops.rope_fwd's output and gradient bit for bit,
    and a __torch_function__ mode still sees rope_fwd."""
    from transformer_engine.pytorch.custom_ops.rope import rope
    t, cu_seqlens, positions = make_case(tensor_format)
    freqs = freqs_for(positions, 48)
    t.requires_grad_()
    direct = rope(t, freqs, tensor_format, False, cu_seqlens, None)
    through_ops = ops.rope_fwd(t, freqs, tensor_format, False, cu_seqlens, None)
    dy = torch.randn_like(direct)
    assert torch.equal(direct, through_ops)
    assert torch.equal(torch.autograd.grad(direct, t, dy)[0], torch.autograd.grad(through_ops, t, dy)[0])
    with FunctionLog() as log:
        rope(t, freqs, tensor_format, False, cu_seqlens, None)
    assert any("rope_fwd" in name for name in log.names), log.names


def _strided_views(tensor_format):
    """(name, view) pairs of inputs that are not contiguous: q split off a fused QKV tensor (the
    kernel reads it where it lies), an expanded batch (stride 0) and a transposed seq/batch pair
    (both copied first)."""
    torch.manual_seed(3)
    heads, head_dim = 3, 40
    if tensor_format == "thd":
        qkv = torch.randn(29, 3 * heads, head_dim)
        return [("qkv split", qkv[:, :heads]), ("heads from a wider row", torch.randn(29, 5 * heads * head_dim)
                                                 .view(29, 5 * heads, head_dim)[:, 1:heads + 1])]
    seq, batch = 11, 4
    lead = (seq, batch) if tensor_format == "sbhd" else (batch, seq)
    qkv = torch.randn(*lead, (heads + 2) * head_dim)
    return [("qkv split", qkv[..., :heads * head_dim].view(*lead, heads, head_dim)),
            ("expanded", torch.randn(lead[0], 1, heads, head_dim).expand(lead[0], lead[1], heads, head_dim)
             if tensor_format == "sbhd" else torch.randn(1, lead[1], heads, head_dim).expand(*lead, heads, head_dim)),
            ("transposed", torch.randn(lead[1], lead[0], heads, head_dim).transpose(0, 1))]


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
def test_strided_inputs_give_the_contiguous_results(tensor_format, interleaved):
    """A non-contiguous input, read in place or copied first, gives bit for bit the result and
    gradient of its contiguous copy; the output is contiguous either way."""
    cu_seqlens = torch.tensor([0, 7, 7, 20, 29], dtype=torch.int32) if tensor_format == "thd" else None
    freqs = freqs_for(40, 32, interleaved)
    for name, view in _strided_views(tensor_format):
        assert not view.is_contiguous(), name
        packed = view.contiguous()
        got = ops.rope_fwd(view, freqs, tensor_format, interleaved, cu_seqlens, None)
        want = ops.rope_fwd(packed, freqs, tensor_format, interleaved, cu_seqlens, None)
        assert got.is_contiguous() and torch.equal(got, want), name
        back = ops.rope_bwd(view, freqs, tensor_format, interleaved, cu_seqlens, None)
        assert torch.equal(back, ops.rope_bwd(packed, freqs, tensor_format, interleaved, cu_seqlens, None)), name


# --- the op cases: each op's calls through opcheck, torch.compile and the reference on every
# backend (tests/helpers/op_cases.py) ---------------------------------------------------
CASES = OpCases("rope")


def _rope_freqs(d, positions, rotary_dim):
    return (torch.rand(positions, 1, 1, rotary_dim) * 6).to(d)


@CASES.case("rope_fwd")
def _(d):
    return (randn(d, 4, 2, 2, 16), _rope_freqs(d, 8, 12), "sbhd", False, None, None), ()


@CASES.case("rope_bwd")
def _(d):
    return (randn(d, 4, 2, 2, 16), _rope_freqs(d, 8, 12), "sbhd", True, None, torch.tensor([1, 3], device=d)), ()


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

            @CASES.case(f"{_op}[fp32, {_format}, {_what}]", compile=_interleaved and _format == "sbhd" and _op == "rope_fwd")
            def _(d, op=_op, tensor_format=_format, interleaved=_interleaved):
                t, cu_seqlens, starts, freqs = _rope_inputs(d, tensor_format)
                return (t, freqs, tensor_format, interleaved, cu_seqlens, starts if interleaved else None), ()


test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()
