"""te.DotProductAttention's options: sliding window, (dk, dv), ALiBi, biases and their gradient,
dropout, checkpointing, torch.compile, FP8 autocast, packed offsets, zero sizes, backend
refusals and argument errors."""
import contextlib
import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.attention import masks
from transformer_engine.pytorch.attention.backends import (AttentionConfig, SdpaBackend, UnfusedBackend,
                                                           select_backend, selection)
from attention_cases import (BACKENDS, B, D, H, attention_backend, check, dense_case,  # noqa: F401 (a fixture)
                             run_dense)
from attention_reference import attention, keep_matrix
from numerics import assert_close, assert_value_error_naming


@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right", "padding", "padding_causal",
                                       "arbitrary"])
@pytest.mark.parametrize("window", [(2, 0), (1, 2)], ids=str)
@pytest.mark.parametrize("sq,skv", [(7, 7), (5, 9)], ids=["self", "cross"])
def test_window(attention_backend, mask_type, window, sq, skv):
    """Keys outside [i + off - left, i + off + right] are masked (off: the type's alignment);
    causal types warn on right != 0 and use right = 0."""
    inputs = dense_case(mask_type, sq, skv, gqa=True, window=window)
    warns = "causal" in mask_type and window[1] != 0
    with pytest.warns(UserWarning, match="window_size") if warns else contextlib.nullcontext():
        _, results = run_dense("sbhd", mask_type, sq, skv, True, torch.float32, inputs=inputs,
                               forward_kwargs={"window_size": window})
    check(results, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_value_head_dim_differs(attention_backend, dtype):
    inputs = dense_case("padding_causal", 7, 7, gqa=True, dv=5)
    m, results = run_dense("bshd", "padding_causal", 7, 7, True, dtype, inputs=inputs)
    assert results["output"][0].shape[-1] == 5
    check(results, dtype)


def reference_alibi(slopes, mask_type, sq, skv, lens_q, lens_kv):
    """[b, h, sq, skv]: -slope * |i + off - j|, off per sequence as the mask type aligns it."""
    slopes = slopes.expand(B, H) if slopes.dim() == 1 else slopes
    bias = torch.zeros(B, H, sq, skv, dtype=torch.float64)
    for b in range(B):
        if mask_type in ("causal", "padding_causal"):
            off = 0
        elif "padding" in mask_type:
            off = lens_kv[b] - lens_q[b]
        else:
            off = skv - sq
        for i in range(sq):
            for j in range(skv):
                bias[b, :, i, j] = -slopes[b].double() * abs(i + off - j)
    return bias


def test_default_alibi_slopes():
    assert torch.equal(masks.default_alibi_slopes(4), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]))
    six = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]  # 4 of n=4, then odd ones of n=8
    assert torch.equal(masks.default_alibi_slopes(6), torch.tensor(six))


@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right", "padding", "padding_causal"])
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
def test_alibi(attention_backend, mask_type, per_batch):
    sq, skv = 5, 9
    inputs = dense_case(mask_type, sq, skv, gqa=True)
    slopes = torch.rand(B, H) if per_batch else masks.default_alibi_slopes(H)
    lens_q, lens_kv = [sq, sq - 3], [skv - 2, skv]  # dense_case's lengths for cross attention
    bias = reference_alibi(slopes, mask_type, sq, skv, lens_q, lens_kv)
    _, results = run_dense("bshd", mask_type, sq, skv, True, torch.float32, inputs=inputs, bias=bias,
                           forward_kwargs={"core_attention_bias_type": "alibi",
                                           "alibi_slopes": slopes if per_batch else None})
    check(results, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias"])
@pytest.mark.parametrize("bias_shape", [(1, H, 7, 7), (B, 1, 7, 7), (1, 1, 1, 7), (B, H, 1, 7)],
                         ids=["1hss", "b1ss", "111s", "bh1s"])
def test_bias_and_its_gradient(attention_backend, bias_type, bias_shape, dtype):
    """pre_scale_bias: softmax(scale * (q k^T + bias)); post_scale_bias: softmax(scale * q k^T + bias)."""
    q, k, v, mask, keep = dense_case("padding_causal", 7, 7, gqa=True)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    bias = torch.randn(bias_shape).to(dtype)
    scale = 0.3
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal",
                               softmax_scale=scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out = m(*leaves[:3], attention_mask=mask, core_attention_bias_type=bias_type, core_attention_bias=leaves[3])
    dy = torch.randn_like(out)
    out.backward(dy)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, bias)]
    ref_bias = ref_leaves[3] * scale if bias_type == "pre_scale_bias" else ref_leaves[3]
    ref = attention(*(t.transpose(1, 2) for t in ref_leaves[:3]), keep=keep, bias=ref_bias, scale=scale)
    ref.transpose(1, 2).reshape(out.shape).backward(dy.double())
    tol = {} if dtype == torch.float32 else {"atol": 2e-2}
    assert_close(out, ref.transpose(1, 2).reshape(out.shape), dtype=dtype, name="output", **tol)
    for name, ours, theirs in zip(("grad_q", "grad_k", "grad_v", "grad_bias"), leaves, ref_leaves):
        assert_close(ours.grad, theirs.grad, dtype=dtype, name=name, **tol)


def test_dropout_statistics(attention_backend):
    """With q = 0 every probability is 1 / skv; v = identity makes the output the dropped
    probabilities: a fraction p of them 0, the rest 1 / (skv (1 - p)). Eval mode drops nothing."""
    s, p = 16, 0.25
    m = te.DotProductAttention(H, (D, s), qkv_format="bshd", attn_mask_type="no_mask", attention_dropout=p)
    q = torch.zeros(B, s, H, D)
    k = torch.randn(B, s, H, D)
    v = torch.eye(s).view(1, s, 1, s).expand(B, s, H, s)  # key j's value is e_j
    out = m(q, k, v)  # training mode
    zeros = (out == 0).double().mean().item()
    assert abs(zeros - p) < 0.05, zeros
    kept = out[out != 0]
    assert_close(kept, torch.full_like(kept, 1 / (s * (1 - p))), name="kept probabilities")
    m.eval()
    assert_close(m(q, k, v), torch.full_like(out, 1 / s), name="eval output")


def test_checkpoint_core_attention_same_grads(attention_backend):
    """Recomputation in backward (dropout included, same RNG) gives the same output and grads."""
    inputs = dense_case("padding_causal", 7, 7, gqa=True)
    q, k, v, mask, _ = inputs
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attention_dropout=0.2,
                               attn_mask_type="padding_causal")
    runs = []
    for checkpoint in (False, True):
        torch.manual_seed(7)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = m(*leaves, attention_mask=mask, checkpoint_core_attention=checkpoint)
        out.backward(torch.ones_like(out))
        runs.append([out] + [t.grad for t in leaves])
    for name, a, b in zip(("output", "grad_q", "grad_k", "grad_v"), *runs):
        assert_close(a, b, name=name)


@pytest.mark.parametrize("backend_name,fmt,mask_type", [("sdpa", "bshd", "padding_causal"),
                                                      ("unfused", "thd", "causal")])
def test_compile_fullgraph_matches_eager(monkeypatch, backend_name, fmt, mask_type):
    """Each backend once (compiling is slow on 2 cores): the default one on a padded batch, the
    fused-softmax one on packed sequences."""
    monkeypatch.setattr(selection, "PREFERENCE", (BACKENDS[backend_name],))
    torch._dynamo.reset()
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format=fmt, attn_mask_type=mask_type)
    if fmt == "thd":
        lens = [3, 6, 2]
        cu = torch.tensor([0, 3, 9, 11], dtype=torch.int32)
        inputs = [torch.randn(sum(lens), n, D) for n in (H, 2, 2)]
        kwargs = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": 6, "max_seqlen_kv": 6}
    else:
        q, k, v, mask, _ = dense_case(mask_type, 7, 7, gqa=True)
        inputs, kwargs = [q, k, v], {"attention_mask": mask}
    compiled = torch.compile(m, fullgraph=True)
    results = []
    for module in (m, compiled):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = module(*leaves, **kwargs)
        out.backward(torch.ones_like(out))
        results.append([out] + [t.grad for t in leaves])
    for name, eager, comp in zip(("output", "grad_q", "grad_k", "grad_v"), *results):
        assert_close(comp, eager, name=name)


@pytest.mark.parametrize("name", ["DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
                                  "MXFP8BlockScaling"])
def test_fp8_autocast_leaves_attention_in_high_precision(name):
    """As TE without fp8_dpa: under every recipe the attention itself runs in high precision."""
    q, k, v, mask, _ = dense_case("padding_causal", 7, 7, gqa=True)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal")
    results = []
    for context in (contextlib.nullcontext(), te.autocast(recipe=getattr(recipe, name)())):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with context:
            out = m(*leaves, attention_mask=mask)
        out.backward(torch.ones_like(out))
        results.append([out] + [t.grad for t in leaves])
    for label, plain, fp8 in zip(("output", "grad_q", "grad_k", "grad_v"), *results):
        assert torch.isfinite(fp8).all()
        assert_close(fp8, plain, name=label)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_on_each_device(device, attention_backend, dtype):
    """The same call on every device present (CUDA/MUSA run SDPA's own kernels) against the
    CPU float64 reference."""
    q, k, v, mask, keep = dense_case("padding_causal_bottom_right", 5, 9, gqa=True)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal_bottom_right")
    leaves = [t.to(device, dtype).clone().requires_grad_() for t in (q, k, v)]
    out = m(*leaves, attention_mask=tuple(x.to(device) for x in mask))
    out.backward(torch.ones_like(out))
    exact = [t.to(dtype).double().detach().requires_grad_() for t in (q, k, v)]
    ref = attention(*(t.transpose(1, 2) for t in exact), keep=keep).transpose(1, 2).reshape(out.shape)
    ref.backward(torch.ones_like(ref))
    tol = {} if dtype == torch.float32 else {"atol": 2e-2}
    assert_close(out, ref, dtype=dtype, name="output", **tol)
    for name, ours, theirs in zip(("grad_q", "grad_k", "grad_v"), leaves, exact):
        assert_close(ours.grad, theirs.grad, dtype=dtype, name=name, **tol)


def test_thd_with_padded_offsets(attention_backend):
    """cu_seqlens_*_padded place each sequence in the packed tensor; tokens between sequences
    come out zero and get no gradient."""
    lens, starts = [3, 5], [0, 4]  # token 3 and tokens 9..10 belong to no sequence
    t = 11
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    cu_padded = torch.tensor([0, 4, 11], dtype=torch.int32)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding_causal")
    leaves = [torch.randn(t, n, D).requires_grad_() for n in (H, 2, 2)]
    out = m(*leaves, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
            cu_seqlens_kv_padded=cu_padded).view(t, H, D)
    out.backward(torch.ones_like(out))
    unused = torch.tensor([3, 9, 10])
    assert torch.equal(out[unused], torch.zeros(3, H, D))
    assert torch.equal(leaves[0].grad[unused], torch.zeros(3, H, D))
    for start, n in zip(starts, lens):
        seq = [x.detach()[start: start + n].transpose(0, 1).unsqueeze(0).requires_grad_() for x in leaves]
        ref = attention(*seq, keep=keep_matrix("causal", n, n), dtype=torch.float64)[0].transpose(0, 1)
        ref.backward(torch.ones_like(ref))
        assert_close(out[start: start + n], ref, dtype=torch.float32, name="output")
        for name, ours, theirs in zip(("grad_q", "grad_k", "grad_v"), leaves, seq):
            assert_close(ours.grad[start: start + n], theirs.grad[0].transpose(0, 1), dtype=torch.float32, name=name)


def test_padding_from_cu_seqlens_matches_mask():
    """sbhd/bshd padding types without attention_mask take the lengths from cu_seqlens."""
    q, k, v, mask, _ = dense_case("padding_causal", 7, 7, gqa=True)
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding_causal")
    lengths = (~mask.view(B, 7)).sum(-1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    assert torch.equal(m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu), m(q, k, v, attention_mask=mask))


def test_zero_sizes(attention_backend):
    m = te.DotProductAttention(H, D, num_gqa_groups=2, attn_mask_type="causal")
    leaves = [torch.randn(7, 0, n, D).requires_grad_() for n in (H, 2, 2)]  # sbhd, batch 0
    out = m(*leaves)
    assert out.shape == (7, 0, H * D)
    out.sum().backward()
    assert leaves[0].grad.shape == leaves[0].shape
    thd = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    cu = torch.zeros(2, dtype=torch.int32)
    empty = torch.randn(0, H, D)
    assert thd(empty, empty, empty, cu_seqlens_q=cu, cu_seqlens_kv=cu).shape == (0, H * D)


def test_default_backend_on_non_contiguous_views():
    """MultiheadAttention-style q/k/v: strided views of one fused projection."""
    s = 6
    qkv = torch.randn(s, B, H, 3 * D)  # [s, b, h, 3d]
    q, k, v = qkv.split(D, dim=-1)
    m = te.DotProductAttention(H, D)  # sbhd, causal
    out = m(q, k, v)
    assert m.last_backend == "flash"
    keep = keep_matrix("causal", s, s)
    ref = attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), keep=keep)  # [b, h, s, d]
    assert_close(out, ref.permute(2, 0, 1, 3).reshape(s, B, H * D), dtype=torch.float32, name="output")


def test_backend_refusals_are_listed():
    config = AttentionConfig(dtype=torch.float8_e4m3fn, device_type="cpu", num_heads=H, num_gqa_groups=H,
                             head_dim_qk=D, head_dim_v=D, causal="none", has_mask=False, has_bias=False, dropout=0.0)
    fp32 = AttentionConfig(**{**config.__dict__, "dtype": torch.float32})
    assert SdpaBackend().supports(fp32) is None and UnfusedBackend().supports(fp32) is None
    assert "float8_e4m3fn" in SdpaBackend().supports(config)
    with pytest.raises(RuntimeError) as info:
        select_backend(config)
    message = str(info.value)
    assert "sdpa: torch SDPA takes" in message and "unfused: the fused softmax kernels take" in message
    m = te.DotProductAttention(H, D, qkv_format="bshd")
    x = torch.randn(B, 5, H, D).to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="no attention backend supports"):
        m(x, x, x)


def test_rng_state_tracker_forks_for_dropout():
    forks = []

    class Tracker:
        @contextlib.contextmanager
        def fork(self):
            forks.append(1)
            yield

    m = te.DotProductAttention(H, D, attention_dropout=0.1, get_rng_state_tracker=Tracker)
    x = torch.randn(5, B, H, D)
    m(x, x, x)
    assert forks == [1]
    m.eval()
    m(x, x, x)
    assert forks == [1]


def test_state_dict_round_trip_and_te_checkpoints():
    m = te.DotProductAttention(H, D)
    state = m.state_dict()
    assert list(state) == ["_extra_state"]
    m.load_state_dict(state)
    m.load_state_dict({})  # saved without the key
    m.load_state_dict({"_extra_state": torch.zeros(8, dtype=torch.uint8)})  # TE's serialised FP8 metadata


def test_causal_window_forced_right_zero():
    with pytest.warns(UserWarning, match="window_size"):
        m = te.DotProductAttention(H, D, attn_mask_type="causal", window_size=(3, 2))
    assert m.window_size == (3, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert te.DotProductAttention(H, D, attn_mask_type="padding,causal").window_size == (-1, 0)
        assert te.DotProductAttention(H, D, attn_mask_type="no_mask").window_size == (-1, -1)


def test_forward_mask_type_override_takes_its_own_default_window():
    """A causal module called with attn_mask_type='no_mask' attends every key: its window (-1, 0)
    becomes (-1, -1) for the call, with TE's warning."""
    q, k, v, _, _ = dense_case("no_mask", 6, 6, gqa=False)
    causal = te.DotProductAttention(H, D, qkv_format="bshd")
    plain = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask")
    with pytest.warns(UserWarning, match="window_size"):
        assert torch.equal(causal(q, k, v, attn_mask_type="no_mask"), plain(q, k, v))
    assert not torch.equal(causal(q, k, v), plain(q, k, v))


def test_tensor_parallel_heads_and_context_parallel_arguments():
    split = te.DotProductAttention(4, D, num_gqa_groups=2, tp_size=2)  # each rank: its heads and groups
    assert (split.num_attention_heads_per_partition, split.num_gqa_groups_per_partition) == (2, 1)
    with pytest.raises(ValueError, match="num_gqa_groups=1.*2 tensor-parallel ranks"):
        te.DotProductAttention(4, D, num_gqa_groups=1, tp_size=2)
    # Context parallelism (tests/distributed/test_context_parallel.py) takes a ProcessGroup and a known cp_comm_type.
    with pytest.raises(ValueError, match="cp_group must be a torch.distributed ProcessGroup.*object"):
        te.DotProductAttention(H, D, cp_group=object())
    with pytest.raises(ValueError, match="cp_comm_type.*'ring'"):
        te.DotProductAttention(H, D, cp_comm_type="ring")


def test_bad_arguments():
    assert_value_error_naming(lambda: te.DotProductAttention(6, D, num_gqa_groups=4), ["num_gqa_groups", "4", "6"])
    assert_value_error_naming(lambda: te.DotProductAttention(H, D, attn_mask_type="sliding"), ["attn_mask_type"])
    assert_value_error_naming(lambda: te.DotProductAttention(H, D, qkv_format="sbh"), ["qkv_format", "sbh"])
    m = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="padding")
    q, k = torch.randn(B, 5, H, D), torch.randn(B, 5, 2, D)
    assert_value_error_naming(lambda: m(q, q, q), ["num_gqa_groups", "(2, 5, 4, 8)"])
    assert_value_error_naming(lambda: m(q[..., :6], k, k), ["kv_channels", "(2, 5, 4, 6)"])
    assert_value_error_naming(lambda: m(q, k, k, attention_mask=torch.zeros(B, 1, 5, 5, dtype=torch.bool)),
                              ["attention_mask", "[2, 1, 1, 5]", "(2, 1, 5, 5)"])
    assert_value_error_naming(lambda: m(q, k, k, attention_mask=torch.zeros(B, 1, 1, 5)),
                              ["attention_mask", "torch.float32"])
    assert_value_error_naming(lambda: m(q, k[:, :4], k[:, :4], attention_mask=torch.zeros(B, 1, 1, 5, dtype=torch.bool)),
                              ["pair", "sq=5", "skv=4"])
    assert_value_error_naming(lambda: m(q, k, k, attn_mask_type="arbitrary",
                                        attention_mask=torch.zeros(B, 3, 5, 5, dtype=torch.bool)),
                              ["arbitrary", "[2, 4, 5, 5]", "(2, 3, 5, 5)"])
    assert_value_error_naming(lambda: m(q, k, k, core_attention_bias_type="post_scale_bias",
                                        core_attention_bias=torch.randn(1, H, 5, 4)),
                              ["core_attention_bias", "sq=5", "skv=5", "(1, 4, 5, 4)"])
    assert_value_error_naming(lambda: m(q, k, k, core_attention_bias_type="alibi", alibi_slopes=torch.rand(3)),
                              ["alibi_slopes", "[4]", "(3,)"])
    assert_value_error_naming(lambda: m(q, k, k, core_attention_bias_type="bias"), ["core_attention_bias_type"])
    thd = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="thd")
    assert_value_error_naming(lambda: thd(q[0], k[0], k[0], cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32)),
                              ["cu_seqlens_kv", "None"])
    assert_value_error_naming(lambda: thd(q[0], k[0], k[0], attn_mask_type="arbitrary"), ["arbitrary", "thd"])
    assert_value_error_naming(lambda: thd(q, k, k), ["3-D", "(2, 5, 4, 8)"])


@pytest.mark.parametrize("side", ["q", "kv"])
def test_thd_cu_seqlens_values_are_checked(side):
    """cu_seqlens that would drop, overlap or run past tokens are refused, naming the argument
    and its values (they gave output, or a bare IndexError past the end)."""
    thd = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding_causal")
    q, k = torch.randn(7, H, D), torch.randn(7, 2, D)
    good = torch.tensor([0, 3, 7], dtype=torch.int32)

    def call(cu, padded=None):
        kwargs = {f"cu_seqlens_{s}": good for s in ("q", "kv")}
        kwargs[f"cu_seqlens_{side}"] = cu
        if padded is not None:
            kwargs[f"cu_seqlens_{side}_padded"] = padded
        return lambda: thd(q, k, k, **kwargs)
    name = f"cu_seqlens_{side}"
    call(good)()
    call(torch.tensor([0, 3, 5], dtype=torch.int32))()  # tokens after the last sequence are allowed
    assert_value_error_naming(call(torch.tensor([0, 5, 3], dtype=torch.int32)),
                              [name, "non-decreasing", f"{name}[2] = 3", "[0, 5, 3]"])
    assert_value_error_naming(call(torch.tensor([0, 3, 2], dtype=torch.int32)), [name, "non-decreasing", "[0, 3, 2]"])
    assert_value_error_naming(call(torch.tensor([1, 3, 7], dtype=torch.int32)), [name, "start at 0", "[1, 3, 7]"])
    assert_value_error_naming(call(torch.tensor([0, 3, 9], dtype=torch.int32)), [name, "7 tokens", "ends at 9"])
    assert_value_error_naming(call(torch.tensor([0.0, 3.0, 7.0])), [name, "integer", "torch.float32"])
    assert_value_error_naming(call(good, torch.tensor([0, 2, 7], dtype=torch.int32)),
                              [f"{name}_padded", "[3, 4]", "[2, 5]"])
    assert_value_error_naming(call(good, torch.tensor([0, 4, 8], dtype=torch.int32)),
                              [f"{name}_padded", "7 tokens", "ends at 8"])
