"""The flash-attention op's terms beyond the mask's structure: a post-scale bias read by
broadcast (with its gradient), a dense boolean mask, the logit softcap, attention sinks (with
their gradient), the max logit, and dropout keyed by (seed, offset). Forward and every gradient
against the float64 reference of the same call, on every CPU tier, compiled, and dropout's draw
checked for its rate, its reproducibility and its independence from the thread count."""
import pytest
import torch

from flash_attention_check import check_flash, fwd_args
from numerics import assert_close
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops.attention import flash_attention

ops = torch.ops.portable_te


def _qkv(b=2, h=4, g=2, sq=37, skv=45, dk=16, dv=12):
    return torch.randn(b, h, sq, dk), torch.randn(b, g, skv, dk), torch.randn(b, g, skv, dv)


BIAS_SHAPES = {"[1,h]": (1, 4), "[b,1]": (2, 1), "[b,h]": (2, 4), "[1,1]": (1, 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", BIAS_SHAPES)
def test_bias_broadcast_and_its_gradient(shape, dtype):
    q, k, v = _qkv()
    bias = torch.randn(*BIAS_SHAPES[shape], 37, 45)
    _, grads = check_flash(q, k, v, (-1, 0), True, dtype, bias=bias)
    assert grads[3].shape == bias.shape


def test_bias_as_a_broadcast_view():
    """A bias expanded over its rows (stride 0) is read where it lies."""
    q, k, v = _qkv()
    check_flash(q, k, v, (-1, -1), False, torch.float32, bias=torch.randn(1, 4, 1, 45).expand(1, 4, 37, 45))


@pytest.mark.parametrize("window,bottom_right", [((-1, -1), False), ((-1, 0), True), ((6, 2), False)],
                         ids=["none", "causal_bottom_right", "window"])
def test_dense_mask_with_the_structure(window, bottom_right):
    """A dense mask ANDed with the window; rows the mask empties give zeros."""
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 37, 45) > 0.7
    mask[1, :, 5] = True
    out, grads = check_flash(q, k, v, window, bottom_right, torch.float32, mask=mask)
    assert not out[1, :, 5].any() and not grads[0][1, :, 5].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("softcap", [0.5, 30.0])
def test_softcap(softcap, dtype):
    q, k, v = _qkv()
    check_flash(q * 3, k, v, (-1, 0), False, dtype, softcap=softcap)


@pytest.mark.parametrize("layout", ["padded", "lengths", "packed"])
@pytest.mark.parametrize("learnable", [False, True], ids=["off_by_one", "learnable"])
def test_sinks_and_their_gradient(learnable, layout):
    """Rows that see no key still have the sink: zeros out, lse = the sink's logit."""
    offset = torch.randn(4) if learnable else torch.zeros(4)
    if layout == "packed":
        cu = torch.tensor([0, 30, 30, 51]), torch.tensor([0, 40, 41, 47])
        q, k, v = torch.randn(51, 4, 16), torch.randn(47, 2, 16), torch.randn(47, 2, 8)
        check_flash(q, k, v, (-1, 0), True, torch.float32, cu=cu, softmax_offset=offset)
        return
    q, k, v = _qkv(sq=50, skv=20)
    cu = (torch.tensor([0, 50, 53]), torch.tensor([0, 20, 40])) if layout == "lengths" else (None, None)
    out, grads = check_flash(q, k, v, (-1, 0), True, torch.float32, cu=cu, softmax_offset=offset)
    assert not out[0, :, :30].any(), "queries before the first key see only the sink"


def test_max_logit_counts_only_what_the_mask_lets_through():
    q, k, v = _qkv()
    mask = torch.rand(1, 4, 37, 45) > 0.5
    mask[:, 2] = True  # head 2 sees nothing
    out, _, logit = flash_attention(q, k, v, 0.25, (-1, -1), False, mask=mask, bias=torch.randn(2, 1, 37, 45),
                                    return_max_logit=True)
    assert logit.dtype == torch.float32 and logit.shape == (4,) and logit[2] == float("-inf")
    check_flash(q, k, v, (7, 0), False, torch.float32, mask=mask, softcap=4.0, slopes=torch.rand(4))


def test_every_term_together_on_every_tier(cpu_tier):
    q, k, v = _qkv(sq=70, skv=90)
    check_flash(q, k, v, (20, 3), True, torch.float32, slopes=torch.rand(2, 4), bias=torch.randn(1, 4, 70, 90),
                mask=torch.rand(2, 1, 70, 90) > 0.8, softmax_offset=torch.randn(4), softcap=5.0, dropout=0.25,
                dropout_rng=torch.tensor([12345, 678]))


# --- dropout ----------------------------------------------------------------------------------

def _rng(seed, offset=0):
    return torch.tensor([seed, offset], dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_dropout_matches_the_reference_draw(layout, dtype):
    """The kernel's keep mask is the reference's Philox draw: forward and gradients agree."""
    rng = _rng(2 ** 40 + 7, 2 ** 33 + 5)
    if layout == "packed":
        cu = torch.tensor([0, 37, 38, 90]), torch.tensor([0, 45, 46, 100])
        q, k, v = torch.randn(90, 4, 16), torch.randn(100, 2, 16), torch.randn(100, 2, 12)
        check_flash(q, k, v, (-1, 0), True, dtype, cu=cu, dropout=0.2, dropout_rng=rng)
    else:
        q, k, v = _qkv()
        check_flash(q, k, v, (-1, -1), False, dtype, dropout=0.2, dropout_rng=rng, softmax_offset=torch.randn(4))


def test_dropout_rate_and_scale():
    """With v the identity, out holds the kept probabilities times 1 / (1 - p): the share dropped
    is p, and a row's kept weights sum to 1 on average."""
    p, sq, skv = 0.3, 64, 256
    q, k = torch.zeros(1, 8, sq, 16), torch.zeros(1, 8, skv, 16)  # uniform attention: 1 / skv each
    v = torch.eye(skv).expand(1, 8, skv, skv)
    out, _ = flash_attention(q, k, v, 1.0, dropout=p, dropout_rng=_rng(99))
    kept = out * skv * (1 - p)  # 1 where kept, 0 where dropped
    assert torch.allclose(kept, kept.round(), atol=1e-4)
    share = 1 - kept.round().mean().item()
    assert abs(share - p) < 0.01, f"dropped {share:.4f}, want {p}"
    assert abs(out.sum(-1).mean().item() - 1) < 0.01


def test_dropout_is_a_function_of_seed_and_offset_alone():
    q, k, v = _qkv()
    draws = {}
    previous = torch.get_num_threads()
    try:
        for threads, seed, offset in ((1, 5, 0), (2, 5, 0), (2, 5, 1), (2, 6, 0)):
            torch.set_num_threads(threads)
            draws[(threads, seed, offset)] = flash_attention(q, k, v, 0.3, dropout=0.5, dropout_rng=_rng(seed, offset))[0]
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(draws[(1, 5, 0)], draws[(2, 5, 0)])
    assert not torch.equal(draws[(2, 5, 0)], draws[(2, 5, 1)])
    assert not torch.equal(draws[(2, 5, 0)], draws[(2, 6, 0)])


def test_dropout_draws_its_key_from_torchs_generator():
    q, k, v = _qkv()
    torch.manual_seed(3)
    first = flash_attention(q, k, v, 0.3, dropout=0.4)[0]
    torch.manual_seed(3)
    assert torch.equal(first, flash_attention(q, k, v, 0.3, dropout=0.4)[0])
    assert not torch.equal(first, flash_attention(q, k, v, 0.3, dropout=0.4)[0])


# Random123's known answers for Philox4x32-10: (counter, key words, output).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff, 0xffffffff), (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


@pytest.mark.parametrize("counter,key,words", PHILOX_KAT)
def test_reference_philox_is_the_published_one(counter, key, words):
    got = reference.philox.philox4x32(torch.tensor([counter]), key[0] | key[1] << 32)
    assert got[0].tolist() == list(words)


# --- compile and opcheck ------------------------------------------------------------------------

def test_every_term_compiles_fullgraph():
    q, k, v = (t.requires_grad_() for t in _qkv())
    bias = torch.randn(1, 4, 37, 45, requires_grad=True)
    offset = torch.randn(4, requires_grad=True)
    mask = torch.rand(2, 1, 37, 45) > 0.8
    rng = _rng(4, 2)

    def attend(q, k, v, bias, offset):
        out, _, logit = flash_attention(q, k, v, 0.25, (9, 0), True, bias=bias, mask=mask, softmax_offset=offset,
                                        softcap=3.0, dropout=0.1, dropout_rng=rng, return_max_logit=True)
        return out, logit

    eager = attend(q, k, v, bias, offset)
    compiled = torch.compile(attend, fullgraph=True, backend="eager")(q, k, v, bias, offset)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    grads = torch.autograd.grad(eager[0].sum(), (q, k, v, bias, offset))
    grads_compiled = torch.autograd.grad(compiled[0].sum(), (q, k, v, bias, offset))
    for a, b in zip(grads, grads_compiled):
        assert torch.equal(a, b)


def test_opcheck_with_every_term():
    q, k, v = _qkv()
    args = fwd_args(q, k, v, bias=torch.randn(1, 4, 37, 45), mask=torch.rand(2, 1, 37, 45) > 0.8,
                    softmax_offset=torch.randn(4), dropout_rng=_rng(1), scale=0.25, window=(-1, 0), softcap=2.0,
                    dropout=0.2, last=True)
    torch.library.opcheck(ops.flash_attention_fwd, args)
    out, lse, _ = ops.flash_attention_fwd(*args)
    bwd = list(args)
    bwd[-1] = True
    torch.library.opcheck(ops.flash_attention_bwd, (torch.randn_like(out), *bwd[:3], out, lse, *bwd[3:]))


def test_the_reference_serves_the_same_numbers():
    """The reference (what accelerators run) against the kernel on one call with every term."""
    q, k, v = _qkv()
    args = fwd_args(q, k, v, alibi_slopes=torch.rand(4), bias=torch.randn(2, 4, 37, 45),
                    mask=torch.rand(1, 4, 37, 45) > 0.8, softmax_offset=torch.randn(4), dropout_rng=_rng(8, 9),
                    scale=0.3, window=(10, 10), softcap=6.0, dropout=0.3, last=True)
    ours, want = ops.flash_attention_fwd(*args), reference.flash_attention_fwd(*args)
    for name, a, b in zip(("out", "lse", "max_logit"), ours, want):
        finite = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), finite)
        assert_close(a[finite], b[finite].to(a.dtype), dtype=torch.float32, name=name)
